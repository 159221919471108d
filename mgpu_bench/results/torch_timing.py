"""Timing torch work on one device (a GPU, or a CPU process standing in for one): a GEMM, a device
copy and an allreduce, the figures fleet's node pass and check's CPU ranks measure the same way.

GPU work is timed with CUDA events, CPU work with the monotonic clock. Local work (GEMM, copy) is
timed in bursts of about 50 ms, repeated for a minimum time: what a process delivers, preemption
and stalls included. torch is imported when a function runs, never at import.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def _clock(device):
    import torch

    if device.type == "cuda":
        def start():
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev

        def stop(ev):
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return ev.elapsed_time(end) / 1e3
        return start, stop
    return time.perf_counter, lambda t0: time.perf_counter() - t0


def timed(fn: Callable[[], None], device, iters: int, warmup: int) -> list[float]:
    """Seconds of each of `iters` calls after `warmup` untimed ones."""
    start, stop = _clock(device)
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = start()
        fn()
        out.append(stop(t0))
    return out


def timed_for(fn: Callable[[], None], device, min_s: float, burst_s: float = 0.05,
              until: float | None = None) -> list[float]:
    """Seconds per call, from bursts of calls lasting about `burst_s` each (what a process
    delivers, preemption and stalls included), bursts repeated for at least `min_s` and 5 bursts
    (local work only: no peer waits). `until` (a time.monotonic() deadline) ends the bursts early,
    after the first one.

    The calls per burst come from one timed call; a burst that took under half of `burst_s` (that
    call was slowed by a stall, so the count came out too small) is sized again from its own time
    and not kept. Bursts too short to span a stall would let a process stopped most of the time
    show its full speed in its fastest bursts (typical() takes a CPU process's fastest quartile)."""
    start, stop = _clock(device)
    fn()
    t0 = start()
    fn()
    one = max(stop(t0), 1e-7)
    per_burst = max(1, min(10_000, int(burst_s / one)))
    out: list[float] = []
    while len(out) < 5 or sum(out) * per_burst < min_s:
        if out and until is not None and time.monotonic() >= until:
            break
        t0 = start()
        for _ in range(per_burst):
            fn()
        took = stop(t0)
        if took < burst_s / 2 and per_burst < 10_000:  # at least doubles: at most 14 resizes
            per_burst = min(10_000, max(2 * per_burst, int(burst_s * per_burst / max(took, 1e-9))))
            out.clear()  # sums below count calls of one size
            continue
        out.append(took / per_burst)
    return out


def typical(seconds: Sequence[float], on_gpu: bool) -> float:
    """The figure of a run of bursts: a GPU's median burst; a CPU process's fastest quartile, as
    the host's other load only ever slows some bursts of a process (a process slowed by its own
    fault is slow in all of them)."""
    if on_gpu or len(seconds) < 2:
        return statistics.median(seconds)
    return statistics.quantiles(seconds, n=4)[0]


def gemm_seconds(n: int, device, min_s: float | None = None, until: float | None = None) -> list[float]:
    """Seconds per N^3 matmul: bf16 on a GPU, fp32 on CPU, random operands; bursts for `min_s`
    (default 0.5 s on a GPU, 0.3 s on CPU)."""
    import torch

    on_gpu = device.type == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    a = torch.rand((n, n), device=device, dtype=dtype) - 0.5
    b = torch.rand((n, n), device=device, dtype=dtype) - 0.5
    return timed_for(lambda: torch.matmul(a, b), device, min_s if min_s is not None else 0.5 if on_gpu else 0.3,
                     until=until)


def copy_seconds(nbytes: int, device, min_s: float | None = None, until: float | None = None
                 ) -> tuple[list[float], int]:
    """Seconds per device-to-device copy of `nbytes`, and the bytes moved (read plus written);
    bursts for `min_s` (default 0.3 s on a GPU, 0.1 s on CPU)."""
    import torch

    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = timed_for(lambda: dst.copy_(src), device,
                        min_s if min_s is not None else 0.3 if device.type == "cuda" else 0.1, until=until)
    return seconds, 2 * src.numel() * 4


def allreduce(size: int, device, group, iters: int, warmup: int) -> dict:
    """busbw of an allreduce of `size` bytes in `group` (as nccl-tests: algbw x 2(n-1)/n) from
    this rank's mean time per call (what it delivered, stalls included, as nccl-tests' time
    column); the data checked once (every element equal to the rank count)."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(group)
    buf = torch.ones(size // 4, device=device, dtype=torch.float32)
    seconds = timed(lambda: dist.all_reduce(buf, group=group), device, iters, warmup)
    buf.fill_(1.0)
    dist.all_reduce(buf, group=group)
    wrong = int((buf != n).sum().item())
    factor = 2 * (n - 1) / n
    return {"seconds": seconds, "busbw": size * factor / statistics.fmean(seconds), "wrong": wrong, "ranks": n}
