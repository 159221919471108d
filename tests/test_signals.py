"""Signals from outside, on real processes: repeated Ctrl-C keeps what was measured, SIGKILL of
the tool leaves no process of it behind, and the temporary folders of killed runs are removed.

Each run is started in a session of its own and signalled as a terminal does: the whole process
group (the tool and every child it started) gets each SIGINT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import AS_A_TERMINAL, DEADLINE_S, FIRST_SIZE, plain, scaled, wait_for_output

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def _cpu_only():
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only (the gloo ranks)")


def _start(args: list[str], cwd, env: dict | None = None, code: str | None = None) -> subprocess.Popen:
    """`mgpu-bench ARGS` in a session of its own (or, given `code`, `python -c CODE ARGS`)."""
    env = {**os.environ, **AS_A_TERMINAL, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    how = ["-c", code] if code is not None else ["-m", "mgpu_bench.cli"]
    return subprocess.Popen([sys.executable, *how, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc/PID/task/*/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie, dead and not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _orphans_after(pids: list[int], deadline_s: float) -> list[int]:
    """The processes of `pids` still running after `deadline_s` (at once when none is); they
    are killed, so that a failing test leaves nothing behind."""
    end = time.monotonic() + deadline_s
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return left


@linux
@pytest.mark.parametrize("presses, gap_s", [(2, 0.3), (20, 0.05)], ids=["twice-0.3s-apart", "20-in-a-second"])
def test_repeated_ctrl_c_writes_what_was_measured(tmp_path, presses, gap_s):
    """The first Ctrl-C stops the sweep; the later ones, to the whole process group as from a
    terminal, are noted and change nothing: exit 130, the JSON with the sizes measured, the
    history row, the report, no traceback from the tool or its gloo ranks."""
    _cpu_only()
    j, db, rep = tmp_path / "r.json", tmp_path / "h.sqlite3", tmp_path / "rep"
    rep.mkdir()
    proc = _start(["comm", "--backend", "torch", "--progress", "--sizes", "1M-64M", "--json", str(j), "--db", str(db),
                   "--report", str(rep)], tmp_path)
    try:
        seen = wait_for_output(proc, FIRST_SIZE)
        sent = 0
        for _ in range(presses):
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, signal.SIGINT)
            sent += 1
            time.sleep(gap_s)
        _out, rest = proc.communicate(timeout=scaled(DEADLINE_S))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = plain((seen + rest).decode(errors="replace"))
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if sent > 1:
        assert "mgpu-bench: already stopping: writing what was measured" in err
    assert "abandoned" not in err
    doc = json.loads(j.read_text())
    assert doc["status"]["stopped"] == "interrupted" and doc["measurements"]
    from mgpu_bench.history import History

    with History.open(db) as h:
        assert [r.kind for r in h.list()] == ["comm"]
    assert (rep / "report.html").exists()


def _line(proc, deadline_s: float | None = None) -> bytes:
    """The next line of `proc`'s stdout, or b"" after `deadline_s` (never a read that waits for
    a process that holds the pipe open)."""
    import select

    end, buf = time.monotonic() + (scaled(DEADLINE_S) if deadline_s is None else deadline_s), b""
    while not buf.endswith(b"\n") and time.monotonic() < end:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            chunk = os.read(proc.stdout.fileno(), 1)
            if not chunk:
                break
            buf += chunk
    return buf


@linux
def test_ctrl_c_four_times_abandons_a_stop_that_hangs(tmp_path):
    """A stop that does not end (here: it sleeps) is abandoned by Ctrl-C pressed three more
    times, a second apart: one line, exit 130, and the child it started is killed with it.

    The child runs mgpu_bench, as every child the tool starts through child_env() does (it binds
    itself to its parent when it imports the package: children.adopt); its pid is printed inside
    the `try`, so that the first SIGINT always finds the handler that waits for it."""
    script = (
        "import subprocess, sys, time\n"
        "from mgpu_bench import children, errors\n"
        "errors.handle_stop_signals()\n"
        "try:\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import mgpu_bench, time; time.sleep(300)'],\n"
        "                             env=children.child_env())\n"
        "    print(child.pid, flush=True)\n"
        "    time.sleep(300)\n"
        "except KeyboardInterrupt:\n"
        "    print('stopping', flush=True)\n"
        "    time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path, start_new_session=True)
    try:
        child = int(_line(proc) or b"0")
        assert child, "the script did not start its child"
        proc.send_signal(signal.SIGINT)
        assert _line(proc).strip() == b"stopping"
        limit = scaled(10.0)
        t0 = time.monotonic()
        for _ in range(6):  # the third press counted after the first, each a second after the last, abandons
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGINT)
            time.sleep(1.1)
        proc.wait(timeout=scaled(DEADLINE_S))
        err = proc.stderr.read()  # the child is gone with its parent: nothing holds the pipe open
    finally:
        if proc.poll() is None:  # its child, bound to it, goes with it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 130, lines
    assert 2.0 <= time.monotonic() - t0 < limit  # three presses counted, each a second after the last
    assert lines[-1] == "mgpu-bench: abandoned after repeated Ctrl-C: what was measured is not written"
    assert lines[-2] == "mgpu-bench: already stopping: writing what was measured (Ctrl-C 1 more time, a second " \
                        "apart, abandons it)"
    assert all(line.startswith("mgpu-bench: already stopping") for line in lines[:-1])
    assert _orphans_after([child], scaled(10.0)) == []


@linux
def test_sigkill_of_comm_leaves_no_gloo_rank_running(tmp_path):
    """SIGKILL (the OOM killer, a launcher's last word) of `comm` mid-sweep: its gloo ranks, and
    multiprocessing's helper, are gone within seconds, not left spinning."""
    _cpu_only()
    proc = _start(["comm", "--backend", "torch", "--progress", "--sizes", "1M-64M", "--no-store"], tmp_path)
    try:
        wait_for_output(proc, FIRST_SIZE)
        below = _descendants(proc.pid)
        assert len(below) >= 2, below  # the two ranks
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = _orphans_after(below, scaled(20.0))
    assert left == [], f"still running 20 s after their parent was killed: {left}"


@linux
def test_sigkill_of_suite_ends_its_probe_and_a_later_run_removes_its_folder(tmp_path):
    """SIGKILL of `suite` as soon as it has started its first probe (a child still starting up,
    before it could bind itself to its parent: the race the child closes by checking its
    parent): the probe ends too; the suite's temporary folder, named with its pid, stays and
    is removed by a later run once it is stale."""
    from mgpu_bench.core import children

    proc = _start(["suite", "--quick", "--rounds", "2", "--no-store", "--no-progress", "--report",
                   str(tmp_path)], tmp_path, env={"TMPDIR": str(tmp_path)})
    try:
        end = time.monotonic() + scaled(DEADLINE_S)
        probes: list[int] = []
        while not probes and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.05)
            probes = [p for p in _descendants(proc.pid) if "mgpu_bench.cli" in _cmdline(p)]
        assert probes, plain(proc.stderr.read().decode(errors="replace")) if proc.poll() is not None else "no probe"
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = _orphans_after(probes, scaled(30.0))
    assert left == [], f"the suite's probe still running 30 s after the suite was killed: {left}"
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("mgpu-bench-suite-")]
    # it ended with the suite, not after its sweep (which takes seconds, and writes this file)
    assert not (folder / "2-comm.json").exists()
    assert folder.name.startswith(f"mgpu-bench-suite-pid{proc.pid}-")
    assert children.clean_stale("mgpu-bench-suite-", str(tmp_path)) == []  # not stale yet
    later = time.time() + children.STALE_S + 1
    assert children.clean_stale("mgpu-bench-suite-", str(tmp_path), now=later) == [str(folder)]


