"""`mgpu-bench suite` on CPU ranks: real child processes for every probe that runs without a GPU,
the GPU probes recorded as skipped, the report and history written, the regression gate, Ctrl-C,
and bad input. The GPU path runs on the device machine (tests/test_gpu_suite.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from conftest import DEADLINE_S, plain, scaled, wait_for_output

from mgpu_bench.core import children
from mgpu_bench.history.store import History
from mgpu_bench.machine.selection import visible_gpu_count
from mgpu_bench.probes.model.analyse import steps_to_fill
from mgpu_bench.results.probe import Step, replace_option
from mgpu_bench.results.probe import headline as metrics_from_document
from mgpu_bench.suite import run as suite

pytestmark = pytest.mark.skipif(visible_gpu_count() > 0, reason="the CPU plan; GPUs run tests/test_gpu_suite.py")


def _suite(tmp_path, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "suite", "--quick", *args],
                          capture_output=True, text=True, timeout=scaled(timeout), check=False, cwd=tmp_path)


def test_plan_covers_three_rounds_and_picks_gpus():
    probes = suite.plan(suite.SuiteConfig(quick=True, duration_s=20, gpus=(0, 1)))
    assert [p.round for p in probes] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3]
    assert [p.name for p in probes] == ["gemm", "memory", "model-1gpu", "sdc", "comm", "links", "model-scaling",
                                        "overlap", "max-batch", "gemm-sustained", "model-sustained"]
    scaling = next(p for p in probes if p.name == "model-scaling")
    assert "1,2" in scaling.args and "--gpus" in scaling.args
    assert next(p for p in probes if p.name == "gemm-sustained").args[-3:] == ("20s", "--gpus", "2")
    odd = suite.plan(suite.SuiteConfig(rounds=(1,), gpus=(2, 3)))
    assert next(p for p in odd if p.name == "model-1gpu").args[-4:-2] == ("--gpus", "2,")

    def counts(n):
        step = next(p for p in suite.plan(suite.SuiteConfig(gpus=tuple(range(n)))) if p.name == "model-scaling")
        return step.args[step.args.index("--scaling") + 1]

    assert counts(8) == "1,2,4,8" and counts(6) == "1,2,4,6" and counts(2) == "1,2"
    assert steps_to_fill({"runs": [{"derived": {"step_s": 0.1}}]}, 20) == 200
    assert steps_to_fill(None, 20) == 0


def test_the_sustained_run_is_planned_from_an_earlier_model_run_or_a_calibration():
    (step,) = [p for p in suite.plan(suite.SuiteConfig(rounds=(3,), duration_s=20, gpus=(0, 1)))
               if p.name == "model-sustained"]
    earlier = [{"name": "model-1gpu", "document": {"runs": [{"world": 1, "derived": {"step_s": 0.1}}]}}]
    ran = []
    planned = step.prepare(step, earlier, ran.append)
    assert ran == [] and replace_option(step.args, "--steps", "200") == planned.args
    calibration = {"name": "model-calibration", "document": {"runs": [{"world": 2, "derived": {"step_s": 0.5}}]}}

    def run_step(s):
        ran.append(s)
        return calibration

    planned = step.prepare(step, [], run_step)
    (calib,) = ran
    assert calib.name == "model-calibration" and calib.args[calib.args.index("--steps") + 1] == "5"
    assert planned.args[planned.args.index("--steps") + 1] == "40"


@pytest.fixture(scope="module")
def rounds_2_and_3(tmp_path_factory):
    """One `suite --quick --rounds 2,3` on CPU ranks (about 10 processes, the file's most costly
    set-up), run once for the module: the round test reads what it wrote and the gate test takes
    its stored document as the baseline. Its own database (the per-test one is not set yet when a
    module's fixture runs); (the process, its folder, its database)."""
    folder = tmp_path_factory.mktemp("rounds-2-3")
    db = folder / "history.sqlite3"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "suite", "--quick", "--rounds", "2,3", "--duration",
                           "2s", "--report", "rep", "--prometheus", "m.prom", "--db", str(db)],
                          capture_output=True, text=True, timeout=scaled(600), check=False, cwd=folder,
                          env={**os.environ, "MGPU_BENCH_DB": str(db)})
    return proc, folder, db


