"""Native comm in one process (one host thread per GPU) against native comm under torchrun (one
process per GPU, NCCL unique id through the launcher's store), same sizes, alternating runs.

    python benchmarks/comm_joined_vs_single.py --ops allreduce,allgather --sizes 64M,256M,1G --rounds 2

Prints busbw per op and size for each mode and round, and the joined mode's difference from the
single-process mode (median over rounds). The issue-7 target: within 2% at >= 64 MiB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(mode: str, ops: str, sizes: str, nproc: int, out: Path) -> dict[tuple[str, int], float]:
    common = ["comm", "--ops", ops, "--sizes", sizes, "--outofplace", "--no-progress", "--json", str(out)]
    if mode == "single":
        cmd = [sys.executable, "-m", "mgpu_bench.cli", *common, "--gpus", str(nproc)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "mgpu_bench.cli", *common]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    doc = json.loads(out.read_text())
    assert doc["backend"] == "native", doc["backend"]
    from mgpu_bench.results.measurement import CommMeasurement

    ms = [CommMeasurement.from_dict(d) for d in doc["measurements"]]
    return {(m.spec.op, m.spec.bytes): m.busbw for m in ms if m.spec.scope == "world"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="allreduce,allgather")
    ap.add_argument("--sizes", default="64M,256M,1G")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    results: dict[str, list[dict]] = {"single": [], "joined": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for mode in ("single", "joined") if r % 2 == 0 else ("joined", "single"):
                results[mode].append(run(mode, a.ops, a.sizes, a.nproc, Path(tmp) / f"{mode}{r}.json"))
    print(f"{'op':<12}{'bytes':>12}  {'single GB/s (rounds)':<26}{'joined GB/s (rounds)':<26}{'joined vs single':>16}")
    for key in results["single"][0]:
        s = [x[key] / 1e9 for x in results["single"]]
        j = [x[key] / 1e9 for x in results["joined"]]
        diff = 100 * (statistics.median(j) / statistics.median(s) - 1)
        print(f"{key[0]:<12}{key[1]:>12}  {' '.join(f'{v:.1f}' for v in s):<26}{' '.join(f'{v:.1f}' for v in j):<26}"
              f"{diff:>+15.1f}%")


if __name__ == "__main__":
    main()
