"""A history database written by the release before the probe protocol (0.1.0 at commit 43889e3,
tests/fixtures/history/release-0.1.0.sqlite3: two gloo comm sweeps, r1 the comm baseline, a tiny
model run and a CPU suite of round 2, all real runs of that code on the CPU machine) still loads,
its documents are read by today's probes into the same metrics, and today's runs compare with it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_bench.history import History
from mgpu_bench.results.probe import headline

RELEASE = Path(__file__).parent / "fixtures" / "history" / "release-0.1.0.sqlite3"


@pytest.fixture
def db(tmp_path) -> Path:
    copy = tmp_path / "history.sqlite3"
    shutil.copy(RELEASE, copy)
    return copy


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mgpu_bench.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_the_release_database_loads_with_its_runs_and_baseline(db):
    with History.open(db) as h:
        runs = h.list()
        assert [(r.run_id, r.kind) for r in runs] == [("r4", "suite"), ("r3", "model"), ("r2", "comm"),
                                                      ("r1", "comm")]
        assert h.baseline("comm") == "r1"


def test_todays_probes_read_the_stored_documents_into_the_stored_metrics(db):
    """The metrics the old release stored are what today's probes compute from the same
    documents: names, values, units and direction. Today's may add metrics the old release did
    not have (samples/s beside tokens/s since workloads other than the GPT were measured), never
    change or drop one."""
    with History.open(db) as h:
        for info in h.list():
            stored = {m.name: (m.value, m.unit, m.better) for m in h.metrics(info.run_id)}
            again = {m.name: (m.value, m.unit, m.better) for m in headline(h.get(info.run_id).document)}
            assert stored and {k: again.get(k) for k in stored} == stored, info.run_id
            assert all(k.endswith(".samples_per_s") for k in set(again) - set(stored)), info.run_id


def test_compare_and_report_work_across_the_release(db, tmp_path):
    proc = _cli("compare", "r2", "--db", str(db), "--json", str(tmp_path / "cmp.json"))
    assert proc.returncode in (0, 1), proc.stderr
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert cmp["base"] == "r1" and {c["status"] for c in cmp["changes"]} <= {"regression", "improvement",
                                                                             "within noise", "unchanged"}
    with History.open(db) as h:
        suite = h.get("r4").document
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    proc = _cli("report", str(tmp_path / "suite.json"), "--out", str(tmp_path / "again"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "verdict" in (tmp_path / "again" / "report.html").read_text()


def test_a_run_of_today_is_stored_beside_them_and_compared_with_the_old_baseline(db, tmp_path):
    proc = _cli("comm", "--backend", "torch", "--ops", "allreduce", "--sizes", "1K,64M", "--iters", "4", "--timeout", "900",
                "--warmup-iters", "2", "--no-progress", "--db", str(db))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stored as r5" in proc.stderr
    proc = _cli("compare", "r5", "--db", str(db), "--json", str(tmp_path / "cmp.json"))
    assert proc.returncode in (0, 1, 4), proc.stderr  # 4: cannot tell (today's run on a busy CPU host)
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert cmp["base"] == "r1" and cmp["new"] == "r5"
    names = {c["name"] for c in cmp["changes"]}
    assert len(names) == 4 and {c["status"] for c in cmp["changes"]}.isdisjoint({"added", "missing"})