def test_rounds_2_and_3_on_cpu_ranks_report_store_and_skip_with_reasons(rounds_2_and_3):
    proc, tmp_path, db = rounds_2_and_3
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "rep" / "suite.json").read_text())
    status = {p["name"]: (p["status"], p["error"]) for p in doc["probes"]}
    assert status["comm"] == ("ok", None) and status["model-scaling"][0] == "ok"
    assert status["model-sustained"][0] == "ok"
    assert status["links"] == ("skipped", "needs 2 NVIDIA GPU(s), 0 selected")
    assert status["max-batch"] == ("skipped", "needs an NVIDIA GPU")
    comm_doc = next(p["document"] for p in doc["probes"] if p["name"] == "comm")
    assert comm_doc["backend"] == "torch-gloo" and comm_doc["measurements"]
    assert doc["findings"] and all({"severity", "text"} <= set(f) for f in doc["findings"])
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "model-scaling" in html or "training steps over process counts" in html
    assert (tmp_path / "rep" / "summary.md").exists()
    with History.open(db, readonly=True) as h:
        (info,) = h.list(kind="suite")
        assert any(m.name.startswith("comm.") for m in h.metrics(info.run_id))
    assert f"stored as {info.run_id}" in proc.stderr
    assert "mgpu_bench_" in (tmp_path / "m.prom").read_text()


@pytest.mark.timing
def test_a_baseline_that_was_faster_makes_the_suite_exit_1(rounds_2_and_3, tmp_path):
    """The baseline is the rounds-2,3 run above, stored again in this test's database a hundred
    times as fast; the run judged is round 1. They share model.tiny.ddp.1gpu.*: model-scaling's
    one-process run there and model-1gpu here train the same tiny model, 8 steps after 2 warm-up
    ones, on one process (`suite.plan`). (The baseline was a round-1 run of its own: a suite
    process and a model process more, about 20 s on CI's loaded 2 cores.)"""
    proc, _folder, db = rounds_2_and_3
    assert proc.returncode == 0, proc.stderr[-3000:]
    with History.open(db, readonly=True) as h:
        (r1,) = h.list(kind="suite")
        doc = h.get(r1.run_id).document
    with History.open() as h:  # MGPU_BENCH_DB: this test's own database
        # the same run, but a hundred times as fast and without its spread (the first run's own
        # noise, 60% on a loaded host, would set the threshold): the next real run, judged against
        # its own noise, must read as a regression. (Ten times was "too close to call" beside a
        # second worker: 7 steps of a quick suite spread 80% there, and 3 x 0.8 passes ln 10; no
        # relative spread of positive rates, 1.4826 x MAD / median, reaches ln(100) / 3 = 1.54.)
        better = [replace(m, value=m.value * 100 if m.better == "higher" else m.value / 100,
                          samples=(m.value * 100 if m.better == "higher" else m.value / 100,) * len(m.samples))
                  for m in metrics_from_document(doc)]
        assert any(m.name.startswith("model.tiny.ddp.1gpu.") for m in better), [m.name for m in better]
        base = h.save(doc, better)
        h.set_baseline(base)
    # Should the noise still decide (compare's threshold: 3 x the larger noise, or a busy host's
    # floor), that verdict is the noise's and not the gate's: another run, as the fleet and Slurm
    # tests rerun a pass the noise decided.
    for attempt in range(3):
        second = _suite(tmp_path, "--rounds", "1", "--report", f"b{attempt}")
        if second.returncode != 0 or not _noise_decided(base):
            break
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    assert "regression: model." in second.stdout and f"compared with baseline {base}" in second.stdout


def _noise_decided(base: str) -> bool:
    """Whether the latest suite run's model figures were all judged by the noise against `base`:
    within it, or too close to it to call ("cannot tell": a busy host's floor)."""
    from mgpu_bench.history import compare_runs

    with History.open() as h:
        latest = h.list(kind="suite")[0].run_id
        changes = [c for c in compare_runs(h, base, latest, 0.05).changes if c.name.startswith("model.")]
    return bool(changes) and all(c.status in ("within noise", "cannot tell") for c in changes)


def _started_probe(proc, deadline_s: float) -> None:
    """Waits until the suite `proc` has its first probe running (a child that runs the CLI), not
    for a number of seconds: on a loaded machine 12 s once fell before the suite had started one."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        if any(b"mgpu_bench.cli" in _cmdline(p) for p in children.descendants(proc.pid)):
            return
        time.sleep(0.05)
    raise AssertionError(f"no probe started within {deadline_s:.0f} s (exit code {proc.poll()})")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.parametrize("when", ["a probe running", "as the suite starts a probe"])
def test_ctrl_c_writes_what_was_measured_and_exits_130(tmp_path, when):
    """Ctrl-C while a probe runs (its entry interrupted, the rest not run), or as the suite goes from
    one probe to the next (a signal there once escaped the suite's loop: no suite.json at all)."""
    proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", "suite", "--quick", "--rounds", "2,3",
                             "--report", str(tmp_path / "r")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    try:
        seen = wait_for_output(proc, r"round 2 \(multi-GPU scaling\), 1/\d+")
        if when == "a probe running":
            _started_probe(proc, scaled(DEADLINE_S))
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=scaled(DEADLINE_S))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = plain((seen + err).decode(errors="replace"))
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    doc = json.loads((tmp_path / "r" / "suite.json").read_text())
    assert doc["status"]["stopped"] == "interrupted"
    if when == "a probe running":
        assert any(p["status"] == "interrupted" for p in doc["probes"])
    assert any(p["error"] == "not run: the suite was interrupted" for p in doc["probes"])
    assert all(p["status"] in ("ok", "skipped", "interrupted") for p in doc["probes"]), doc["probes"]


