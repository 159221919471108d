"""StepMonitor keeps what it measured when the job ends without finish(): a loop that raises, a
job SIGTERMed (as a scheduler's time limit does), a job whose other rank dies (real torchrun
agents, gloo); and when the history cannot take the run, a file `history add` stores later. Each
job is the user's own script in a process of its own: forked, with torch already imported, from
one process the module starts (_Forks), or, the rank that dies, started by torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    from mgpu_bench import StepMonitor

    how, db = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    distributed = how == "rank-dies"
    if distributed:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    model = torch.nn.Linear(64, 64)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 64)
    mon = StepMonitor("ends-" + how, model=model, warmup=2, window=5, db=db, print=False)
    for i in range(1000):
        with mon.step(samples=8):
            with mon.compute():
                loss = model(x).square().mean(); loss.backward(); opt.step(); opt.zero_grad()
                time.sleep(0.002)
        if i == 23:
            if how == "raises":
                raise RuntimeError("the user's loop broke")
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            if how == "rank-dies" and dist.get_rank() == 1:
                os._exit(3)
            if how == "store-gone":
                open(db, "wb").write(b"this is no database any more" * 100)
                mon.finish()
                sys.exit(0)
    mon.finish()
""")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


# The process each job is forked from: it imports torch (3.5 s of CPU, the most of a job's cost)
# once, and nothing of mgpu_bench. Per request (a JSON line on its stdin: the script, its arguments,
# folder, MGPU_BENCH_DB and the files for its stdout and stderr), it forks; the child runs the script
# as `python SCRIPT ARGS` would (as __main__, the same argv, the same exit: an uncaught exception,
# sys.exit or the end of the script leave through the interpreter's own finalisation, at-exit hooks
# included; a signal's default action ends it); the parent answers one JSON line, [pid, exit code
# as subprocess gives it (-N: ended by signal N)], or [pid, null] after 240 s, the child killed.
FORK_SERVER = textwrap.dedent("""
    import json, os, runpy, signal, sys, time
    import torch  # noqa: F401 - what a job's script imports first, imported once

    for line in sys.stdin:
        script, argv, folder, db, out, err = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the job: nothing of the request loop runs after this
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.chdir(folder)
            os.environ["MGPU_BENCH_DB"] = db
            sys.argv = [script, *argv]
            runpy.run_path(script, run_name="__main__")
            sys.exit(0)  # the script's end, as the interpreter would end it
        end = time.monotonic() + 240
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < end:
            time.sleep(0.02)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        print(json.dumps([pid, os.waitstatus_to_exitcode(done[1]) if done[0] else None]), flush=True)
""")


class _Forks:
    """The test's end of FORK_SERVER: run() as subprocess.run(capture_output=True, text=True) would."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=_env())

    def run(self, script: Path, argv: list[str], folder: Path, db: str) -> subprocess.CompletedProcess:
        out, err = folder / "job.out", folder / "job.err"
        self.proc.stdin.write(json.dumps([str(script), argv, str(folder), db, str(out), str(err)]) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the fork server ended (exit code {self.proc.poll()})"
        _pid, code = json.loads(answer)
        assert code is not None, f"the job did not end within 240 s: {err.read_text()[-3000:]}"
        return subprocess.CompletedProcess([sys.executable, str(script), *argv], code, out.read_text(),
                                           err.read_text())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def forks():
    server = _Forks()
    try:
        yield server
    finally:
        server.close()


def _job(tmp_path: Path, how: str, forks: _Forks | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """The job SCRIPT ended `how`: forked by `forks`, or, without, under torchrun with two ranks."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    db = str(tmp_path / "h.sqlite3")
    if forks is not None:
        return forks.run(script, [how, db], tmp_path, db), db
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script), how, db]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**_env(), "MGPU_BENCH_DB": db},
                          cwd=tmp_path, check=False)
    return proc, db


def _stored(db: str) -> dict:
    from mgpu_bench.history import History

    with History.open(db, readonly=True) as h:
        (info,) = h.list(5, kind="model")
        return h.get(info.run_id).document


def _kept_windows(doc: dict) -> int:
    return len(doc["job"]["windows"])


def test_a_loop_that_raises_keeps_its_windows_marked_as_ended_early(tmp_path, forks):
    proc, db = _job(tmp_path, "raises", forks)
    assert proc.returncode == 1 and "the user's loop broke" in proc.stderr  # the user's error, untouched
    doc = _stored(db)
    assert doc["status"]["stopped"] == "interrupted" and "ended early" in doc["status"]["message"]
    assert "without finish()" in doc["status"]["message"]
    assert _kept_windows(doc) >= 4 and doc["runs"][0]["derived"]["measured_steps"] >= 20


def test_a_job_sigtermed_keeps_its_windows_and_still_ends_by_the_signal(tmp_path, forks):
    proc, db = _job(tmp_path, "sigterm", forks)
    assert proc.returncode == -signal.SIGTERM  # the default action, as it would have been without the monitor
    doc = _stored(db)
    assert doc["status"]["stopped"] == "interrupted" and "SIGTERM" in doc["status"]["message"]
    assert _kept_windows(doc) >= 4


def test_a_job_whose_other_rank_dies_keeps_rank_0s_figures(tmp_path):
    proc, db = _job(tmp_path, "rank-dies")
    assert proc.returncode != 0
    doc = _stored(db)
    assert doc["status"]["stopped"] == "interrupted" and "ended early" in doc["status"]["message"]
    assert doc["runs"][0]["derived"]["measured_steps"] >= 15


