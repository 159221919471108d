"""Hardening (issue 24): nothing lost, nothing written where it must not go, the history read back
through its declared shapes.

1. an output that is the history database (or its -wal/-shm), or two outputs of one run that are
   the same file, is refused before measuring (exit 2), however the path is spelled;
2. a run is never lost when stdout cannot be written: stored and written first, printed last; a
   broken pipe exits as if printed, a full or closed stdout is one line and exit 1;
3. SIGHUP keeps what was measured, as SIGTERM does (exit 129);
4. report and data folders are real folders, never /dev; the default database follows the XDG
   rules and is never guessed at; a read never creates a database;
5. no traceback from a closed stdout, a huge --factor, or a metrics row edited outside the tool;
6. stored text reaches each medium (terminal, HTML, Markdown, matplotlib, Prometheus) escaped;
7. nonsense refused: digits other than 0-9, empty list entries, impossible dates, documents that
   would not render, a suite slot holding another probe's document;
8. messages that say what is wrong.

Real processes where the point is the process (pipes, /dev/full, a closed descriptor, signals):
three minimal `comm` sweeps on gloo run at once in one session fixture, a fourth takes the
hang-up. The rest in process through CliRunner, each probe stopped where its measurement would
start (its `delegate`). Generated cases of each class: test_property_inputs.py.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import AS_A_TERMINAL, DEADLINE_S, FIRST_SIZE, Measuring, plain, scaled, wait_for_output
from test_headline import comm_document

from mgpu_bench.cli import cli
from mgpu_bench.history import History

FIX = Path(__file__).with_name("fixtures")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /dev/full, /proc")
TRACES = ("Traceback", "Exception ignored", "resource_tracker", "leaked")




def invoke(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def refused(r, *words: str) -> str:
    """Exit 2, one line on stderr, no traceback, naming `words`; the line."""
    assert not isinstance(r.exception, Measuring), f"measured: {r.output}"
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("mgpu-bench: error: "), r.output
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def reached(r) -> None:
    """The options were taken and the probe reached its measurement, no traceback."""
    assert isinstance(r.exception, Measuring), r.output + repr(r.exception)


@pytest.fixture
def db(tmp_path) -> Path:
    """A history with two comm runs, r1 the baseline."""
    path = tmp_path / "h.sqlite3"
    with History.open(path) as h:
        h.set_baseline(h.save(comm_document()))
        h.save(comm_document(scale=1.01))
    return path


def _files(db: Path) -> bytes:
    """The database's bytes (its -wal and -shm are SQLite's own: a reader may leave them)."""
    return db.read_bytes()


# -- 1. no output over the database, nor over another output ---------------------------------------


def _spellings(db: Path) -> dict[str, str]:
    """The database's file named another way: relative, through .., a symbolic link, a hard link."""
    link, hard = db.parent / "link.db", db.parent / "hard.db"
    (db.parent / "x").mkdir(exist_ok=True)
    link.symlink_to(db.name)
    os.link(db, hard)
    return {"as given": str(db), "relative": db.name, "dotdot": str(db.parent / "x" / ".." / db.name),
            "symlink": str(link), "hard link": str(hard), "its -wal": f"{db}-wal", "its -shm": f"{db}-shm"}


@pytest.mark.parametrize("command", [["comm", "--sizes", "1K"], ["model", "--steps", "1"],
                                     ["suite", "--quick", "--rounds", "1"]])
@pytest.mark.parametrize("flag", ["--json", "--prometheus", "--csv"])
def test_an_output_that_is_the_database_is_refused_before_measuring(before_measuring, db, command, flag):
    if flag == "--csv" and command[0] != "comm":
        pytest.skip("comm alone writes --csv")
    before = _files(db)
    for how, path in _spellings(db).items():
        for via_env in (False, True):
            db_args, env = (([], {"MGPU_BENCH_DB": str(db)}) if via_env else (["--db", db], None))
            line = refused(invoke(*command, flag, path, *db_args, env=env), flag, "would replace")
            assert str(db) in line, (how, line)
    assert _files(db) == before  # not a byte changed, the link and the hard link included


