"""The history's retention (issue 33): a check's own limit applied as it is stored, `history prune`
by age and count per kind and host, baselines and the runs they reference always kept, raw samples
dropped while headline metrics stay, reads that do not grow with the history (their query plans
walk an index from the newest row), and the file's faults named as what they are (a full disk, a
path that is not UTF-8). Real SQLite files throughout."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.core.errors import InputError
from mgpu_bench.history import History
from mgpu_bench.history.retention import references

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpu" / "check-1xh200.json"


def check_doc(node: str, minute: int, keep: int | None = None, refs: list[str] | None = None,
              day: int = 1) -> dict:
    doc = json.loads(FIXTURE.read_text())
    doc["node"] = doc["environment"]["host"] = node
    doc["created"] = f"2026-11-{day:02d}T10:{minute:02d}:00+00:00"
    if keep is not None:
        doc["keep"] = keep
    if refs:
        doc["reference"] = {"kind": "recent", "runs": refs, "label": "recent", "metrics": {}}
    return doc


def _runs(db: Path) -> list[tuple[str, str]]:
    with History.open(db, readonly=True) as h:
        return [(r.run_id, r.host) for r in h.list(1000)]


def test_a_check_keeps_its_nodes_newest_runs_and_every_baseline_with_its_references(tmp_path):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        for i in range(3):
            h.save(check_doc("a", i))  # r1-r3
        base = h.save(check_doc("a", 3, refs=["r1", "r2"]))  # r4, judged against r1 and r2
        h.set_baseline(base)
        for i in range(4, 9):
            h.save(check_doc("a", i, keep=3))  # r5-r9
        h.save(check_doc("b", 9, keep=3))  # another node's runs are its own
        h.save(check_doc("b", 10))  # no keep: nothing removed for it
    runs = _runs(db)
    assert [r for r, host in runs if host == "a"] == ["r9", "r8", "r7", "r4", "r2", "r1"]
    assert [r for r, host in runs if host == "b"] == ["r11", "r10"]
    with History.open(db) as h:  # the baseline's metrics and document are whole
        assert h.metrics("r4") and h.get("r4").document["reference"]["runs"] == ["r1", "r2"]


def test_references_are_the_run_ids_a_document_names_as_its_sources():
    doc = {"reference": {"runs": ["r3", "r12"]}, "fit": {"max_batch_measured": [{"run": "r7"}]},
           "points": [{"source": "r9 (suite: model)"}, {"source": "theory.py"}], "name": "r5 is no field of these"}
    assert references(doc) == {3, 12, 7, 9}


def _cli(*args: str):
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output


def test_prune_by_count_and_age_per_kind_and_host_keeps_baselines_and_compacts(tmp_path):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        for day in range(1, 11):
            h.save(check_doc("a", 0, day=day))  # r1-r10, one a day
        h.save(check_doc("b", 0, day=10))  # r11
        h.set_baseline("r2")
    size = db.stat().st_size
    code, out = _cli("history", "prune", "--keep", "3", "--kind", "check", "--host", "a", "--dry-run", "--db", str(db))
    assert code == 0 and "would remove 6 of 10 run(s) considered (check on a: 6); 1 kept as baselines" in out, out
    assert len(_runs(db)) == 11
    code, out = _cli("history", "prune", "--keep", "3", "--db", str(db))
    assert code == 0 and "removed 6 of 11 run(s) considered (check on a: 6)" in out, out
    assert [r for r, _ in _runs(db)] == ["r11", "r10", "r9", "r8", "r2"]
    code, out = _cli("history", "prune", "--older-than", "36500d", "--db", str(db))
    assert code == 0 and "removed 0 of 5" in out
    code, out = _cli("history", "prune", "--older-than", "1h", "--db", str(db))  # 2026-12 is past: all but r2 go
    assert code == 0 and "removed 4 of 5" in out and "1 kept as baselines" in out, out
    assert [r for r, _ in _runs(db)] == ["r2"]
    assert db.stat().st_size < size  # VACUUM gave the pages back
    code, out = _cli("history", "show", "r2", "--db", str(db))
    assert code == 0 and "check.gpu0.tflops" in out


@pytest.mark.parametrize("args, words", [
    ([], "say what to prune"), (["--older-than", "3m"], "is not an age"), (["--older-than", "-1d"], "is not an age"),
    (["--keep", "x"], "--keep"), (["--keep", "1", "--kind", "nope"], "not a kind of run"),
])
def test_prune_refuses_bad_input_in_one_line(tmp_path, args, words):
    db = tmp_path / "h.sqlite3"
    History.open(db).close()
    code, out = _cli("history", "prune", *args, "--db", str(db))
    assert code == 2 and len(out.strip().splitlines()) == 1 and words in out, out


def test_dropping_samples_keeps_the_runs_and_their_headline_metrics(tmp_path):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        for i in range(4):
            h.save(check_doc("a", i))
        before = {m.name: m.value for m in h.metrics("r1")}
        assert any(m.samples for m in h.metrics("r1"))
    code, out = _cli("history", "prune", "--keep", "1", "--drop-samples", "--db", str(db))
    assert code == 0 and "thinned 3 of 4" in out, out
    with History.open(db, readonly=True) as h:
        assert len(h.list()) == 4
        assert {m.name: m.value for m in h.metrics("r1")} == before and not any(m.samples for m in h.metrics("r1"))
        doc = h.get("r1").document  # still of its kind's declared shape
        assert doc["thinned"] and all(not f["samples"] for p in doc["parts"] for f in p["figures"])
        assert any(f["samples"] for p in h.get("r4").document["parts"] for f in p["figures"])
    code, out = _cli("compare", "r4", "--baseline", "r1", "--db", str(db))
    assert code == 0, out
    code, out = _cli("history", "trend", "check.gpu0.tflops", "--db", str(db))
    assert code == 0 and out.count("vm") == 0 and "r1" in out


def _plan(conn: sqlite3.Connection, sql: str, args: tuple) -> str:
    return " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))


def test_the_reads_of_a_growing_history_walk_an_index_from_the_newest_row(tmp_path):
    """What keeps them flat (benchmarks/retention.py measures it at 52,000 runs): no read a check or
    a listing makes scans a table or sorts every row it matched."""
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        h.save(check_doc("a", 0))
    conn = sqlite3.connect(db)
    reads = {
        "reference": (("SELECT r.id FROM metrics m JOIN runs r ON r.id = m.run WHERE m.name = ? AND m.value = ? "
                      "AND (? IS NULL OR r.kind = ?) AND (? IS NULL OR r.host = ?) ORDER BY m.run DESC LIMIT ?"),
                      ("check.healthy", 1.0, "check", "check", "a", "a", 5)),
        "trend": (("SELECT r.id, r.created, r.host, m.value, m.unit, m.better FROM metrics m JOIN runs r ON r.id = m.run "
                  "WHERE m.name = ? AND (? IS NULL OR r.host = ?) ORDER BY m.run DESC LIMIT ?"),
                  ("check.gpu0.tflops", "a", "a", 20)),
        "keep": ("SELECT id FROM runs WHERE kind = ? AND host IS ? ORDER BY id DESC LIMIT ? OFFSET ?",
                 ("check", "a", 200, 1000)),
    }
    source = Path(__file__).resolve().parents[1] / "mgpu_bench" / "history"
    code = (source / "store.py").read_text() + (source / "retention.py").read_text()
    for name, (sql, args) in reads.items():
        assert " ".join(sql.split()[:6]) in " ".join(code.split()), name  # the query the code runs
        plan = _plan(conn, sql, args)
        assert "TEMP B-TREE" not in plan and "SCAN m" not in plan and "SCAN metrics" not in plan, (name, plan)
    conn.close()


# -- the file's faults, named ----------------------------------------------------------------------------


def test_a_database_that_cannot_grow_is_said_to_be_full_and_stays_intact(tmp_path):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        h.save(check_doc("a", 0))
    conn = sqlite3.connect(db)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    with History.open(db) as h:
        h._conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLITE_FULL, as a full disk gives it
        with pytest.raises(InputError, match=r"is full .*nothing was stored and the database is as it was"):
            for i in range(1, 50):
                h.save(check_doc("a", i))
    with History.open(db, readonly=True) as h:
        assert len(h.list()) >= 1
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1) to "
                    "mount a small tmpfs in a namespace of its own")
def test_a_full_file_system_is_named_as_one(tmp_path):
    """A real full disk: a 256 KiB tmpfs, mounted in a mount namespace of the test's own."""
    code = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_history_retention import check_doc
