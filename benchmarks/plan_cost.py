"""What `mgpu-bench plan` costs as the history grows: the same question on a history of 100 stored
runs and on one of 20,000, each the real documents of tests/fixtures (the H200 runs, the 2x H200
comm sweep) and then more of them (MIX): half of them `check` runs, as a node that runs it every 10
minutes stores them (52,000 a year), the rest model runs of this workload and another, suites, comm
sweeps, GEMM and memory runs.

    python benchmarks/plan_cost.py [--runs 20000] [--repeat 3] [--json OUT] [--against TREE]

The extra runs are copies of stored ones, made in SQL (their row and their metrics, as
History.save writes them; a save validates each document, which would take minutes for 20,000).
Each plan is the tool's own command in a child process (imports and the workload's build on the
meta device included), --no-store; the median of --repeat wall times is reported with the load
average before and after (a loaded machine's figures are the load's as much as the plan's), and
the child's CPU time (user + system), which the load changes less. The
targets (issue 34): the large history within 1.5x of the small one, and under 5 s there on an
idle 2-core machine. --against TREE runs the same question with another checkout's mgpu_bench
as well (the code before issue 34, to see what the index saved). Exit code 1 when the ratio misses.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
QUESTION = ["plan", "--model", "350m", "--tokens", "300B", "--gpus", "64", "--network", "NDR", "--gpus-per-node", "8"]
RATIO_TARGET, SECONDS_TARGET = 1.5, 5.0


def load() -> float:
    return round(os.getloadavg()[0], 2)


def base_history(db: Path) -> dict[str, str]:
    """Every result document of tests/fixtures/gpu and the 2x H200 comm sweep, stored as the tool
    stores them; -> the run id of each by file name."""
    sys.path.insert(0, str(ROOT))
    from mgpu_bench.history import History

    ids = {}
    with History.open(db) as h:
        for f in sorted((FIX / "gpu").glob("*.json")) + [FIX / "comm_2x_h200.json"]:
            doc = json.loads(f.read_text())
            if isinstance(doc, dict) and doc.get("schema") == "mgpu-bench/result":
                ids[f.name] = h.save(doc)
    return ids


def grow(db: Path, run_id: str, copies: int) -> None:
    row = int(run_id[1:])
    con = sqlite3.connect(db)
    with con:
        for _ in range(copies):
            new = con.execute("INSERT INTO runs (created, kind, command, host, fingerprint, document) SELECT created, "
                              "kind, command, host, fingerprint, document FROM runs WHERE id = ?", (row,)).lastrowid
            con.execute("INSERT INTO metrics (run, name, value, unit, better, samples, labels) SELECT ?, name, value, "
                        "unit, better, samples, labels FROM metrics WHERE run = ?", (new, row))
    con.close()


# What the runs beyond the fixtures are, by share: mostly a node's `check` runs, then what a cluster
# also stores (model runs of this workload and of another, suites, comm sweeps, GEMM and memory runs).
MIX = (("check-1xh200.json", 0.50), ("model-healthy.json", 0.10), ("model-1xh200.json", 0.10),
       ("suite-quick-1xh200.json", 0.05), ("comm-small-1xh200.json", 0.10), ("comm_2x_h200.json", 0.05),
       ("gemm-dtypes-1xh200.json", 0.05), ("suite-quick-1xh200--max-batch.json", 0.05))


def build(db: Path, total: int) -> int:
    """A history of `total` runs: the fixtures, then copies of them in the shares of MIX."""
    ids = base_history(db)
    extra = max(0, total - len(ids))
    counts = [int(extra * share) for _, share in MIX]
    counts[0] += extra - sum(counts)
    for (name, _), n in zip(MIX, counts):
        grow(db, ids[name], n)
    con = sqlite3.connect(db)
    n = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    con.close()
    return n


def time_plan(db: Path, tree: Path, tmp: Path, repeat: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    walls, cpus, out = [], [], tmp / "plan.json"
    for _ in range(repeat):
        t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", *QUESTION, "--db", str(db), "--no-store",
                               "--no-progress", "--json", str(out)], capture_output=True, text=True, env=env,
                              check=False, cwd=tmp)
        walls.append(time.monotonic() - t0)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"plan failed ({proc.returncode}) on {db}:\n{proc.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    return {"median_s": statistics.median(walls), "walls_s": walls, "cpu_s": statistics.median(cpus), "cpus_s": cpus,
            "documents_read": doc.get("documents_read"),
            "days": (doc.get("answer") or {}).get("days")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--against", default=None, help="another checkout to time the same question with")
    a = ap.parse_args()
    result: dict = {"question": "mgpu-bench " + " ".join(QUESTION), "cpus": os.cpu_count(), "load_before": load()}
    with tempfile.TemporaryDirectory(prefix="plan-cost-") as t:
        tmp = Path(t)
        small, large = tmp / "small.sqlite3", tmp / "large.sqlite3"
        t0 = time.monotonic()
        result["small_runs"], result["large_runs"] = build(small, a.small), build(large, a.runs)
        result["build_s"] = time.monotonic() - t0
        for name, tree in (("this", ROOT), *((("against", Path(a.against)),) if a.against else ())):
            for size, db in (("small", small), ("large", large)):
                result[f"{name}_{size}"] = time_plan(db, tree, tmp, a.repeat)
                print(f"{name} tree, {result[f'{size}_runs']:,} runs: median {result[f'{name}_{size}']['median_s']:.2f} s "
                      f"of {[round(w, 2) for w in result[f'{name}_{size}']['walls_s']]} (CPU "
                      f"{result[f'{name}_{size}']['cpu_s']:.2f} s), "
                      f"{result[f'{name}_{size}']['documents_read']} documents read, load {load()}", flush=True)
    result["load_after"] = load()
    ratio = result["this_large"]["median_s"] / result["this_small"]["median_s"]
    cpu_ratio = result["this_large"]["cpu_s"] / result["this_small"]["cpu_s"]
    result["ratio"], result["cpu_ratio"] = ratio, cpu_ratio
    same = result["this_large"]["days"] == result["this_small"]["days"]
    print(f"{result['large_runs']:,} runs against {result['small_runs']:,}: {ratio:.2f}x by the wall clock, "
          f"{cpu_ratio:.2f}x in CPU time (target {RATIO_TARGET}x), "
          f"{result['this_large']['median_s']:.2f} s (target {SECONDS_TARGET:g} s on an idle 2-core machine); the same "
          f"answer: {same}; load average {result['load_before']} before, {result['load_after']} after, on "
          f"{result['cpus']} CPUs")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0 if min(ratio, cpu_ratio) <= RATIO_TARGET and same else 1


if __name__ == "__main__":
    sys.exit(main())