def test_a_report_folder_never_replaces_the_database_or_another_output(before_measuring, tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    inside = rep / "report.html"
    with History.open(inside) as h:  # a database named as a report file
        h.save(comm_document())
    refused(invoke("comm", "--sizes", "1K", "--report", rep, "--db", inside), "--report", "would replace")
    refused(invoke("comm", "--sizes", "1K", "--json", rep / "summary.md", "--report", rep, "--no-store"),
            "same file")
    refused(invoke("comm", "--sizes", "1K", "--json", rep / "busbw_allreduce.png", "--report", rep, "--no-store"),
            "same file")
    refused(invoke("comm", "--sizes", "1K", "--json", "out", "--csv", "./out", "--no-store"), "same file")
    refused(invoke("comm", "--sizes", "1K", "--json", "out", "--report", "out", "--no-store"), "same file")
    # any history database the report would replace, not only the run's own (issue 41: it ran, then exit 1)
    refused(invoke("comm", "--sizes", "1K", "--report", rep, "--no-store"), "--report", "history database")
    inside.unlink()
    reached(invoke("comm", "--sizes", "1K", "--json", rep / "r.json", "--report", rep, "--no-store"))


def test_compare_show_and_report_never_write_over_the_database(db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "relative" is relative to the database's folder
    before = _files(db)
    for path in _spellings(db).values():
        refused(invoke("compare", "r2", "--json", path, "--db", db), "--json", "would replace")
        refused(invoke("history", "show", "r1", "--prometheus", path, "--db", db), "--prometheus", "would replace")
    moved = tmp_path / "rep"
    moved.mkdir()
    os.link(db, moved / "summary.md")  # the database, by another name, inside the report folder
    refused(invoke("report", "r1", "--out", moved, "--db", db), "--out", "would replace")
    assert _files(db) == before
    result = tmp_path / "rep2" / "report.html"  # a result file that its own report would replace
    result.parent.mkdir()
    result.write_text((FIX / "comm_2x_h200.json").read_text())
    refused(invoke("report", result, "--out", result.parent), "--out", "would replace the result")


def test_write_output_never_replaces_a_history_database(db):
    """The last line of defence, whatever a caller checked: the one writer of every output."""
    from mgpu_bench.core.paths import write_output

    before = _files(db)
    (db.parent / "link.db").symlink_to(db.name)
    for path in (db, db.parent / "link.db"):
        with pytest.raises(OSError, match="history database"):
            write_output(path, "{}")
    assert _files(db) == before


# -- 2 and 5. stdout the reader closed, filled or never opened --------------------------------------


def _env(**more) -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", **more}


def _comm(folder: Path) -> list[str]:
    return [sys.executable, "-m", "mgpu_bench.cli", "comm", "--sizes", "1K,4K", "--ops", "allreduce", "--outofplace",
            "--iters", "5", "--json", str(folder / "r.json"), "--db", str(folder / "h.sqlite3"), "--report",
            str(folder / "rep")]


@pytest.fixture(scope="session")
def stdout_runs(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    """One minimal comm sweep per way stdout fails, all at once: its reader gone at once (a broken
    pipe: `| head -0`), /dev/full, and descriptor 1 closed (`>&-`). -> way: (exit code, stderr, folder)."""
    runs = {}
    for way in ("broken pipe", "full", "closed"):
        folder = tmp_path_factory.mktemp(way.replace(" ", "-"))
        cmd = _comm(folder)
        if way == "closed":
            cmd = ["sh", "-c", 'exec "$@" >&-', "sh", *cmd]
        out = open("/dev/full", "w") if way == "full" else subprocess.PIPE  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=_env(), cwd=folder)
        if way == "broken pipe":
            proc.stdout.close()  # the reader stops before the first line
        if way == "full":
            out.close()
        runs[way] = (proc, folder)
    out = {}
    for way, (proc, folder) in runs.items():
        _o, err = proc.communicate(timeout=scaled(300))
        out[way] = (proc.returncode, err.decode(errors="replace"), folder)
    return out


def _kept(folder: Path) -> None:
    """The run's document, report and history row are all there."""
    doc = json.loads((folder / "r.json").read_text())
    assert doc["measurements"] and doc["status"]["completed"], doc["status"]
    assert (folder / "rep" / "report.html").exists()
    with History.open(folder / "h.sqlite3", readonly=True) as h:
        assert [r.kind for r in h.list()] == ["comm"]


@linux
@pytest.mark.parametrize("way, code", [("broken pipe", 0), ("full", 1), ("closed", 1)])
def test_a_run_is_kept_whatever_happens_to_stdout(stdout_runs, way, code):
    returncode, err, folder = stdout_runs[way]
    assert returncode == code, err[-2000:]
    assert not any(t in err for t in TRACES), err[-3000:]
    _kept(folder)
    said = [ln for ln in err.splitlines() if "stdout" in ln]
    if way == "broken pipe":
        assert said == [], said  # the reader's choice: nothing to say
    else:
        assert len(said) == 1 and said[0].startswith("mgpu-bench: could not write to stdout"), said
        assert ("No space left" if way == "full" else "closed") in said[0]


def _cli(args, cwd, stdout=subprocess.PIPE, close_at_once=False, closed=False):
    cmd = [sys.executable, "-m", "mgpu_bench.cli", *map(str, args)]
    if closed:
        cmd = ["sh", "-c", 'exec "$@" >&-', "sh", *cmd]
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, env=_env(), cwd=cwd)
    if close_at_once:
        proc.stdout.close()
    _o, err = proc.communicate(timeout=scaled(DEADLINE_S))
    return proc.returncode, err.decode(errors="replace")


@linux
def test_history_add_stores_every_file_though_its_reader_stopped(tmp_path):
    files = []
    for i in range(3):
        f = tmp_path / f"{i}.json"
        f.write_text(json.dumps(comm_document(scale=1 + i / 10)))
        files.append(f)
    code, err = _cli(["history", "add", *files, "--db", tmp_path / "h.db"], tmp_path, close_at_once=True)
    assert code == 0 and not any(t in err for t in TRACES), err
    with History.open(tmp_path / "h.db", readonly=True) as h:
        assert len(h.list()) == 3
    code, err = _cli(["history", "list", "--db", tmp_path / "h.db"], tmp_path, stdout=open("/dev/full", "w"))  # noqa: SIM115
    assert code == 1 and err.count("could not write to stdout") == 1 and "Traceback" not in err, err


@linux
def test_compare_with_stdout_closed_writes_its_json_and_is_no_regression(db, tmp_path):
    out = tmp_path / "cmp.json"
    code, err = _cli(["compare", "r2", "--db", db, "--json", out], tmp_path, closed=True)
    assert code == 3, err  # compared, nothing regressed, not printed: never 1, the regression code
    assert json.loads(out.read_text())["regressions"] == 0
    code, err = _cli(["compare", "r2", "--db", db, "--json", out], tmp_path, close_at_once=True)
    assert code == 0 and "Traceback" not in err, err  # a reader that stopped: as if printed


def test_stdout_guard_keeps_the_failure_and_raises_nothing(tmp_path):
    from mgpu_bench.output.console import GuardedStdout

    full = open("/dev/full", "w")  # noqa: SIM115 - the guard owns it
    g = GuardedStdout(full)
    assert g.write("x" * 100000) == 100000
    g.flush()
    assert g.failure is not None and g.failure.errno == 28  # ENOSPC
    g.write("more")  # dropped, no error
    closed = GuardedStdout(None)
    assert closed.write("x") == 1 and not closed.isatty() and closed.failure is not None


# -- 3. a hang-up keeps what was measured ------------------------------------------------------------


@linux
def test_sighup_to_the_process_group_keeps_the_run(tmp_path):
    """A closed terminal: SIGHUP to comm and its gloo ranks mid-sweep. Exit 129, the JSON with the
    sizes measured, the history row, the report, no traceback, and no semaphore the tracker had to
    call leaked (it survives the hang-up and cleans up as usual)."""
    cmd = [sys.executable, "-m", "mgpu_bench.cli", "comm", "--backend", "torch", "--progress", "--sizes", "1M-64M",
           "--json", "r.json", "--db", "h.db", "--report", "rep"]
    # SIGHUP as a terminal leaves it, even where this test runs under nohup (an ignored SIGHUP is
    # inherited, and the command keeps it ignored)
    hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(**AS_A_TERMINAL),
                                cwd=tmp_path, start_new_session=True)
    finally:
        signal.signal(signal.SIGHUP, hup)
    try:
        seen = wait_for_output(proc, FIRST_SIZE)
        os.killpg(proc.pid, signal.SIGHUP)
        _out, rest = proc.communicate(timeout=scaled(DEADLINE_S))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = plain((seen + rest).decode(errors="replace"))
    assert proc.returncode == 129, err[-3000:]
    assert not any(t in err for t in TRACES), err[-3000:]
    assert "terminated (SIGHUP)" in err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["status"]["stopped"] and doc["measurements"]
    with History.open(tmp_path / "h.db", readonly=True) as h:
        assert [r.kind for r in h.list()] == ["comm"]
    assert (tmp_path / "rep" / "report.html").exists()


