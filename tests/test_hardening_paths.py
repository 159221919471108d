"""Hardening (issue 17): output paths and stored text an adversarial user controls.

- Writing never replaces what a path points to: a symbolic link is written through (the link
  stays), a FIFO, socket or directory is refused, before any measurement (exit code 2) and again
  at write time.
- Output paths are checked by doing (a scratch file in the folder), so root under /proc, or a
  user in a read-only folder, is told before measuring.
- `compare --json` that cannot be written after comparing is not exit code 1, the regression code.
- Stored text (host names, commands, GPU names) reaches the terminal with its control characters
  shown, never obeyed.
- A bounded option says the bound it broke.

Real FIFOs, sockets, symbolic links, read-only folders, SQLite files and one real `comm` run on
gloo; never a device node (an earlier bug replaced /dev/full with a regular file).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import scaled
from test_headline import comm_document

from mgpu_bench.cli import cli
from mgpu_bench.core.errors import InputError
from mgpu_bench.core.paths import check_report_dir, check_writable, write_output
from mgpu_bench.history import History
from mgpu_bench.output.console import safe_text

# Under /proc no file can be created, whoever asks: root passes every permission-bit test but not
# this one, so the checks must try, not look.
PROC_PATH = "/proc/self/mgpu-bench-test.json"
# What a path there is told: its file system is the kernel's, where nothing of ours is written.
PROC_WORDS = "/proc/self is on a proc file system"
ESCAPES = "\x1b[2J\x1b]0;pwn\x07"


def invoke(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def one_error_line(r, code: int = 2) -> str:
    """The result's only output line, an error, after exit code `code` without a traceback."""
    assert r.exit_code == code, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgpu-bench: error: "), r.output
    return lines[0]


@pytest.fixture
def fifo(tmp_path) -> Path:
    p = tmp_path / "pipe.json"
    os.mkfifo(p)
    return p


@pytest.fixture
def sock():
    """A listening Unix socket (in a short folder: socket paths are limited to ~108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="mgpu-sock-"))
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(folder / "s.json"))
    yield folder / "s.json"
    s.close()
    (folder / "s.json").unlink()
    folder.rmdir()


def _temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


# -- one function writes every output ---------------------------------------------------------


def test_a_symbolic_link_is_written_through_and_stays(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to("real.json")  # relative, as users make them
    assert write_output(link, "new") == target.resolve()
    assert link.is_symlink() and os.readlink(link) == "real.json"
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640  # its mode kept
    dangling = tmp_path / "later.json"
    dangling.symlink_to(tmp_path / "sub-target.json")
    write_output(dangling, b"\x00bytes")
    assert dangling.is_symlink() and (tmp_path / "sub-target.json").read_bytes() == b"\x00bytes"
    assert _temporaries(tmp_path) == []


def test_what_is_not_a_regular_file_is_refused_at_write_time_and_left_alone(tmp_path, fifo, sock):
    folder = tmp_path / "folder.json"
    folder.mkdir()
    link_to_fifo = tmp_path / "to-fifo.json"
    link_to_fifo.symlink_to(fifo)
    for path, words in ((fifo, "FIFO"), (link_to_fifo, "FIFO"), (sock, "socket"), (folder, "directory")):
        with pytest.raises(OSError) as info:
            write_output(path, "{}")
        assert words in info.value.strerror and "give a regular file's name" in info.value.strerror
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link_to_fifo.is_symlink()
    assert stat.S_ISSOCK(os.lstat(sock).st_mode) and folder.is_dir() and list(folder.iterdir()) == []
    assert _temporaries(tmp_path) == [] and _temporaries(sock.parent) == []


def test_the_option_check_names_the_path_kind_and_the_fix(tmp_path, fifo, sock):
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "loop2.json")
    (tmp_path / "loop2.json").symlink_to(loop)
    cases = ((fifo, "is a FIFO (named pipe), which mgpu-bench does not write into: give a regular file's name"),
             (sock, "is a socket"), (tmp_path, "is a directory"),
             (loop, "cannot be followed (Too many levels of symbolic links)"),
             (tmp_path / "none" / "r.json", "does not exist: create it first"),
             (PROC_PATH, PROC_WORDS))
    for path, words in cases:
        with pytest.raises(InputError, match="^--json ") as info:
            check_writable(path, "--json")
        assert words in str(info.value), str(info.value)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.json", "loop2.json", "pipe.json"]  # no scratch left


def test_the_check_agrees_with_a_real_write(tmp_path):
    """Read-only folder (refused for a user, writable for root, whom CI may run as) and /proc
    (refused for everyone): the check refuses exactly where writing would fail."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        for path in (ro / "r.json", PROC_PATH):
            try:
                check_writable(path, "--json")
                refused = None
            except InputError as exc:
                refused = str(exc)
            try:
                write_output(path, "{}")
                failed = False
            except OSError:
                failed = True
            assert (refused is not None) == failed, (path, refused)
            if refused:
                assert "give a path in a writable folder" in refused or "give a folder elsewhere" in refused
        assert refused and "/proc/self" in refused  # /proc refuses root too
    finally:
        ro.chmod(0o700)


