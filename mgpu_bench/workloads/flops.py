"""FLOPs of one training step, counted, and the dense ops they come from, timed alone.

`count()` runs one forward, loss and backward under torch.utils.flop_counter.FlopCounterMode (on
the meta device where the model allows: shapes only, no memory). The same pass records every
matmul and convolution it sees (mm, addmm, bmm, baddbmm, convolution, convolution_backward) with
its argument shapes, how often it ran and its FLOPs, through FlopCounterMode's own
`custom_mapping` hook, so the counted FLOPs and the recorded ops are one mechanism. The
optimizer step is not counted (MFU convention: model FLOPs only).

`ceiling()` replays each recorded op alone on a GPU in bf16 and gives the FLOP-weighted rate of
all of them: what this GPU's matmuls and convolutions reach on the model's own shapes, the
ceiling the verdict holds the step against. Attention counted on meta is its math form (two
batched matmuls forward, four backward: torch decomposes scaled-dot-product attention there), so
it enters the ceiling as the batched matmuls of the same FLOPs.

Base units: FLOPs, seconds, FLOP/s.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

from mgpu_bench.core.errors import InputError

# The ops recorded for the ceiling: every matmul and convolution FlopCounterMode counts.
DENSE_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward")


@dataclass(frozen=True)
class FlopCount:
    """One training micro-batch counted: `flops` of forward + backward at `batch_size` samples,
    counted on `device` ("meta", "cpu", "cuda:0"); `dense_ops` the matmuls and convolutions seen
    (each {"op", "args", "count", "flops"}: flops per call); `note` why not on meta, when not."""

    flops: float
    batch_size: int
    device: str
    dense_ops: tuple[dict, ...] = field(default=(), repr=False)
    note: str | None = None

    @property
    def per_sample(self) -> float:
        return self.flops / self.batch_size

    def to_dict(self) -> dict:
        return {"flops": self.flops, "batch_size": self.batch_size, "device": self.device,
                "dense_ops": list(self.dense_ops), "note": self.note}

    @classmethod
    def from_dict(cls, d: dict) -> FlopCount:
        return cls(float(d["flops"]), int(d["batch_size"]), str(d["device"]), tuple(d.get("dense_ops") or ()),
                   d.get("note"))


def _spec(x: Any) -> Any:
    """An op argument as JSON: a tensor as its shape (and "t": true for a transposed 2-D/3-D
    layout, last two dimensions swapped in memory), lists element-wise, numbers, bools and None
    as they are; anything else as its repr (such an op is not replayed)."""
    import torch

    if isinstance(x, torch.Tensor):
        out: dict[str, Any] = {"tensor": list(x.shape)}
        if x.dim() in (2, 3) and x.shape[-1] > 1 and x.shape[-2] > 1 and x.stride(-2) == 1 and x.stride(-1) != 1:
            out["t"] = True
        return out
    if isinstance(x, (list, tuple)):
        return [_spec(v) for v in x]
    if x is None or isinstance(x, (bool, int, float)):
        return x
    return {"repr": repr(x)}


def _attention_formulas() -> dict:
    """FLOPs of the CPU flash-attention kernel, which FlopCounterMode does not list (the CUDA
    ones it does): as torch's own sdpa formulas, forward Q K^T and P V, 2 x b h s_q s_k d each;
    backward four such batched matmuls (dV, dP, dQ, dK)."""
    import torch

    def fwd(q, k, v, *args, out_shape=None, **kwargs):
        b, h, s_q, d = q
        return 2 * b * h * s_q * k[-2] * d + 2 * b * h * s_q * k[-2] * v[-1]

    def bwd(grad_out, q, k, v, *args, out_shape=None, **kwargs):
        b, h, s_q, d = q
        s_k, d_v = k[-2], v[-1]
        return 2 * b * h * (s_k * s_q * d_v + s_q * d_v * s_k + s_q * s_k * d + s_k * s_q * d)

    out = {}
    for name, fn in (("_scaled_dot_product_flash_attention_for_cpu", fwd),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward", bwd)):
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            out[packet] = fn
    return out


class Counter:
    """torch.utils.flop_counter.FlopCounterMode with torch's formulas, the CPU flash-attention
    ones it lacks, and the record of every dense op (DENSE_OPS) it sees, entered around what is
    to be counted: `with Counter() as c: ...; c.result(batch_size, device)`.

    `guarded`: every formula runs inside a guard, and one that fails on an odd argument counts 0
    and is said in `failed` (for counting a user's live training step, which the count must never
    break); unguarded, a formula's error is raised (a workload mgpu-bench builds)."""

    def __init__(self, guarded: bool = False) -> None:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        base = FlopCounterMode(display=False).flop_registry  # torch's formulas, each taking raw arguments
        self.seen: dict[str, dict] = {}
        self.failed: list[str] = []
        dense = {getattr(torch.ops.aten, n, None): n for n in DENSE_OPS}
        dense.pop(None, None)
        packets = base if guarded else {p: base[p] for p in dense if p in base}
        mapping = {p: self._wrap(formula, dense.get(p), raw=True, guarded=guarded) for p, formula in packets.items()}
        for packet, formula in _attention_formulas().items():  # shape formulas: FlopCounterMode wraps them
            mapping[packet] = self._wrap(formula, None, raw=False, guarded=guarded) if guarded else formula
        self.mode = FlopCounterMode(display=False, custom_mapping=mapping)

    def _wrap(self, formula: Callable, dense_name: str | None, raw: bool, guarded: bool) -> Callable:
        def counted(*args, out_val=None, **kwargs):
            try:
                n = formula(*args, out_val=out_val, **kwargs)
            except Exception as exc:
                if not guarded:
                    raise
                if len(self.failed) < 5:
                    self.failed.append(f"{getattr(formula, '__name__', 'formula')}: {type(exc).__name__}")
                return 0
            if dense_name is not None:
                spec = {"op": dense_name, "args": _spec(args), "kwargs": {k: _spec(v) for k, v in kwargs.items()}}
                row = self.seen.setdefault(json.dumps(spec, sort_keys=True), {**spec, "count": 0, "flops": float(n)})
                row["count"] += 1
            return n

        counted._get_raw = raw  # FlopCounterMode passes the tensors themselves, not their shapes
        return counted

    def __enter__(self) -> Self:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)

    @property
    def total(self) -> float:
        return float(self.mode.get_total_flops())

    def result(self, batch_size: int, device: str, note: str | None = None) -> FlopCount:
        """The count as a FlopCount of `batch_size` samples on `device`, its dense ops largest
        share first."""
        ops = tuple(sorted(self.seen.values(), key=lambda r: -r["flops"] * r["count"]))
        return FlopCount(self.total, batch_size, device, ops, note)