def test_sighup_is_a_stop_signal_unless_ignored(monkeypatch):
    import multiprocessing.resource_tracker as tracker

    from mgpu_bench.core import errors

    monkeypatch.setattr(tracker, "_IGNORED_SIGNALS", (signal.SIGINT, signal.SIGTERM))
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal leaves it (this test may run under nohup)
        errors.handle_stop_signals()
        assert signal.getsignal(signal.SIGHUP) is errors._stop_signal
        assert signal.SIGHUP in tracker._IGNORED_SIGNALS  # the tracker is started with it blocked
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        errors.handle_stop_signals()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert str(errors.Terminated(signum=signal.SIGHUP)) == "terminated (SIGHUP)"
    import pickle

    again = pickle.loads(pickle.dumps(errors.Terminated("ctx", signum=signal.SIGHUP)))
    assert again.signum == signal.SIGHUP and again.context == "ctx"


# -- 4. where files may go ---------------------------------------------------------------------------


@linux
def test_dev_is_no_folder_for_reports_data_or_outputs(before_measuring, db):
    refused(invoke("report", "r1", "--out", "/dev", "--db", db), "/dev", "writes nothing")
    refused(invoke("suite", "--quick", "--report", "/dev", "--no-store"), "/dev")
    refused(invoke("model", "--data", "loader", "--data-dir", "/dev", "--no-store"), "--data-dir", "/dev")
    refused(invoke("comm", "--sizes", "1K", "--json", "/dev/x.json", "--no-store"), "/dev")
    refused(invoke("comm", "--sizes", "1K", "--db", "/dev/h.sqlite3"), "/dev")
    refused(invoke("comm", "--sizes", "1K", "--report", "/sys/kernel/x", "--no-store"), "/sys")
    assert not os.path.exists("/dev/x.json") and not os.path.exists("/dev/h.sqlite3")


