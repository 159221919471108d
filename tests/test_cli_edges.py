"""The command line's edges (issue 33): each in one line, exit code 2 for bad input, nothing made
before a refusal, never a traceback.

- the current folder deleted under the shell; `comm --nproc 0`; `report --out` on a full disk;
- HOME and XDG_DATA_HOME in special places (/dev, /proc, /sys, a folder that is not there, a
  relative one, none): the history refused before anything is made there, and the libraries'
  caches never written there (paths.private_caches);
- user code that hangs or exits: at import and in the workload function, bounded and said
  (workloads/user.py), in process and in a real `model` run whose ranks hang, exit or raise (their
  own error in one line, not torch-elastic's traceback and `ChildFailedError: `);
- the command a child process stores is the one the user typed (children.user_command);
- a bounded option's value and its bound printed alike (probe.within).

Real processes where the point is the process (the folder, the environment, the ranks)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import scaled
from hypothesis import given, settings
from hypothesis import strategies as st

from mgpu_bench.cli import cli
from mgpu_bench.core.errors import InputError

FIX = Path(__file__).with_name("fixtures")
ROOT = Path(__file__).resolve().parents[1]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc, /dev, mounts")
TRACES = ("Traceback", "ChildFailedError", "Exception ignored", "torch/distributed/elastic")


def _env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _cli(args, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mgpu_bench.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env or _env(), timeout=timeout, check=False)


def _one_line(proc, code: int = 2, *words: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr[-3000:]
    assert len(lines) == 1 and not any(t in proc.stderr for t in TRACES), proc.stderr[-3000:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# -- the current folder, --nproc, a full disk -----------------------------------------------------


@linux
@pytest.mark.parametrize("args", [["comm", "--sizes", "1K", "--json", "run.json", "--no-store"],
                                  ["report", str(FIX / "comm_2x_h200.json"), "--out", "rep"],
                                  ["history", "list"]], ids=lambda a: a[0])
def test_a_deleted_current_folder_is_one_line(tmp_path, args):
    """`--json` in a folder removed under the shell was a FileNotFoundError traceback (and torch's
    MKL failed to load): now one line naming the fix, exit 2, before anything runs."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (f"import os, subprocess, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
              f"sys.exit(subprocess.run([sys.executable, '-m', 'mgpu_bench.cli', *{args!r}]).returncode)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(),
                          timeout=300, check=False)
    _one_line(proc, 2, "the current folder is gone", "cd to an existing folder")


@pytest.mark.parametrize("nproc,bound", [("0", "collectives need at least 2 ranks"),
                                         ("1", "collectives need at least 2 ranks"),
                                         ("-3", "collectives need at least 2 ranks"),
                                         ("257", "at most 256 (gloo processes on this machine's CPUs)")])
