"""`mgpu-bench plan` against the end-to-end training times Megatron-LM published (Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC21): given
each configuration and its achieved per-GPU rate, the plan's days beside the paper's, and the
memory per GPU the plan gives that configuration against an A100 80GB.

    python benchmarks/plan_megatron.py [--json OUT]

The rows: section 5.1's two estimates (GPT-3 175B, 300B tokens, 1,024 A100 at 140 TFLOP/s: about
34 days; 1T parameters, 450B tokens, 3,072 A100 at 163 TFLOP/s: about 84 days) and Table 2's
PTD-P rows (174.6B and 529.6B parameters, 300B tokens each, model-parallel sizes 96 and 280: tp 8
within a node and pp 12 and 35). For the 175B row at 1,024 GPUs the paper gives no degrees: tp 8
(Table 1 has tp 8 from 18B up) and pp 16 (a divisor of 96 layers that leaves whole replicas).
Every model at sequence 2048, vocabulary 51,200, micro-batch 1, with recomputation (section 5.1:
their FLOP count, equation 3, assumes it). Nothing is measured: the history is empty and the
rate is the paper's (--rate, labelled assumed). Exit code 1 when a row misses 10%.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET = 0.10
GIB = float(1 << 30)
# (what, layers, width, heads, tokens, GPUs, tp, pp, global batch, TFLOP/s per GPU, the paper's days)
ROWS = [
    ("GPT-3 175B, section 5.1", 96, 12288, 96, "300B", 1024, 8, 16, 1536, 140, 34),
    ("1T, section 5.1 (Table 1's last row)", 128, 25600, 160, "450B", 3072, 8, 64, 3072, 163, 84),
    ("174.6B, Table 2 PTD-P", 96, 12288, 96, "300B", 384, 8, 12, 1536, 153, 84),
    ("174.6B, Table 2 PTD-P", 96, 12288, 96, "300B", 768, 8, 12, 1536, 149, 43),
    ("174.6B, Table 2 PTD-P", 96, 12288, 96, "300B", 1536, 8, 12, 1536, 141, 23),
    ("529.6B, Table 2 PTD-P", 105, 20480, 128, "300B", 560, 8, 35, 2240, 171, 156),
    ("529.6B, Table 2 PTD-P", 105, 20480, 128, "300B", 1120, 8, 35, 2240, 167, 80),
    ("529.6B, Table 2 PTD-P", 105, 20480, 128, "300B", 2240, 8, 35, 2240, 159, 42),
]


def plan(tmp: Path, row: tuple) -> dict:
    what, layers, width, heads, tokens, gpus, tp, pp, batch, rate, paper = row
    out = tmp / "plan.json"
    args = ["plan", "--model", f"layers={layers},width={width},heads={heads},vocab=51200", "--tokens", tokens,
            "--gpus", str(gpus), "--parallel", f"tp={tp},pp={pp}", "--checkpointing", "--global-batch", str(batch),
            "--batch-size", "1", "--gpu", "a100_sxm4_80gb", "--rate", f"{rate}T", "--network", "HDR",
            "--db", str(tmp / "h.sqlite3"), "--no-store", "--no-progress", "--json", str(out)]
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", *args], capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"mgpu-bench {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    doc = json.loads(out.read_text())
    a = doc["answer"]
    days = a.get("days")
    return {"what": what, "params": doc["workload"]["params"], "gpus": gpus, "tp": tp, "pp": pp, "dp": gpus // (tp * pp),
            "global_batch": batch, "micro_batches": a.get("micro_batches"), "rate_tflops": rate, "paper_days": paper,
            "plan_days": days, "error": None if days is None else days / paper - 1, "fits": a.get("fits"),
            "memory_gib": None if a.get("memory") is None else a["memory"] / GIB,
            "ok": days is not None and abs(days / paper - 1) <= TARGET and a.get("fits") is True}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="plan-megatron-") as tmp:
        rows = [plan(Path(tmp), r) for r in ROWS]
    print("| model | GPUs | tp x pp x dp | global batch (micro-batches) | TFLOP/s per GPU | paper | plan | "
          "difference | memory per GPU (of 80 GiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} ({r['params'] / 1e9:.1f}B) | {r['gpus']:,} | {r['tp']} x {r['pp']} x {r['dp']} | "
              f"{r['global_batch']:,} ({r['micro_batches']}) | {r['rate_tflops']} | {r['paper_days']} days | "
              f"{r['plan_days']:.1f} days | {100 * r['error']:+.1f}% | {r['memory_gib']:.1f} GiB"
              + ("" if r["ok"] else " MISSED") + " |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
