"""`mgpu-bench comm --tune`: which NCCL setting to use, per size band, measured on this node.

Every setting runs in a process of its own (tune_run.py run as `python -m`, a "trial"), with
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
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.measurement import CommMeasurement, CommRequest

from .plan import CommConfig

MIN_GAIN = 0.02  # a setting must beat the default by more than this (2%) ...
NOISE_FACTOR = 3.0  # ... and by more than this many times the noise
SIZES_PER_BAND = 2
# (upper edge in bytes, inclusive, or None; band name): where NCCL's protocols change regime
BAND_EDGES: tuple[tuple[int | None, str], ...] = ((4 << 20, "small"), (64 << 20, "medium"), (None, "large"))
# The collectives NCCL picks an algorithm and protocol for (alltoall and sendrecv are send/recv).
TUNABLE = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")
SCOPED_SYNTAX = 22400  # NCCL 2.24 reads "allreduce:Tree" in NCCL_ALGO / NCCL_PROTO (tuning.cc parseList)
PROTOCOLS = ("LL", "LL128", "Simple")
DEFAULT_BUFFSIZE = 4 << 20  # NCCL's DEFAULT_BUFFSIZE (src/init.cc)
BUFFSIZES = (8 << 20, 16 << 20)
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS (src/include/device.h, 2.28)
# Guesses for the estimate said at the start: a trial's fixed cost (Python, CUDA contexts, NCCL
# set-up and teardown on the GPUs) and the bus rate its sizes run at. Never a figure.
TRIAL_START_S = 2.5
_GUESS_RATE = 100e9
_GUESS_FIXED_S = 0.05

DEFAULT, ALGORITHM, PROTOCOL, CHANNELS, BUFFER, COMBINED = (
    "default", "algorithm", "protocol", "channels", "buffer", "combined")
TAG = "mgpu-bench-tune "  # a trial's result lines on its stdout start with this


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneConfig(CommConfig):
    """comm --tune: the comm config (its sizes are the range the bands are cut from; one
    placement) and how many sizes each band is measured at."""

    sizes_per_band: int = SIZES_PER_BAND


@dataclass(frozen=True)
class Band:
    """A size band: its name and the requested sizes (bytes) measured in it."""

    name: str
    sizes: tuple[int, ...]

    @property
    def label(self) -> str:
        from mgpu_bench.results.sizes import format_bytes

        lo, hi = min(self.sizes), max(self.sizes)
        return format_bytes(lo) if lo == hi else f"{format_bytes(lo)}-{format_bytes(hi)}"


@dataclass(frozen=True)
class Candidate:
    """One setting: the variables its trial sets on top of the environment, the group it
    belongs to and the collectives it is measured on (those its variables affect)."""

    env: tuple[tuple[str, str], ...]
    group: str
    ops: tuple[str, ...]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env) if self.env else "default"

    def lines(self) -> list[str]:
        """The environment lines that give this setting, exactly as a shell takes them."""
        return [f"export {k}={shlex.quote(v)}" for k, v in self.env]

    @property
    def uses_nvls(self) -> bool:
        return any((k == "NCCL_ALGO" and "nvls" in v.lower()) or (k == "NCCL_NVLS_ENABLE" and v.strip() != "0")
                   for k, v in self.env)


@dataclass(frozen=True)
class Nvls:
    """Whether NVLink SHARP may be recommended here, and why (or why not)."""

    allowed: bool
    why: str


def tune_config(cfg: CommConfig) -> TuneConfig:
    """The checks --tune adds (InputError, exit code 2, before any work) and its config: one
    placement (out-of-place unless --inplace alone was given)."""
    from dataclasses import fields

    from mgpu_bench.core import launch
    from mgpu_bench.machine import selection

    other = [op for op in cfg.ops if op not in TUNABLE]
    if other:
        raise InputError(f"--tune tunes the collectives NCCL picks an algorithm and protocol for ({', '.join(TUNABLE)}); "
                         f"{', '.join(other)} run as point-to-point sends: drop them from --ops")
    if not cfg.timing.check:
        raise InputError("--tune checks every setting's results (one that returns wrong data is never recommended): "
                         "drop --no-check")
    if launch.detect() is not None:
        raise InputError("--tune starts a process per NCCL setting on this node itself: run it directly, not under "
                         "torchrun, srun or mpirun")
    if cfg.launch == "processes":
        raise InputError("--tune already runs every setting in a process of its own: drop --launch processes")
    if cfg.backend == "torch":
        raise InputError("--tune tunes NCCL through the native backend: drop --backend torch")
    ngpu = selection.visible_gpu_count()
    if ngpu == 0:
        raise InputError(f"--tune tunes NCCL on GPUs, and no NVIDIA GPU is usable here ({selection.no_gpu_reason()}); "
                         "on CPU ranks `mgpu-bench comm` without --tune measures gloo, which has no such settings")
    gpus = selection.parse_gpus(cfg.gpus, ngpu)
    if len(gpus) < 2:
        raise InputError(f"--tune needs 2 or more GPUs: {len(gpus)} selected ({ngpu} visible); on one GPU an "
                         "allreduce is a copy, with no NCCL setting to tune")
    given = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    given["inplace"] = (True,) if tuple(cfg.inplace) == (True,) else (False,)
    return TuneConfig(**given)


def cut_bands(sizes: Sequence[int], per_band: int = SIZES_PER_BAND) -> tuple[Band, ...]:
    """The bands the sizes fall in, each with at most `per_band` of them: its ends (and, for
    more, sizes evenly spaced between them in the list)."""
    out = []
    lo = -1
    for hi, name in BAND_EDGES:
        inside = sorted({s for s in sizes if s > lo and (hi is None or s <= hi)})
        if inside:
            if len(inside) > per_band:
                step = (len(inside) - 1) / max(per_band - 1, 1)
                inside = sorted({inside[round(i * step)] for i in range(per_band)})
            out.append(Band(name, tuple(inside)))
        lo = hi if hi is not None else lo
    return tuple(out)


def scoped(var: str, op: str, value: str, nccl_version: int) -> tuple[str, str]:
    """NCCL_ALGO / NCCL_PROTO for one collective where NCCL reads that form (2.24+), else for all."""
    return (var, f"{op}:{value}" if nccl_version >= SCOPED_SYNTAX else value)


def first_candidates(ops: Sequence[str], nccl_version: int, nvls: Nvls) -> list[Candidate]:
    """Algorithm and protocol settings, per collective, and the buffer sizes."""
    out: list[Candidate] = []
    scoped_ok = nccl_version >= SCOPED_SYNTAX
    every = tuple(ops)
    for op in ops:
        algos = []
        if op == "allreduce":
            # Tree for all collectives (NCCL < 2.24) fails for those that have none: only alone
            algos = ["Ring", "Tree"] if scoped_ok or every == ("allreduce",) else ["Ring"]
        elif op in ("allgather", "reducescatter") and nvls.allowed:
            algos = ["Ring"]  # NVLS may be the default there
        if nvls.allowed and op in ("allreduce", "allgather", "reducescatter"):
            algos.append("NVLS")
        target = (op,) if scoped_ok else every
        out += [Candidate((scoped("NCCL_ALGO", op, a, nccl_version),), ALGORITHM, target) for a in algos]
        out += [Candidate((scoped("NCCL_PROTO", op, p, nccl_version),), PROTOCOL, target) for p in PROTOCOLS]
        if not scoped_ok:
            break  # one unscoped set of candidates covers every collective
    out += [Candidate((("NCCL_BUFFSIZE", str(b)),), BUFFER, every) for b in BUFFSIZES]
    return out


def channel_candidates(ops: Sequence[str], channels: int | None) -> list[Candidate]:
    """Half and twice the default's channel count (NCCL's INFO log said it), within 1..64."""
    if not channels:
        return []
    out = []
    if channels // 2 >= 1:
        out.append(Candidate((("NCCL_MAX_NCHANNELS", str(channels // 2)),), CHANNELS, tuple(ops)))
    if min(2 * channels, MAX_CHANNELS) > channels:
        out.append(Candidate((("NCCL_MIN_NCHANNELS", str(min(2 * channels, MAX_CHANNELS))),), CHANNELS, tuple(ops)))
    return out


def nvls_before(environ: Mapping[str, str]) -> Nvls | None:
    """What the environment alone says about NVLS (None: the default trial's log decides)."""
    if environ.get("NCCL_NVLS_ENABLE", "").strip() == "0":
        return Nvls(False, "NCCL_NVLS_ENABLE=0 in this environment")
    return None


def unread(environ: Mapping[str, str]) -> str:
    """Why NCCL's log did not give the default's channels."""
    if "NCCL_DEBUG" in environ or "NCCL_DEBUG_FILE" in environ:
        return "NCCL_DEBUG is set in this environment, so this tool does not read NCCL's log"
    return "NCCL's log did not state it"


def nvls_after(nvls_channels: int | None, environ: Mapping[str, str]) -> Nvls:
    """What the default trial's NCCL log says about NVLS."""
    if nvls_channels is None:
        return Nvls(False, f"NVLS support is unknown ({unread(environ)}): NVLS not tried")
    if nvls_channels == 0:
        return Nvls(False, "NCCL set up no NVLS channels on these GPUs (no NVSwitch multicast)")
    return Nvls(True, f"NCCL set up {nvls_channels} NVLS channels")


def tune_requests(cfg: CommConfig, bands: Sequence[Band]) -> list[CommRequest]:
    """ops x the bands' sizes, one placement."""
    from mgpu_bench.results.ops import OPS

    sizes = sorted({s for b in bands for s in b.sizes})
    return [CommRequest(op, cfg.dtype, cfg.redop if OPS[op].reduces else None, s, cfg.inplace[0])
            for op in cfg.ops for s in sizes]


def estimate(cfg: TuneConfig) -> str:
    """"about N s: ..." from the number of trials (their start-up) and their sizes (a guess)."""
    bands = cut_bands(cfg.sizes, cfg.sizes_per_band)
    sizes = sorted({s for b in bands for s in b.sizes})
    t = cfg.timing
    calls = max(2, t.warmup_iters) + 2 * (t.iters if t.iters > 0 else max(t.min_iters, 1)) + 1

    def per_size(size: int) -> float:
        return _GUESS_FIXED_S + calls * max(size / _GUESS_RATE, t.min_time_s / calls if t.iters <= 0 else 0.0)

    version = 99999  # the estimate assumes the scoped syntax: one collective per algorithm/protocol trial
    cands = first_candidates(cfg.ops, version, Nvls(False, "")) + channel_candidates(cfg.ops, 16)
    trials = [(2, len(cfg.ops))] + [(1, len(c.ops)) for c in cands]
    total = sum(n * (TRIAL_START_S + nops * sum(per_size(s) for s in sizes)) for n, nops in trials)
    count = sum(n for n, _ in trials)
    when = f"about {total:.0f} s" if total < 120 else f"about {total / 60:.0f} min"
    return (f"{when} for {count} NCCL settings (the default twice), each in a fresh process, x {len(sizes)} size(s) "
            f"in {len(bands)} band(s) x {len(cfg.ops)} op(s) (a guess: {TRIAL_START_S:g} s to start each, sizes at "
            f"{_GUESS_RATE / 1e9:g} GB/s)")


# -- one trial: a process of its own ------------------------------------------------------------


@dataclass
class Trial:
    """One setting measured in a process of its own: what it measured, how it ended, and what
    NCCL's log said (coll and NVLS channels, warnings). run: 1, or 2 for the default's repeat."""

    candidate: Candidate
    run: int = 1
    measurements: list[CommMeasurement] = field(default_factory=list)
    error: str | None = None
    stopped: str | None = None  # as CommRun.stopped, for a trial that ended early
    channels: int | None = None
    nvls_channels: int | None = None
    warnings: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0

    @property
    def wrong(self) -> int:
        return sum(m.total_wrong for m in self.measurements)

    def at(self, op: str, size: int) -> CommMeasurement | None:
        return next((m for m in self.measurements if m.spec.op == op and m.spec.size == size), None)

    def to_dict(self) -> dict:
        return {"label": self.candidate.label, "group": self.candidate.group, "env": dict(self.candidate.env),
                "ops": list(self.candidate.ops), "run": self.run, "error": self.error, "stopped": self.stopped,
                "channels": self.channels, "nvls_channels": self.nvls_channels, "warnings": self.warnings,
                "wall_seconds": self.wall_seconds, "measurements": [m.to_dict() for m in self.measurements]}

    @classmethod
    def from_dict(cls, d: Mapping) -> Trial:
        cand = Candidate(tuple((str(k), str(v)) for k, v in (d.get("env") or {}).items()), str(d["group"]),
                         tuple(d.get("ops") or ()))
        return cls(cand, int(d.get("run", 1)), [CommMeasurement.from_dict(m) for m in d.get("measurements") or []],
                   d.get("error"), d.get("stopped"), d.get("channels"), d.get("nvls_channels"),
                   list(d.get("warnings") or []), float(d.get("wall_seconds", 0.0)))


_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels, \d+ collnet channels, (\d+) nvls channels")


def channels_in(log: str) -> tuple[int | None, int | None]:
    """(coll channels, NVLS channels) NCCL's INFO log states at set-up, or None each."""
    m = _CHANNELS.search(log)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


# -- the decision (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """A setting against the default at one size: gain = busbw / default busbw - 1 (the
    better default run), noise (relative; None: too few samples) and the gain needed."""

    size: int
    default_busbw: float
    busbw: float
    gain: float
    noise: float | None

    @property
    def needed(self) -> float | None:
        return None if self.noise is None else max(MIN_GAIN, NOISE_FACTOR * self.noise)

    @property
    def passes(self) -> bool:
        return self.needed is not None and self.gain > self.needed

    @property
    def margin(self) -> float:
        return float("-inf") if self.needed is None else self.gain - self.needed

    @property
    def loses(self) -> bool:
        """Slower than the default beyond the same threshold (2% where there is no noise figure)."""
        return self.gain < -(self.needed if self.needed is not None else MIN_GAIN)


def compare(defaults: Sequence[CommMeasurement], m: CommMeasurement) -> Comparison:
    """`m` against the default runs at its size (see the module's rule)."""
    base = max(d.busbw for d in defaults)
    covs = [d.cov for d in defaults] + [m.cov]
    noise = None
    if all(c is not None for c in covs):
        spread = (base - min(d.busbw for d in defaults)) / base if base > 0 else 0.0
        noise = max([float(c) for c in covs] + [spread])
    gain = m.busbw / base - 1 if base > 0 else float("nan")
    return Comparison(m.spec.size, base, m.busbw, gain, noise)


def exclusion(trial: Trial, nvls: Nvls) -> str | None:
    """Why a setting is never recommended (anywhere), or None."""
    from mgpu_bench.results.sizes import format_bytes

    if trial.wrong:
        bad = next(m for m in trial.measurements if m.total_wrong)
        return (f"failed the data check: {trial.wrong} wrong element(s) ({bad.spec.op} {format_bytes(bad.spec.size)} "
                "first)")
    if trial.error:
        return f"failed: {trial.error}"
    if trial.candidate.uses_nvls and not nvls.allowed:
        return f"NVLS is off here: {nvls.why}"
    return None


@dataclass(frozen=True)
class Choice:
    """The best setting for one collective in one band, and whether it is recommended.
    The figures are those of `at`, the band's size where the setting's margin over the needed
    gain is smallest (the size that decides); costs: where it loses elsewhere."""

    op: str
    band: Band
    setting: str | None
    recommended: bool
    reason: str
    at: Comparison | None = None
    costs: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        c = self.at
        return {"op": self.op, "band": self.band.name, "sizes": list(self.band.sizes), "setting": self.setting,
                "recommended": self.recommended, "reason": self.reason, "costs": list(self.costs),
                "at_bytes": c.size if c else None, "default_busbw": c.default_busbw if c else None,
                "busbw": c.busbw if c else None, "gain": c.gain if c else None, "noise": c.noise if c else None,
                "needed": c.needed if c else None}


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def defaults_at(trials: Sequence[Trial], op: str, size: int) -> list[CommMeasurement]:
    """The default runs' measurements of `op` at `size` (one or two)."""
    return [m for t in trials if t.candidate.group == DEFAULT for m in [t.at(op, size)] if m is not None]


def _scored(trials: Sequence[Trial], op: str, band: Band) -> list[tuple[float, Trial, list[Comparison]]]:
    """(worst-size gain, trial, comparisons) of every single setting measured at every size of
    the band (the default measured there too)."""
    out = []
    for t in trials:
        if t.candidate.group in (DEFAULT, COMBINED) or op not in t.candidate.ops:
            continue
        ms = [t.at(op, s) for s in band.sizes]
        if all(m is not None for m in ms):
            comps = [compare(defaults_at(trials, op, s), m) for s, m in zip(band.sizes, ms)]
            out.append((min(c.gain for c in comps), t, comps))
    return out


def _choice(trials: Sequence[Trial], scored: tuple[float, Trial, list[Comparison]], op: str, band: Band,
            bands: Sequence[Band], ops: Sequence[str]) -> Choice:
    """One setting in one band judged by the rule, with the reason and, if it passes, its costs."""
    from mgpu_bench.results.sizes import format_bytes

    score, t, comps = scored
    worst = min(comps, key=lambda c: c.margin)
    passes = all(c.passes for c in comps)
    size = format_bytes(worst.size)
    if passes:
        reason = (f"{_pct(worst.gain)} at {size} beats the {100 * worst.needed:.1f}% needed (max(2%, 3 x noise)), "
                  "and so does every size of the band")
    elif worst.noise is None:
        reason = f"no noise figure at {size} (fewer than 5 samples): raise --min-time"
    elif score <= 0:
        reason = f"no other setting beat the default: the best gives {_pct(worst.gain)} at {size}"
    else:
        reason = (f"{_pct(worst.gain)} at {size} is within the {100 * worst.needed:.1f}% needed: "
                  f"max(2%, 3 x noise {100 * worst.noise:.1f}%)")
    costs = tuple(_costs(trials, t, op, band, bands, ops)) if passes else ()
    return Choice(op, band, t.candidate.label, passes, reason, worst, costs)


def evaluate(trials: Sequence[Trial], bands: Sequence[Band], ops: Sequence[str], nvls: Nvls) -> list[Choice]:
    """Every setting that may be recommended, judged by the rule in every band it ran in."""
    return [_choice(trials, sc, op, band, bands, ops) for op in ops for band in bands
            if all(defaults_at(trials, op, s) for s in band.sizes)
            for sc in _scored(trials, op, band) if exclusion(sc[1], nvls) is None]


def decide(trials: Sequence[Trial], bands: Sequence[Band], ops: Sequence[str], nvls: Nvls) -> list[Choice]:
    """Per collective and band: the setting with the best worst-size gain among those that may
    be recommended (on a tie, one that costs nothing elsewhere), and whether it passes the rule
    at every size of the band."""
    out = []
    for op in ops:
        for band in bands:
            if not all(defaults_at(trials, op, s) for s in band.sizes):
                out.append(Choice(op, band, None, False, "the default was not measured at every size of the band"))
                continue
            scored = _scored(trials, op, band)
            eligible = [sc for sc in scored if exclusion(sc[1], nvls) is None]
            if not eligible:
                why = "no other setting ran at every size of the band" if not scored else \
                    "every other setting failed or is off here"
                out.append(Choice(op, band, None, False, why))
                continue
            judged = [(sc[0], _choice(trials, sc, op, band, bands, ops)) for sc in eligible]
            score, best = max(judged, key=lambda j: (j[0], not j[1].costs))
            off = [sc for sc in scored if sc[0] > score and exclusion(sc[1], nvls)]
            if off:
                top = max(off, key=lambda sc: sc[0])
                best = replace(best, reason=f"{best.reason}; {top[1].candidate.label} did better but "
                                            f"{exclusion(top[1], nvls)}")
            out.append(best)
    return out


def _costs(trials: Sequence[Trial], trial: Trial, op: str, band: Band, bands: Sequence[Band],
           ops: Sequence[str]) -> list[str]:
    """Where `trial` loses against the default outside (op, band): "-8.1% at 256 MiB"."""
    from mgpu_bench.results.sizes import format_bytes

    out = []
    for op2 in ops:
        for b in bands:
            if (op2, b) == (op, band):
                continue
            for s in b.sizes:
                m, base = trial.at(op2, s), defaults_at(trials, op2, s)
                if m is not None and base:
                    c = compare(base, m)
                    if c.loses:
                        out.append(f"{_pct(c.gain)} at {format_bytes(s)}" + ("" if op2 == op else f" ({op2})"))
    return out


@dataclass(frozen=True)
class Advice:
    """What to paste: `lines` (for every job) and `given` (per setting in them, where it gained:
    "NCCL_PROTO=allreduce:LL128: allreduce 1 MiB-4 MiB (+7.1%)"), `only_for` ((lines, where it
    gains, what it costs elsewhere) for jobs whose messages are all in those bands), notes, and
    `combined`: the candidate to measure before several settings are given together (None when
    nothing is left to measure)."""

    lines: tuple[str, ...]
    only_for: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...]
    notes: tuple[str, ...]
    combined: Candidate | None = None
    given: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"lines": list(self.lines), "given": list(self.given), "notes": list(self.notes),
                "only_for": [{"lines": list(lines), "where": where, "costs": list(costs)}
                             for lines, where, costs in self.only_for]}


