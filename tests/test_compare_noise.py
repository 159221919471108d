"""The regression gate tells a drop from noise, on real CPU runs stored in a real history: two
identical `comm` runs never compare as a regression; a `model` run slowed to a third (stopped
from outside two thirds of the time) is one; a pair too noisy to judge says "cannot tell" with its own
exit code (4), never 0 or 1. The rules themselves (log ratios, one spread, a noisy host's floor)
are checked on exact samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_bench.history.compare import NOISE_K, compare
from mgpu_bench.results.metrics import Metric

pytestmark = pytest.mark.timing  # judges measured speed (against what the same run measured)

ROOT = Path(__file__).resolve().parent.parent
CORE = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0


def _command(*args, db: Path, env: dict | None = None, core: bool = True) -> tuple[list[str], dict]:
    """mgpu-bench's command line and environment: on one core (the process and its children, as
    taskset pins them from the start), one thread, the history at `db`."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "mgpu_bench.cli", *args, "--db", str(db)]
    if core:
        pin = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); os.execv(sys.argv[2], sys.argv[2:])"
        cmd = [sys.executable, "-c", pin, str(CORE), *cmd]
    return cmd, full


def _cli(*args, db: Path, env: dict | None = None, core: bool = True) -> subprocess.CompletedProcess:
    """mgpu-bench in a process of its own (see _command)."""
    cmd, full = _command(*args, db=db, env=env, core=core)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full, check=False)


def _compare(db: Path, new: str, base: str) -> tuple[int, dict, str]:
    out = db.with_name(f"compare-{new}-{base}.json")
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "compare", new, "--baseline", base, "--db", str(db),
                           "--json", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def test_two_identical_cpu_comm_runs_compare_with_no_regression(tmp_path):
    db = tmp_path / "h.sqlite3"
    for _ in range(2):
        run = _cli("comm", "--ops", "allreduce", "--sizes", "4M-16M", "--no-progress", db=db)
        assert run.returncode == 0, run.stderr[-2000:]
    code, doc, out = _compare(db, "r2", "r1")
    assert code in (0, 4), out  # agreed, or too noisy to say: never a regression of a run against its twin
    assert doc["regressions"] == 0 and "regression:" not in out
    if code == 4:
        assert doc["cannot_tell"] > 0 and "cannot tell (exit code 4)" in out


def _timed(cmd: list[str], env: dict, throttle=None) -> tuple[subprocess.CompletedProcess, float]:
    """Runs `cmd` (slowed from outside by `throttle(pid)`, a context manager, when given); the
    process and its children's CPU time per second of wall time: the share of a core it got."""
    import resource
    import time

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    c0, t0 = cpu(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if throttle is None:
        out, err = proc.communicate(timeout=600)
    else:
        with throttle(proc.pid):
            out, err = proc.communicate(timeout=600)
    share = (cpu() - c0) / max(1e-9, time.monotonic() - t0)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), share


# The throttle's cycle: stopped STOP_S, then running RUN_S (two thirds stopped). Each SIGCONT wakes
# the process with the scheduler's credit for a sleeper (up to half its latency period, a few ms):
# beside 8 busy processes, where the process gets about a tenth of its core, a 10 ms run window
# (the earlier 0.02/0.01 s cycle) gave it as much CPU as an unthrottled run, and the run measured
# -43.9% instead of about -67%. Over a cycle of 0.6 s that credit is a small share.
STOP_S, RUN_S = 0.4, 0.2


def test_a_run_slowed_to_a_third_is_a_regression(tmp_path):
    """The second run is stopped two thirds of the time from outside (SIGSTOP, SIGCONT, as a bad
    node is slow): a third of the rate whatever else the host runs. (A busy loop sharing its core
    halved it on an idle host, but beside 8 busy processes it took only a sixth more of the core.)
    The reference, measured in the same test: the share of a core each run got (its CPU time per
    second of wall time), whose ratio is the slowdown the throttle achieved on this host now; the
    rate the tool measured must drop as much, within 15 points, and by more than 45%."""
    from tests.slurm_cluster import Throttle, processes

    db = tmp_path / "h.sqlite3"
    args = ("model", "--model", "tiny", "--nproc", "1", "--steps", "20", "--warmup-steps", "2", "--no-progress",
            "--no-exposed-comm")
    cmd, env = _command(*args, db=db)
    base, base_share = _timed(cmd, env)
    assert base.returncode == 0, base.stderr[-2000:]
    slow, slow_share = _timed(cmd, env, lambda pid: Throttle(lambda: processes("", below=pid), stop_s=STOP_S,
                                                              run_s=RUN_S))
    assert slow.returncode == 0, slow.stderr[-2000:]
    achieved = slow_share / base_share - 1  # the throttle's slowdown on this host now
    code, doc, out = _compare(db, "r2", "r1")
    changes = {c["name"]: c for c in doc["changes"]}
    rate = changes["model.tiny.ddp.1gpu.synthetic.tokens_per_s"]
    print(f"throttle achieved {achieved:+.1%} (CPU share {slow_share:.3f} against {base_share:.3f}); the tool measured "
          f"{rate['change']:+.1%}")
    assert achieved < -0.5, f"the throttle slowed the run by {-achieved:.0%} only (its CPU share {slow_share:.3f} " \
                            f"against {base_share:.3f}): it cannot test the gate here"
    assert rate["change"] == pytest.approx(achieved, abs=0.15), (achieved, out)  # the tool measures what was done
    assert rate["change"] < -0.45, out  # stopped 2/3 of the time: about a third as fast
    from mgpu_bench.history import History
    from mgpu_bench.history.compare import BUSY_LOAD, busy_load

    with History.open(db, readonly=True) as h:
        busy = max(busy_load(h.get("r1")), busy_load(h.get("r2")))
    if busy <= BUSY_LOAD:  # a quiet host: the drop is told from noise
        assert code == 1 and rate["status"] == "regression", out
        assert "regression: model.tiny.ddp.1gpu.synthetic.tokens_per_s" in out
    else:  # a busy host (8 processes beside the tests, say): a drop to a third may be its drift, never "within noise"
        assert code in (1, 4) and rate["status"] in ("regression", "cannot tell"), out


