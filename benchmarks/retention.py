"""A year of health checks stored in one node's history, as slurmd's HealthCheckInterval=600 (or
node-problem-detector's 10 m) stores them: 52,560 checks, one every 600 s.

    python benchmarks/retention.py [--runs 52000] [--keep 1000] [--db /tmp/retention.sqlite3]

Each run is the 1x H200 check of session 15 (tests/fixtures/gpu/check-1xh200.json) with its raw
samples at the lengths the check measures (10 GEMM bursts, 20 copies; the fixture keeps 5), a
reference of the node's last 5 passing checks as a check after its fifth carries, its figures
moved by a few percent and its time 600 s after the one before. Every run is stored by
History.save as the check's measuring process stores it (one transaction, its "keep" applied).

Printed, as the history grows: the database's size on disk, and the time of the reads a check and
a person make: the check's reference (reference._from: the newest 5 passing checks of the node),
`history list` (20 runs with their status), `history trend check.gpu0.tflops --host NODE` (20
points) and `history show latest` (the record and its metrics), each the median of 5. With --keep
0 every check stays (the growth without a limit); with the default the history holds the newest
1000 and the reads run on that.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def document_of(base: dict, i: int, when: dt.datetime, keep: int) -> dict:
    doc = copy.deepcopy(base)
    doc["created"] = when.isoformat(timespec="seconds")
    doc["keep"] = keep
    wobble = 1.0 + 0.02 * (((i * 7919) % 101) / 50.0 - 1.0)
    for part in doc["parts"]:
        for f in part.get("figures") or []:
            f["value"] *= wobble
            n = 10 if f["kind"] == "gemm" else 20
            base_samples = f.get("samples") or [f["value"]]
            f["samples"] = [base_samples[k % len(base_samples)] * wobble * (1 + 0.001 * k) for k in range(n)]
    metrics = {}
    for part in doc["parts"]:
        for f in part.get("figures") or []:
            name = f"check.{f['device']}.{'tflops' if f['kind'] == 'gemm' else 'copy_bandwidth'}"
            metrics[name] = {"value": f["value"], "unit": f["unit"], "noise": 0.012}
    doc["reference"] = {"kind": "recent", "runs": [f"r{max(1, i - k)}" for k in range(5, 0, -1)],
                        "label": "the median of this node's last 5 passing check(s)", "metrics": metrics}
    return doc


def timed(fn, repeat: int = 5) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def reads(db: Path, node: str) -> dict[str, float]:
    from click.testing import CliRunner

    from mgpu_bench.cli import cli
    from mgpu_bench.history import History
    from mgpu_bench.probes.check import reference

    def ref() -> None:
        with History.open(db, readonly=True) as h:
            got, why = reference._from(h, node)
            assert got is not None, why

    def listing() -> None:
        r = CliRunner().invoke(cli, ["history", "list", "--db", str(db)])
        assert r.exit_code == 0, r.output

    def trend() -> None:
        with History.open(db, readonly=True) as h:
            assert len(h.trend("check.gpu0.tflops", 20, node)) == 20

    def show() -> None:
        with History.open(db, readonly=True) as h:
            rec = h.get("latest")
            assert h.metrics(rec.run_id)

    return {"reference": timed(ref), "list": timed(listing), "trend": timed(trend), "show": timed(show)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=52_000)
    ap.add_argument("--keep", type=int, default=1000)
    ap.add_argument("--db", default="/tmp/mgpu-bench-retention.sqlite3")
    ap.add_argument("--at", default="100,20000,52000", help="run counts at which to measure")
    a = ap.parse_args()
    from mgpu_bench.history import History

    for suffix in ("", "-wal", "-shm"):
        Path(a.db + suffix).unlink(missing_ok=True)
    base = json.loads((ROOT / "tests/fixtures/gpu/check-1xh200.json").read_text())
    node = base["node"]
    at = {int(x) for x in a.at.split(",")}
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    print(f"load: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; keep {a.keep or 'all'}", flush=True)
    t0 = time.monotonic()
    with History.open(a.db) as h:
        for i in range(1, a.runs + 1):
            h.save(document_of(base, i, start + dt.timedelta(seconds=600 * i), a.keep))
            if i in at:
                h._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                r = reads(Path(a.db), node)
                stored = h._conn.execute("SELECT count(*) FROM runs").fetchone()[0]
                print(json.dumps({"checks": i, "stored": stored, "bytes": h.size(), "per_stored_run": h.size() // stored,
                                  "save_s_mean": (time.monotonic() - t0) / i, "load_1m": os.getloadavg()[0],
                                  **{f"{k}_ms": round(1e3 * v, 2) for k, v in r.items()}}), flush=True)


if __name__ == "__main__":
    main()