def test_stale_temporary_folders_of_dead_runs_are_removed_never_a_live_ones(tmp_path):
    from mgpu_bench.core import children

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    gone, me = int(dead.stdout), os.getpid()
    old = time.time() - children.STALE_S - 60
    very_old = time.time() - children.STALE_UNNAMED_S - 60

    def make(name: str, when: float, file: bool = False):
        p = tmp_path / name
        if file:
            p.write_text("log")
        else:
            p.mkdir()
            (p / "1-model.log").write_text("log")
            os.utime(p / "1-model.log", (when, when))
        os.utime(p, (when, when))
        return p

    removed = {
        make(f"mgpu-bench-suite-pid{gone}-abcd_123", old),  # owner gone, unchanged for long
        make("mgpu-bench-suite-k2j4h5g6", very_old),  # an older release's name: no pid, a day old
    }
    kept = {
        make(f"mgpu-bench-suite-pid{me}-abcd_124", old),  # owner alive
        make(f"mgpu-bench-suite-pid{gone}-abcd_125", time.time()),  # owner gone, but changed just now
        make("mgpu-bench-suite-k2j4h5g7", old),  # no pid, not a day old
        make("mgpu-bench-suite-20240101-120000", very_old),  # a report folder's name, not ours
        make(f"mgpu-bench-nccl-pid{gone}-abcd_126.log", old, file=True),  # another prefix
    }
    busy = make(f"mgpu-bench-suite-pid{gone}-abcd_127", old)  # a file in it written just now
    os.utime(busy / "1-model.log")
    kept.add(busy)
    target = make("elsewhere", old)
    link = tmp_path / f"mgpu-bench-suite-pid{gone}-abcd_128"
    link.symlink_to(target)
    kept |= {link, target}

    got = children.clean_stale("mgpu-bench-suite-", str(tmp_path))
    assert sorted(got) == sorted(str(p) for p in removed)
    assert all(not os.path.lexists(p) for p in removed)
    assert all(os.path.lexists(p) for p in kept) and (target / "1-model.log").exists()
    assert children.clean_stale("mgpu-bench-nccl-", str(tmp_path)) == [str(tmp_path / f"mgpu-bench-nccl-pid{gone}-abcd_126.log")]


