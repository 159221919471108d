"""One rank of `mgpu-bench comm --backend torch` (torch_backend.py starts it): the native core's
data pattern (csrc/comm_data.cuh), its timing loop (csrc/comm_session.cpp, Worker::measure) and
its check, on torch.distributed ("gloo" on CPU, "nccl" on a GPU). Only the ranks import this
module, and torch with it: the parent that starts them does not import torch at all (a CPU comm
run's parent paid 3.5-4 s of CPU for an import it never used)."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from mgpu_bench.core.errors import InputError, OutOfMemoryError, portable
from mgpu_bench.results.measurement import TimingOptions

from . import cpu_sizing

# Largest integer N such that every integer in [-N, N] is exact in the dtype (csrc/dtype.cpp).
EXACT_LIMIT = {
    "fp32": 2.0**24,
    "fp16": 2048.0,
    "bf16": 256.0,
    "fp64": 2.0**53,
    "int32": 2147483647.0,
    "int8": 127.0,
    "fp8_e4m3": 16.0,
    "fp8_e5m2": 8.0,
}

# Relative spacing near 1 (2^-mantissa bits); 0 for integers (csrc/comm_data.cu, ulp()).
ULP = {
    "fp32": 2.0**-23,
    "fp16": 2.0**-10,
    "bf16": 2.0**-7,
    "fp64": 2.0**-52,
    "int32": 0.0,
    "int8": 0.0,
    "fp8_e4m3": 2.0**-3,
    "fp8_e5m2": 2.0**-2,
}

TORCH_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
    "int32": torch.int32,
    "int8": torch.int8,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}

_REDOPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "avg": dist.ReduceOp.AVG,
}

# torch 2.13 renamed these (the old names warn); older releases have only the old ones.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# torch's all_reduce, reduce and broadcast write into their input (see the module docstring).
_INPUT_IS_OUTPUT = ("allreduce", "reduce", "broadcast")


# Elements per slice when filling or checking: 2 MiB per int64 temporary, so that a slice's
# arithmetic stays in the CPU's cache (1 << 22 elements, 32 MiB temporaries, made the pattern and
# the check of a 256 MiB allreduce 13x slower on a 2-core VM: 14 s instead of 1.2 s per rank).
_CHUNK = 1 << 18


# -- the data pattern (csrc/comm_data.cuh) --------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    k: int  # values in [-k, k] (times scale); 0 selects the one-hot pattern
    scale: int  # n for avg, 1 otherwise
    nranks: int


def make_pattern(dtype: str, op_reduces: bool, redop: str | None, nranks: int) -> Pattern:
    """The C++ make_pattern: k so that every partial sum of n values is exact in the dtype."""
    summing = op_reduces and redop in ("sum", "avg")
    scale = nranks if (op_reduces and redop == "avg") else 1
    denom = float(nranks if summing else 1) * scale
    k = int(min(8.0, math.floor(EXACT_LIMIT[dtype] / denom)))
    return Pattern(k=k, scale=scale, nranks=nranks)


def _hash_high(i: torch.Tensor, r: int | torch.Tensor) -> torch.Tensor:
    """hash(i, r) >> 16 as a new int64 tensor, hash = ((i mod 2^32) * 1103515245 + 12345 + r *
    2246822519) mod 2^32. In place after the first op: (i mod 2^32) * 1103515245 < 2^63, so
    nothing overflows before the mask."""
    h = torch.bitwise_and(i, 0xFFFFFFFF)
    h.mul_(1103515245).add_(12345)
    h.add_(r * 2246822519)
    return h.bitwise_and_(0xFFFFFFFF).bitwise_right_shift_(16)


def pattern_values(p: Pattern, rank: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """v(rank, index) as int64 (every value is an integer); rank may be a tensor like index."""
    if p.k == 0:
        owner = _hash_high(index, 0).remainder_(p.nranks)
        return owner.eq_(rank).mul_(p.scale)
    v = _hash_high(index, rank).remainder_(2 * p.k + 1).sub_(p.k)
    return v.mul_(p.scale) if p.scale != 1 else v


def _fill(buf: torch.Tensor, rank: int, p: Pattern) -> None:
    for start in range(0, buf.numel(), _CHUNK):
        n = min(_CHUNK, buf.numel() - start)
        idx = torch.arange(start, start + n, dtype=torch.int64, device=buf.device)
        buf[start:start + n].copy_(pattern_values(p, rank, idx))  # small integers: exact in every dtype


@dataclass(frozen=True)
class Expect:
    """What one rank's receive buffer must hold (csrc/op.hpp)."""

    defined: bool = True  # False: unspecified on this rank (reduce on a non-root)
    reduce: bool = False
    from_rank: int = 0
    chunk: int = 0
    base: int = 0
    count: int = 0


