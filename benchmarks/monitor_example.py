"""The README's StepMonitor loop as a program: a job of its own (the built-in GPT through a real
DataLoader), measured by the monitor and stored in the history as users run it (the store on:
$MGPU_BENCH_DB or the default database). benchmarks/gpu_smoke.sh runs it as its `monitor` row.

    python benchmarks/monitor_example.py --json job.json                  # a GPU: 125m, seq 512
    python benchmarks/monitor_example.py --model tiny --seq-len 64 --steps 20 --json job.json   # CPU
"""

from __future__ import annotations

import argparse
import contextlib


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="125m")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from mgpu_bench import StepMonitor, workloads

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    w = workloads.resolve(args.model, seq_len=args.seq_len)
    model = w.build(device)
    opt = w.optimizer(model)
    amp = w.autocast_dtype(device)
    loader = w.loader(args.batch_size, num_workers=args.num_workers, samples=args.batch_size * args.steps,
                      pin_memory=device.type == "cuda")

    mon = StepMonitor(name="smoke-example", tokens_per_sample=w.tokens_per_sample, model=model, optimizer=opt,
                      json=args.json)
    for batch in loader:
        with mon.step(samples=args.batch_size), mon.compute():
            batch = w.prepare(batch, device)
            with torch.autocast(device.type, dtype=amp) if amp else contextlib.nullcontext():
                loss = w.loss(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    doc = mon.finish()
    return 0 if (doc.get("status") or {}).get("completed", True) and doc.get("runs") else 1


if __name__ == "__main__":
    raise SystemExit(main())
