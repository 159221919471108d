"""A plain hand-written training loop of the built-in GPT, for `mgpu-bench model`'s overhead
target: same model, batch, sequence length, bf16 autocast and fused AdamW, synthetic tokens on
the device; no events, no phases: host clock around the timed steps with one synchronize at
each end.

    python benchmarks/plain_gpt_loop.py --model 350m --seq-len 2048 --batch-size 8 --steps 30 [--compile]

With --compile the model goes through torch.compile first (default mode); the first warm-up
step, which compiles, is timed apart.
"""

from __future__ import annotations

import argparse
import time

import torch

from mgpu_bench.workloads import gpt as models


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="350m")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    spec = models.get_model_spec(args.model)
    dev = torch.device("cuda", 0)
    torch.manual_seed(1234)
    model = models.GPT(spec, device=dev)
    opt = models.make_optimizer(model)
    if args.compile:
        model = torch.compile(model)
    gen = torch.Generator(device=dev).manual_seed(1234)
    t0 = time.perf_counter()
    for i in range(args.warmup_steps):
        if i == 1:
            torch.cuda.synchronize()
            print(f"first step (compile included): {time.perf_counter() - t0:.1f} s", flush=True)
        x, y = models.synthetic_batch(spec, args.batch_size, args.seq_len, dev, gen)
        models.train_step(model, opt, x, y, torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        x, y = models.synthetic_batch(spec, args.batch_size, args.seq_len, dev, gen)
        models.train_step(model, opt, x, y, torch.bfloat16)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    tokens = args.batch_size * args.seq_len / dt
    mfu = tokens * models.flops_per_token(spec, args.seq_len) / 989e12
    print(f"plain loop{' compiled' if args.compile else ''} {spec.name} seq {args.seq_len} batch {args.batch_size}: {dt * 1e3:.1f} ms/step, "
          f"{tokens:.0f} tokens/s, MFU {100 * mfu:.1f}% of 989 TFLOP/s (6N + 12 L d T)", flush=True)


if __name__ == "__main__":
    main()
