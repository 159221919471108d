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

With a Noise attached (noise_scale.py), the hook also takes each bucket's squared norm before the
all-reduce (this rank's gradient) and after it (the whole batch's), on the device, summed per step
into per-window sums that are copied to the host at window edges (no synchronisation): the gradient
noise scale's two figures. GradMarks takes the same two figures without a communication hook: in
the steps that take them only, a post-accumulate-grad hook on every parameter (this rank's
gradient, before DDP's own hook copies it into its bucket) and one multi-tensor norm of the
all-reduced gradients after DDP's end of backward.

Nothing here may stop the training. Every hook and callback keeps its own bookkeeping in a
try/except: a fault becomes one line, once (GradSync.fault and GradMarks.fault for the marks,
Noise.error for the norms), the part that failed stops (the marks, or the norms) and the rest goes
on; the communication hook's all-reduce runs and returns DDP's value whatever its marks did. A step
whose marks are incomplete (a fault inside it, a callback that never ran) reads as None, never as a
figure made of another step's marks. Gradient buckets' all-reduces may finish in any order (gloo
completes its futures on its own threads): the done marks are kept by bucket index, not by arrival.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def _why(exc: BaseException) -> str:
    """A fault in one line: its type and the first line of its message (200 characters at most)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose message itself fails
        text = ""
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _norm_dtype(torch, dtypes) -> Any:
    """The dtype a gradient norm is taken in: float32 for 16- and 32-bit gradients, float64 for
    float64 ones (torch's norms refuse a dtype narrower than their input)."""
    out = torch.float32
    for dtype in dtypes:
        out = torch.promote_types(out, dtype)
    return out


class Slot:
    """One step's marks: k buckets seen (GradMarks: its three marks reached), their ready and done
    marks (events or host seconds, reused from step to step: a mark not set in this step holds an
    earlier step's), `ndone` the done marks set in this step (GradSync: the step is whole when it is
    k), the bytes all-reduced, `backwards` the backward passes of this step that reached its last
    gradient (GradMarks: more than one under gradient accumulation)."""

    __slots__ = ("backwards", "done", "k", "nbytes", "ndone", "ready")

    def __init__(self) -> None:
        self.k, self.nbytes, self.ndone, self.backwards = 0, 0, 0, 0
        self.ready: list = []
        self.done: list = []

    def reset(self) -> None:
        self.k, self.nbytes, self.ndone, self.backwards = 0, 0, 0, 0


class Noise:
    """Squared gradient norms for the noise scale: per bucket this rank's (before the all-reduce)
    and the all-reduced one, on the device where the gradients are (0-d tensors; plain floats on
    CPU), summed per step by end_step() into the current window's sums; rotate() at a window edge
    starts the next window and copies the last one's sums to the host without waiting; windows()
    gives the sums read back so far ({small_sq, big_sq, steps, b_small}). `host_s`: host seconds
    spent on all this, for its cost. Norms are taken in float32 (float64 for float64 gradients) and
    summed in float64. A fault in any of these sets `error` (its first, once) and stops the norms:
    the noise scale is lost, never the training."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda, self._torch = cuda, torch
        self._local: list = []
        self._global: list = []
        self._acc = None  # [small, big] of the window (float64 on the device)
        self._steps, self._samples = 0, 0
        self._pending: list = []
        self.done: list[dict] = []
        self.host_s = 0.0
        self.steps_total = 0  # steps whose norms were taken
        self.seen = 0  # steps that ended (end_step), those without norms included
        self.active = True  # take the norms in this step (StepMonitor's noise_every picks 1 step in k)
        self.error: str | None = None  # why the norms stopped, if they failed
        self._main = torch.cuda.current_stream() if cuda else None

    def fail(self, exc: BaseException) -> None:
        """The norms failed: none are taken from here on (`error` says why: the first fault only)."""
        if self.error is None:
            self.error = _why(exc)
        self._local.clear()
        self._global.clear()

    def _norm(self, tensor):
        torch = self._torch
        return torch.linalg.vector_norm(tensor, dtype=_norm_dtype(torch, (tensor.dtype,)))

    def local(self, tensor) -> None:
        if self.error:
            return
        t0 = time.perf_counter()
        try:
            self._local.append(self._norm(tensor))
        except Exception as exc:  # noqa: BLE001 - the noise scale is lost, never the training
            self.fail(exc)
        self.host_s += time.perf_counter() - t0

    def reduced_all(self, tensors: list) -> None:
        """The all-reduced gradients' norms at once (one multi-tensor kernel), in the order of the
        local ones: this backward's, replacing an earlier backward's of the same step."""
        if self.error:
            return
        t0 = time.perf_counter()
        torch = self._torch
        try:
            dtype = _norm_dtype(torch, {t.dtype for t in tensors})
            self._global = list(torch._foreach_norm(tensors, 2, dtype=dtype))
            if self.cuda and torch.cuda.current_stream() != self._main:  # made on the backward's stream, read on the step's
                self._main.wait_stream(torch.cuda.current_stream())
                for norm in self._global:
                    norm.record_stream(self._main)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        self.host_s += time.perf_counter() - t0

    def reduced(self, tensor) -> None:
        if self.error:
            return
        t0 = time.perf_counter()
        try:
            norm = self._norm(tensor)
            if self.cuda:  # made on the callback's stream, read on the step's: kept until that stream is done with it
                norm.record_stream(self._main)
            self._global.append(norm)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        self.host_s += time.perf_counter() - t0

    def end_step(self, samples: int) -> None:
        """The step's sums into the window's (its buckets' norms squared and added, in float64)."""
        self.seen += 1
        if self.error or not self._local or len(self._global) != len(self._local):
            self._local.clear()
            self._global.clear()
            return
        t0 = time.perf_counter()
        torch = self._torch
        try:
            both = torch.stack([torch.stack(self._local).double().square().sum(),
                                torch.stack(self._global).double().square().sum()])
            self._acc = both if self._acc is None else self._acc.add_(both)
            self._steps += 1
            self._samples += samples
            self.steps_total += 1
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        self._local.clear()
        self._global.clear()
        self.host_s += time.perf_counter() - t0

    def rotate(self) -> None:
        """A window edge: the window's sums go to the host without waiting (read when done)."""
        t0 = time.perf_counter()
        try:
            if self._acc is not None and self._steps and not self.error:
                torch = self._torch
                host = torch.empty(2, dtype=torch.float64, pin_memory=self.cuda)
                host.copy_(self._acc, non_blocking=self.cuda)
                event = None
                if self.cuda:
                    event = torch.cuda.Event()
                    event.record()
                self._pending.append((event, host, self._steps, self._samples / self._steps))
            self._acc, self._steps, self._samples = None, 0, 0
            self._collect(False)
        except Exception as exc:  # noqa: BLE001
            self._acc, self._steps, self._samples = None, 0, 0
            self.fail(exc)
        self.host_s += time.perf_counter() - t0

    def _collect(self, wait: bool) -> None:
        keep = []
        for event, host, steps, b_small in self._pending:
            if event is not None and not event.query():
                if not wait:
                    keep.append((event, host, steps, b_small))
                    continue
                event.synchronize()
            small, big = (float(x) for x in host.tolist())
            self.done.append({"small_sq": small, "big_sq": big, "steps": steps, "b_small": b_small})
        self._pending = keep

    def windows(self) -> list[dict]:
        """Every window read back, the one under way closed first (at finish())."""
        self.rotate()
        self._collect(True)
        return list(self.done)

    def figures(self, nbytes: int, device) -> dict:
        """What a record keeps (noise_scale.combine reads it): the windows, the host seconds, the
        steps, the device seconds per step of the norms of `nbytes` of gradients (norm_cost)."""
        share = self.steps_total / self.seen if self.seen else 1.0  # the steps that took the norms
        return {"windows": self.windows(), "host_s": self.host_s, "steps": self.seen, "norm_steps": self.steps_total,
                "device_s_per_step": share * norm_cost(nbytes, device) if self.cuda else 0.0}


def norm_cost(nbytes: int, device) -> float:
    """Seconds per step of the noise scale's device work: two squared norms per gradient byte
    (before and after the all-reduce), timed alone on a 64 MiB buffer and scaled to the step's
    gradient bytes (a norm is memory-bound: its time is linear in the bytes)."""
    import torch

    if not nbytes:
        return 0.0
    n = 16 << 20
    buf = torch.randn(n, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.linalg.vector_norm(buf)
    start.record()
    for _ in range(20):
        torch.linalg.vector_norm(buf)
    end.record()
    end.synchronize()
    return 2 * nbytes * start.elapsed_time(end) / 1e3 / 20 / (4 * n)


class GradSync:
    """Registered on a DDP model with attach(); `slot` is the step's Slot while compute() runs
    (None outside: a bucket then is counted in `unmarked` and all-reduced all the same); `noise`:
    a Noise taking the buckets' squared norms, or None. `fault`: the first fault of the marks' own
    code ("Type: message"), None while there is none; from it on no step is marked (each reads
    None, the step it struck included) and the all-reduce goes on as DDP's own."""

    def __init__(self, cuda: bool, noise: bool = False) -> None:
        self.cuda = cuda
        self.slot: Slot | None = None
        self.unmarked = 0
        self.world = 1
        self.fault: str | None = None
        self._group = None
        self._lock = threading.Lock()  # done callbacks may run at once on gloo's threads
        self.noise = Noise(cuda) if noise else None
        if cuda:
            import torch

            self._event = lambda: torch.cuda.Event(enable_timing=True)
            self._stream = torch.cuda.current_stream
        import torch.distributed as dist

        self._all_reduce = dist.all_reduce

    def arm(self) -> None:
        """(The hook takes the norms of a step whose Noise is active: nothing to add.)"""

    def disarm(self) -> None:
        """(Nothing to remove.)"""

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

    @staticmethod
    def read(slot: Slot, start, between) -> dict | None:
        return read(slot, start, between)

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
        """Mark k of `marks`, the list grown to hold it: a later bucket's all-reduce may finish
        before an earlier one's (its done mark comes first)."""
        while len(marks) <= k:
            marks.append(self._event() if self.cuda else 0.0)
        if self.cuda:
            marks[k].record(self._stream())
        else:
            marks[k] = time.perf_counter()

    def _fail(self, exc: BaseException, slot: Slot | None) -> None:
        """The marks' own fault: said once (`fault`), no more marks; the step it struck reads None."""
        if self.fault is None:
            self.fault = _why(exc)
        if slot is not None:
            slot.k = 0  # read() gives None for a step with no bucket marked

    def _begin(self, bucket_bytes: int) -> tuple[Slot | None, int, Noise | None]:
        """A bucket ready: (the slot it is marked in or None, its index, the Noise taking its norms
        or None). The slot is None outside compute() and after a fault of the marks."""
        slot = self.slot
        noise = self.noise
        if slot is None or noise is None or not noise.active or noise.error:
            noise = None
        if slot is None:
            self.unmarked += 1
            return None, -1, noise
        if self.fault is not None:
            return None, -1, noise
        k = -1
        try:
            k = slot.k
            slot.k = k + 1
            slot.nbytes += bucket_bytes
            self._mark(slot.ready, k)
        except Exception as exc:  # noqa: BLE001 - the marks are lost, never the all-reduce
            self._fail(exc, slot)
            return None, -1, noise
        return slot, k, noise

    def _settled(self, slot: Slot | None, k: int, noise: Noise | None, value) -> None:
        """A bucket's all-reduce done (in its future's callback): its done mark, the whole batch's
        norm."""
        if slot is not None and self.fault is None:
            try:
                with self._lock:
                    self._mark(slot.done, k)
                    slot.ndone += 1
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, slot)
        if noise is not None:
            try:
                noise.reduced(value)
            except Exception as exc:  # noqa: BLE001 - the noise scale is lost, never the training
                noise.fail(exc)


class GradMarks:
    """The cheap way to the same arrival and exposed communication, with no communication hook:
    three marks a step from hooks on the model's own tensors. First ready: the earliest
    post-accumulate-grad hook of the last few parameters (model order: their gradients come first
    in backward, the ones DDP's first bucket holds). Last ready: that of the first parameter (its
    gradient comes last). Backward done: a callback queued on the autograd engine at the last
    gradient that queues itself once more, so that it runs after DDP's own end-of-backward
    callback (queued after it) has waited for its all-reduces (CUDA: the stream waits, the mark is
    an event on it). The hooks run in every backward; a step's marks
    are those of its last backward (the one that all-reduces, under gradient accumulation).
    Attached where no communication hook is asked for: DDP's all-reduce stays its own C++ path.
    On one H200 the hook path cost 2.4% of a 350m DDP step (57 buckets); these marks cost three
    Python calls a step. With noise=True, the noise scale's norms in the steps whose Noise is
    active (arm() before its compute, disarm() after).

    Each backward of a marked step (one with a slot, while the marks run) counts in its slot's
    `backwards` (at its last gradient) and, once its backward-done mark is set, calls
    `after_backward` if one is set (a callable of no arguments; None by default).

    Every hook is guarded: `fault` holds the first fault of this object's own code ("Type:
    message", None while there is none), said once. A fault of the marks stops them (no step is
    marked from there on; the step it struck reads None); a fault in `after_backward` clears it
    and is noted as "after_backward: Type: message" (the marks go on); a fault of the norms stops
    the norms (Noise.error)."""

    FIRST = 3  # parameters from the end whose gradients mark the first bucket
    after_backward: Callable[[], None] | None = None  # called at the end of each backward of a marked step

    def __init__(self, cuda: bool, noise: bool = False) -> None:
        self.cuda = cuda
        self.slot: Slot | None = None
        self.fault: str | None = None
        self.after_backward = None
        self._stopped = False  # the marks stopped after a fault of their own
        self.noise = Noise(cuda) if noise else None
        self._params: list = []
        self._model = None  # the DDP module: its require_backward_grad_sync says whether a backward reduces
        self._norm_hooks: list = []  # the noise scale's, in a step that takes its norms
        self._fired: list = []  # the parameters whose local norms this backward took
        self._fresh = True  # the next local norm is the first of a backward
        self.nbytes = 0  # the gradient bytes the last norms covered
        self._handles: list = []
        self._event = None
        if cuda:
            import torch

            self._event = lambda: torch.cuda.Event(enable_timing=True)
            self._stream = torch.cuda.current_stream
        self._pending = False

    def attach(self, model) -> bool:
        """Hooks on the model's parameters; False where it has none with gradients or torch lacks
        the hooks."""
        import torch

        params = [p for p in model.parameters() if p.requires_grad]
        if not params or not hasattr(params[0], "register_post_accumulate_grad_hook"):
            return False
        self._params, self._model = params, model
        for p in params[-self.FIRST:]:
            self._handles.append(p.register_post_accumulate_grad_hook(self._first))
        self._handles.append(params[0].register_post_accumulate_grad_hook(self._last))
        self._queue = torch.autograd.Variable._execution_engine.queue_callback
        return True

    def detach(self) -> None:
        """Every hook this attached goes (the marks' and, in an armed step, the norms')."""
        self.disarm()
        for h in self._handles:
            h.remove()
        self._handles = []

    def slots(self, n: int, _buckets: int = 0) -> list[Slot]:
        """n slots with their three marks made ahead."""
        out = []
        for _ in range(n):
            slot = Slot()
            slot.ready = [self._event() if self.cuda else 0.0 for _ in range(3)]
            out.append(slot)
        return out

    @staticmethod
    def read(slot: Slot, start, between) -> dict | None:
        return read_marks(slot, start, between)

    def _mark(self, slot: Slot, k: int) -> None:
        marks = slot.ready
        while len(marks) <= k:
            marks.append(self._event() if self.cuda else 0.0)
        if self.cuda:
            marks[k].record(self._stream())
        else:
            marks[k] = time.perf_counter()

    def _note(self, exc: BaseException, where: str = "") -> None:
        if self.fault is None:
            self.fault = where + _why(exc)

    def _stop(self, exc: BaseException, slot: Slot | None) -> None:
        """The marks' own fault: said once, no more marks; the step it struck reads None."""
        self._note(exc)
        self._stopped = True
        if slot is not None:
            slot.k = 0  # read_marks gives None unless all three marks were set

    def _first(self, _param) -> None:
        slot = self.slot
        if slot is None or self._stopped:
            return
        try:
            if slot.k != 1:  # the first of these hooks in this backward
                self._mark(slot, 0)
                slot.k = 1
        except Exception as exc:  # noqa: BLE001 - the marks are lost, never the training
            self._stop(exc, slot)

    def _last(self, _param) -> None:
        slot = self.slot
        if slot is None:
            return
        if not self._stopped:
            try:
                slot.backwards += 1
                self._mark(slot, 1)
                slot.k = 2
            except Exception as exc:  # noqa: BLE001
                self._stop(exc, slot)
        if not self._pending and (not self._stopped or self._fired):  # (the norms need it too, marks or not)
            try:
                self._queue(self._behind)
                self._pending = True
            except Exception as exc:  # noqa: BLE001
                self._stop(exc, slot)
                if self._fired:
                    self._fail(exc)  # no end of backward: no whole-batch norm

    def _behind(self) -> None:
        """Queued once more from inside the engine's final callbacks, so that it runs after the ones
        queued after it: DDP's end of backward, queued at its last bucket, which waits for the
        all-reduces (measured on gloo: a first callback ran 1-10 ms after the last gradient, before
        that wait; the second with the backward's return)."""
        try:
            self._queue(self._done)
        except Exception as exc:  # noqa: BLE001
            self._pending = False
            self._stop(exc, self.slot)
            if self._fired:
                self._fail(exc)

    def _done(self) -> None:
        self._pending = False
        slot = self.slot
        marked = slot is not None and not self._stopped
        if marked:
            try:
                if slot.k == 2:
                    self._mark(slot, 2)
                    slot.k = 3
            except Exception as exc:  # noqa: BLE001 - the marks are lost, never the training
                self._stop(exc, slot)
                marked = False
        if self._fired:  # the noise scale's step: the all-reduced gradients, DDP's wait behind them
            try:
                if getattr(self._model, "require_backward_grad_sync", True):
                    self.noise.reduced_all([p.grad for p in self._fired])
                else:  # a backward under no_sync(): nothing reduced, no whole-batch gradient to take
                    self.noise._global.clear()
            except Exception as exc:  # noqa: BLE001 - the noise scale is lost, never the training
                self._fail(exc)
            self._fresh = True
        callback = self.after_backward
        if marked and callback is not None:
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - the owner's callback is dropped, never the training
                self.after_backward = None
                self._note(exc, "after_backward: ")

    # -- the noise scale's norms, in the steps that take them (Noise.active) --------------------------

    def arm(self) -> None:
        """A step that takes the noise scale's norms: a post-accumulate-grad hook on every
        parameter for this step alone (its other steps pay nothing)."""
        noise = self.noise
        if noise is None or not noise.active or self._norm_hooks or noise.error:
            return
        self._fired, self._fresh = [], True
        self._norm_hooks = [p.register_post_accumulate_grad_hook(self._local) for p in self._params]

    def disarm(self) -> None:
        """The step ended: its hooks go."""
        for h in self._norm_hooks:
            h.remove()
        self._norm_hooks = []
        self._fired = []

    def _local(self, param) -> None:
        """This rank's gradient, accumulated over the step's micro-batches, before DDP's hook (run
        after this one, as the parameter's accumulator's own) puts it in its bucket."""
        if self.noise.error:
            return
        try:
            if self._fresh:  # a backward's first: an earlier backward's (a micro-batch's under no_sync) go
                self._fresh = False
                self._fired = []
                self.noise._local.clear()
                self.nbytes = 0
            grad = param.grad
            self.noise.local(grad)
            self._fired.append(param)
            self.nbytes += grad.numel() * grad.element_size()
        except Exception as exc:  # noqa: BLE001 - the noise scale is lost, never the training
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """The norms failed: no more are taken (the run says why; the training goes on)."""
        self._fired = []
        self.noise.fail(exc)


def read_marks(slot: Slot, start, between) -> dict | None:
    """GradMarks' figures of a finished step: arrival_s (compute start to the first gradient) and
    exposed_s (the last gradient to the backward's end, DDP's wait for its all-reduces); busy_s and
    bytes are not known this way (None)."""
    if slot.k != 3:
        return None
    first, last, done = (between(start, slot.ready[j]) for j in range(3))
    return {"arrival_s": max(0.0, first), "exposed_s": max(0.0, done - last), "busy_s": None, "bytes": None}


def _hook(state: GradSync, bucket):
    """DDP's default all-reduce (default_hooks.allreduce_hook), with marks. The marks and norms
    are kept apart from the all-reduce: a fault in them is noted (GradSync.fault, Noise.error) and
    the bucket is all-reduced and its value returned all the same."""
    tensor = bucket.buffer()
    slot, k, noise = None, -1, None
    try:
        slot, k, noise = state._begin(tensor.numel() * tensor.element_size())
        if noise is not None:
            try:
                noise.local(tensor)  # this rank's own gradient, before the all-reduce
            except Exception as exc:  # noqa: BLE001 - the noise scale is lost, never the training
                noise.fail(exc)
                noise = None
    except Exception as exc:  # noqa: BLE001 - the marks are lost, never the all-reduce
        state._fail(exc, state.slot)
        slot, noise = None, None
    tensor.div_(state.world)
    fut = state._all_reduce(tensor, group=state._group, async_op=True).get_future()
    if slot is None and noise is None:
        return fut.then(_value)

    def done(f):
        value = f.value()[0]  # the all-reduce's own failure is the training's: raised as DDP's would be
        try:
            state._settled(slot, k, noise, value)  # the done mark, the whole batch's norm
        except Exception as exc:  # noqa: BLE001
            state._fail(exc, slot)
        return value

    return fut.then(done)


def _value(f):
    return f.value()[0]


def read(slot: Slot, start, between) -> dict | None:
    """A finished step's figures (seconds; see the module docs) against `start`, its compute()
    start mark, with `between(a, b)` the owner's clock difference; None when no bucket was marked
    or a marked bucket has no done mark of this step (its callback never ran, or failed)."""
    n = slot.k
    if not n or slot.ndone != n or len(slot.done) < n:
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
