"""mgpu-bench's GEMM probe against torch.matmul on the same GPU, shape and dtype, in one process.

    python benchmarks/gemm_vs_torch.py --shape 8192 --dtypes bf16,fp16,tf32 [--gpu 0]

torch is timed the plain way: random inputs, 10 warm-up matmuls, then 5 bursts of matmuls
filling about 0.1 s each, CUDA events at each burst's ends; its figure is the median burst.
torch runs before and after the probe so that a warming GPU does not favour either side.
fp8 goes through torch._scaled_mm (e4m3 inputs, bf16 output, unit scales) where available.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mgpu_bench.machine.selection import require_gpus
from mgpu_bench.probes.gemm import measure as gemm
from mgpu_bench.probes.gemm.measure import GemmConfig, Shape

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32,
                "fp64": torch.float64}


def torch_tflops(dtype: str, shape: Shape, gpu: int, init: str = "uniform", bursts: int = 5,
                 burst_s: float = 0.1) -> float:
    """init as the probe's --init: uniform in [-1, 1), normal (randn), positive (rand in [0, 1))."""
    dev = torch.device("cuda", gpu)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    t = torch.float32 if dtype == "fp8" else TORCH_DTYPES[dtype]

    def make(rows: int, cols: int) -> torch.Tensor:
        if init == "normal":
            return torch.randn(rows, cols, device=dev, dtype=t)
        x = torch.rand(rows, cols, device=dev, dtype=t)
        return x if init == "positive" else x * 2 - 1

    if dtype == "fp8":
        a = make(shape.m, shape.k).to(torch.float8_e4m3fn)
        b = make(shape.n, shape.k).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.ones((), device=dev)

        def step():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        a, b = make(shape.m, shape.k), make(shape.k, shape.n)

        def step():
            return torch.matmul(a, b)
    for _ in range(10):
        step()
    torch.cuda.synchronize(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        step()
    end.record()
    end.synchronize()
    iters = max(1, round(burst_s / (start.elapsed_time(end) / 3e3)))
    per = []
    for _ in range(bursts):
        start.record()
        for _ in range(iters):
            step()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / 1e3 / iters)
    return shape.flops / statistics.median(per) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192")
    ap.add_argument("--dtypes", default="bf16,fp16,tf32,fp8")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--inits", default="uniform", help="comma-separated: uniform, normal, positive")
    args = ap.parse_args()
    (shape,) = gemm.parse_shapes(args.shape)
    _, devices = require_gpus("gemm", None)
    devices = [d for d in devices if d["index"] == args.gpu]
    for dtype in gemm.parse_dtypes(args.dtypes):
        for init in args.inits.split(","):
            before = torch_tflops(dtype, shape, args.gpu, init)
            t0 = time.monotonic()
            run = gemm.run_gemm(GemmConfig(dtypes=(dtype,), shapes=(shape,), gpus=(args.gpu,), init=init), devices)
            wall = time.monotonic() - t0
            after = torch_tflops(dtype, shape, args.gpu, init)
            (r,) = run.results
            if r.best is None:
                errors = "; ".join(sorted({c.error or "wrong results" for c in r.candidates}))
                print(f"{dtype} {shape} {init}: mgpu-bench has no result ({errors}) | torch {before:.1f} before, "
                      f"{after:.1f} after", flush=True)
                continue
            first = r.heuristic_first
            first_tf = shape.flops / first.median_s / 1e12 if first and first.median_s else float("nan")
            clock = (r.telemetry or {}).get("sm_hz_median") or float("nan")
            ref = max(before, after)
            print(f"{dtype} {shape} {init}: mgpu-bench {r.tflops:.1f} TFLOP/s (best {r.best.name()}, heuristic's "
                  f"first {first_tf:.1f}; {r.pct_peak or float('nan'):.1f}% of peak; SM {clock / 1e6:.0f} MHz; probe "
                  f"{wall:.2f} s incl. selection) | torch {before:.1f} before, {after:.1f} after | "
                  f"mgpu-bench - best torch = {100 * (r.tflops / ref - 1):+.1f}%", flush=True)


if __name__ == "__main__":
    main()
