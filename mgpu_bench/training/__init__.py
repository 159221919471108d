"""Instruments inside a training step, shared by the model probe, plan and the in-job monitor (here, not in
monitor/, because the model probe uses them and the monitor uses the model probe). Imports nothing else.

    gradsync.py     the gradient all-reduce timed from inside: a DDP hook marking each bucket's ready and done
    noise_scale.py  the gradient noise scale from the job's own gradients, and what more GPUs buy
"""