def expect(op: str, rank: int, nranks: int, root: int, c: dict) -> Expect:
    """The Expect rules of csrc/ops/*.cu."""
    if op == "allreduce":
        return Expect(reduce=True, count=c["recv_count"])
    if op == "allgather":
        return Expect(chunk=c["send_count"], count=c["recv_count"])
    if op == "reducescatter":
        return Expect(reduce=True, base=rank * c["recv_count"], count=c["recv_count"])
    if op == "broadcast":
        return Expect(from_rank=root, count=c["recv_count"])
    if op == "reduce":
        return Expect(defined=rank == root, reduce=True, count=c["recv_count"])
    if op == "alltoall":
        return Expect(chunk=c["count"], base=rank * c["count"], count=c["recv_count"])
    if op == "sendrecv":
        return Expect(from_rank=(rank - 1) % nranks, count=c["recv_count"])
    raise InputError(f"unknown op '{op}'")


def expected_values(e: Expect, p: Pattern, redop: str | None, index: torch.Tensor) -> torch.Tensor:
    """The C++ expected(): float64 values for output positions `index`."""
    if not e.reduce:
        if e.chunk > 0:
            return pattern_values(p, index // e.chunk, e.base + index % e.chunk).to(torch.float64)
        return pattern_values(p, e.from_rank, e.base + index).to(torch.float64)
    src = e.base + index
    acc = pattern_values(p, 0, src)  # int64: exact sums
    for r in range(1, p.nranks):
        v = pattern_values(p, r, src)
        if redop == "max":
            torch.maximum(acc, v, out=acc)
        elif redop == "min":
            torch.minimum(acc, v, out=acc)
        else:
            acc.add_(v)
    acc = acc.to(torch.float64)
    return acc.div_(p.nranks) if redop == "avg" else acc


def count_wrong(out: torch.Tensor, e: Expect, p: Pattern, redop: str | None, dtype: str) -> int:
    """Elements of `out` that differ from the expectation: exact, except 2 ulp (relative) for avg
    on floating types; NaN always counts as wrong."""
    tol_rel = 2.0 * ULP[dtype] if redop == "avg" else 0.0
    wrong = 0
    for start in range(0, e.count, _CHUNK):
        n = min(_CHUNK, e.count - start)
        idx = torch.arange(start, start + n, dtype=torch.int64, device=out.device)
        want = expected_values(e, p, redop, idx)
        got = out[start:start + n].to(torch.float64)
        if not tol_rel:  # exact; NaN differs from everything
            wrong += int(got.ne(want).sum().item())  # got may be `out` itself (fp64): not in place
            continue
        tol = tol_rel * want.abs().clamp(min=1.0)
        wrong += int((~((got - want).abs() <= tol)).sum().item())
    return wrong


def _poison(buf: torch.Tensor) -> None:
    buf.fill_(float("nan") if buf.dtype.is_floating_point else torch.iinfo(buf.dtype).max)


# -- one measurement, in each process ------------------------------------------------------------


class _CpuClock:
    """Wall time; gloo calls return when done, so a timestamp after a call ends it."""

    def mark(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        pass

    @staticmethod
    def seconds(a: float, b: float) -> float:
        return b - a


class _CudaClock:
    """CUDA events on the current stream, which torch makes wait for each collective."""

    def mark(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def sync(self) -> None:
        torch.cuda.synchronize()

    @staticmethod
    def seconds(a: torch.cuda.Event, b: torch.cuda.Event) -> float:
        return a.elapsed_time(b) * 1e-3  # elapsed_time is in ms


def _agree_max(value: int, device: torch.device, group=None) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def _launcher(op: str, send: torch.Tensor, recv: torch.Tensor, redop: str | None, root: int,
              rank: int, nranks: int, group=None, ranks: tuple[int, ...] | None = None) -> Callable[[], None]:
    """The call for `op` on `group` (None: the world). rank, nranks and root count within the
    group; `ranks` maps them to the global ranks torch's rooted and point-to-point calls take."""
    rop = _REDOPS.get(redop or "sum")
    glob = (lambda r: r) if ranks is None else (lambda r: ranks[r])
    if op == "allreduce":
        return lambda: dist.all_reduce(recv, op=rop, group=group)
    if op == "reduce":
        return lambda: dist.reduce(recv, dst=glob(root), op=rop, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(recv, src=glob(root), group=group)
    if op == "allgather":
        return lambda: _ALL_GATHER(recv, send, group=group)
    if op == "reducescatter":
        return lambda: _REDUCE_SCATTER(recv, send, op=rop, group=group)
    if op == "alltoall":
        return lambda: dist.all_to_all_single(recv, send, group=group)
    if op == "sendrecv":
        nxt, prev = glob((rank + 1) % nranks), glob((rank - 1) % nranks)

        def ring() -> None:
            ops = [dist.P2POp(dist.isend, send, nxt, group), dist.P2POp(dist.irecv, recv, prev, group)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return ring
    raise InputError(f"unknown op '{op}'")


def _measure(plan: dict, rank: int, nranks: int, device: torch.device, timing: TimingOptions, group=None,
             ranks: tuple[int, ...] | None = None, budget_s: float | None = None,
             projected_s: float | None = None) -> dict:
    """Worker::measure, step for step; returns this rank's (burst, samples, wrong) and, on every
    rank, the figures that were agreed (iters, batch, the slowest rank's warm-up estimate) and its
    own warm-up estimate. With a `group` (global `ranks`), rank and nranks count within it. With
    `budget_s` (CPU), the timed iterations fit in it (at least cpu_sizing.MIN_ITERS), and a
    `projected_s` per iteration that makes the usual warm-up long cuts it to 2."""
    t_begin = time.monotonic()
    op, dtype, redop, inplace, root = plan["op"], plan["dtype"], plan["redop"], plan["inplace"], plan["root"]
    c = plan["counts"]
    tdtype = TORCH_DTYPES[dtype]
    on_cpu = device.type == "cpu"
    clock = _CpuClock() if on_cpu else _CudaClock()

    # 1. Buffers, agreed: if any rank is out of memory, every rank stops at this size.
    work_count = max(c["send_count"], c["recv_count"])
    ok = True
    work = send = None
    try:
        work = torch.empty(work_count, dtype=tdtype, device=device)
        send = work if inplace else torch.empty(c["send_count"], dtype=tdtype, device=device)
    except (torch.OutOfMemoryError, MemoryError):
        ok = False
    except RuntimeError as exc:  # torch's CPU allocator says so in a plain RuntimeError
        if "can't allocate memory" not in str(exc):
            raise
        ok = False
    if _agree_max(0 if ok else 1, device, group) != 0:
        work = send = None
        need = (work_count + (0 if inplace else c["send_count"])) * tdtype.itemsize
        raise OutOfMemoryError(
            f"out of memory for {op} at {c['bytes']} bytes ({need} bytes of buffers per rank)"
            f"{'' if not ok else ' on another rank'}")
    if inplace:
        send_view = work[c["send_inplace_offset"] * rank:][: c["send_count"]]
        recv_view = work[c["recv_inplace_offset"] * rank:][: c["recv_count"]]
    else:
        send_view, recv_view = send, work[: c["recv_count"]]
    load = op in _INPUT_IS_OUTPUT and not inplace  # the call's input is recv_view (docstring)
    launch = _launcher(op, send_view, recv_view, redop, root, rank, nranks, group, ranks)
    pattern = make_pattern(dtype, plan["reduces"], redop, nranks)
    _fill(send_view, rank, pattern)
    if load:
        recv_view.copy_(send_view)

    # 2. Warm-up; its later iterations give the per-iteration estimate.
    warm = cpu_sizing.warmup_count(timing, projected_s, budget_s)
    launch()
    w0 = clock.mark()
    for _ in range(1, warm):
        launch()
    w1 = clock.mark()
    clock.sync()
    estimate = clock.seconds(w0, w1) / (warm - 1)

    # 3. Iteration count: fixed, or enough to fill min_time at the slowest rank's estimate.
    agreed = _agree_max(int(estimate * 1e9), device, group) * 1e-9
    iters, batch, nsamples = cpu_sizing.timed_counts(agreed, timing, budget_s)  # budget: sized to the machine (CPU)

    # 4. Burst: iters back to back, timed at its ends only.
    if on_cpu:
        dist.barrier(group=group)  # start together: the first call would otherwise absorb the skew
    start = clock.mark()
    for _ in range(iters):
        launch()
    end = clock.mark()
    clock.sync()
    burst = clock.seconds(start, end) / iters

    # 5. Samples: nsamples * batch iterations, a timestamp after every batch.
    if on_cpu:
        dist.barrier(group=group)
    marks = [clock.mark()]
    for _ in range(nsamples):
        for _ in range(batch):
            launch()
        marks.append(clock.mark())
    clock.sync()
    samples = [clock.seconds(marks[s], marks[s + 1]) / batch for s in range(nsamples)]

    # 6. Check: poison the output, write known data, run once, count wrong elements.
    wrong = 0
    if timing.check:
        _poison(work if inplace else recv_view)
        _fill(send_view, rank, pattern)
        if load:
            recv_view.copy_(send_view)
        launch()
        clock.sync()
        e = expect(op, rank, nranks, root, c)
        if e.defined:
            wrong = count_wrong(recv_view, e, pattern, redop, dtype)

    # The size's whole wall time and the part that is not collectives (the slowest rank's): what
    # the next size's projection starts from.
    wall = time.monotonic() - t_begin
    if budget_s is not None:
        wall = _agree_max(int(wall * 1e9), device, group) * 1e-9
    calls = warm + iters + nsamples * batch + (1 if timing.check else 0)
    return {"iters": iters, "batch": batch, "burst": burst, "samples": samples, "wrong": wrong,
            "estimate": estimate, "agreed": agreed, "fixed": max(0.0, wall - calls * agreed), "wall": wall}


def _series(plan: dict) -> tuple:
    return plan["op"], plan["dtype"], plan["redop"], plan["inplace"]


def _rank_loop(plans: list[dict], rank: int, nranks: int, device: torch.device, timing: TimingOptions,
               emit: Callable[[int, dict], None], timeout_s: float | None = None,
               skip: Callable[[int, str], None] | None = None) -> None:
    """Every plan on this rank; rank 0 gathers every rank's raw seconds and hands the combined
    result of each plan to emit(index, raw) (the same dict the native session returns). On CPU
    with `timeout_s`, the sweep is sized to the machine by cpu_sizing's rule (each plan's
    "allot_s" its share of the first estimate): a size that does not fit ends its series, and rank
    0 says why through skip(index, why) for it and each larger size of the series. Every rank
    decides from the same agreed figures, so all skip together."""
    sized = device.type == "cpu" and timeout_s is not None
    rule = cpu_sizing.Plan([p.get("allot_s", 0.0) for p in plans], timing, timeout_s,
                           [_series(p) for p in plans]) if sized else None
    last: dict[tuple, cpu_sizing.Measured] = {}  # series -> its last size measured, agreed
    used: dict[tuple, float] = {}  # series -> seconds its requests took (agreed walls)
    ended: dict[tuple, tuple[int, str]] = {}  # series -> (the bytes that did not fit, why)
    for index, plan in enumerate(plans):
        key, size = _series(plan), plan["counts"]["bytes"]
        decision = cpu_sizing.Decision(True)
        if rule is not None:
            if key in ended and size >= ended[key][0]:
                decision = cpu_sizing.Decision(False, why=ended[key][1])
            else:
                decision = rule.decide(index, size, used.get(key, 0.0), last.get(key), sum(used.values()))
                if not decision.run:
                    ended[key] = (size, decision.why)
        if not decision.run:
            if rank == 0 and skip is not None:
                skip(index, decision.why)
            continue
        m = _measure(plan, rank, nranks, device, timing, budget_s=decision.budget_s,
                     projected_s=decision.projected_s)
        last[key] = cpu_sizing.measured(size, m["agreed"], m["fixed"], first=index == 0)
        if index:  # the first request warms the processes up: start-up, not its series' time (cpu_sizing)
            used[key] = used.get(key, 0.0) + m["wall"]
        mine = (m["burst"], m["samples"], m["wrong"])
        gathered = [None] * nranks if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank == 0:
            emit(index, {
                "counts": dict(plan["counts"]),
                "iters": m["iters"],
                "batch": m["batch"],
                "burst_seconds": [float(g[0]) for g in gathered],
                "samples": np.asarray([g[1] for g in gathered], dtype=float).reshape(nranks, -1),
                "wrong": [int(g[2]) for g in gathered],
                "warmup_seconds_per_iter": float(m["estimate"]),
            })


def worker(rank: int, nranks: int, device_kind: str, gpu: int, store_path: str, plans: list[dict],
           timing: TimingOptions, timeout_s: float, start_s: float, out) -> None:
    """One rank. Sends ("ready", rank), then rank 0 sends ("result", index, raw) per request;
    any rank that fails sends ("error", rank, exception) and stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    # The environment (NCCL_NVLS_ENABLE and the rest) is the parent's, as for the native
    # backend, so that both measure the same NCCL configuration.
    try:
        if device_kind == "cuda":
            torch.cuda.set_device(gpu)
            device, backend = torch.device("cuda", gpu), "nccl"
        else:
            device, backend = torch.device("cpu"), "gloo"
            # The ranks share the host's cores: one intra-op pool each the width of its share, not
            # nranks pools as wide as the host (which only contend while writing and checking data).
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            torch.set_num_threads(max(1, cores // nranks))
        limit = timedelta(seconds=max(timeout_s, start_s))  # start_s: the parent's STARTUP_TIMEOUT_S
        store = dist.FileStore(store_path, nranks)
        store.set_timeout(limit)
        dist.init_process_group(backend, store=store, rank=rank, world_size=nranks, timeout=limit,
                                device_id=device if device_kind == "cuda" else None)
        out.put(("ready", rank))
        _rank_loop(plans, rank, nranks, device, timing, lambda index, raw: out.put(("result", index, raw)),
                   timeout_s, lambda index, why: out.put(("skipped", index, why)))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - everything goes to the parent
        out.put(("error", rank, portable(exc)))