from mgpu_bench.history import History
from mgpu_bench.core.errors import InputError
h = History.open("/mnt/h.sqlite3")
try:
    for i in range(200):
        h.save(check_doc("a", i % 60))
except InputError as e:
    print("REFUSED", e)
"""
    (tmp_path / "fill.py").write_text(code)
    script = f"mount -t tmpfs -o size=256k none /mnt && {shlex.quote(sys.executable)} {tmp_path / 'fill.py'}"
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120, check=False)
    if "mount" in r.stderr and "REFUSED" not in r.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[:200]}")
    assert "REFUSED" in r.stdout and "is full" in r.stdout and "not a usable" not in r.stdout, r.stdout + r.stderr


def test_a_database_path_that_is_not_utf8_lists_without_a_traceback(tmp_path):
    raw = os.fsencode(tmp_path) + b"/h\xff.sqlite3"
    with History.open(os.fsdecode(raw)) as h:
        h.save(check_doc("a", 0))
    r = subprocess.run([sys.executable, "-m", b"mgpu_bench.cli", b"history", b"list", b"--db", raw],
                       capture_output=True, timeout=60, check=False,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert b"Traceback" not in r.stderr and b"check" in r.stdout


# -- issue 41: the words of retention, the sizes said, ages beyond any date --------------------------------

def _on_disk(db: Path) -> int:
    return sum(Path(f"{db}{suffix}").stat().st_size for suffix in ("", "-wal", "-shm")
               if Path(f"{db}{suffix}").exists())


def test_prune_keep_0_is_refused_naming_the_fix_and_help_says_what_keep_means(tmp_path):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        for i in range(3):
            h.save(check_doc("a", i))
    code, out = _cli("history", "prune", "--keep", "0", "--db", str(db))
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert "--keep 0 would remove every run but the baselines" in out and "give --keep 1 or more" in out
    assert len(_runs(db)) == 3  # nothing removed
    code, out = _cli("history", "prune", "--help")
    assert code == 0 and "Keep the newest N runs (N at least 1)" in out and "0 is refused" in out
    code, out = _cli("check", "--help")  # check's own word: 0 keeps all (what prune refuses to read otherwise)
    assert code == 0 and "0 keeps all" in " ".join(out.split())


def test_prune_says_the_bytes_on_disk_after_compacting_the_write_ahead_log_included(tmp_path):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        for i in range(30):
            h.save(check_doc("a", i % 60, day=1 + i // 60))
    code, out = _cli("history", "prune", "--keep", "1", "--db", str(db))
    assert code == 0 and "removed 29 of 30" in out, out
    said = re.search(r": (\d+\.\d+) MB -> (\d+\.\d+) MB", out)
    assert said, out
    before, after = float(said.group(1)), float(said.group(2))
    assert after < before  # VACUUM in WAL mode writes into the log; the checkpoint truncates it
    assert round(_on_disk(db) / 1e6, 2) == after, (out, _on_disk(db))
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0


@pytest.mark.parametrize("age", ["99999999999999d", "1e400d", "1e300y", "5000000y"])
def test_an_age_beyond_any_date_removes_nothing_and_is_no_traceback(tmp_path, age):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        h.save(check_doc("a", 0))
    code, out = _cli("history", "prune", "--older-than", age, "--db", str(db))
    assert code == 0 and "removed 0 of 1 run(s) considered" in out, out
    assert len(_runs(db)) == 1
