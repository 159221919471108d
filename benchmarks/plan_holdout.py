"""`mgpu-bench plan` against points held out of its history: each figure predicted from the others,
then measured, both printed.

    python benchmarks/plan_holdout.py cpu [--json OUT]   # 2 gloo processes, one thread each (any machine)
    python benchmarks/plan_holdout.py gpu [--json OUT]   # one GPU (the lead's H200 run)

cpu: the 2-process DDP step of the tiny GPT at batch 4 and seq 32, predicted from the 1-process step at batch 4,
  comm's measured gloo allreduce of the gradient's bytes and the overlap a 2-process run at batch 2
  measured; then measured. The 1- and 2-process steps at batch 4 come from one `model --scaling 1,2`
  run (back to back); the 2-process one is removed from the document before it is stored. Target:
  within 20% on an idle host (the 1-minute load average is printed before and after: above half the
  CPUs, the figures are noise, as compare's busy-host rule says).
gpu: the 350m step at batch 16 predicted from batches 4 and 8 (target: within 5%); for 125m, 350m
  and 760m the largest batch per GPU predicted from the peak memory at batches 4 and 8 against
  `memory --max-batch` (target: within 10%), and whether the predicted fit at that batch holds.

Every measurement is the tool's own command in a child process; nothing measured here is stored
outside a temporary history. Exit code 1 when a comparison misses its target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CPU_TARGET, STEP_TARGET, BATCH_TARGET = 0.20, 0.05, 0.10
BUSY_LOAD = 0.5  # per CPU: compare's busy-host rule (history/compare.py)


def cli(args: list[str], env: dict | None = None) -> str:
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", *args, "--no-progress"], capture_output=True,
                          text=True, check=False, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"mgpu-bench {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def load() -> dict:
    return {"load_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def store(db: Path, doc: dict) -> None:
    from mgpu_bench.history import History

    with History.open(db) as h:
        h.save(doc)


def plan(db: Path, tmp: Path, *args: str) -> dict:
    out = tmp / "plan.json"
    cli(["plan", *args, "--db", str(db), "--no-store", "--json", str(out)])
    return json.loads(out.read_text())


def curve_step(doc: dict, n: int) -> dict:
    return next(p for p in doc["curve"] if p["gpus"] == n)


def held_out(doc: dict, world: int) -> tuple[dict, dict]:
    """(the document without its run on `world` GPUs, that run)."""
    run = next(r for r in doc["runs"] if r["world"] == world and r["data"] == "synthetic")
    rest = dict(doc, runs=[r for r in doc["runs"] if r is not run], gpu_counts=[n for n in doc["gpu_counts"] if n != world],
                scaling={k: v for k, v in (doc.get("scaling") or {}).items() if int(k) != world})
    return rest, run


def cpu(tmp: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread each: two processes on two cores do not contend
    db = tmp / "h.sqlite3"
    before = load()
    # seq 32: a short step, so that the gradient allreduce (13 MB, the token table's) is a tenth of it, not a hundredth
    tiny = ["--model", "tiny", "--seq-len", "32", "--steps", "10", "--warmup-steps", "2"]
    overlap = tmp / "overlap.json"
    cli(["model", *tiny, "--nproc", "2", "--batch-size", "2", "--json", str(overlap), "--no-store"], env)
    store(db, json.loads(overlap.read_text()))
    comm = tmp / "comm.json"
    cli(["comm", "--backend", "torch", "--nproc", "2", "--ops", "allreduce", "--sizes", "4M-32M", "--json", str(comm),
         "--no-store"], env)
    store(db, json.loads(comm.read_text()))
    pair = tmp / "pair.json"
    cli(["model", *tiny, "--scaling", "1,2", "--batch-size", "4", "--json", str(pair), "--no-store"], env)
    rest, two = held_out(json.loads(pair.read_text()), 2)
    store(db, rest)
    predicted = curve_step(plan(db, tmp, "--model", "tiny", "--seq-len", "32", "--batch-size", "4", "--gpus", "2",
                                "--tokens", "1M"), 2)
    measured = float(two["derived"]["step_s"])
    after = load()
    error = predicted["step_s"] / measured - 1
    return {"what": "tiny, 2 gloo processes, batch 4: DDP step", "predicted_s": predicted["step_s"],
            "range_s": [predicted["low_s"], predicted["high_s"]], "measured_s": measured, "error": error,
            "compute_s": predicted["compute_s"], "comm_s": predicted["comm_s"], "exposed_s": predicted["exposed_s"],
            "target": CPU_TARGET, "ok": abs(error) <= CPU_TARGET, "load_before": before, "load_after": after,
            "busy": max(before["load_1m"], after["load_1m"]) > BUSY_LOAD * (before["cpus"] or 1)}


def gpu(tmp: Path) -> list[dict]:
    """On one GPU: the runs the plan reads (peak memory of 125m, 350m and 760m at batches 4 and 8,
    with the 350m step times), the held-out 350m step at batch 16, and the largest batch without
    checkpointing of each model, found as `memory --max-batch MODEL` finds it (torch_memory.max_batch,
    its without-checkpointing half: the plan's DDP fit has no checkpointing)."""
    from mgpu_bench.probes.memory import torch_memory

    db = tmp / "h.sqlite3"
    out = []
    timed = ["--steps", "20", "--warmup-steps", "5", "--gpus", "1", "--no-exposed-comm", "--no-profile"]
    memory_only = ["--steps", "6", "--warmup-steps", "2", "--gpus", "1", "--no-exposed-comm", "--no-profile"]
    for model in ("350m", "125m", "760m"):  # 350m first: the step prediction needs only its runs
        for batch in (4, 8):
            doc = tmp / f"{model}-{batch}.json"
            cli(["model", "--model", model, "--batch-size", str(batch), *(timed if model == "350m" else memory_only),
                 "--json", str(doc), "--no-store"])
            store(db, json.loads(doc.read_text()))
    p = plan(db, tmp, "--model", "350m", "--batch-size", "16", "--gpus", "1")
    predicted = curve_step(p, 1)
    doc = tmp / "350m-16.json"
    cli(["model", "--model", "350m", "--batch-size", "16", *timed, "--json", str(doc), "--no-store"])
    measured = float(next(r for r in json.loads(doc.read_text())["runs"] if r["world"] == 1)["derived"]["step_s"])
    error = predicted["step_s"] / measured - 1
    out.append({"what": "350m step at batch 16 from batches 4 and 8", "predicted": predicted["step_s"],
                "measured": measured, "unit": "s", "error": error, "target": STEP_TARGET,
                "ok": abs(error) <= STEP_TARGET})
    print("row:", json.dumps(out[-1]), file=sys.stderr, flush=True)  # kept should a later part be cut short
    for model in ("125m", "350m", "760m"):
        p = plan(db, tmp, "--model", model, "--batch-size", "8", "--gpus", "1")
        found = torch_memory.max_batch(model, 2048, checkpointing=False)
        if found.get("error"):
            raise SystemExit(f"max batch of {model}: {found['error']}")
        pred, meas = p["fit"]["largest_batch_ddp"], int(found["max_batch"])
        error = pred / meas - 1 if pred is not None and meas else float("nan")
        out.append({"what": f"{model} largest batch per GPU (seq 2048) from batches 4 and 8", "predicted": pred,
                    "measured": meas, "unit": "samples", "error": error, "target": BATCH_TARGET,
                    "ok": abs(error) <= BATCH_TARGET, "search_s": found.get("wall_s"),
                    "fit_at_batch_8": p["fit"]["ddp"]["fits"], "reserved_at_batch_8": p["fit"]["ddp"]["reserved"],
                    "capacity": p["fit"]["ddp"]["capacity"]})
        print("row:", json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", choices=["cpu", "gpu"])
    ap.add_argument("--json", default=None, help="write the comparisons here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="plan-holdout-") as tmp:
        rows = [cpu(Path(tmp))] if a.which == "cpu" else gpu(Path(tmp))
    for r in rows:
        if a.which == "cpu":
            print(f"{r['what']}: predicted {1e3 * r['predicted_s']:.1f} ms (range {1e3 * r['range_s'][0]:.1f} - "
                  f"{1e3 * r['range_s'][1]:.1f}; compute {1e3 * r['compute_s']:.1f} + exposed {1e3 * r['exposed_s']:.1f} "
                  f"of a {1e3 * r['comm_s']:.1f} ms allreduce), measured {1e3 * r['measured_s']:.1f} ms: "
                  f"{100 * r['error']:+.1f}% (target {100 * r['target']:.0f}%); load {r['load_before']['load_1m']} "
                  f"before, {r['load_after']['load_1m']} after, on {r['load_before']['cpus']} CPUs"
                  + (" (busy: noise)" if r["busy"] else ""))
        else:
            print(f"{r['what']}: predicted {r['predicted']}, measured {r['measured']} {r['unit']}: "
                  f"{100 * r['error']:+.1f}% (target {100 * r['target']:.0f}%)" + ("" if r["ok"] else "  MISSED"))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