def test_a_history_that_cannot_take_the_run_leaves_a_file_history_add_stores(tmp_path, forks):
    proc, _ = _job(tmp_path, "store-gone", forks)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "history add" in x)
    kept = line.split("its document is in ", 1)[1].split(":", 1)[0]
    doc = json.loads(Path(kept).read_text())
    assert doc["kind"] == "model" and doc["runs"][0]["derived"]["samples_per_s"] > 0
    from click.testing import CliRunner

    from mgpu_bench.cli import cli

    fresh = tmp_path / "fresh.sqlite3"
    res = CliRunner().invoke(cli, ["history", "add", kept, "--db", str(fresh)])
    assert res.exit_code == 0, res.output
    assert _stored(str(fresh))["job"]["name"] == "ends-store-gone"


def test_a_sample_count_beyond_sense_is_refused_at_step():
    from mgpu_bench.monitor import MonitorError, StepMonitor

    mon = StepMonitor("huge", warmup=0, store=False, print=False, strict=True)
    with pytest.raises(MonitorError, match="at most"):
        mon.step(samples=2**70)
    with pytest.raises(MonitorError, match="up to 1,099,511,627,776"):
        mon.step(samples=8, tokens=2**70)


# -- signals, threads and forks ----------------------------------------------------------------------

SIGNALLED = textwrap.dedent("""
    import os, signal, sys, threading, time
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal leaves it (a test run under nohup hands it on ignored)
    import torch
    from mgpu_bench import StepMonitor  # imported in the main thread, as a job's script does

    how, db = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    asked = []
    if how == "own-handler":  # the job's own graceful stop, set after the import
        signal.signal(signal.SIGTERM, lambda signum, frame: asked.append(signum))

    def train():
        model = torch.nn.Linear(32, 32)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(8, 32)
        mon = StepMonitor("signalled-" + how, model=model, warmup=2, window=5, db=db, print=False)
        for i in range(60):
            with mon.step(samples=8):
                with mon.compute():
                    loss = model(x).square().mean(); loss.backward(); opt.step(); opt.zero_grad()
                    time.sleep(0.002)
            if i != 23:
                continue
            if how.startswith("fork"):  # a forked child (as a fork-started DataLoader worker is) that ends
                pid = os.fork()
                if pid == 0:
                    if how == "fork-exit":
                        sys.exit(0)  # the child's exit runs the exit hooks it inherited
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(30)
                print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
            else:
                os.kill(os.getpid(), getattr(signal, how.split("-")[0].replace("own", "SIGTERM")))
        mon.finish()
        print("finished", asked, flush=True)

    if how.endswith("-thread"):  # the monitor made and stepped in a worker thread; the main thread waits
        worker = threading.Thread(target=train)
        worker.start()
        worker.join()
    else:
        train()
""")


def _signalled(tmp_path: Path, how: str, forks: _Forks) -> tuple[subprocess.CompletedProcess, str]:
    script = tmp_path / "job.py"
    script.write_text(SIGNALLED)
    db = str(tmp_path / "h.sqlite3")
    return forks.run(script, [how, db], tmp_path, db), db


@pytest.mark.parametrize("how", ["SIGHUP", "SIGTERM-thread", "SIGHUP-thread"])
def test_a_job_ended_by_sighup_or_from_a_worker_thread_keeps_its_windows(tmp_path, how, forks):
    """SIGHUP (the job's terminal or ssh session closed) keeps the figures as SIGTERM does; so do both
    when the monitor was made and stepped in a worker thread (where no handler can be set: the one
    the main thread set at the import keeps it). The process still ends by the signal."""
    proc, db = _signalled(tmp_path, how, forks)
    sig = getattr(signal, how.split("-")[0])
    assert proc.returncode == -sig, proc.stderr[-3000:]
    assert "finished" not in proc.stdout  # ended by the signal, not run on to finish()
    doc = _stored(db)
    assert doc["status"]["stopped"] == "interrupted" and sig.name in doc["status"]["message"], doc["status"]
    assert _kept_windows(doc) >= 4 and doc["runs"][0]["derived"]["measured_steps"] >= 20


def test_a_job_with_its_own_sigterm_handler_goes_on_and_finishes(tmp_path, forks):
    """A job that handles SIGTERM itself (a graceful stop it decides on) is not cut short by the
    monitor: its handler runs, the training goes on, finish() stores the whole run."""
    proc, db = _signalled(tmp_path, "own-handler", forks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"finished [{int(signal.SIGTERM)}]" in proc.stdout  # the job's handler ran
    doc = _stored(db)
    assert not doc["status"].get("stopped"), doc["status"]
    assert doc["runs"][0]["derived"]["measured_steps"] >= 50  # the steps after the signal counted too


@pytest.mark.parametrize("how, child", [("fork-exit", 0), ("fork-term", -signal.SIGTERM)])
def test_a_forked_child_that_ends_stores_nothing(tmp_path, how, child, forks):
    """A child forked from the monitored process (os.fork, as a fork-started DataLoader worker is)
    that calls sys.exit, or is ended by SIGTERM, inherits the monitor's exit hook and signal
    handler but stores no run of its own: only the parent's whole run is in the history."""
    proc, db = _signalled(tmp_path, how, forks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"child {child}\n" in proc.stdout, proc.stdout  # the child ended as it would have: 0, or by the signal
    doc = _stored(db)  # exactly one model run
    assert doc["job"]["name"] == f"signalled-{how}" and not doc["status"].get("stopped"), doc["status"]
    assert doc["runs"][0]["derived"]["measured_steps"] >= 50