def _m(value: float, samples) -> Metric:
    return Metric("x.rate", value, "samples/s", "higher", tuple(samples))


def test_a_drop_inside_only_the_noisier_runs_spread_is_cannot_tell_not_within_noise():
    """The runs agree ("within noise") only inside the quieter run's spread: a steady baseline and a
    run whose own steps spread 124% (a throttled node) three times slower cannot be told apart from
    noise, but they do not agree."""
    quiet = [100.0 * (1 + 0.01 * d) for d in (-2, -1, 0, 1, 2, 0, 1, -1)]  # 1.5% spread
    wild = [2.0, 5.0, 33.0, 70.0, 90.0, 33.0, 60.0, 8.0]  # median 33, 1.4826 x MAD / median = 1.24
    (drop,) = compare([_m(100, quiet)], [_m(33, wild)])
    assert drop.status == "cannot tell", drop
    (same,) = compare([_m(100, quiet)], [_m(101.5, quiet)])  # inside both: they agree
    assert same.status in ("unchanged", "within noise"), same


def test_the_rules_on_exact_samples():
    quiet = [100.0 * (1 + 0.01 * d) for d in (-2, -1, 0, 1, 2, 0, 1, -1)]  # 1.5% spread
    noisy = [100.0 * (1 + 0.10 * d) for d in (-2, -1, 0, 1, 2, 0, 1, -1)]  # 14.8% spread
    (same,) = compare([_m(100, quiet)], [_m(101, quiet)])
    assert same.status == "unchanged"
    (drop,) = compare([_m(100, quiet)], [_m(50, [x / 2 for x in quiet])])
    assert drop.status == "regression"
    # a 67.9% drop is far beyond a 14.8% spread: never "within noise"; ln(1 / 0.321) = 1.14 > 3 x 0.148
    (big,) = compare([_m(100, noisy)], [_m(32.1, [x * 0.321 for x in noisy])])
    assert big.status == "regression"
    # a 30% drop beside a 14.8% spread: beyond one spread, under three: cannot tell
    (unsure,) = compare([_m(100, noisy)], [_m(70, [x * 0.7 for x in noisy])])
    assert unsure.status == "cannot tell" and unsure.threshold == pytest.approx(NOISE_K * 1.4826 * 0.10)
    # a 10x drop and a 10x gain are as far from no change
    (down,) = compare([_m(100, noisy)], [_m(10, [x / 10 for x in noisy])])
    (up,) = compare([_m(100, noisy)], [_m(1000, [x * 10 for x in noisy])])
    assert (down.status, up.status) == ("regression", "improvement")
    # a noisy host's floor: a 25% drop of quiet figures is no regression there
    (floored,) = compare([_m(100, quiet)], [_m(75, [x * 0.75 for x in quiet])], floor=0.15)
    assert floored.status == "cannot tell" and floored.floor == 0.15


def test_a_pair_too_noisy_to_judge_says_cannot_tell_with_exit_code_4(tmp_path):
    """Two stored model runs of a host whose figures spread about 20% within each run, 20% apart."""
    from mgpu_bench.history import History
    from tests.test_headline import _environment, model_document

    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        for step in (0.100, 0.125):
            doc = model_document(step_1=step, step_2=step)
            for run in doc["runs"]:  # every rank's steps spread 10% (MAD), the host's figures with them
                for r in run["ranks"]:
                    r["phases"]["step"] = [s * (1 + 0.1 * ((i % 5) - 2) / 1.4826) for i, s in
                                           enumerate(r["phases"]["step"])]
            doc["environment"] = _environment()
            h.save(doc)
    code, doc, out = _compare(db, "r2", "r1")
    assert code == 4, out
    assert doc["regressions"] == 0 and doc["cannot_tell"] >= 1
    assert "too noisy to compare" in out and "cannot tell (exit code 4)" in out