def test_comm_nproc_out_of_range_is_one_line(before_measuring, nproc, bound):
    """`comm --nproc 0` was a ValueError traceback from the size planning."""
    r = CliRunner().invoke(cli, ["comm", "--nproc", nproc, "--no-store"])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [f"mgpu-bench: error: --nproc {nproc}: {bound}"], \
        r.output


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs filled to the last block: a disk that is full (root can mount one)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                                           capture_output=True, check=False).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    try:
        with contextlib.suppress(OSError), open(mnt / "fill", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


@linux
def test_report_out_on_a_full_disk_is_one_line_naming_it(tmp_path, full_disk):
    proc = _cli(["report", FIX / "comm_2x_h200.json", "--out", full_disk / "rep"], tmp_path)
    line = _one_line(proc, 1, "could not write the report into", "No space left on device", "the disk or quota is full")
    assert str(full_disk / "rep") in line


# -- HOME and XDG_DATA_HOME in special places -----------------------------------------------------

SPECIAL_HOMES = {"HOME=/dev": {"HOME": "/dev"}, "HOME=/proc": {"HOME": "/proc"}, "HOME=/sys": {"HOME": "/sys"},
                 "XDG_DATA_HOME=/dev": {"XDG_DATA_HOME": "/dev"}, "XDG_DATA_HOME=/proc/self": {"XDG_DATA_HOME": "/proc/self"},
                 "HOME missing": {"HOME": "{tmp}/no-such-home"}, "HOME relative": {"HOME": "relative/home"},
                 "HOME empty": {"HOME": ""}}


def _listing(*folders: str) -> dict[str, set[str]]:
    out = {}
    for f in folders:
        try:
            out[f] = set(os.listdir(f))
        except OSError:
            out[f] = set()
    return out


@linux
@pytest.mark.parametrize("where", list(SPECIAL_HOMES))
@pytest.mark.parametrize("command", ["history add", "baseline set", "comm", "suite"])
def test_a_special_home_is_refused_before_anything_is_made(before_measuring, monkeypatch, where, command):
    """`history add` with HOME=/dev made /dev/.local/share, then refused it: every command that
    stores refuses the default database's place in one line (exit 2) before making any folder,
    in /dev, /proc, /sys or a HOME that is not there (in process: the place is read when used)."""
    tmp = before_measuring
    for var in ("MGPU_BENCH_DB", "XDG_DATA_HOME"):
        monkeypatch.delenv(var, raising=False)
    for k, v in SPECIAL_HOMES[where].items():
        monkeypatch.setenv(k, v.format(tmp=tmp))
    args = {"history add": ["history", "add", str(FIX / "comm_2x_h200.json")], "baseline set": ["baseline", "set", "r1"],
            "comm": ["comm", "--sizes", "1K"], "suite": ["suite", "--quick", "--report", str(tmp / "rep")]}[command]
    before = _listing("/dev", str(tmp))  # /proc and /sys refuse new files by themselves
    r = CliRunner().invoke(cli, args)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("mgpu-bench: error: "), r.output
    assert any(w in lines[0] for w in ("history", "HOME")), lines[0]
    assert _listing("/dev", str(tmp)) == before


@linux
@pytest.mark.parametrize("where", ["HOME=/dev", "HOME=/proc", "HOME missing", "HOME empty"])
def test_the_libraries_never_write_into_a_special_home(tmp_path, where):
    """`report` with HOME=/dev made /dev/.cache and /dev/.config (matplotlib's font cache and
    config): the libraries' caches go to a private temporary folder instead, removed at exit, and
    nothing is said about them."""
    env = _env(MGPU_BENCH_DB=None, XDG_CACHE_HOME=None, XDG_CONFIG_HOME=None, MPLCONFIGDIR=None,
               **{k: v.format(tmp=tmp_path) for k, v in SPECIAL_HOMES[where].items()})
    before = _listing("/dev", str(tmp_path))
    proc = _cli(["report", FIX / "comm_2x_h200.json", "--out", tmp_path / "rep"], tmp_path, env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert (tmp_path / "rep" / "report.html").exists()
    after = _listing("/dev", str(tmp_path))
    assert {k: v - before[k] for k, v in after.items()} == {"/dev": set(), str(tmp_path): {"rep"}}


def test_private_caches_moves_only_what_is_unusable(tmp_path, monkeypatch):
    from mgpu_bench.core import paths

    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    assert paths.private_caches(env) is None and env == {"HOME": str(home)}  # a usable HOME: nothing moved
    env = {"HOME": "/dev", "XDG_CACHE_HOME": str(tmp_path)}
    folder = paths.private_caches(env)
    assert folder and env["XDG_CACHE_HOME"] == str(tmp_path)  # a usable cache of its own is kept
    assert env["XDG_CONFIG_HOME"].startswith(folder) and env["TRITON_CACHE_DIR"].startswith(folder)
    assert Path(folder).is_dir() and f"pid{os.getpid()}-" in folder


# -- user code that hangs or exits -----------------------------------------------------------------

BAD_MODULE = '''
import os, sys, time
import torch
MODE = os.environ.get("BAD", "")
if MODE == "sleep at import":
    time.sleep(600)
if MODE.startswith("exit at import"):
    sys.exit(int(MODE.split()[-1]))
if MODE == "loop at import":
    while True:
        try:
            time.sleep(0.01)
        except Exception:  # a module that swallows every exception still stops at its bound
            pass


def step(device):
    if MODE == "sleep in the workload function":
        time.sleep(600)
    if MODE == "exit in the workload function":
        sys.exit(0)
    model = torch.nn.Linear(8, 8).to(device)

    def loss(m, b):
        real = b.device.type != "meta"
        if real and MODE == "raise in the step":
            raise RuntimeError("my step broke: shapes (4, 8) and (9, 8)")
        if real and MODE == "sleep in the step":
            time.sleep(600)
        if real and MODE == "exit in the step":
            sys.exit(0)
        return m(b).square().mean()

    return model, lambda n: torch.randn(n, 8, device=device), loss
'''


@pytest.fixture
def bad_module(tmp_path) -> Path:
    path = tmp_path / "badstep.py"
    path.write_text(BAD_MODULE)
    return path


IMPORT_CASES = {"sleep at import": "did not return within", "loop at import": "did not return within",
                "exit at import 0": "called sys.exit(0)", "exit at import 3": "called sys.exit(3)",
                "sleep in the workload function": "did not return within",
                "exit in the workload function": "called sys.exit(0)"}


@pytest.mark.parametrize("mode", list(IMPORT_CASES))
def test_user_code_that_hangs_or_exits_before_measuring_is_bad_input(bad_module, monkeypatch, mode):
    """A module that sleeps at import made `model` wait for ever; one that calls sys.exit(0) made it
    exit 0 having run nothing: both are bad input in one line, within the bound, in process (the
    CLI's configure runs here)."""
    import time

    import torch.distributed  # noqa: F401 - imported before the 1 s bound starts: the module's own code is timed

    from mgpu_bench import workloads

    monkeypatch.setenv("BAD", mode)
    monkeypatch.setenv("MGPU_BENCH_USER_CODE_TIMEOUT", "1")  # the module's own code takes ms; three cases sleep to it
    monkeypatch.delitem(sys.modules, "mgpu_bench_user_badstep", raising=False)
    t0 = time.monotonic()
    with pytest.raises(InputError) as caught:
        workloads.resolve(f"{bad_module}:step")
    assert IMPORT_CASES[mode] in str(caught.value) and "\n" not in str(caught.value), caught.value
    assert time.monotonic() - t0 < 60  # the bound, not the 600 s the module asks for
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0 and signal.getsignal(signal.SIGALRM) is signal.SIG_DFL


def test_the_bound_leaves_a_callers_own_timer_and_handler_alone(monkeypatch):
    """Off its own terms (a SIGALRM handler of the caller's) the bound arms nothing and changes
    nothing; on them it stops a sleeper at the bound; a bound that is not a positive number of
    seconds is said."""
    import time

    from mgpu_bench.workloads import user

    monkeypatch.setenv(user.USER_CODE_ENV, "0.2")
    theirs = signal.signal(signal.SIGALRM, lambda s, f: None)
    try:
        with user.bounded("theirs"):
            assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
            time.sleep(0.4)  # past the bound: not stopped, the caller's handler is not ours to use
        assert signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGALRM, theirs)
    t0 = time.monotonic()
    with pytest.raises(user.UserCodeError, match="did not return within 0.2 s"), user.bounded("a sleeper"):
        time.sleep(30)
    assert time.monotonic() - t0 < 20
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0 and signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    for bad in ("0", "-1", "x", "nan"):
        monkeypatch.setenv(user.USER_CODE_ENV, bad)
        with pytest.raises(InputError, match=user.USER_CODE_ENV):
            user.user_code_limit()


STEP_CASES = {"raise in the step": ("rank 0 failed: RuntimeError: my step broke: shapes (4, 8) and (9, 8) (at ",
                                    "badstep.py:"),
              "sleep in the step": ("badstep.py:step's loss did not return within {bound} s",),
              "exit in the step": ("called sys.exit(0)",)}


# `python -m mgpu_bench.cli ARGS` with torch warmed up first. The CLI imports a user module before
# torch and counts the workload's FLOPs on the meta device, under the bound: torch's import and the
# lazy imports of its first meta step under the FLOP counter (800 modules, 5 s of CPU, 10-20 s on a
# loaded machine) would need a bound of half a minute. Done before, every bounded call of the CLI
# and of the ranks (which import torch themselves, first) takes under 0.1 s, and a step that sleeps
# is stopped after seconds.
_CLI_TORCH_FIRST = (
    "import runpy, torch\n"
    "from torch.utils.flop_counter import FlopCounterMode\n"
    "with FlopCounterMode(display=False):\n"
    "    torch.nn.Linear(8, 8, device='meta')(torch.randn(4, 8, device='meta')).square().mean().backward()\n"
    "runpy.run_module('mgpu_bench.cli', run_name='__main__', alter_sys=True)\n"
)


@pytest.mark.parametrize("mode", list(STEP_CASES))
def test_a_ranks_step_that_fails_hangs_or_exits_is_its_own_one_line(tmp_path, bad_module, mode):
    """Two gloo ranks under torch's elastic agent: a step that raised printed 30-65 lines of the
    agent's traceback and then `mgpu-bench: ChildFailedError: `; one that slept never answered.
    Now the rank's own error in one line, exit 1, the document written with the failure."""
    bound = max(5, round(scaled(2)))  # 50 times what the slowest bounded call takes (warmed, _CLI_TORCH_FIRST)
    env = _env(BAD=mode, MGPU_BENCH_USER_CODE_TIMEOUT=str(bound))
    args = ["model", "--model", f"{bad_module}:step", "--steps", "1", "--warmup-steps", "0", "--no-exposed-comm",
            "--no-progress", "--no-store", "--json", tmp_path / "m.json"]
    proc = subprocess.run([sys.executable, "-c", _CLI_TORCH_FIRST, *map(str, args)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert not any(t in proc.stderr for t in TRACES), proc.stderr[-3000:]
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("mgpu-bench: "))
    words = [w.format(bound=bound) for w in STEP_CASES[mode]]
    for w in words:
        assert w in line, (w, proc.stderr[-2000:])
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["status"]["stopped"] == "failed" and words[0] in doc["status"]["message"]


# -- the command the user typed --------------------------------------------------------------------


def test_a_child_records_the_command_its_parent_was_given(tmp_path):
    """check's measuring process stored `cli.py check --json /tmp/.../check.json`: a process the
    tool starts (child_env) records the command the user typed; a process that merely inherits the
    variable from elsewhere (no mark from a live parent) records its own."""
    from mgpu_bench.core import children

    probe = "import mgpu_bench, json; from mgpu_bench.core.children import user_command; print(json.dumps(user_command()))"
    typed = ["mgpu-bench", "check", "--drain", "--format", "npd"]
    env = {**_env(), children.COMMAND_ENV: json.dumps(typed), children.ENV: f"{os.getpid()}:keep"}
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert json.loads(got.stdout) == typed
    stray = {**_env(), children.COMMAND_ENV: json.dumps(typed)}  # no parent's mark: not ours to read
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=stray, check=True)
    assert json.loads(got.stdout) == ["-c"]


def test_python_dash_m_is_recorded_as_typed(tmp_path):
    """`python -m mgpu_bench.cli comm ...` was stored as `/path/mgpu_bench/cli.py comm ...`."""
    db = tmp_path / "h.sqlite3"
    proc = _cli(["comm", "--sizes", "1K", "--ops", "allreduce", "--outofplace", "--iters", "3", "--db", db], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from mgpu_bench.history import History

    with History.open(db, readonly=True) as h:
        (run,) = h.list()
    assert run.command.split()[1:4] == ["-m", "mgpu_bench.cli", "comm"], run.command
    assert os.path.basename(run.command.split()[0]).startswith("python"), run.command


# -- a bounded value and its bound alike -----------------------------------------------------------


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(low=st.integers(0, 10**6), span=st.integers(1, 10**6), step=st.floats(1e-9, 1e6, allow_nan=False))
def test_a_value_out_of_its_range_never_reads_as_inside_it(low, span, step):
    """`--preprocess-ms 60000.0000001: at most 60000` and `--peak-tflops 1e+06: at most 1000000`: the
    value and its bound are printed with the same exactness, so the value shown is the value given
    and never equals the bound it broke."""
    from mgpu_bench.results.probe import within

    high = float(low + span)
    for value, side in ((high + step, "at most"), (low - step, "at least")):
        if value in (high, float(low)) or not math.isfinite(value):
            continue
        with pytest.raises(InputError) as caught:
            within("--x", value, low, high)
        text = str(caught.value)
        shown, bound = text.removeprefix("--x ").split(f": {side} ")
        assert float(shown) == value and shown != bound, text
