"""A year of health checks stored in one node's history, as slurmd's HealthCheckInterval=600 (or
node-problem-detector's 10 m) stores them: 52,000 checks, one every 600 s.

    python benchmarks/retention.py [--runs 52000] [--keep 1000] [--db /tmp/retention.sqlite3]

Each run is the 1x H200 check of session 15 (tests/fixtures/gpu/check-1xh200.json) with its raw
samples at the lengths the check measures (10 GEMM bursts, 20 copies; the fixture keeps 5), a
reference of the node's last 5 passing checks as a check after its fifth carries, its figures
moved by a few percent and its time 600 s after the one before. Every run is stored by
History.save as the check's measuring process stores it (one transaction, its "keep" applied).

First the history is built, a copy of it taken (SQLite's backup) at each count of --at; then the
reads a check and a person make are timed on every copy, one after the other in the same
conditions: the check's reference (reference._from: the newest 5 passing checks of the node),
`history list` (20 runs with their status, the table printed), `history trend check.gpu0.tflops
--host NODE` (20 points) and `history show latest` (the record and its metrics); each the best
and the median of --repeat. Printed per copy: runs stored, bytes on disk, bytes per stored run,
and those times. With --keep 0 every check stays (the growth without a limit); with the default
the history holds the newest 1000.
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


def timed(fn, repeat: int) -> tuple[float, float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out), statistics.median(out)


def reads(db: Path, node: str, repeat: int) -> dict[str, tuple[float, float]]:
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

    return {"reference": timed(ref, repeat), "list": timed(listing, repeat), "trend": timed(trend, repeat),
            "show": timed(show, repeat)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=52_000)
    ap.add_argument("--keep", type=int, default=1000)
    ap.add_argument("--db", default="/tmp/mgpu-bench-retention.sqlite3")
    ap.add_argument("--at", default="100,20000,52000", help="run counts at which to copy the history")
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    import sqlite3

    from mgpu_bench.history import History

    base = json.loads((ROOT / "tests/fixtures/gpu/check-1xh200.json").read_text())
    node = base["node"]
    at = sorted(int(x) for x in a.at.split(","))
    copies = {n: Path(f"{a.db}.{n}") for n in at}
    for path in [Path(a.db), *copies.values()]:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    t0 = time.monotonic()
    with History.open(a.db) as h:
        for i in range(1, a.runs + 1):
            h.save(document_of(base, i, start + dt.timedelta(seconds=600 * i), a.keep))
            if i in copies:
                with sqlite3.connect(copies[i]) as dst:
                    h._conn.backup(dst)
    build_s = time.monotonic() - t0
    print(json.dumps({"built": a.runs, "keep": a.keep or "all", "seconds": round(build_s, 1),
                      "save_ms_mean": round(1e3 * build_s / a.runs, 2)}), flush=True)
    print(f"reads: load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    for n, path in copies.items():
        with History.open(path, readonly=True) as h:
            stored = h._conn.execute("SELECT count(*) FROM runs").fetchone()[0]
            size = h.size()
        r = reads(path, node, a.repeat)
        print(json.dumps({"checks": n, "stored": stored, "bytes": size, "per_stored_run": size // stored,
                          "load_1m": round(os.getloadavg()[0], 1),
                          **{f"{k}_ms": [round(1e3 * best, 2), round(1e3 * med, 2)] for k, (best, med) in r.items()}}),
              flush=True)


if __name__ == "__main__":
    main()