def test_every_child_process_and_temporary_folder_of_the_tool_is_bound_to_its_run():
    """The class, not the examples: wherever mgpu_bench starts a process it binds it to itself
    (children.child_env for a subprocess, children.spawning around multiprocessing, torch's
    elastic agent only through launch.run_elastic), and it makes temporary folders and files in
    the temporary directory only with its pid in their names (children.temp_folder, temp_name)."""
    import ast
    from pathlib import Path

    import mgpu_bench

    root = Path(mgpu_bench.__file__).parent
    wrong: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        text = path.read_text()
        if not any(w in text for w in ("subprocess", "elastic_launch", "get_context", "spawn", "start_processes",
                                       "tempfile")):
            continue  # none of the calls below can be in it (parsing every file is most of the test's time)
        tree = ast.parse(text)
        spawns_mp = False
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            where = f"{rel}:{node.lineno} {name}()"
            keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
            if name in ("subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
                        "subprocess.check_output") and "child_env(" not in keywords.get("env", ""):
                wrong.append(f"{where}: give env=children.child_env(...)")
            elif name.endswith("elastic_launch") and rel != "mgpu_bench/core/launch.py":
                wrong.append(f"{where}: use launch.run_elastic")
            elif name.endswith(("get_context", "mp.spawn", "start_processes")):
                spawns_mp = True
            elif name in ("tempfile.mkdtemp", "tempfile.TemporaryDirectory", "tempfile.mkstemp") \
                    and rel != "mgpu_bench/core/children.py" and "dir" not in keywords \
                    and "temp_name(" not in keywords.get("prefix", ""):
                wrong.append(f"{where}: use children.temp_folder, or prefix=children.temp_name(...)")
        if spawns_mp and "children.spawning(" not in text:
            wrong.append(f"{rel}: starts processes with multiprocessing outside children.spawning()")
    assert wrong == [], "\n".join(wrong)


def test_every_child_started_through_child_env_runs_mgpu_bench():
    """The mark of child_env() binds a child only when the child imports mgpu_bench (adopt(), in
    the package's __init__): a child that never does (scontrol, a shell, `python -c 'import time'`)
    would outlive a parent killed before its orderly stop (a CI hang: such a test child outlived
    its parent and held its pipe). So every subprocess the tool starts with child_env() runs this
    interpreter on one of the package's modules (`sys.executable -m mgpu_bench...`), or is bound
    by the kernel itself (preexec_fn=children.die_with_parent)."""
    import ast
    from pathlib import Path

    import mgpu_bench

    root = Path(mgpu_bench.__file__).parent
    wrong, seen = [], 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if "child_env" not in text:
            continue  # no call below can be in it (parsing and unparsing every file is most of the test's time)
        tree = ast.parse(text)
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and ast.unparse(node.func).startswith("subprocess.") and \
                        any(k.arg == "env" and "child_env(" in ast.unparse(k.value) for k in node.keywords):
                    seen += 1
                    body = ast.unparse(fn)
                    bound = any(k.arg == "preexec_fn" and ast.unparse(k.value) == "children.die_with_parent"
                                for k in node.keywords)
                    if not bound and ("sys.executable" not in body or not any(
                            f"'-m', '{m}" in body or f'"-m", "{m}' in body for m in ("mgpu_bench.",))):
                        wrong.append(f"{path.relative_to(root.parent)}:{node.lineno} {fn.name}")
    assert seen >= 3, seen  # the suite's probes, the allocator children, comm --tune's trials
    assert wrong == [], wrong