def test_report_folders(tmp_path, fifo):
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    to_file = tmp_path / "to-file"
    to_file.symlink_to(afile)
    to_nothing = tmp_path / "to-nothing"
    to_nothing.symlink_to(tmp_path / "gone")
    held = tmp_path / "old-report"
    held.mkdir()
    os.mkfifo(held / "report.html")
    for path, words in ((afile, "is a file"), (fifo, "is a FIFO"), (to_file, "is a symbolic link to a file"),
                        (to_nothing, "is a symbolic link to nothing"),
                        (held, "holds report.html, which is a FIFO (named pipe)"),
                        (tmp_path / "no" / "rep", "does not exist"), ("/proc/self/rep", PROC_WORDS)):
        with pytest.raises(InputError) as info:
            check_report_dir(path)
        assert str(info.value).startswith("--report ") or "--report" in str(info.value)
        assert words in str(info.value), str(info.value)
    clean = tmp_path / "clean"
    clean.mkdir()
    to_dir = tmp_path / "to-dir"
    to_dir.symlink_to(clean)
    check_report_dir(to_dir)  # a link to a folder is a folder
    check_report_dir(tmp_path / "new")  # created later, in a writable folder


# -- every command refuses before measuring ----------------------------------------------------


@pytest.fixture
def db(tmp_path) -> Path:
    """Two stored comm runs (r1 the baseline), the second with escape sequences in its host name
    and command line."""
    path = tmp_path / "h.sqlite3"
    base = comm_document(host="node-a")
    new = comm_document(host=f"node-b{ESCAPES}")
    new["command"] = ["mgpu-bench", "comm", f"--note={ESCAPES}"]
    with History.open(path) as h:
        h.set_baseline(h.save(base))
        h.save(new)
    return path


OUTPUT_OPTIONS = [
    ("topo", "--json"),
    ("comm", "--json"), ("comm", "--csv"), ("comm", "--prometheus"), ("comm", "--report"),
    ("model", "--json"), ("model", "--report"),
    ("suite", "--json"), ("suite", "--report"),
    ("history show r1", "--prometheus"),
    ("compare r2", "--json"),
]


@pytest.mark.parametrize("bad", ["fifo", "proc"])
@pytest.mark.parametrize("command, flag", OUTPUT_OPTIONS, ids=[" ".join(c) for c in OUTPUT_OPTIONS])
def test_every_command_refuses_a_bad_output_before_measuring(command, flag, bad, fifo, db):
    path = fifo if bad == "fifo" else (PROC_PATH if flag != "--report" else "/proc/self/mgpu-report")
    extra = {"comm": ["--sizes", "1K", "--ops", "allreduce", "--no-store"], "model": ["--steps", "1", "--no-store"],
             "suite": ["--rounds", "1", "--quick", "--no-store"]}.get(command, [])
    if command.startswith(("history", "compare")):
        extra = ["--db", db]
    line = one_error_line(invoke(*command.split(), flag, path, *extra))
    assert line.startswith(f"mgpu-bench: error: {flag} {path}")
    assert ("is a FIFO (named pipe)" if bad == "fifo" else PROC_WORDS) in line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_fleet_exclude_file_is_checked_before_the_pass(fifo):
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}  # two nodes of one process each
    line = one_error_line(invoke("fleet", "--exclude-file", fifo, "--no-store", env=torchrun))
    assert f"--exclude-file {fifo} is a FIFO" in line


