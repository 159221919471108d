"""Why do HBM copies run about 10% slower after allocator churn in the same process?

    python benchmarks/hbm_after_churn.py [--gpu 0] [--patterns interleaved,grow-shrink]

Seen in session 11 (benchmarks/RESULTS.md): after one churn pattern, with any allocator, the
copy-engine figure drops from 4.28 to 3.83 TB/s, although every churned block was freed. This
script tells the candidate causes apart:
- buffers allocated BEFORE the churn, copied again after it: if they keep their speed, the loss
  belongs to where new allocations land (physical placement, page size), not to the GPU's state;
- buffers allocated AFTER it, at 4 GiB and at smaller sizes: does the loss depend on the size?
- the same figure after 10 s idle: a clock or thermal effect would fade;
- after one allocation of most of the free memory, freed again: does that restore new buffers?

Each line is one measurement: native copy engine on fresh buffers (mgpu_bench's probe, 20
iterations after 3 warm-up ones) or torch's copy_ between two buffers (CUDA events, 20
iterations after 3). Bandwidth counts bytes read plus bytes written.
"""

from __future__ import annotations

import argparse
import time

import torch

from mgpu_bench import _native

GIB = 1 << 30


def native_copy(gpu: int) -> float:
    r = _native.hbm_bandwidth(gpu, "copy_ce", 4 * GIB, 3, 20)
    return (r["bytes_read"] + r["bytes_written"]) / r["seconds"] / 1e12


def torch_copy(x: torch.Tensor, y: torch.Tensor, iters: int = 20) -> float:
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        y.copy_(x)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / iters
    return 2 * x.numel() * x.element_size() / seconds / 1e12


def pair(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    return x, torch.empty_like(x)


def line(what: str, tbs: float) -> None:
    print(f"{what:62s} {tbs:6.3f} TB/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--patterns", default="interleaved,grow-shrink")
    ap.add_argument("--allocator", default="cudaMalloc", choices=list(_native.memory_allocators()))
    args = ap.parse_args()
    torch.cuda.set_device(args.gpu)
    print(f"{torch.cuda.get_device_name(args.gpu)}, driver {_native.driver_version()}", flush=True)

    old_x, old_y = pair(4 * GIB)
    line("before churn: native copy engine, fresh 4 GiB buffers", native_copy(args.gpu))
    line("before churn: torch copy, 4 GiB buffers", torch_copy(old_x, old_y))
    for pattern in args.patterns.split(","):
        t0 = time.monotonic()
        _native.memory_churn(args.gpu, args.allocator, pattern, 20261129, 0.8)
        print(f"churn {pattern} with {args.allocator}: {time.monotonic() - t0:.1f} s", flush=True)
        line(f"after {pattern}: native copy engine, fresh 4 GiB buffers", native_copy(args.gpu))
        line(f"after {pattern}: torch copy, 4 GiB buffers from BEFORE the churn", torch_copy(old_x, old_y))
        new_x, new_y = pair(4 * GIB)
        line(f"after {pattern}: torch copy, 4 GiB buffers from AFTER the churn", torch_copy(new_x, new_y))
        del new_x, new_y
        torch.cuda.empty_cache()
        for mib in (64, 512):
            sx, sy = pair(mib << 20)
            line(f"after {pattern}: torch copy, {mib} MiB buffers from after it", torch_copy(sx, sy, 200))
            del sx, sy
            torch.cuda.empty_cache()
        time.sleep(10)
        line(f"after {pattern} and 10 s idle: native copy engine", native_copy(args.gpu))
    free, _total = torch.cuda.mem_get_info()
    big = torch.empty(int(free * 0.9) // 4, dtype=torch.float32, device="cuda")
    del big
    torch.cuda.empty_cache()
    line("after one allocation of 90% of free memory, freed: native copy engine", native_copy(args.gpu))


if __name__ == "__main__":
    main()
