"""The gradient all-reduce of a DDP model, timed from inside: a communication hook that runs the
same all-reduce DDP runs by default and marks, per step, when each gradient bucket was ready and
when its all-reduce finished. From those marks, per step and rank:

    arrival_s   compute() start -> the first bucket ready: how long this rank computed before it
                reached the gradient collectives (the rank the others wait for reaches them last)
    exposed_s   the last bucket ready -> the last all-reduce done: communication the backward pass
                could not hide (the optimizer waits for it); the rank that arrived last waits the
                least, so its figure is the communication alone
    busy_s      time with an all-reduce running (the union of each bucket's [max(ready, the previous
                one's end), its end]), for the bus bandwidth it ran at
    bytes       the gradient bytes all-reduced

The hook is torch's own default, `allreduce_hook` (torch.distributed.algorithms.ddp_comm_hooks.
default_hooks: divide by the group size, all_reduce, take the result), whose documentation says
DDP's results are the same as with no hook registered; it adds one Python call per bucket and a
mark. Marks are CUDA events on the current stream (the ready mark on the backward's stream; the
done mark in the future's callback, which torch runs on a stream that waits for the all-reduce)
or the host clock on CPU processes (gloo runs the callback when the work completes). Nothing is
read on the hot path: the owner reads a step's slot when its events are long done.
"""

from __future__ import annotations

import time
from typing import Any


class Slot:
    """One step's marks: k buckets seen, their ready and done marks (events or host seconds,
    reused from step to step), the bytes all-reduced."""

    __slots__ = ("done", "k", "nbytes", "ready")

    def __init__(self) -> None:
        self.k, self.nbytes = 0, 0
        self.ready: list = []
        self.done: list = []

    def reset(self) -> None:
        self.k, self.nbytes = 0, 0


class GradSync:
    """Registered on a DDP model with attach(); `slot` is the step's Slot while compute() runs
    (None outside: a bucket then is counted in `unmarked` and all-reduced all the same)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.slot: Slot | None = None
        self.unmarked = 0
        self.world = 1
        self._group = None
        if cuda:
            import torch

            self._event = lambda: torch.cuda.Event(enable_timing=True)
            self._stream = torch.cuda.current_stream
        import torch.distributed as dist

        self._all_reduce = dist.all_reduce

    @staticmethod
    def usable(model: Any) -> tuple[Any, str | None]:
        """(the DDP module to hook, None) or (None, why not): a DistributedDataParallel model (under
        torch.compile's wrapper too) with no communication hook of its own."""
        ddp = getattr(model, "_orig_mod", model)
        if "DistributedDataParallel" not in {c.__name__ for c in type(ddp).__mro__}:
            return None, "the model is not a DistributedDataParallel model"
        if getattr(ddp, "_comm_hooks", None):
            return None, "the model has a DDP communication hook of its own"
        return ddp, None

    def attach(self, ddp) -> None:
        import torch.distributed as dist

        self._group = ddp.process_group
        self.world = dist.get_world_size(self._group)
        ddp.register_comm_hook(self, _hook)

    def slots(self, n: int, buckets: int) -> list[Slot]:
        """n empty slots with `buckets` marks each made ahead (no event is made in a timed step)."""
        out = []
        for _ in range(n):
            slot = Slot()
            slot.ready = [self._event() if self.cuda else 0.0 for _ in range(buckets)]
            slot.done = [self._event() if self.cuda else 0.0 for _ in range(buckets)]
            out.append(slot)
        return out

    def _mark(self, marks: list, k: int) -> None:
        if self.cuda:
            if k == len(marks):
                marks.append(self._event())
            marks[k].record(self._stream())
        elif k == len(marks):
            marks.append(time.perf_counter())
        else:
            marks[k] = time.perf_counter()


def _hook(state: GradSync, bucket):
    """DDP's default all-reduce (default_hooks.allreduce_hook), with marks."""
    tensor = bucket.buffer()
    slot = state.slot
    if slot is None:
        state.unmarked += 1
    else:
        k = slot.k
        slot.k = k + 1
        slot.nbytes += tensor.numel() * tensor.element_size()
        state._mark(slot.ready, k)
    tensor.div_(state.world)
    fut = state._all_reduce(tensor, group=state._group, async_op=True).get_future()
    if slot is None:
        return fut.then(_value)

    def done(f, slot=slot, k=k):
        state._mark(slot.done, k)
        return f.value()[0]

    return fut.then(done)


def _value(f):
    return f.value()[0]


def read(slot: Slot, start, between) -> dict | None:
    """A finished step's figures (seconds; see the module docs) against `start`, its compute()
    start mark, with `between(a, b)` the owner's clock difference; None when no bucket was marked."""
    n = slot.k
    if not n or len(slot.done) < n:
        return None
    ready = [between(start, slot.ready[j]) for j in range(n)]
    done = [between(start, slot.done[j]) for j in range(n)]
    busy, end = 0.0, float("-inf")
    for r, d in sorted(zip(ready, done)):
        begin = max(r, end)
        if d > begin:
            busy += d - begin
        end = max(end, d)
    return {"arrival_s": max(0.0, min(ready)), "exposed_s": max(0.0, max(done) - max(ready)), "busy_s": busy,
            "bytes": slot.nbytes}
