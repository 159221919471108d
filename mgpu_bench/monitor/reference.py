"""Reference steps: the monitor's exposed communication as the wall clock sees it.

The marks on the model's tensors (gradsync.GradMarks) time the tail of the all-reduce the backward
could not hide, but not what the all-reduce costs the compute beside it: gloo's all-reduce runs on
the CPU cores the backward computes on, NCCL's kernels take SMs and memory bandwidth. Measured on
two gloo ranks, the marks read 1.6x below the step time the same loop saves under no_sync().

So, in one timed step in EVERY, the monitor runs the step as no_sync() would (DDP's
require_backward_grad_sync off from the start of compute(): no bucket is all-reduced during the
backward) and, when the backward is done (GradMarks' end-of-backward callback, before the
optimizer), all-reduces the gradients itself, flattened per dtype into chunks of CHUNK_BYTES,
divided by the world size (what DDP computes: the mean of the ranks' gradients), timed alone. The
step less that all-reduce is the step without communication; the usual step less it is the
exposed communication (ledger.reference_exposed takes the medians). The training's gradients are
the ranks' mean either way (float sums in another order).

Averaging is linear, so a step that runs more backwards (gradient accumulation, with or without
the user's own no_sync()) still trains on the mean: the first backward's gradients are reduced by
the monitor, DDP's own sync is back on for the rest, and a later sync averages gradients the ranks
already agree on. Such a step is no reference (only a step with one backward is) and is left out.

Reference steps run only where the all-reduce cannot differ from DDP's in what it touches: a DDP
model of dense gradients without find_unused_parameters or static_graph, not compiled, every rank
deciding by the same step number. Base units: seconds.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

EVERY = 20  # one timed step in this many is a reference step (5%: its all-reduce runs unhidden)
CHUNK_BYTES = 25 << 20  # DDP's default bucket size (bucket_cap_mb=25)
KEPT = 2000  # reference steps kept per run (their count and cost are whole)


def usable(ddp: Any, model: Any) -> str | None:
    """None when reference steps can run on this DDP module, else why not."""
    if model is not None and hasattr(model, "_orig_mod"):
        return "a compiled model (the flag would recompile its graph)"
    if getattr(ddp, "find_unused_parameters", False):
        return "find_unused_parameters=True (ranks may hold different gradients)"
    if getattr(ddp, "static_graph", False):
        return "static_graph=True"
    if not hasattr(ddp, "require_backward_grad_sync"):
        return "this DDP has no require_backward_grad_sync"
    return None


def attach(marks: Any, ddp: Any, model: Any, cuda: bool, every: int, notes: list[str]) -> Reference | None:
    """A Reference on `ddp` whose after_backward GradMarks `marks` calls, or None with the reason
    in `notes` where reference steps cannot run."""
    why = usable(ddp, model)
    if why is not None:
        notes.append(f"no reference steps ({why}): exposed communication from the marks alone, which miss what "
                     "the all-reduce costs the compute beside it")
        return None
    ref = Reference(ddp, cuda, every)
    marks.after_backward = ref.after_backward
    return ref


class Reference:
    """The reference steps of one monitor: begin() at the compute() start of a chosen step,
    after_backward() from GradMarks' end-of-backward callback, end() at compute()'s end with the
    step's count of backwards. `taken`: [(step number, all-reduce seconds or CUDA event pair)]."""

    def __init__(self, ddp: Any, cuda: bool, every: int = EVERY) -> None:
        import torch
        import torch.distributed as dist

        self.ddp, self.cuda, self.every = ddp, cuda, every
        self._torch, self._dist = torch, dist
        self.group = ddp.process_group
        self.world = dist.get_world_size(self.group)
        self.params = [p for p in ddp.module.parameters() if p.requires_grad]
        self.active = False
        self._done = False
        self._step = -1
        self._comm: Any = None
        self.taken: list[tuple[int, Any]] = []
        self.count = 0
        self.left_out = 0  # reference steps with other than one backward
        self.error: str | None = None

    def wanted(self, timed: int) -> bool:
        """Whether the timed step of this number (counted alike on every rank) is a reference step."""
        return self.error is None and timed % self.every == self.every - 1

    def begin(self, step: int) -> bool:
        """The step's compute starts: DDP's sync off (as no_sync() sets it) unless the job has it off."""
        if self.ddp.require_backward_grad_sync is not True:
            return False
        self.ddp.require_backward_grad_sync = False
        self.active, self._done, self._step, self._comm = True, False, step, None
        return True

    def after_backward(self) -> None:
        """The first backward of a reference step is done: its gradients all-reduced here, timed,
        and DDP's own sync back on."""
        if not self.active or self._done:
            return
        self._done = True
        try:
            t0 = self._mark()
            self._reduce()
            self._comm = (t0, self._mark())
        finally:
            self.ddp.require_backward_grad_sync = True

    def end(self, backwards: int | None, ok: bool) -> None:
        """compute() ended: DDP's sync is on again whatever happened; the step is a reference when
        it ran one backward and no exception."""
        if not self.active:
            return
        self.active = False
        self.ddp.require_backward_grad_sync = True
        if self._comm is None or not ok or backwards != 1:
            self.left_out += self._comm is not None
            return
        self.count += 1
        if len(self.taken) < KEPT:
            self.taken.append((self._step, self._comm))

    def _mark(self) -> Any:
        if self.cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _reduce(self) -> None:
        """The mean of the ranks' gradients, in place: per dtype, flattened chunks of about
        CHUNK_BYTES (None gradients as zeros, left None: a parameter no backward reached)."""
        torch = self._torch
        by_dtype: dict[Any, list] = {}
        for p in self.params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype in sorted(by_dtype, key=str):
            chunk: list = []
            size = 0
            for p in by_dtype[dtype]:
                chunk.append(p)
                size += p.numel() * p.element_size()
                if size >= CHUNK_BYTES:
                    self._reduce_chunk(chunk, torch)
                    chunk, size = [], 0
            if chunk:
                self._reduce_chunk(chunk, torch)

    def _reduce_chunk(self, params: list, torch) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat.div_(self.world)
        self._dist.all_reduce(flat, group=self.group)
        at = 0
        for p, g in zip(params, grads):
            n = g.numel()
            if p.grad is not None:
                p.grad.copy_(flat[at:at + n].view_as(g))
            at += n

    def off(self) -> None:
        """No more reference steps, and DDP's gradient sync on (a step the monitor turned it off in
        must never leave it off): the monitor's fault or its finish()."""
        self.error = self.error or "the monitor stopped"
        if self.active:
            self.active = False
            with contextlib.suppress(Exception):
                self.ddp.require_backward_grad_sync = True

    def figures(self) -> dict | None:
        """What a record keeps: {"steps": [numbers], "comm_s": [seconds], "count", "left_out"}."""
        if not self.taken:
            return None if not self.left_out else {"steps": [], "comm_s": [], "count": 0, "left_out": self.left_out}
        steps, comm = [], []
        for step, (a, b) in self.taken:
            if self.cuda:
                b.synchronize()
                secs = a.elapsed_time(b) / 1e3
            else:
                secs = b - a
            steps.append(step)
            comm.append(max(0.0, secs))
        return {"steps": steps, "comm_s": comm, "count": self.count, "left_out": self.left_out}