@pytest.mark.parametrize("home, words", [("", "HOME is empty"), ("relative/home", "HOME is a relative path"),
                                         ("/nonexistent-mgpu-bench/h", "not an existing folder")])
def test_a_home_that_is_no_folder_is_refused_never_created(before_measuring, monkeypatch, home, words):
    monkeypatch.delenv("MGPU_BENCH_DB")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", home)
    roots = {p: os.path.exists(p) for p in ("/.local", "/nonexistent-mgpu-bench", "relative")}
    f = before_measuring / "r.json"
    f.write_text(json.dumps(comm_document()))
    refused(invoke("history", "add", f), words, "MGPU_BENCH_DB")
    refused(invoke("comm", "--sizes", "1K"), words, "--db")
    refused(invoke("history", "list"), words)
    assert {p: os.path.exists(p) for p in roots} == roots
    assert sorted(p.name for p in before_measuring.iterdir()) == ["r.json"]


def test_the_default_database_follows_the_xdg_rules_and_says_where(before_measuring, monkeypatch,
                                                                  tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.delenv("MGPU_BENCH_DB")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", "data")  # relative: ignored, as the specification says
    f = before_measuring / "r.json"
    f.write_text(json.dumps(comm_document()))
    r = invoke("history", "add", f)
    chosen = home / ".local" / "share" / "mgpu-bench" / "history.sqlite3"
    assert r.exit_code == 0 and f"created the history database {chosen}" in r.output, r.output
    assert chosen.is_file() and not (before_measuring / "data").exists()
    r = invoke("history", "add", f)
    assert "created" not in r.output  # once, when it is made
    xdg = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_DATA_HOME", str(xdg))
    assert invoke("history", "add", f).exit_code == 0
    assert (xdg / "mgpu-bench" / "history.sqlite3").is_file()
    for blank in ("", " ", "\t"):
        monkeypatch.setenv("MGPU_BENCH_DB", blank)
        refused(invoke("history", "add", f), "MGPU_BENCH_DB is set but blank")
    refused(invoke("history", "add", f, "--db", " "), "--db", "blank")
    assert sorted(p.name for p in before_measuring.iterdir()) == ["r.json"]  # no file named ' '


def test_a_read_never_creates_a_database(before_measuring):
    missing = before_measuring / "none.sqlite3"
    for args in (["history", "list"], ["history", "show", "r1"], ["history", "trend", "comm.x"],
                 ["compare", "r1", "--baseline", "r1"], ["report", "r1"], ["baseline", "show"],
                 ["baseline", "set", "r1"]):
        refused(invoke(*args, "--db", missing), f"no history database at {missing}")
    assert list(before_measuring.iterdir()) == []


def test_reading_takes_no_write_lock(db, monkeypatch):
    """`history list` (and every read) while another process holds the write lock: answered at
    once, with what is committed (a WAL reader waits for no writer)."""
    from mgpu_bench.history import store

    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 1.0)
    writer = sqlite3.connect(db, isolation_level=None, timeout=1)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO baselines (scope, run, set_at) VALUES ('x', 1, 'now')")
    try:
        t0 = time.monotonic()
        for args in (["history", "list"], ["history", "show", "r1"], ["compare", "r2"], ["baseline", "show"]):
            r = invoke(*args, "--db", db)
            assert r.exit_code == 0, (args, r.output)
        assert time.monotonic() - t0 < 30
        assert "r2" in invoke("history", "list", "--db", db).output
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_run_the_database_does_not_take_is_kept_for_history_add(tmp_path, monkeypatch):
    """A real sweep whose database stays locked past the busy timeout: the line names the file
    that holds its document (none was asked for with --json) and the `history add` that stores it
    later, which then does."""
    from mgpu_bench.history import store
    from mgpu_bench.machine import selection

    monkeypatch.setattr(selection, "visible_gpu_count", lambda: 0)
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 1.0)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "h.sqlite3"
    History.open(db).close()
    writer = sqlite3.connect(db, isolation_level=None, timeout=1)
    writer.execute("BEGIN IMMEDIATE")
    try:
        r = invoke("comm", "--sizes", "1K", "--ops", "allreduce", "--outofplace", "--iters", "5", "--db", db)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert r.exit_code == 1, r.output
    line = next(ln for ln in r.output.splitlines() if "stores it later" in ln)
    kept = next(tmp_path.glob("mgpu-bench-comm-*.json"))
    assert f"its document is in {kept.name}" in line or str(kept) in line
    assert f"mgpu-bench history add {kept.name} --db {db}" in line or f"history add {kept}" in line
    assert "stayed locked" in r.output
    r = invoke("history", "add", kept, "--db", db)
    assert r.exit_code == 0 and "stored r1: comm" in r.output, r.output