@pytest.mark.parametrize("args, message", [
    (["--rounds", "4"], "the rounds are 1, 2 and 3"),
    (["--tolerance", "150%"], "less than 100%"),
    (["--duration", "soon"], "is not a duration"),
    (["--report", "no/such/folder"], "create it first"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = _suite(tmp_path, *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_foreign_database_is_refused_and_left_alone(tmp_path):
    foreign = tmp_path / "notes.sqlite3"
    foreign.write_text("not a database\n")
    proc = _suite(tmp_path, "--rounds", "1", "--db", str(foreign), timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert foreign.read_text() == "not a database\n"


def test_every_command_stores_unless_told_not_to():
    """comm on two gloo ranks, once with --no-store (nothing in the history) and once without
    (stored, and said so on stderr). In this process through click's runner: what is checked is
    the command's storing, not a process of its own; the ranks are real processes either way
    (a process of its own cost a torch import more per run)."""
    from click.testing import CliRunner

    from mgpu_bench.cli import cli

    base = ["comm", "--backend", "torch", "--sizes", "1K", "--ops", "allreduce", "--no-progress"]
    unstored = CliRunner().invoke(cli, [*base, "--no-store"])
    assert unstored.exit_code == 0, unstored.output + repr(unstored.exception)
    with History.open() as h:  # MGPU_BENCH_DB: this test's own database
        assert h.list() == []
    stored = CliRunner().invoke(cli, base)
    assert stored.exit_code == 0 and "stored as" in stored.stderr, stored.output + repr(stored.exception)
    with History.open() as h:
        (info,) = h.list()
        assert info.kind == "comm"


@pytest.mark.parametrize("gpus", [[0, 1], [0, 1, 2, 3, 4, 5, 6, 7], [3]])
def test_every_planned_command_line_parses(gpus, tmp_path):
    """The GPU plan's command lines, as run_probe extends them, are valid for their commands
    (checked by click's parser here, since CI cannot run them)."""
    from mgpu_bench.cli import cli

    for p in suite.plan(suite.SuiteConfig(quick=False, duration_s=60, gpus=tuple(gpus))) + \
            suite.plan(suite.SuiteConfig(quick=True, duration_s=20, gpus=tuple(gpus))):
        args = suite.child_args(p, tmp_path / "x.json")
        cli.commands[p.args[0]].make_context(p.args[0], args[1:])


def test_report_renders_a_stored_suite_again(tmp_path):
    """`mgpu-bench report` of a stored suite document, in this process through click's runner (the
    drawing is what takes the time; a process of its own added its start-up and imports)."""
    from pathlib import Path

    from click.testing import CliRunner

    from mgpu_bench.cli import cli

    fixture = Path(__file__).with_name("fixtures") / "suite" / "suite.json"
    result = CliRunner().invoke(cli, ["report", str(fixture), "--out", str(tmp_path / "again")])
    assert result.exit_code == 0, result.output[-2000:] + repr(result.exception)
    html = (tmp_path / "again" / "report.html").read_text()
    assert "verdict" in html and "data:image/png;base64," in html


def test_a_probe_past_its_time_limit_is_a_failure_not_an_interrupt(tmp_path):
    probe = Step(2, 10, "comm", "collective bus bandwidth",
                 ("comm", "--backend", "torch", "--ops", "allreduce", "--sizes", "1K", "--min-time", "60",
                  "--iters", "0"), min_gpus=0, timeout_s=3)
    # 3 s (it was 8): the child is then still starting (a torch import alone is 3.5 s of CPU here)
    # or measuring for its 60 s; either way past its limit, which is what is checked
    entry = suite.run_probe(probe, 0, tmp_path)
    assert entry["status"] == "failed" and entry["error"] == "did not finish within 3 s; stopped"
    assert entry["seconds"] < 3 + 60 + 10  # SIGINT at 3 s, SIGKILL 60 s later at the latest


def test_replace_option_replaces_only_that_value():
    args = ("model", "--model", "350m", "--steps", "50", "--warmup-steps", "3", "--gpus", "2")
    assert replace_option(replace_option(args, "--steps", "5"), "--warmup-steps", "2") == (
        "model", "--model", "350m", "--steps", "5", "--warmup-steps", "2", "--gpus", "2")
