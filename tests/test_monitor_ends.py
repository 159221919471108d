"""StepMonitor keeps what it measured when the job ends without finish(): a loop that raises, a
job SIGTERMed (as a scheduler's time limit does), a job whose other rank dies (real torchrun
agents, gloo); and when the history cannot take the run, a file `history add` stores later. Each
job is the user's own script in a process of its own."""

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


def _job(tmp_path: Path, how: str, torchrun: bool = False) -> tuple[subprocess.CompletedProcess, str]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    db = str(tmp_path / "h.sqlite3")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MGPU_BENCH_DB": db}
    cmd = [sys.executable, str(script), how, db]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script), how, db]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path, check=False)
    return proc, db


def _stored(db: str) -> dict:
    from mgpu_bench.history import History

    with History.open(db, readonly=True) as h:
        (info,) = h.list(5, kind="model")
        return h.get(info.run_id).document


def _kept_windows(doc: dict) -> int:
    return len(doc["job"]["windows"])


def test_a_loop_that_raises_keeps_its_windows_marked_as_ended_early(tmp_path):
    proc, db = _job(tmp_path, "raises")
    assert proc.returncode == 1 and "the user's loop broke" in proc.stderr  # the user's error, untouched
    doc = _stored(db)
    assert doc["status"]["stopped"] == "interrupted" and "ended early" in doc["status"]["message"]
    assert "without finish()" in doc["status"]["message"]
    assert _kept_windows(doc) >= 4 and doc["runs"][0]["derived"]["measured_steps"] >= 20


def test_a_job_sigtermed_keeps_its_windows_and_still_ends_by_the_signal(tmp_path):
    proc, db = _job(tmp_path, "sigterm")
    assert proc.returncode == -signal.SIGTERM  # the default action, as it would have been without the monitor
    doc = _stored(db)
    assert doc["status"]["stopped"] == "interrupted" and "SIGTERM" in doc["status"]["message"]
    assert _kept_windows(doc) >= 4


def test_a_job_whose_other_rank_dies_keeps_rank_0s_figures(tmp_path):
    proc, db = _job(tmp_path, "rank-dies", torchrun=True)
    assert proc.returncode != 0
    doc = _stored(db)
    assert doc["status"]["stopped"] == "interrupted" and "ended early" in doc["status"]["message"]
    assert doc["runs"][0]["derived"]["measured_steps"] >= 15


def test_a_history_that_cannot_take_the_run_leaves_a_file_history_add_stores(tmp_path):
    proc, _ = _job(tmp_path, "store-gone")
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
