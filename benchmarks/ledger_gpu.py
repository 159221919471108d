"""Issue 40 on one GPU: the step ledger of a job waiting on its DataLoader, from StepMonitor and from
`mgpu-bench model --data both` over the same loop.

The loop: a built-in workload (default 125m, seq 512, batch 8) through the workload's own DataLoader
(workloads.Workload.loader, the one `model --data loader` uses) with `--num-workers 0` and
`--preprocess-ms` per sample (a sleep standing for a CPU transform: the batch is never in hand when
the GPU is done), bf16 autocast, the workload's optimizer. First the loop monitored by StepMonitor
(store on: $MGPU_BENCH_DB or the default history), then `mgpu-bench model` on the same workload,
batch, workers and preprocessing with `--data both`. Printed: each one's verdict, ledger line, gross
and effective throughput, and whether the two name the same bound.

    python benchmarks/ledger_gpu.py --json-dir OUT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="125m")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--preprocess-ms", type=float, default=5.0)
    ap.add_argument("--json-dir", default=".")
    args = ap.parse_args()

    import torch

    from mgpu_bench import StepMonitor, workloads

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    w = workloads.resolve(args.model, seq_len=args.seq_len)
    model = w.build(device)
    opt = w.optimizer(model)
    amp = w.autocast_dtype(device)
    warm = 5 + 3  # the monitor's warm-up and profiled steps (not timed)
    loader = w.loader(args.batch_size, num_workers=args.num_workers, preprocess_ms=args.preprocess_ms,
                      samples=args.batch_size * (args.steps + warm), pin_memory=device.type == "cuda")
    mon_json = os.path.join(args.json_dir, "ledger-monitor.json")
    mon = StepMonitor(name="ledger-slow-loader", tokens_per_sample=w.tokens_per_sample, model=model, optimizer=opt,
                      json=mon_json)
    for batch in loader:
        with mon.step(samples=args.batch_size), mon.compute():
            batch = w.prepare(batch, device)
            with torch.autocast(device.type, dtype=amp) if amp else contextlib.nullcontext():
                loss = w.loss(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    doc = mon.finish()
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()

    model_json = os.path.join(args.json_dir, "ledger-model-both.json")
    cmd = [sys.executable, "-m", "mgpu_bench.cli", "model", "--model", args.model, "--seq-len", str(args.seq_len),
           "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--data", "both", "--num-workers",
           str(args.num_workers), "--preprocess-ms", str(args.preprocess_ms), "--json", model_json, "--no-progress"]
    print("$", " ".join(cmd[2:]), flush=True)
    proc = subprocess.run(cmd, text=True, capture_output=True, check=False)
    print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n", flush=True)
    with open(model_json) as f:
        both = json.load(f)

    def bound(d: dict) -> str:
        v = next((f for f in d.get("findings") or [] if f.startswith(("1 GPU(s): ", "1 process(es): "))), "-")
        return v.split(": ", 2)[1] if ": " in v else v

    def ledger(d: dict, data: str | None = None) -> dict:
        runs = [r for r in d.get("runs") or [] if data is None or r["data"] == data]
        return (runs[0].get("ledger") or {}).get("shares") or {} if runs else {}

    j = doc.get("job") or {}
    gross, eff = j.get("gross_samples_per_s"), j.get("effective_samples_per_s")
    print(f"monitor: gross {gross:,.1f} samples/s, effective {eff:,.1f} samples/s: loss {100 * (1 - gross / eff):.1f}%; "
          f"ledger {json.dumps({k: round(100 * v, 1) for k, v in ledger(doc).items()})}; bound: {bound(doc)}")
    print(f"model --data both: ledger (loader) "
          f"{json.dumps({k: round(100 * v, 1) for k, v in ledger(both, 'loader').items()})}; bound: {bound(both)}")
    print(f"same bound: {bound(doc) == bound(both)}")
    return 0 if bound(doc) == bound(both) else 1


if __name__ == "__main__":
    sys.exit(main())