# -- 5. tracebacks that remained ---------------------------------------------------------------------


def test_a_huge_factor_is_taken_or_refused_not_a_traceback(before_measuring):
    reached(invoke("comm", "--sizes", "1M-1G", "--factor", "1e308", "--no-store"))
    refused(invoke("comm", "--sizes", "1M-1G", "--factor", "1e400", "--no-store"), "--factor")


def _tamper(db: Path, sql: str, *args) -> None:
    """A change made by another program (the sqlite3 shell), which need not keep our CHECKs."""
    con = sqlite3.connect(db)
    con.execute("PRAGMA ignore_check_constraints = ON")
    con.execute(sql, args)
    con.commit()
    con.close()


METRIC_DAMAGE = [("samples", "'not json'", "samples: is not JSON"), ("samples", "'{\"a\": 1}'", "samples: is an object"),
                 ("samples", "'[\"x\"]'", "samples[0]"), ("value", "'abc'", "value: is 'abc'"),
                 ("labels", "'[1]'", "labels: is a list"), ("unit", "'furlongs'", "unit: is 'furlongs'"),
                 ("better", "'sideways'", "better: is 'sideways'"), ("samples", "x'00ff'", "samples: is bytes data")]


@pytest.mark.parametrize("column, value, words", METRIC_DAMAGE, ids=[f"{c}={v}" for c, v, _ in METRIC_DAMAGE])
def test_a_metrics_row_edited_outside_is_named_where_it_is_read(db, column, value, words):
    name = sqlite3.connect(db).execute("SELECT name FROM metrics WHERE run = 2 LIMIT 1").fetchone()[0]
    _tamper(db, f"UPDATE metrics SET {column} = {value} WHERE run = 2 AND name = ?", name)
    refused(invoke("history", "show", "r2", "--db", db), "stored run r2", f"metric {name} {words}", "changed outside")
    for args in (["compare", "r2"], ["compare", "r1", "--baseline", "r2"]):  # comm compares from its documents
        r = invoke(*args, "--db", db)
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        if r.exit_code == 2:
            refused(r, "stored run r2", f"metric {name} {words}")
    r = invoke("history", "trend", name, "--db", db)  # a listing goes on without the row, and says so
    if column in ("value", "unit", "better"):
        assert r.exit_code == 0 and "note: left out: stored run r2" in r.output and " r1 " in r.output, r.output
    else:
        assert r.exit_code == 0, r.output
    assert invoke("history", "list", "--db", db).exit_code == 0


