"""The monitor's clocks: per timed step four marks (the step starts, its compute starts, its
compute ends, the step ends), recorded into a preallocated pool of slots and read back only at
window edges.

On a GPU a mark is a CUDA event recorded on the device's current stream (no synchronisation:
the host runs on, the GPU stamps the event when it gets there), so every figure is the GPU's
timeline, as `mgpu-bench model` times it: host time spent waiting for a batch while the GPU is
still busy with the previous step is no loss, and is not counted as one. On CPU a mark is the
host clock (time.perf_counter, seconds).

A step's wall runs from its start to the next step's start when that step is the next one
(time between the `with` blocks, where `for batch in loader` fetches the batch, belongs to the
step before it), else to its own end (the last step, one before a profiled or discarded step).
Its data wait is the wall outside compute(): (compute start - start) + (next start - compute
end). On a GPU each mark also keeps the host clock, so that how far the GPU was behind the host
at a step's compute end can be read back (queue_s: stalls.queue_depths): 0 when the GPU had caught
up and waited for the host. With a DDP model the pool also keeps each step's gradient all-reduce
marks (gradsync.Slot, filled by the communication hook): arrival_s, sync_exposed_s, sync_busy_s and
sync_bytes per step (gradsync.read). Base units: seconds.
"""

from __future__ import annotations

import statistics
import time

START, COMPUTE_START, COMPUTE_END, END = range(4)


class HostPool:
    """`size` slots of host-clock marks; slot k holds the step's index, its four marks, its
    samples and tokens, and whether compute() ran in it. `n` slots are filled."""

    def __init__(self, size: int) -> None:
        self.size, self.n = size, 0
        self.index = [0] * size
        self.samples = [0] * size
        self.tokens: list[int | None] = [None] * size
        self.computed = [False] * size
        self.reference = [False] * size  # a reference step (reference.py): no sync in its backward
        self.marks: list[list] = [[0.0, 0.0, 0.0, 0.0] for _ in range(size)]
        self.sync: list | None = None  # gradsync.Slot per slot, once a communication hook marks steps
        self.sync_read = None  # how a slot is read: GradSync.read (the hook's) or GradMarks.read

    def mark(self, which: int) -> None:
        self.marks[self.n][which] = time.perf_counter()

    def sync_slot(self):
        """The current slot's gradient all-reduce marks, emptied (made at the first use)."""
        if self.sync is None:
            from mgpu_bench.training.gradsync import Slot

            self.sync = [Slot() for _ in range(self.size)]
        slot = self.sync[self.n]
        slot.reset()
        return slot

    def between(self, a, b) -> float:
        return b - a

    def settle(self, mark) -> None:
        """Waits until `mark` has happened (the device caught up); nothing to wait for on the host."""

    def read(self, following: HostPool | None) -> dict[str, list]:
        """The filled slots as per-step columns (index, wall_s, data_s, compute_s, samples,
        tokens, computed). `following`: the pool filled after this one, whose first step may
        be the next step of this pool's last."""
        n = self.n
        out: dict[str, list] = {"index": self.index[:n], "wall_s": [], "data_s": [], "compute_s": [],
                                "samples": self.samples[:n], "tokens": self.tokens[:n], "computed": self.computed[:n]}
        if any(self.reference[:n]):
            out["reference"] = self.reference[:n]
        if not n:
            return out
        syncs = None
        if self.sync is not None:
            from mgpu_bench.training.gradsync import read

            reader = self.sync_read or read
            syncs = [reader(self.sync[k], self.marks[k][COMPUTE_START], self.between) if self.computed[k] else None
                     for k in range(n)]
        nxt = None
        if following is not None and following.n and following.index[0] == self.index[n - 1] + 1:
            nxt = following.marks[0][START]
        self.settle(nxt if nxt is not None else self.marks[n - 1][END])
        for k in range(n):
            m = self.marks[k]
            if k + 1 < n and self.index[k + 1] == self.index[k] + 1:
                stop = self.marks[k + 1][START]
            elif k + 1 == n and nxt is not None:
                stop = nxt
            else:
                stop = m[END]
            wall = self.between(m[START], stop)
            out["wall_s"].append(wall)
            if self.computed[k]:
                compute = self.between(m[COMPUTE_START], m[COMPUTE_END])
                out["compute_s"].append(compute)
                out["data_s"].append(max(0.0, wall - compute))
            else:
                out["compute_s"].append(0.0)
                out["data_s"].append(0.0)
        if syncs is not None:
            for key, col in (("arrival_s", "arrival_s"), ("exposed_s", "sync_exposed_s"), ("busy_s", "sync_busy_s"),
                             ("bytes", "sync_bytes")):
                out[col] = [x[key] if x else None for x in syncs]
        self._queue(out, n)
        return out

    def _queue(self, out: dict, n: int) -> None:
        """The GPU's lag behind the host at each step's compute end (CudaPool); none on the host."""