def advise(choices: Sequence[Choice], trials: Sequence[Trial]) -> Advice:
    """The lines to paste from the recommended choices (evaluate(): every setting that passes
    in a band, not only each band's best): settings that lose nowhere, one value per variable
    (the larger gain wins); two or more only once measured together and found to hold in every
    band where each was recommended (else the best alone). Those that cost elsewhere are given
    for their bands only."""
    recs = [c for c in choices if c.recommended]
    by_label: dict[str, list[Choice]] = {}
    for c in recs:
        by_label.setdefault(str(c.setting), []).append(c)
    cand = {t.candidate.label: t.candidate for t in trials}
    gain = {lab: max(c.at.gain for c in cs if c.at) for lab, cs in by_label.items()}
    where = {lab: ", ".join(f"{c.op} {c.band.label} ({_pct(c.at.gain)})" for c in cs if c.at)
             for lab, cs in by_label.items()}
    costs = {lab: tuple(dict.fromkeys(x for c in cs for x in c.costs)) for lab, cs in by_label.items()}
    only_for = tuple((tuple(cand[lab].lines()), where[lab], costs[lab]) for lab in by_label if costs[lab])
    chosen: list[str] = []
    notes: list[str] = []
    for lab in sorted((lab for lab in by_label if not costs[lab]), key=lambda lab: -gain[lab]):
        names = {k for k, _ in cand[lab].env}
        clash = next((c for c in chosen if names & {k for k, _ in cand[c].env}), None)
        if clash:
            notes.append(f"{lab} also beat the default: {where[lab]}, but sets what {clash} sets, which gained more")
        else:
            chosen.append(lab)
    if len(chosen) < 2:
        return Advice(tuple(x for lab in chosen for x in cand[lab].lines()), only_for, tuple(notes),
                      given=tuple(f"{lab}: {where[lab]}" for lab in chosen))
    together = Candidate(tuple(kv for lab in chosen for kv in cand[lab].env), COMBINED,
                         tuple(dict.fromkeys(op for lab in chosen for op in cand[lab].ops)))
    trial = next((t for t in trials if t.candidate.label == together.label), None)
    best = chosen[0]
    if trial is None:
        notes.append(f"{', '.join(chosen[1:])} also beat the default alone; not measured together with {best}, so "
                     "only the best is given")
        return Advice(tuple(cand[best].lines()), only_for, tuple(notes), together, (f"{best}: {where[best]}",))
    holds, figures = _holds(trial, [c for lab in chosen for c in by_label[lab]], trials)
    if holds:
        notes.append(f"measured together: {figures}")
        return Advice(tuple(together.lines()), only_for, tuple(notes),
                      given=tuple(f"{lab}: {where[lab]}" for lab in chosen))
    notes.append(f"together they did not hold ({figures}): only the best alone, {best}, is given")
    return Advice(tuple(cand[best].lines()), only_for, tuple(notes), given=(f"{best}: {where[best]}",))


