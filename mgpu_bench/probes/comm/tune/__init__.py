"""`mgpu-bench comm --tune`: which NCCL setting to use, per size band, measured on this node.

Every setting runs in a process of its own (run.py run as `python -m`, a "trial"), with
the user's environment plus the setting's variables, on one fresh communicator over the chosen
GPUs. A fresh process is the only safe way: NCCL reads NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS
and NCCL_BUFFSIZE through NCCL_PARAM, which caches the value the first time a process reads it
(src/include/param.h, NCCL 2.28), so a second communicator in the same process keeps the first
one's value. NCCL_ALGO and NCCL_PROTO are read by getenv at every communicator's set-up
(src/graph/tuning.cc) and could change between communicators, but setenv while the session's
threads run is unsafe; ncclConfig_t's minCTAs/maxCTAs would set channels per communicator, but
only through ncclCommInitRankConfig, which the native session does not call.

The plan: the sweep's sizes are cut into bands (small <= 4 MiB where latency and the LL/LL128
protocols matter, medium <= 64 MiB, large above, where Simple and the channel count and buffer
size matter) and each band is measured at SIZES_PER_BAND sizes (its two ends). The trials run
one after another (the GPUs are shared, so never at once): the default (the environment as it
is), then NCCL_ALGO and NCCL_PROTO per collective (NCCL >= 2.24 takes "allreduce:Tree", which
leaves the other collectives alone), channels (half and twice the default's, read from NCCL's
INFO log) and NCCL_BUFFSIZE (8 and 16 MiB against 4 MiB), then the default again. Iterations
per size follow comm's stopping rules; every result is checked with exact integer-valued data.

The rule (recommend, pure Python): at every size of the band the setting's busbw beats the
default's (the better of its two runs) by more than max(MIN_GAIN, NOISE_FACTOR x noise), where
noise is the largest of the samples' coefficients of variation (default and setting) and the
relative difference between the two default runs (two fresh communicators of the same
settings differ by that much). Fewer than 5 samples give no noise figure and no recommendation.
Never recommended: a setting that failed the data check (any wrong element) or failed to run,
and an NVLS algorithm where NVLS is off (NCCL_NVLS_ENABLE=0 in the environment, or NCCL set up
no NVLS channels: no NVSwitch multicast). A setting recommended in one band that costs more than
the same threshold in another is given only for jobs whose messages are in its band. Settings
of different variables recommended together are measured together once more before both are
given as lines to paste.

    trials.py  what is tried: the size bands, the settings (candidates), NVLS allowed or not, the
               estimate, and one trial's record (Trial)
    rule.py    the rule that recommends, pure: each setting against the default per band, the
               choices and the advice; Tuning, the whole run as the document holds it
    run.py     the running part: each trial in a process of its own, and the whole tuning run
"""