class CudaPool(HostPool):
    """The same slots with CUDA events (enable_timing) made once on `device`, recorded on its
    current stream; elapsed_time reads them back (milliseconds, converted to seconds)."""

    def __init__(self, size: int, device) -> None:
        import torch

        super().__init__(size)
        self.device = device
        self._current_stream = torch.cuda.current_stream
        with torch.cuda.device(device):
            self.marks = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(size)]
        self.host = [[0.0, 0.0, 0.0, 0.0] for _ in range(size)]  # the host clock at each mark

    def mark(self, which: int) -> None:
        self.marks[self.n][which].record(self._current_stream(self.device))
        self.host[self.n][which] = time.perf_counter()

    def _queue(self, out: dict, n: int) -> None:
        """queue_s per step: at its compute end (its end where compute() did not run), the GPU's
        time less the host's, against the least such difference at the pool's step starts and
        compute ends (stalls.queue_depths), both clocks from the pool's first start."""
        from mgpu_bench.probes.model.stalls import queue_depths

        first = self.marks[0][START]
        h0 = self.host[0][START]
        gpu, host, at = [], [], []
        for k in range(n):
            end = COMPUTE_END if self.computed[k] else END
            for which in (START, end):
                gpu.append(self.between(first, self.marks[k][which]))
                host.append(self.host[k][which] - h0)
            at.append(len(gpu) - 1)
        depth = queue_depths(gpu, host)
        out["queue_s"] = [depth[i] for i in at]

    def between(self, a, b) -> float:
        try:
            return a.elapsed_time(b) / 1e3
        except RuntimeError:  # recorded on another stream that has not reached it yet
            a.synchronize()
            b.synchronize()
            return a.elapsed_time(b) / 1e3

    def settle(self, mark) -> None:
        mark.synchronize()


def summary(cols: dict[str, list], window: int) -> dict:
    """One window's figures: its steps (first and last index), the medians of wall, data wait and
    compute (seconds), samples and tokens in all, steps that ran compute(), the seconds of the
    walls and of compute() in all, and its long steps (stalls.events against the window's own
    median: [index, excess seconds, where])."""
    from mgpu_bench.probes.model.stalls import events

    walls = cols["wall_s"]
    out = {"window": window, "first": cols["index"][0], "last": cols["index"][-1], "steps": len(walls),
           "step_s": statistics.median(walls), "data_s": None, "compute_s": None,
           "samples": sum(cols["samples"]), "tokens": None, "computed": sum(cols["computed"]),
           "seconds": sum(walls), "compute_seconds": None}
    told = out["computed"] == len(walls)
    if told:
        out["data_s"] = statistics.median(cols["data_s"])
        out["compute_s"] = statistics.median(cols["compute_s"])
        out["compute_seconds"] = sum(cols["compute_s"])
    if all(t is not None for t in cols["tokens"]):
        out["tokens"] = sum(cols["tokens"])
    ref = cols.get("reference")
    if ref and any(ref):  # a reference step's all-reduce runs unhidden: no stall of the job's
        keep = [k for k, x in enumerate(ref) if not x]
        out["reference_steps"] = len(walls) - len(keep)

        def pick(col):
            return [col[k] for k in keep] if col is not None else None
    else:
        def pick(col):
            return col
    out["stalls"] = events(pick(walls), pick(cols["data_s"]) if told else None,
                           pick(cols["compute_s"]) if told else None, pick(cols.get("queue_s")), pick(cols["index"]))
    return out


def joined(windows) -> dict[str, list]:
    """Kept windows' columns end to end (oldest first); a column some windows lack (the gradient
    marks before the hook was attached) is None there."""
    windows = list(windows)
    keys = ["index", "wall_s", "data_s", "compute_s", "samples", "tokens", "computed"]
    keys += [k for cols in windows for k in cols if k not in keys]
    keys = list(dict.fromkeys(keys))
    out: dict[str, list] = {k: [] for k in keys}
    for cols in windows:
        n = len(cols.get("index") or [])
        for key in keys:
            out[key].extend(cols.get(key) or [None] * n)
    return out