def _holds(trial: Trial, recs: Sequence[Choice], trials: Sequence[Trial]) -> tuple[bool, str]:
    """Whether the settings measured together pass the rule wherever one of them was
    recommended and lose nowhere; with the figures that say so."""
    from mgpu_bench.results.sizes import format_bytes

    if exclusion(trial, Nvls(True, "")):
        return False, str(exclusion(trial, Nvls(True, "")))
    figures, ok = [], True
    for c in recs:
        for s in c.band.sizes:
            m, base = trial.at(c.op, s), defaults_at(trials, c.op, s)
            if m is None or not base:
                return False, f"not measured at {c.op} {format_bytes(s)}"
            comp = compare(base, m)
            ok &= comp.passes
            figures.append((c.op, s, f"{_pct(comp.gain)} at {format_bytes(s)}"))
    for m in trial.measurements:
        base = defaults_at(trials, m.spec.op, m.spec.size)
        if base and compare(base, m).loses:
            ok = False
            figures.append((m.spec.op, m.spec.size, f"{_pct(compare(base, m).gain)} at {format_bytes(m.spec.size)}"))
    named = len({op for op, _, _ in figures}) > 1
    return ok, ", ".join(dict.fromkeys(text + (f" ({op})" if named else "") for op, _, text in sorted(figures)))


