"""A user's workload module that ends the tool's process its own way: a KeyboardInterrupt it
raises (made `model` and `plan` exit 130 as if Ctrl-C had been pressed) and os._exit (made them
exit 0 with nothing measured) are the module's error, one line, exit code 2; a real Ctrl-C while
the module imports is still a stop (130). Real CLI processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import DEADLINE_S, scaled, wait_for_output

pytest.importorskip("torch")

MODULE = textwrap.dedent("""
    import os, sys, time
    MODE = os.environ.get("BAD", "")
    if MODE == "KeyboardInterrupt at import":
        raise KeyboardInterrupt
    if MODE == "os._exit at import":
        os._exit(0)
    if MODE == "sleep at import":
        print("importing", file=sys.stderr, flush=True)
        time.sleep(120)


    def step(device):
        import torch
        if MODE == "KeyboardInterrupt in the function":
            raise KeyboardInterrupt
        if MODE == "os._exit in the function":
            os._exit(0)
        model = torch.nn.Linear(8, 8).to(device)
        return model, lambda n: torch.randn(n, 8, device=device), lambda m, b: m(b).square().mean()
""")

SAID = {"KeyboardInterrupt": "raised KeyboardInterrupt with no Ctrl-C pressed: the module's error, not a stop",
        "os._exit": "called os._exit(0): a workload's code must return"}


def _cli(tmp_path: Path, command: str, mode: str, **popen) -> subprocess.Popen:
    (tmp_path / "mine.py").write_text(MODULE)
    args = ["--model", "mine.py:step"] + (["--no-store", "--no-progress"] if command == "model" else [])
    env = {**os.environ, "BAD": mode, "CUDA_VISIBLE_DEVICES": "", "MGPU_BENCH_DB": str(tmp_path / "h.sqlite3")}
    return subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", command, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=tmp_path, **popen)


@pytest.mark.parametrize("command, mode", [
    ("model", "KeyboardInterrupt at import"), ("model", "os._exit at import"),
    ("model", "KeyboardInterrupt in the function"), ("model", "os._exit in the function"),
    ("plan", "KeyboardInterrupt at import"), ("plan", "os._exit in the function"),
])
def test_a_module_that_ends_the_process_its_own_way_is_its_error_in_one_line(tmp_path, command, mode):
    proc = _cli(tmp_path, command, mode)
    _out, err = proc.communicate(timeout=scaled(DEADLINE_S))
    lines = [x for x in err.decode().splitlines() if x.strip()]
    assert proc.returncode == 2, (proc.returncode, err.decode()[-2000:])
    assert len(lines) == 1 and lines[0].startswith("mgpu-bench: error: "), lines
    assert SAID[mode.split()[0]] in lines[0] and "mine.py" in lines[0], lines
    assert not (tmp_path / "h.sqlite3").exists()  # nothing measured, nothing stored


def test_a_real_ctrl_c_while_the_module_imports_is_still_a_stop(tmp_path):
    """The module is innocent here: Ctrl-C pressed while it imports (it sleeps) stops the command
    as Ctrl-C does, exit code 130, not blamed on the module."""
    proc = _cli(tmp_path, "model", "sleep at import", start_new_session=True)
    try:
        wait_for_output(proc, "importing")
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=scaled(DEADLINE_S))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err.decode()
    assert proc.returncode == 130, (proc.returncode, text[-2000:])
    assert "interrupted" in text and "the module's error" not in text and "Traceback" not in text, text[-2000:]


GUARD = textwrap.dedent("""
    import os, sys, threading
    from mgpu_bench.workloads import user

    real = os._exit
    with user.bounded("the test's block"):
        pid = os.fork()
        if pid == 0:
            os._exit(5)  # a forked child (a DataLoader worker) ends as it asks
        print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
        try:
            os._exit(0)
        except BaseException as exc:  # in the block's own thread: its error, not the end
            print("caught", type(exc).__name__, flush=True)
        if sys.argv[1] == "thread":
            threading.Thread(target=os._exit, args=(7,)).start()  # another thread of the job's ends it
            threading.Event().wait(60)
    print("os._exit restored after the block:", "yes" if os._exit is real else "no", flush=True)
""")


@pytest.mark.parametrize("where", ["block", "thread"])
def test_the_os_exit_guard_holds_in_the_blocks_own_thread_and_process_only(tmp_path, where):
    proc = subprocess.run([sys.executable, "-c", GUARD, where], capture_output=True, text=True, cwd=tmp_path,
                          timeout=scaled(120), check=False)
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["child 5", "caught _Exited"], (lines, proc.stderr[-2000:])
    if where == "thread":
        assert proc.returncode == 7, (proc.returncode, proc.stderr[-2000:])
    else:
        assert proc.returncode == 0 and lines[2] == "os._exit restored after the block: yes", lines