def test_every_probe_defers_stop_signals_once_its_last_measurement_is_in():
    """The class, not the examples: the runner defers stop signals only once probe.run returns, so
    a signal while a probe's ranks, sessions, GPU buffers or child processes went after its last
    measurement, or while it was analysed, lost the run (comm, then model). Every registered
    probe calls errors.defer_sigterm() in its own package, where its last measurement is in."""
    import ast
    import importlib
    from pathlib import Path

    from mgpu_bench.results import probe as registry

    missing = []
    for name in registry.names():
        folder = Path(importlib.import_module(type(registry.get(name)).__module__).__file__).parent
        calls = {ast.unparse(node.func) for path in folder.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call)}
        if not any(c.split(".")[-1] == "defer_sigterm" for c in calls):
            missing.append(name)
    assert missing == [], f"no errors.defer_sigterm() once the last measurement is in: {missing}"


# -- signals at the end of a run ----------------------------------------------------------------------

_FLOOD = (
    "import atexit, os, subprocess, sys\n"
    "atexit.register(lambda: subprocess.Popen(['sh', '-c', f'while kill -{SIG} {os.getpid()} 2>/dev/null; do :; '\n"
    "                                          'done'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))\n"
    "# registered first: runs after errors' own at-exit step; it stops once this process is reaped\n"
    "from mgpu_bench import errors\n"
    "errors.handle_stop_signals()\n"
    "errors.defer_sigterm()  # measured and written: what is left is the exit\n"
    "print('written', flush=True)\n"
    "sys.exit(0)\n"
)