# -- the whole tuning run ---------------------------------------------------------------------------


@dataclass
class Tuning:
    """A tuning run: its bands, the collectives, NCCL's version, NVLS, every trial in run order."""

    ops: tuple[str, ...]
    bands: tuple[Band, ...]
    nccl_version: int
    nvls: Nvls
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def choices(self) -> list[Choice]:
        return decide(self.trials, self.bands, self.ops, self.nvls)

    def advice(self) -> Advice:
        return advise(evaluate(self.trials, self.bands, self.ops, self.nvls), self.trials)

    @property
    def wrong(self) -> list[Trial]:
        return [t for t in self.trials if t.wrong]

    def to_dict(self) -> dict:
        choices = self.choices()
        return {"ops": list(self.ops), "bands": [{"name": b.name, "sizes": list(b.sizes)} for b in self.bands],
                "nccl_version": self.nccl_version, "nvls": {"allowed": self.nvls.allowed, "why": self.nvls.why},
                "rule": {"min_gain": MIN_GAIN, "noise_factor": NOISE_FACTOR}, "notes": list(self.notes),
                "trials": [t.to_dict() for t in self.trials],
                "choices": [c.to_dict() for c in choices], "advice": self.advice().to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping) -> Tuning:
        """The run from its document ("choices" and "advice" are derived again, never read)."""
        nv = d.get("nvls") or {}
        return cls(tuple(d["ops"]), tuple(Band(b["name"], tuple(b["sizes"])) for b in d["bands"]),
                   int(d.get("nccl_version") or 0), Nvls(bool(nv.get("allowed")), str(nv.get("why", ""))),
                   [Trial.from_dict(t) for t in d.get("trials") or []], list(d.get("notes") or []))
