"""The in-job step monitor: `from mgpu_bench import StepMonitor`.

    monitor.py   StepMonitor (the public face: step(), compute(), finish()), the hot path, the end
    windows.py   its first step's set-up (device, ranks, gradient hooks) and its window edges
    clock.py     the pooled marks (CUDA events on GPUs, the host clock on CPU), read at window edges
    counting.py  the FLOP count of the first step (FlopCounterMode) and the profiled window
    ranks.py     every rank's figures through the job's store (the straggler rule: probes/model/straggler.py)
    ending.py    a job that ends without finish(): its figures kept at exit, on SIGTERM and SIGHUP
    result.py    the model probe's run and document of the job: printed, stored, written
"""

from __future__ import annotations

from .monitor import MonitorError, MonitorWarning, StepMonitor

__all__ = ["MonitorError", "MonitorWarning", "StepMonitor"]