RUN_DAMAGE = [("document", "'[1, 2]'", "the document: is a list"), ("document", "'{'", "document: is not JSON"),
              ("document", "x'7b7d'", "document: is bytes data"), ("fingerprint", "'[]'", "fingerprint: is a list"),
              ("created", "'9999-99-99T99:99:99'", "created: is '9999"), ("created", "5", "created: is '5'"),
              ("kind", "'comm'", None), ("host", "x'00'", "host: is b")]


@pytest.mark.parametrize("column, value, words", RUN_DAMAGE, ids=[f"{c}={v}" for c, v, _ in RUN_DAMAGE])
def test_a_runs_row_edited_outside_is_named_where_it_is_read(db, tmp_path, column, value, words):
    _tamper(db, f"UPDATE runs SET {column} = {value} WHERE id = 2")
    if words is None:  # a change that leaves a valid row: read as it is
        assert invoke("history", "show", "r2", "--db", db).exit_code == 0
        return
    for args in (["history", "show", "r2"], ["compare", "r2"], ["report", "r2", "--out", tmp_path / "rep"],
                 ["baseline", "set", "r2"]):
        refused(invoke(*args, "--db", db), "stored run r2", words)
    r = invoke("history", "list", "--db", db)
    assert r.exit_code == 0 and "r1" in r.output, r.output
    if column in ("created", "host"):
        assert "note: left out: stored run r2" in r.output, r.output


# -- 6. one escaping step per medium -----------------------------------------------------------------

CONTROLS = "\x1b[2J\x1b]0;pwn\x07\r\x9b31m\u202eevil"


def test_stored_text_reaches_html_markdown_plots_and_prometheus_escaped(tmp_path):
    doc = comm_document(host=f"node{CONTROLS}**bold** <b>x</b> [l](javascript:y)")
    doc["backend"] = "native $\\frac{$"  # mathtext that matplotlib would refuse to parse
    doc["notes"] = [f"a note {CONTROLS}"]
    f = tmp_path / "r.json"
    f.write_text(json.dumps(doc))
    db = tmp_path / "h.sqlite3"
    assert invoke("history", "add", f, "--db", db).exit_code == 0
    r = invoke("report", "r1", "--db", db, "--out", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    raw = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x202E) if chr(c) not in "\n\t"]
    page = (tmp_path / "rep" / "report.html").read_text()
    summary = (tmp_path / "rep" / "summary.md").read_text()
    for text in (page, summary):
        assert not [c for c in raw if c in text], [hex(ord(c)) for c in raw if c in text]
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "**bold**" not in summary and "\\*\\*bold\\*\\*" in summary and "\\[l\\](javascript" in summary
    prom = tmp_path / "m.prom"
    assert invoke("history", "show", "r1", "--db", db, "--prometheus", prom).exit_code == 0
    assert not [c for c in raw if c in prom.read_text()]


def test_each_medium_has_its_one_function():
    from mgpu_bench.output.console import safe_text
    from mgpu_bench.output.html_page import esc, md
    from mgpu_bench.output.plotting import plain
    from mgpu_bench.output.prometheus import escape_value

    assert esc("<a href='x'>\x1b\u202e") == "&lt;a href=&#x27;x&#x27;&gt;\\x1b\\u202e"
    assert md("**b** _i_ `c` [l](u) <h> | # x") == "\\*\\*b\\*\\* \\_i\\_ \\`c\\` \\[l\\](u) \\<h> \\| # x"
    assert md("# heading") == "\\# heading" and md("> quote") == "\\> quote" and md("1. item") == "1\\. item"
    assert plain("$x$ \x07") == "\\$x\\$ \\x07"
    assert escape_value('a"\x1b\n') == 'a\\"\\\\x1b\\n'
    assert safe_text("\ud83d") == "\\ud83d"  # a lone surrogate: no encoder would write it