@linux
@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP"])
def test_a_flood_of_stop_signals_while_the_process_exits_never_ends_it_by_the_signal(tmp_path, sig):
    """A Ctrl-C in a run's last 50 ms, everything written and stored, ended the process by the
    signal (exit -2: the interpreter's finalisation puts the default action back): once the exit
    code is chosen, stop signals are ignored, however many come."""
    proc = subprocess.run([sys.executable, "-c", _FLOOD.replace("{SIG}", sig)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=scaled(120), check=False, start_new_session=True)
    assert proc.returncode == 0 and proc.stdout == "written\n", (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr


_RANKS = '''
import os, pathlib, time
from mgpu_bench import launch


def worker(folder, keep_first):
    rank = os.environ["RANK"]
    if keep_first:
        launch.keep_result({"rank": int(rank)})  # measured: what follows is the rank's teardown
    pathlib.Path(folder, rank + ".ready").touch()
    time.sleep(300)
    return {"rank": int(rank), "late": True}
'''

_DRIVER = '''
import sys
import ranks
from torch.distributed.launcher.api import LaunchConfig
from mgpu_bench import errors, launch

errors.handle_stop_signals()
folder, keep_first = sys.argv[1], sys.argv[2] == "kept"


def lc():
    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="t", rdzv_backend="c10d",
                        rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0, monitor_interval=0.1,
                        start_method="spawn")


try:
    got = launch.run_elastic(lc(), ranks.worker, folder, keep_first, children="die")
    print("kept", sorted(got.items()), flush=True)
except (KeyboardInterrupt, Exception) as exc:  # torch's SignalException is an Exception
    print("lost", type(exc).__name__, flush=True)
try:
    launch.run_elastic(lc(), ranks.worker, folder, False, children="die")
    print("started again", flush=True)
except KeyboardInterrupt as exc:
    print("not started:", type(exc).__name__, flush=True)
'''


@linux
@pytest.mark.parametrize("when", ["kept", "not kept"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_after_the_ranks_kept_their_results_keeps_them(tmp_path, sig, when):
    """A signal after the model's ranks finished their steps, while they tore their group down
    (seconds on a loaded machine), lost the configuration: the results a rank keeps
    (launch.keep_result) are returned by run_elastic, and the stop is raised where the next launch
    would start, so no more work begins; a rank that kept nothing is lost, as before."""
    (tmp_path / "ranks.py").write_text(_RANKS)
    folder = tmp_path / "ready"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(folder), when], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, start_new_session=True)
    try:
        end = time.monotonic() + scaled(DEADLINE_S)
        while len(list(folder.glob("*.ready"))) < 2:
            assert time.monotonic() < end and proc.poll() is None, proc.stderr.read() if proc.poll() else "no ranks"
            time.sleep(0.05)
        proc.send_signal(getattr(signal, sig))
        out, err = proc.communicate(timeout=scaled(DEADLINE_S))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stopped = "Terminated" if sig == "SIGTERM" else "KeyboardInterrupt"
    lines = out.splitlines()
    if when == "kept":
        assert lines == ["kept [(0, {'rank': 0}), (1, {'rank': 1})]", f"not started: {stopped}"], out + err
    else:
        assert len(lines) == 2 and lines[0].startswith("lost ") and lines[1] == f"not started: {stopped}", out + err
    assert "Traceback" not in err and "ChildFailedError" not in err, err[-3000:]


# -- a stop signal in a run's last second ----------------------------------------------------------

# Two sizes: the bar shows "1/2" once the first is measured; what follows is the last size (a few
# ms), the ranks' teardown, the analysis, the history row, the report and the JSON: the window.
_LAST_RUN = ["comm", "--backend", "torch", "--progress", "--sizes", "1K,2K", "--ops", "allreduce", "--outofplace",
             "--iters", "5", "--warmup-iters", "1"]
_LAST_SIZE = r"(?:^|[\s\[])1/2(?:[\s\]]|$)"


def _last_second(folder, delay_s: float | None, sig: int = signal.SIGTERM, group: bool = False,
                 run: list[str] | None = None, until: str = _LAST_SIZE, code: str | None = None) -> dict:
    """One short comm run into `folder` (or `run`: another command, its JSON and history database
    in `folder` too; `code`: run by `python -c CODE`); `delay_s` after `until` appears on its
    stderr (comm: its last size began), `sig` to the tool (or, with `group`, to its process group:
    the gloo ranks too, as a closing terminal or scancel does). -> its exit code, stderr, and the
    seconds from `until` to its exit."""
    folder.mkdir()
    outputs = ["--json", str(folder / "r.json"), "--db", str(folder / "h.sqlite3")]
    proc = _start([*run, *outputs] if run is not None else [*_LAST_RUN, *outputs, "--report", str(folder / "rep")],
                  folder, code=code)
    try:
        seen = wait_for_output(proc, until)
        began, began_wall = time.monotonic(), time.time()
        if delay_s is not None:
            time.sleep(delay_s)
            (os.killpg if group else os.kill)(proc.pid, sig)  # a zombie not yet reaped takes it silently
        _out, rest = proc.communicate(timeout=scaled(DEADLINE_S))
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    j = folder / "r.json"
    return {"code": proc.returncode, "err": plain((seen + rest).decode(errors="replace")), "window_s": ended - began,
            "folder": folder, "sig": sig, "delay_s": delay_s,
            # from `until` to the JSON's last write: the run's own end, before the interpreter's teardown
            "written_s": j.stat().st_mtime - began_wall if j.exists() else None}


def _kept_whole(trial: dict) -> str:
    """What the run left, checked: the JSON, its history row and its report, each complete; or,
    where the stop came before anything was measured, none of them. -> "stopped" (the run says the
    signal stopped it), "complete", or "nothing"."""
    from mgpu_bench.history import History

    folder, err = trial["folder"], trial["err"]
    assert "Traceback" not in err, err[-3000:]
    j, db, rep = folder / "r.json", folder / "h.sqlite3", folder / "rep" / "report.html"
    if not j.exists():
        assert not rep.exists() and (not db.exists() or not History.open(str(db)).list()), err[-3000:]
        return "nothing"
    doc = json.loads(j.read_text())  # whole: it parses
    assert doc["measurements"], err[-3000:]
    assert rep.exists() and "allreduce" in rep.read_text(), err[-3000:]
    with History.open(str(db)) as h:
        (row,) = h.list()
        assert len(h.get(row.run_id).document["measurements"]) == len(doc["measurements"])
    return "stopped" if doc["status"].get("stopped") else "complete"


@linux
def test_a_stop_signal_in_the_last_second_of_comm_keeps_the_json_the_history_row_and_the_report(tmp_path):
    """SIGTERM or SIGHUP, to the tool or to its process group, at points spread over the end of a
    run (the last size, the ranks' teardown, the analysis, storing, the report, the JSON; the window
    measured by a first run): every trial leaves the JSON, its history row and the report whole,
    and exits 128 + the signal (or 0, where the signal came once the exit code was chosen); a run
    that says it was stopped always exits 128 + the signal. Once it lost all three when the signal
    came while the gloo ranks were joined."""
    from concurrent.futures import ThreadPoolExecutor

    _cpu_only()
    first = _last_second(tmp_path / "first", None)
    assert first["code"] == 0 and _kept_whole(first) == "complete", first["err"][-3000:]
    window = first["window_s"]
    kinds = [(signal.SIGTERM, False), (signal.SIGHUP, True), (signal.SIGTERM, True), (signal.SIGHUP, False)]
    # every signal kind once, at 0, 1/4, 1/2 and 3/4 of the window: each trial is a comm run of its own, three
    # processes that import torch (10 s of CPU); the window in sixths, two kinds twice, cost CI 20 s more
    n = len(kinds)
    plans = [(tmp_path / f"t{k}", window * k / n, *kinds[k % len(kinds)]) for k in range(n)]
    with ThreadPoolExecutor(4) as pool:  # all four at once: the test's time, and a host as busy as a real one
        trials = list(pool.map(lambda p: _last_second(*p), plans))
    told = []
    for t in trials:
        what = _kept_whole(t)
        code, expected = t["code"], 128 + t["sig"]
        assert what != "nothing", (t["delay_s"], code, t["err"][-3000:])  # a size was measured before the signal
        assert code in (0, expected), (t["delay_s"], code, t["err"][-3000:])
        assert what != "stopped" or code == expected, (t["delay_s"], code, t["err"][-3000:])
        told.append(code == expected)
    # the signals did land in the runs, not after them
    assert sum(told) >= n // 2, [(round(t["delay_s"], 2), t["code"], round(t["window_s"], 2)) for t in trials]


# One configuration of the tiny GPT on 2 gloo processes. Rank 0's line for its last pass (the
# all-reduce timed in DDP's hook, after the timed steps) comes once the steps are measured; what
# follows is the ranks handing their figures over and tearing their group down, the elastic agent's
# end, the analysis, the history row and the JSON: the window.
_MODEL_RUN = ["model", "--progress", "--nproc", "2", "--steps", "2", "--warmup-steps", "1", "--batch-size", "2",
              "--seq-len", "64", "--no-exposed-comm"]
_MODEL_LAST_PASS = r"communication hook \(not in the figures\): step (\d+)/\1\b"
_SIGNALS = [(signal.SIGTERM, False), (signal.SIGHUP, True), (signal.SIGTERM, True), (signal.SIGHUP, False)]


def _model_left(trial: dict) -> str:
    """What a model run left, checked: the JSON, always; complete (the configuration's timed steps
    on both ranks) with one history row holding it, or marked interrupted with a row only where
    something was measured. -> "complete" or "stopped"."""
    from mgpu_bench.history import History

    folder, err = trial["folder"], trial["err"]
    said = (trial["delay_s"], trial["code"], err[-3000:])
    assert "Traceback" not in err, said
    j, db = folder / "r.json", folder / "h.sqlite3"
    assert j.exists(), said  # never nothing
    doc = json.loads(j.read_text())  # whole: it parses
    stored = []
    if db.exists():
        with History.open(str(db)) as h:
            stored = [h.get(row.run_id).document for row in h.list()]
    if doc["status"].get("stopped"):
        assert doc["status"]["stopped"] == "interrupted" and len(stored) == (1 if doc["runs"] else 0), said
        return "stopped"
    (run,) = doc["runs"]
    assert [len(r["phases"]["step"]) for r in run["ranks"]] == [2, 2], said
    (row,) = stored
    assert row["status"]["completed"] and [len(r["phases"]["step"]) for r in row["runs"][0]["ranks"]] == [2, 2], said
    return "complete"


# Run as `python -c _AT_ANALYSIS model ...`: the CLI, with SIGTERM sent to itself as the last
# configuration's figures are analysed (the ranks gone, the runner not yet writing): a scancel
# landing at that moment, every time.
_AT_ANALYSIS = (
    "import os, signal, sys\n"
    "from mgpu_bench.probes.model import measure\n"
    "analyse = measure.analyse\n"
    "def stopped_while_read(*args, **kwargs):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return analyse(*args, **kwargs)\n"
    "measure.analyse = stopped_while_read\n"
    "from mgpu_bench.cli import main\n"
    "sys.argv = ['mgpu-bench', *sys.argv[1:]]\n"
    "main()\n"
)


@pytest.fixture(scope="module")
def model_at_analysis(tmp_path_factory) -> dict:
    """One model run (_MODEL_RUN) with SIGTERM at its analysis (_AT_ANALYSIS), for two tests: what it
    kept, and, from rank 0's line for its last pass to its JSON's write, the window of a model run's
    end (the SIGTERM is deferred there: the run goes on through the ranks' teardown, the analysis,
    the history row and the JSON, as a run no signal reached does). A model run is the CLI and the
    rank server importing torch, and two ranks forked from it; one serves both tests."""
    _cpu_only()
    return _last_second(tmp_path_factory.mktemp("at-analysis") / "run", None, run=_MODEL_RUN, until=_MODEL_LAST_PASS,
                        code=_AT_ANALYSIS)


@linux
def test_sigterm_while_the_last_configuration_is_analysed_keeps_it(model_at_analysis):
    """The narrow part of model's window, hit every time: SIGTERM after the last configuration's
    ranks returned, while their figures are read. The run is kept whole (the JSON and its history
    row, not a run marked interrupted with nothing in it) and exits 143. It once lost the
    configuration: the signal raised in the analysis, before the runner deferred stop signals."""
    trial = model_at_analysis
    assert trial["code"] == 143 and _model_left(trial) == "complete", trial["err"][-3000:]


@linux
def test_a_stop_signal_in_the_last_seconds_of_model_keeps_the_json_and_the_history_row(tmp_path, model_at_analysis):
    """SIGTERM or SIGHUP, to the tool or to its process group (the gloo ranks too), at points spread
    over the end of a model run (the window measured by the run of model_at_analysis: from rank 0's
    line for its last pass to its JSON's write): every trial leaves the JSON, complete with its history
    row, and exits 128 + the signal (or 0, where the signal came once the exit code was chosen);
    only a signal at the line itself may come before the ranks handed their figures over, and its
    run says it was interrupted. Once a signal after the ranks had returned (their analysis, the
    document) lost the configuration or every output."""
    from concurrent.futures import ThreadPoolExecutor

    _cpu_only()
    reference = model_at_analysis  # a whole run's end: what it wrote is checked, so its window is a whole one
    assert reference["code"] == 143 and _model_left(reference) == "complete", reference["err"][-3000:]
    # the run's own end: to its JSON's write. After that the exit code is chosen, and what is left of the
    # exit is the interpreter's teardown (1-2.5 s with torch loaded; the ranks, forked from the rank
    # server, now end in a fraction of a second): signals spread over the whole exit mostly came too late
    window = reference["written_s"]
    assert window is not None and 0 < window <= reference["window_s"], reference
    n = 4  # each run: the CLI and the rank server importing torch, two ranks forked: a minute on 2 cores
    plans = [(tmp_path / f"t{k}", window * k / n, *_SIGNALS[k % len(_SIGNALS)]) for k in range(n)]
    with ThreadPoolExecutor(2) as pool:  # two at a time: each run is four processes
        trials = list(pool.map(lambda p: _last_second(*p, run=_MODEL_RUN, until=_MODEL_LAST_PASS), plans))
    told = []
    for t in trials:
        what = _model_left(t)
        code, expected = t["code"], 128 + t["sig"]
        said = (t["delay_s"], code, t["err"][-3000:])
        assert code in (0, expected), said
        assert what != "stopped" or code == expected, said
        assert what == "complete" or t["delay_s"] == 0, said  # the figures are handed over within ms of the line
        told.append(code == expected)
    # the signals did land in the runs, not after them
    assert sum(told) >= n // 2, [(round(t["delay_s"], 2), t["code"], round(t["window_s"], 2)) for t in trials]
