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

from mgpu_bench import gemm
from mgpu_bench.gemm import GemmConfig, Shape

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32,
                "fp64": torch.float64}


def torch_tflops(dtype: str, shape: Shape, gpu: int, bursts: int = 5, burst_s: float = 0.1) -> float:
    dev = torch.device("cuda", gpu)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    if dtype == "fp8":
        a = (torch.rand(shape.m, shape.k, device=dev) * 2 - 1).to(torch.float8_e4m3fn)
        b = (torch.rand(shape.n, shape.k, device=dev) * 2 - 1).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device=dev)

        def step():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        t = TORCH_DTYPES[dtype]
        a = torch.rand(shape.m, shape.k, device=dev, dtype=t) * 2 - 1
        b = torch.rand(shape.k, shape.n, device=dev, dtype=t) * 2 - 1

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
    args = ap.parse_args()
    (shape,) = gemm.parse_shapes(args.shape)
    _, devices = gemm.devices_or_error(str(args.gpu))
    devices = [d for d in devices if d["index"] == args.gpu] or devices
    for dtype in gemm.parse_dtypes(args.dtypes):
        before = torch_tflops(dtype, shape, args.gpu)
        t0 = time.monotonic()
        run = gemm.run_gemm(GemmConfig(dtypes=(dtype,), shapes=(shape,), gpus=(args.gpu,)), devices)
        wall = time.monotonic() - t0
        after = torch_tflops(dtype, shape, args.gpu)
        (r,) = run.results
        first = r.heuristic_first
        first_tf = shape.flops / first.median_s / 1e12 if first and first.median_s else float("nan")
        ref = max(before, after)
        print(f"{dtype} {shape}: mgpu-bench {r.tflops:.1f} TFLOP/s (best {r.best.name()}, heuristic's first "
              f"{first_tf:.1f}; {r.pct_peak or float('nan'):.1f}% of peak; probe {wall:.2f} s incl. selection) | "
              f"torch {before:.1f} before, {after:.1f} after | mgpu-bench - best torch = "
              f"{100 * (r.tflops / ref - 1):+.1f}%", flush=True)


if __name__ == "__main__":
    main()
