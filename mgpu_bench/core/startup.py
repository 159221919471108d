"""Start-up, as every estimate counts it: the time a command spends before it measures anything
(its interpreter, its imports, its planning) and the processes it starts (each a Python that
imports torch and the tool, then meets the others), on this host now.

An estimate said before a run is the whole command's, start-up included ("about 55 s in all,
start-up included: 9 s before this line"):

    spent_s()            what this process has already spent (measured: its age, /proc), or, while
                         a plan is made for a command another process will run (as_new_process()),
                         what a new process will spend to get as far (modelled, process_s(1));
    process_s(n, cpu_s)  n processes started together, each needing `cpu_s` seconds of CPU
                         (PROCESS_CPU_S: a Python importing the tool and torch.distributed),
                         sharing this host's CPUs with what runs here now;
    host_share(n)        how many times longer than alone each of n new processes takes beside the
                         processes running now: every runnable task takes an equal share of the
                         CPUs this process may use (the runnable count of /proc/loadavg, proc(5)).

The figures below were measured on the 2-core CPU host of CI (torch 2.14, 2026-12-07): a
`python -c "import mgpu_bench.cli, torch.distributed"` took 3.2-3.6 s of CPU (10-11 s of wall
beside 11 runnable tasks, as host_share says); a gloo rank of `model --model tiny` about 4.5 s of
CPU before its first step (the model built, the group formed, DDP's first broadcast).
Standard library only: every layer may use it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time

PROCESS_CPU_S = 3.5  # CPU seconds: a new Python importing the tool and torch.distributed
SAMPLES = 9  # /proc/loadavg read this many times over about 0.1 s: one reading catches a moment

_state = threading.local()
_others: list[int] = []  # the runnable tasks besides this process, read once per process


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def others() -> int:
    """The tasks running or waiting to run besides this process (the median of a few readings of
    /proc/loadavg's runnable count, less the reader itself); 0 where it cannot be read. Read once
    per process, so that every estimate of one command sees the same host."""
    if _others:
        return _others[0]
    seen = []
    try:
        for i in range(SAMPLES):
            if i:
                time.sleep(0.012)
            with open("/proc/loadavg") as f:  # "0.52 0.58 0.59 3/913 12345": runnable / all tasks
                seen.append(int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        seen = []
    _others.append(max(0, round(statistics.median(seen))) if seen else 0)
    return _others[0]


def host_share(n: int = 1) -> float:
    """How many times longer than on an idle host each of `n` CPU-bound processes started now takes:
    max(1, (others + n) / cpus), every runnable task taking an equal share of the CPUs."""
    return max(1.0, (others() + max(1, n)) / cpus())


def process_s(n: int = 1, cpu_s: float = PROCESS_CPU_S) -> float:
    """Wall seconds for `n` processes started together to each spend `cpu_s` seconds of CPU here."""
    return cpu_s * host_share(n)


def process_seconds() -> float | None:
    """Seconds since this process started (Linux: its start time in /proc/self/stat against the
    system's uptime), start-up of the interpreter and its imports included; None elsewhere."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def spent_s() -> float:
    """The start-up an estimate made now counts as already spent: this process's age, or inside
    as_new_process(), a new process's start-up (process_s(1))."""
    if getattr(_state, "new_process", False):
        return process_s(1)
    return process_seconds() or 0.0


@contextlib.contextmanager
def as_new_process():
    """Estimates made inside are those of a command a new process will run (the suite's steps):
    their start-up is a new process's, not this one's age."""
    before = getattr(_state, "new_process", False)
    _state.new_process = True
    try:
        yield
    finally:
        _state.new_process = before


def seconds_text(seconds: float) -> str:
    """'about 45 s' or 'about 4 min'."""
    return f"about {seconds:.0f} s" if seconds < 120 else f"about {seconds / 60:.0f} min"


def said(total_s: float, spent: float) -> str:
    """'about 55 s in all, start-up included (9 s of it before this line)'."""
    return f"{seconds_text(total_s)} in all, start-up included ({spent:.0f} s of it before this line)"