def test_a_real_run_writes_through_links_and_keeps_them(tmp_path):
    """One comm run on 2 gloo ranks: --json, --csv and --prometheus are links, the report folder
    is a link to a folder holding a link for report.html; every target gets its file."""
    targets = tmp_path / "targets"
    targets.mkdir()
    links = {}
    for name in ("r.json", "r.csv", "r.prom", "report.html"):
        (targets / name).write_text("stale")
        links[name] = tmp_path / f"link-{name}"
        links[name].symlink_to(targets / name)
    report = targets / "rep"
    report.mkdir()
    (report / "report.html").symlink_to(targets / "report.html")
    (tmp_path / "rep").symlink_to(report)
    out = subprocess.run(
        [sys.executable, "-m", "mgpu_bench.cli", "comm", "--sizes", "1K", "--ops", "allreduce", "--nproc", "2",
         "--iters", "5", "--warmup-iters", "1", "--no-store", "--no-progress",
         "--json", links["r.json"], "--csv", links["r.csv"], "--prometheus", links["r.prom"], "--report", "rep"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=scaled(300))
    assert out.returncode == 0, out.stderr
    assert all(p.is_symlink() for p in (*links.values(), tmp_path / "rep", report / "report.html"))
    assert json.loads((targets / "r.json").read_text())["schema"] == "mgpu-bench/result"
    assert (targets / "r.csv").read_text().count("\n") >= 2
    assert "mgpu_bench_info" in (targets / "r.prom").read_text()
    assert (targets / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert stat.S_IMODE((targets / "r.prom").stat().st_mode) == 0o644  # for a collector of another user
    assert (report / "summary.md").is_file() and _temporaries(targets) == _temporaries(report) == []


# -- compare: an output failure is not a regression --------------------------------------------


def _small_files():
    """In the child: files may not grow past 64 KiB (EFBIG instead of SIGXFSZ). The database is
    only read; the comparison's JSON is larger (see below), so its write fails after comparing."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))


def test_compare_json_that_cannot_be_written_is_exit_3_or_the_regression(tmp_path):
    path = tmp_path / "h.sqlite3"
    docs = [comm_document(), comm_document(), comm_document(scale=2.0)]  # r3 is twice as slow
    for i, d in enumerate(docs):  # a recorded variable that differs: ~120 KB of differences in the JSON
        d["environment"]["env"] = {"NCCL_DEBUG_SUBSYS": str(i) * 60_000}
    with History.open(path) as h:
        ids = [h.save(d) for d in docs]
    for new, code, words in ((ids[1], 3, "the file is missing"), (ids[2], 1, "a regression")):
        out = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "compare", new, "--baseline", ids[0],
                              "--db", path, "--json", tmp_path / "c.json"],
                             check=False, capture_output=True, text=True, timeout=scaled(120), preexec_fn=_small_files)
        assert out.returncode == code, out.stderr
        err = out.stderr.strip().splitlines()
        assert len(err) == 1 and "compared, but could not write" in err[0] and "File too large" in err[0], err
        assert f"exit code {code}: {words}" in err[0]
        assert not (tmp_path / "c.json").exists() and _temporaries(tmp_path) == []
    help_text = invoke("compare", "--help").output
    assert "3 compared without a regression, but --json could not be written" in " ".join(help_text.split())


# -- stored text on the terminal ----------------------------------------------------------------


def test_safe_text_shows_every_control_character():
    assert safe_text(f"a{ESCAPES}b") == "a\\x1b[2J\\x1b]0;pwn\\x07b"
    assert safe_text("x\x9b31m\x7f\u202egnp.exe\r\n\t") == "x\\x9b31m\\x7f\\u202egnp.exe\\r\\n\\t"
    assert safe_text("two\n\tlines\r", lines=True) == "two\n\tlines\\r"
    assert safe_text("gpu07 Ωμ 日本") == "gpu07 Ωμ 日本"  # printable text untouched


@pytest.mark.parametrize("args", [
    ["history", "list"], ["history", "show", "r2"], ["history", "show", "latest"],
    ["history", "trend", "comm.allreduce.fp32.1GiB.out.2ranks.busbw"], ["compare", "r2"],
    ["history", "trend", f"nope{ESCAPES}"], ["history", "list", "--kind", ESCAPES],
])
def test_stored_escape_sequences_are_shown_not_obeyed(db, args):
    """Host and command of r2 (and, for the last two, the argument quoted in the error)."""
    r = invoke(*args, "--db", db)
    assert r.exit_code in (0, 2), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "\x1b" not in r.output and "\x07" not in r.output
    # shown as text (a table may wrap a long cell, so the whole sequence is looked for in lines only)
    assert "\\x1b[2J" in r.output and "\\x07" in r.output
    if args[:2] in (["history", "show"], ["compare", "r2"]):
        assert "\\x1b[2J\\x1b]0;pwn\\x07" in r.output


# -- bounded options -----------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["model", "--batch-size", "1000000000"], "--batch-size 1000000000: at most 1000000"),
    (["model", "--steps", "999999999"], "--steps 999999999: at most 1000000"),
    (["model", "--steps", "0"], "--steps 0: at least 1"),
    (["model", "--grad-accum", "20000"], "--grad-accum 20000: at most 10000"),
    (["model", "--warmup-steps", "2000000"], "--warmup-steps 2000000: at most 1000000"),
    (["model", "--num-workers", "1000"], "--num-workers 1000: at most 256"),
    (["model", "--peak-tflops", "1e9"], "--peak-tflops 1000000000: at most 1000000"),
    (["model", "--peak-tflops", "nan"], "--peak-tflops nan: give a number above 0"),
    (["model", "--nproc", "65"], "--nproc 65: at most 64"),
    (["memory", "--batch-size", "2000000"], "--batch-size 2000000: at most 1000000"),
    (["memory", "--steps", "100001"], "--steps 100001: at most 100000"),
    (["memory", "--seq-len", "8"], "--seq-len 8: at least 16"),
    (["fleet", "--iters", "100001"], "--iters 100001: at most 100000"),
    (["fleet", "--concurrency", "100001"], "--concurrency 100001: at most 100000"),
    (["comm", "--nproc", "100000", "--sizes", "1K"], "--nproc 100000: at most 256"),
])
def test_a_bounded_option_names_the_bound_it_broke(args, words):
    assert words in one_error_line(invoke(*args))


def test_no_range_check_names_only_its_lower_bound():
    """The class, not the examples: a configure() message that says "must be at least" while
    its check also has an upper bound (`<= N`) is the wrong fix; within() says the one broken."""
    root = Path(__file__).resolve().parent.parent / "mgpu_bench"
    offenders = []
    for path in root.rglob("*.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "must be at least" in line and "at most" not in line:
                check = " ".join(lines[max(0, i - 3):i])
                if "<=" in check and check.count("<=") >= 2:
                    offenders.append(f"{path.relative_to(root)}:{i + 1}")
    assert offenders == []


def test_markdown_of_stored_text_carries_no_control_character():
    """summary.md is read with `cat` too: a host name holding escape sequences is written as
    their escapes, never as the bytes a terminal obeys."""
    from mgpu_bench.output.html_page import md

    out = md("gpu-node\x1b[2J\x1b]0;pwn\x07 | <b>")
    assert not any(ord(c) < 32 or ord(c) == 127 for c in out)
    assert "x1b" in out and "\\|" in out and "\\<b>" in out


# -- one place decides where the tool writes (issue 41, item 3) -----------------------------------

CHECK = [sys.executable, "-m", "mgpu_bench.cli", "check", "--budget", "40s", "--no-progress"]


def _daemon_env(**extra) -> dict:
    """A check's environment as a daemon gives it: no history of its own, no GPU, no launcher."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TORCHELASTIC", "MGPU_BENCH", "XDG_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "CUDA_VISIBLE_DEVICES": "", "SLURMD_NODENAME": "cpu-node", **extra}


def _one_stderr_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgpu-bench: error: "), out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    return lines[0]


def test_special_places_are_refused_by_the_path_and_by_the_file_system(tmp_path):
    from mgpu_bench.core.paths import special_place

    for folder, words in (("/dev", "devtmpfs"), ("/dev/shm", "in /dev"), ("/dev/shm/new/deeper", "in /dev"),
                          ("/proc/self", "proc"), ("/sys/kernel", "sys")):
        where = special_place(folder)
        assert where is not None and words in where, (folder, where)
    link = tmp_path / "to-shm"
    link.symlink_to("/dev/shm")
    assert "in /dev" in (special_place(link) or "")  # resolved first
    assert special_place(tmp_path) is None and special_place(tmp_path / "not-yet") is None


@pytest.mark.parametrize("state", ["/dev", "/dev/shm/{tag}/state", "/proc/self/{tag}"])
def test_a_check_never_makes_its_state_folder_in_a_special_place(state):
    """HOME=/dev XDG_STATE_HOME=/dev mgpu-bench check made /dev/mgpu-bench: the state folder is
    refused (exit 2, one line naming the fix) before anything is made there."""
    tag = f"mgpu-bench-test-{os.getpid()}"
    state = state.format(tag=tag)
    made = Path(state, "mgpu-bench")
    assert not made.exists()
    try:
        out = subprocess.run(CHECK, env=_daemon_env(HOME="/dev", XDG_STATE_HOME=state), capture_output=True,
                             text=True, timeout=scaled(120), check=False)
        line = _one_stderr_line(out)
        assert f"XDG_STATE_HOME={state}" in line and "set XDG_STATE_HOME to a writable folder elsewhere" in line
        assert not made.exists() and not Path("/dev/.local").exists()
        assert not os.path.lexists(f"/dev/shm/{tag}")
    finally:  # a regression must not leave a folder in /dev behind
        for p in (made, Path("/dev/shm", tag, "state", "mgpu-bench"), Path("/dev/shm", tag, "state"),
                  Path("/dev/shm", tag)):
            if p.is_dir() and str(p).startswith("/dev/"):
                try:
                    p.rmdir()
                except OSError:
                    pass


def test_a_set_xdg_state_home_that_is_not_there_yet_is_made_and_used(tmp_path):
    """An XDG_STATE_HOME that is set but not yet made was skipped for /var/lib/mgpu-bench: it is
    made as the XDG Base Directory specification says (its missing folders 0700) and the check's
    history goes in its mgpu-bench folder."""
    state = tmp_path / "deep" / "state"
    out = subprocess.run(CHECK, env=_daemon_env(HOME="/dev", XDG_STATE_HOME=str(state)), capture_output=True,
                         text=True, timeout=scaled(180), check=False)
    db = state / "mgpu-bench" / "history.sqlite3"
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"stored in {db} instead" in out.stderr
    assert stat.S_IMODE((tmp_path / "deep").stat().st_mode) == 0o700 and stat.S_IMODE(state.stat().st_mode) == 0o700
    with History.open(db, readonly=True) as h:
        assert [i.kind for i in h.list()] == ["check"]


@pytest.fixture
def shm_tag():
    """A name under /dev/shm that the test checks is never made (removed should a regression make it)."""
    tag = f"mgpu-bench-test-{os.getpid()}"
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    yield tag
    p = Path("/dev/shm", tag)
    if p.is_dir():
        for q in sorted(p.rglob("*"), reverse=True):
            q.rmdir() if q.is_dir() else q.unlink()
        p.rmdir()
    elif p.exists():
        p.unlink()


def test_shared_memory_is_refused_for_every_output_and_the_database(db, shm_tag, tmp_path):
    """/dev/shm (a tmpfs under /dev: memory, gone at reboot) was taken for reports, JSON and the
    database: refused, one line, nothing made there."""
    shm = f"/dev/shm/{shm_tag}"
    result = tmp_path / "r.json"
    result.write_text(json.dumps(comm_document()))
    comm = ["comm", "--sizes", "1K", "--ops", "allreduce"]
    cases = [([*comm, "--json", shm, "--no-store"], "--json"), ([*comm, "--report", shm, "--no-store"], "--report"),
             ([*comm, "--csv", shm, "--no-store"], "--csv"), ([*comm, "--prometheus", shm, "--no-store"], "--prometheus"),
             ([*comm, "--db", shm], "history database"), (["history", "list", "--db", shm], "history database"),
             (["report", result, "--out", shm], "--out"), (["side-by-side", "r1", "r2", "--db", db, "--json", shm], "--json"),
             (["compare", "r2", "--db", db, "--json", shm], "--json"), (["topo", "--json", shm], "--json")]
    for args, words in cases:
        line = one_error_line(invoke(*args))
        assert words in line and "/dev" in line, (args, line)
        assert not os.path.lexists(shm), args
    line = one_error_line(invoke(*comm, env={"MGPU_BENCH_DB": f"{shm}.sqlite3"}))
    assert "in /dev" in line and not os.path.lexists(f"{shm}.sqlite3")


@pytest.mark.parametrize("args, flag", [
    (["side-by-side", "r1", "r2", "--report"], "--report"), (["side-by-side", "r1", "r2", "--json"], "--json"),
    (["report", "r1", "--out"], "--out"), (["compare", "r2", "--json"], "--json"),
    (["history", "show", "r1", "--prometheus"], "--prometheus"), (["topo", "--json"], "--json"),
    (["comm", "--sizes", "1K", "--no-store", "--report"], "--report"),
    (["comm", "--sizes", "1K", "--no-store", "--csv"], "--csv"),
    (["model", "--data", "loader", "--no-store", "--data-dir"], "--data-dir"),
])
@pytest.mark.parametrize("name", ["", " ", "\t", "rep/ "])
def test_a_blank_output_name_is_refused_and_nothing_is_made(db, tmp_path, monkeypatch, args, flag, name):
    """`side-by-side --report ''` wrote into the working folder and `--report ' '` made a folder
    named with a space: a blank name (or a blank folder name in it) is refused, one line naming
    the fix, and the working folder is left as it was."""
    work = tmp_path / "work"
    (work / "rep").mkdir(parents=True)
    monkeypatch.chdir(work)
    db_args = ["--db", db] if args[0] in ("side-by-side", "report", "compare", "history") else []
    line = one_error_line(invoke(*args, name, *db_args))
    assert f"{flag} {name!r}" in line and ("is blank" in line or "blanks only" in line), line
    assert "give a name of visible characters" in line or "give names of visible characters" in line
    assert sorted(p.name for p in work.rglob("*")) == ["rep"]


def test_a_report_folder_whose_report_file_is_a_database_is_refused_before_anything(db, tmp_path):
    """`report --out` into a folder whose report.html is a history database ran, then exit 1 (the
    write refused it): refused up front again, exit 2, the database untouched, for a result file
    and for a stored run, and for a measuring command's --report."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(db, out / "report.html")
    before = (out / "report.html").read_bytes()
    result = tmp_path / "r.json"
    result.write_text(json.dumps(comm_document()))
    for args in (["report", result, "--out", out], ["report", "r1", "--db", db, "--out", out],
                 ["comm", "--sizes", "1K", "--no-store", "--report", out],
                 ["side-by-side", "r1", "r2", "--db", db, "--report", out]):
        line = one_error_line(invoke(*args))
        assert "history database" in line and "give the output another path" in line, (args, line)
    line = one_error_line(invoke("comm", "--sizes", "1K", "--no-store", "--json", out / "report.html"))
    assert "would replace an mgpu-bench history database" in line
    assert (out / "report.html").read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["report.html"]