def count(model, batch, loss_fn: Callable, batch_size: int, device: str, autocast_dtype=None,
          note: str | None = None) -> FlopCount:
    """FLOPs of loss_fn(model, batch) and its backward, counted by FlopCounterMode (Counter),
    with the dense ops recorded. The model's gradients are set to None afterwards. InputError
    when the loss is not a 0-d floating tensor (the workload protocol's contract)."""
    import contextlib

    import torch

    counter = Counter()
    dev_type = device.split(":")[0]
    amp = torch.autocast(device_type=dev_type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with counter:
        with amp:
            loss = loss_fn(model, batch)
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point()):
            got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__)
            raise InputError(f"the loss returned {got}: expected a 0-d floating tensor (the mean loss of the batch)")
        loss.backward()
    model.zero_grad(set_to_none=True)
    if counter.total <= 0:
        raise InputError("the step has no counted FLOPs (no matmul, convolution or attention in forward or "
                         "backward): nothing for MFU to measure")
    return counter.result(batch_size, device, note)


def _tensor(spec: dict, device, dtype, channels_last: bool, gen):
    import torch

    shape = list(spec["tensor"])
    if spec.get("t"):
        shape[-1], shape[-2] = shape[-2], shape[-1]
    x = torch.rand(shape, device=device, dtype=dtype, generator=gen) - 0.5
    if spec.get("t"):
        x = x.transpose(-1, -2)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _build(arg, device, dtype, channels_last, gen):
    if isinstance(arg, dict) and "tensor" in arg:
        return _tensor(arg, device, dtype, channels_last, gen)
    if isinstance(arg, dict):
        raise TypeError(f"not replayable: {arg.get('repr')}")
    if isinstance(arg, list):
        return [_build(a, device, dtype, channels_last, gen) for a in arg]
    return arg


def replay(op: dict, device, channels_last: bool = False, gen=None):
    """One recorded dense op (FlopCount.dense_ops) made callable again: (the aten op, its args,
    its kwargs) with bf16 tensors of the recorded shapes and layouts on `device`. RuntimeError,
    ValueError or TypeError where it cannot be (an argument recorded only as its repr)."""
    import torch

    fn = getattr(torch.ops.aten, op["op"])
    args = [_build(a, device, torch.bfloat16, channels_last, gen) for a in op["args"]]
    kwargs = {k: _build(v, device, torch.bfloat16, channels_last, gen) for k, v in (op.get("kwargs") or {}).items()}
    return fn, args, kwargs


def ceiling(ops, device, channels_last: bool = False) -> dict:
    """Each dense op of a count (FlopCount.dense_ops) replayed alone in bf16 on `device` (CUDA):
    3 untimed calls, then the median of 5 bursts of about 10 ms each (CUDA events); and the rate
    of all of them together, weighted by how often each ran: {"flops_per_s", "shapes": rows,
    "skipped": ops that could not be replayed}. Ops are timed largest share of the FLOPs first."""
    import torch

    gen = torch.Generator(device=device).manual_seed(7)
    rows, flops_total, seconds_total, skipped = [], 0.0, 0.0, 0
    for op in ops:
        try:
            fn, args, kwargs = replay(op, device, channels_last, gen)
            for _ in range(3):
                fn(*args, **kwargs)
        except (RuntimeError, ValueError, TypeError):
            skipped += 1
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args, **kwargs)
        end.record()
        end.synchronize()
        reps = max(1, min(200, int(0.01 / max(start.elapsed_time(end) / 1e3, 1e-6))))
        samples = []
        for _ in range(5):
            start.record()
            for _ in range(reps):
                fn(*args, **kwargs)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / reps)
        secs = statistics.median(samples)
        shapes = [a["tensor"] for a in op["args"] if isinstance(a, dict) and "tensor" in a]
        rows.append({"op": op["op"], "shapes": shapes, "count": op["count"], "flops": op["flops"], "seconds": secs,
                     "flops_per_s": op["flops"] / secs})
        flops_total += op["flops"] * op["count"]
        seconds_total += secs * op["count"]
        del args, kwargs
    torch.cuda.empty_cache()
    return {"flops_per_s": flops_total / seconds_total if seconds_total else None, "shapes": rows, "skipped": skipped}
