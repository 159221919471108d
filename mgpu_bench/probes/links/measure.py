"""`mgpu-bench links`: GPU-to-GPU and host-to-GPU copy bandwidth and latency, per pair, with
the outlier named.

Every ordered pair (src, dst) is measured with the copy engines (cudaMemcpyPeerAsync) and with
SMs (a kernel on dst reading src's memory over the peer mapping), one direction and both at
once; plus the latency of a dependent 4-byte read from the peer's memory, and pinned host to
device / device to host copies per GPU. Each figure is the median of `iters` copies.
Localisation compares each pair with the node's own median (robust z-score: deviation over
1.4826 x the median absolute deviation), so one slow link stands out whatever the hardware.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from mgpu_bench.core.errors import InputError, defer_sigterm

from .result import ENGINES, LinkMeasurement, LinkSpec, LinksRun

ProgressFn = Callable[[int, int, str], None]


def run_links(gpus: list[int], *, size: int = 256 << 20, iters: int = 10, warmup: int = 3,
              engines: tuple[str, ...] = ENGINES, latency: bool = True, host: bool = True,
              progress: ProgressFn | None = None) -> LinksRun:
    """Measures every ordered pair of `gpus`. A pair without peer access gets copy-engine
    figures only (the driver stages them through host memory) and a note."""
    from mgpu_bench import _native

    if len(gpus) < 2 and not host:
        raise InputError("links needs 2 GPUs or more (or host copies)")
    if size < 16 or iters < 1 or warmup < 0:
        raise InputError("--size must be >= 16 bytes, --iters >= 1, --warmup >= 0")
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise InputError(f"unknown engine '{bad[0]}': choose from {', '.join(ENGINES)}")
    run = LinksRun(gpus=list(gpus))
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    steps = len(pairs) + (len(gpus) if host else 0)
    t0 = time.perf_counter()
    pair_walls = []
    for i, (a, b) in enumerate(pairs):
        if progress:
            progress(i, steps, f"GPU {a} -> GPU {b}")
        tp = time.perf_counter()
        peer = bool(_native.can_access_peer(a, b))
        run.peer_access[(a, b)] = peer
        if not peer:
            run.notes.append(f"GPU {a} -> GPU {b}: no peer access; copies go through host memory, SM copies skipped")
        for engine in engines:
            if engine == "sm" and not peer:
                continue
            for bidir in (False, True):
                r = _native.links_copy(a, b, size, engine, bidir, warmup, iters)
                spec = LinkSpec("copy", a, b, engine, bidir, None, size // 16 * 16)
                run.measurements.append(LinkMeasurement(spec, tuple(r["seconds"])))
        if latency and peer:
            # GPU b reads GPU a's memory: the latency of the a -> b direction of the link.
            t = _native.links_read_latency(b, a, 64 << 20, 5000, 5)
            run.measurements.append(LinkMeasurement(LinkSpec("latency", a, b), tuple(t)))
        pair_walls.append(time.perf_counter() - tp)
    th = time.perf_counter()
    if host:
        for j, g in enumerate(gpus):
            if progress:
                progress(len(pairs) + j, steps, f"host <-> GPU {g}")
            for direction in ("h2d", "d2h"):
                t = _native.links_host_copy(g, size, direction == "h2d", warmup, iters)
                run.measurements.append(LinkMeasurement(LinkSpec("host", g, None, direction=direction, bytes=size), tuple(t)))
    defer_sigterm()  # measured: a stop signal now waits while the topology is read and the run is written
    run.host_seconds = time.perf_counter() - th
    run.wall_seconds = time.perf_counter() - t0
    run.per_pair_seconds = statistics.median(pair_walls) if pair_walls else 0.0
    return run