# -- 7. nonsense refused ------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["comm", "--nproc", "１２"], ["comm", "--sizes", "１K"], ["comm", "--sizes", "1K,,2K"],
                                  ["comm", "--sizes", "1K,"], ["comm", "--iters", "٣"], ["comm", "--gpus", "１"],
                                  ["comm", "--min-time", "０.1"], ["comm", "--sizes", "1M-1G", "--factor", "２"],
                                  ["model", "--scaling", "１,２"], ["model", "--steps", "1_0"],
                                  ["suite", "--tolerance", "５%"], ["compare", "r1", "--tolerance", "５%"],
                                  ["history", "list", "--limit", "１０"], ["history", "trend", "x", "--limit", "²"]],
                         ids=lambda a: " ".join(a))
def test_numbers_take_ascii_digits_only(before_measuring, args):
    line = refused(invoke(*args, *(["--no-store"] if args[0] in ("comm", "model", "suite") else [])))
    assert "0-9" in line or "empty entry" in line, line


def test_ascii_numbers_are_still_taken(before_measuring):
    reached(invoke("comm", "--nproc", "2", "--sizes", "1K,2K", "--iters", " 12 ", "--min-time", "1e-2", "--no-store"))


def _doc_file(tmp_path: Path, doc: dict) -> Path:
    f = tmp_path / "d.json"
    f.write_text(json.dumps(doc))
    return f


def test_documents_that_would_not_render_are_refused_at_history_add(tmp_path):
    db = tmp_path / "h.sqlite3"
    impossible = comm_document()
    impossible["created"] = "9999-99-99T99:99:99"
    refused(invoke("history", "add", _doc_file(tmp_path, impossible), "--db", db), "created", "9999-99-99")
    nan = json.loads((FIX / "comm_2x_h200.json").read_text())
    for m in nan["measurements"]:
        m["burst_seconds"] = [float("nan")] * len(m["burst_seconds"])
    refused(invoke("history", "add", _doc_file(tmp_path, nan), "--db", db), "burst_seconds")
    refused(invoke("report", _doc_file(tmp_path, nan), "--out", tmp_path / "rep"), "burst_seconds")
    suite = json.loads((FIX / "suite" / "suite.json").read_text())
    comm_slot = next(p for p in suite["probes"] if p["name"] == "comm")
    comm_slot["document"] = next(p for p in suite["probes"] if p["name"] == "model-1gpu")["document"]
    refused(invoke("history", "add", _doc_file(tmp_path, suite), "--db", db), "document", "is a model document",
            "mgpu-bench comm")
    assert not db.exists()


# -- 8. messages that say what is wrong --------------------------------------------------------------


def test_suite_without_gpus_says_what_the_suite_takes(before_measuring):
    line = refused(invoke("suite", "--quick", "--gpus", "2", "--no-store"), "drop --gpus")
    assert "--nproc" not in line


def test_trend_of_a_host_says_what_that_host_has(db):
    with History.open(db) as h:
        h.save(comm_document(host="other"))
    name = "comm.allreduce.fp32.1GiB.out.2ranks.busbw"
    line = refused(invoke("history", "trend", name, "--host", "nowhere", "--db", db), "no stored run is of host")
    assert "did you mean" not in line
    line = refused(invoke("history", "trend", "comm.nothing.busbw", "--host", "other", "--db", db),
                   "host 'other' has no stored run with the metric", "its metrics include comm.")
    assert invoke("history", "trend", name, "--host", "other", "--db", db).exit_code == 0


def test_size_and_factor_messages_show_what_was_given(before_measuring):
    refused(invoke("comm", "--sizes", "1K-4K", "--factor", "1.0000001", "--no-store"), "--factor 1.0000001")
    refused(invoke("comm", "--sizes", "-1K", "--no-store"), "negative")
    refused(invoke("comm", "--sizes", "1K--2K", "--no-store"), "'-2K' is negative")
    refused(invoke("comm", "--sizes", "1K,-2K", "--no-store"), "'-2K' is negative")


def test_a_text_too_long_says_its_length_and_the_limit(tmp_path):
    doc = comm_document()
    doc["notes"] = ["A" * 70000]
    line = refused(invoke("history", "add", _doc_file(tmp_path, doc), "--db", tmp_path / "h.db"), "notes[0]")
    assert "70000 characters, longer than the 65536" in line and "AAAA" not in line
