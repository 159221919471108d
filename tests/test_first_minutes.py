"""A new user's first minutes on a machine without a GPU (issue 16): the README's main command
sized to the machine, messages that name a way forward, `report` of a stored run, and the model's
derived metrics carrying a noise estimate."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.history.compare import noise
from mgpu_bench.machine.selection import visible_gpu_count, without_gpu
from mgpu_bench.probes.comm import torch_backend as tb
from mgpu_bench.probes.comm.measure import sized_out_notes
from mgpu_bench.probes.model.headline import headline as model_headline
from mgpu_bench.results.measurement import CommRequest, TimingOptions

FIX = Path(__file__).parent / "fixtures"
cpu_only = pytest.mark.skipif(visible_gpu_count() > 0, reason="checks what a machine without a GPU does")


@cpu_only
def test_a_size_too_large_for_the_machine_is_left_out_with_a_note_not_a_timeout():
    """1 KiB measured, then 1 GiB of the same series projected from its rate: far past half of a
    20 s --timeout on gloo, so it is not started, the sweep ends clean and says why."""
    reqs = [CommRequest("allreduce", "fp32", "sum", 1024, inplace=False),
            CommRequest("allreduce", "fp32", "sum", 1 << 30, inplace=False)]
    skipped, done = [], []
    t0 = time.monotonic()
    sweep = tb.run_sweep(reqs, nproc=2, device="cpu", timeout_s=20.0, timing=TimingOptions(),
                         on_result=lambda i, raw: done.append(i), on_skip=lambda i, why: skipped.append((i, why)))
    assert sweep.error is None and not sweep.interrupted
    assert done == [0] and [i for i, _ in skipped] == [1]
    assert "past half of --timeout 20 s" in skipped[0][1]
    (note,) = sized_out_notes(reqs, skipped)
    assert note.startswith("allreduce (fp32 sum, out-of-place): 1 GiB not run on these CPU processes (gloo)")
    assert note.endswith("a longer --timeout runs them")
    assert time.monotonic() - t0 < 60  # no 1 GiB allreduce was started


def _one_line_exit_2(args: list[str], env: dict | None = None) -> str:
    r = CliRunner().invoke(cli, args, env=env)
    lines = [x for x in r.output.strip().splitlines() if x.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    return lines[0]


@cpu_only
@pytest.mark.parametrize("command", ["gemm", "memory", "links", "sdc"])
def test_a_gpu_only_command_without_a_gpu_names_what_runs_here(command):
    line = _one_line_exit_2([command])
    assert f"{command} needs NVIDIA GPUs" in line and line.endswith(without_gpu())


@cpu_only
@pytest.mark.parametrize("command", ["comm", "model"])
def test_gpus_without_a_gpu_says_the_same_for_every_command(command):
    line = _one_line_exit_2([command, "--gpus", "0,1"])
    assert line.endswith("drop --gpus; on CPU processes give their number with --nproc"), line


def test_report_takes_a_stored_run_and_says_what_a_topo_snapshot_is(tmp_path):
    db = tmp_path / "h.db"
    r = CliRunner().invoke(cli, ["history", "add", str(FIX / "comm_2x_h200.json"), "--db", str(db)])
    assert r.exit_code == 0, r.output
    out = tmp_path / "again"
    r = CliRunner().invoke(cli, ["report", "r1", "--db", str(db), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "report.html").exists() and "allreduce" in (out / "summary.md").read_text()
    line = _one_line_exit_2(["report", "r7", "--db", str(db), "--out", str(tmp_path / "x")])
    assert "no run r7" in line
    line = _one_line_exit_2(["report", str(FIX / "topo_2x_h200.json"), "--out", str(tmp_path / "t")])
    assert "is a `mgpu-bench topo` snapshot" in line and "not an mgpu-bench result" not in line
    line = _one_line_exit_2(["report", str(tmp_path / "nothing.json")])
    assert "or a stored run id such as r12" in line


def test_the_estimate_is_not_said_before_bad_input_is_refused():
    line = _one_line_exit_2(["comm", "--timeout", "0"], env={"CUDA_VISIBLE_DEVICES": ""})
    assert "--timeout" in line and "about" not in line


def test_derived_model_metrics_carry_per_step_samples_and_so_a_noise_estimate():
    """Scaling efficiency and exposed communication were compared without noise ("-"), so two
    runs of a noisy host read as regressions; now each has per-step-pair samples."""
    suite = json.loads((FIX / "suite" / "suite.json").read_text())
    doc = next(p["document"] for p in suite["probes"] if p["name"] == "model-scaling")
    metrics = {m.quantity: m for m in model_headline(doc) if m.quantity in ("exposed_comm", "scaling_efficiency")}
    eff, exposed = metrics["scaling_efficiency"], metrics["exposed_comm"]
    assert len(eff.samples) >= 5 and len(exposed.samples) >= 5
    assert min(eff.samples) <= eff.value <= max(eff.samples)
    assert all(0.0 <= s < 1.0 for s in exposed.samples)
    assert noise(eff.samples, absolute=True) > 0 and noise(exposed.samples, absolute=True) is not None


@cpu_only
def test_a_plain_progress_line_off_a_terminal_and_the_whole_process_wall(tmp_path):
    """stderr a pipe: the estimate, then '<name>: <what> [i/n], N s elapsed' lines, no bar; the
    closing line counts the whole process too, start-up included."""
    out = tmp_path / "c.json"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "comm", "--ops", "allreduce", "--sizes", "1K,2K",
                           "--no-store", "--json", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["process_seconds"] > doc["wall_seconds"] > 0
    assert f"{doc['process_seconds']:.2f} s since the process started" in proc.stdout
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("comm: about ") and "a guess at" in lines[0]
    assert any(x.startswith("comm: allreduce 1 KiB") and "[0/4]" in x and "s elapsed" in x for x in lines), lines
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr


def test_compare_says_when_a_host_is_too_noisy_to_compare(tmp_path):
    """Two CPU runs a minute apart gave "regressions" of 19 and 27 points: a run that started on a
    busy host, or whose figures spread over 10% within the run, is said to be too noisy; the
    changes keep their own noise-aware status."""
    from mgpu_bench.history import History, compare_runs
    from mgpu_bench.results.metrics import Metric

    suite = json.loads((FIX / "suite" / "suite.json").read_text())
    doc = next(p["document"] for p in suite["probes"] if p["name"] == "model-scaling")
    quiet = {**doc, "environment": {**doc["environment"], "host_load": {"load_1m": 0.2, "cpus": 2}}}
    busy = {**doc, "environment": {**doc["environment"], "host_load": {"load_1m": 3.4, "cpus": 2}}}
    with History.open(tmp_path / "h.db") as h:
        a, b = h.save(quiet), h.save(busy)
        c = compare_runs(h, a, b)
        busy_line = (f"{b}: the host was busy when it started (load average 3.4 on 2 CPU(s)) and it ran on CPU "
                     "processes: its figures drift between runs more than its own samples show; run both on an idle "
                     "host")
        floor = ("every metric's noise is taken as at least 17% (the noisier run's typical spread, at least 10%, or "
                 "10% per unit of load per CPU on a busy host): a change under 3 times that cannot be told from the "
                 "host's drift")  # 3.4 / 2 CPUs x 10%
        assert c.warnings == (busy_line, floor)
        assert not compare_runs(h, a, a).warnings
        # three figures whose samples spread 30% within the run
        spread = [Metric(f"model.tiny.ddp.{n}gpu.synthetic.tokens_per_s", 1000.0, "tokens/s", "higher",
                         tuple(1000.0 * (1 + 0.3 * ((i % 3) - 1)) for i in range(9))) for n in (1, 2, 4)]
        noisy = h.save(quiet, spread)
        line, floor_line = compare_runs(h, a, noisy).warnings
        assert line.startswith(f"{noisy}: its figures spread ") and "the host is too noisy to compare" in line
        assert floor_line.startswith("every metric's noise is taken as at least ")


def _timed_lines(args: list[str], cwd: Path, timeout: float) -> tuple[int, list[tuple[float, str]], float]:
    """`mgpu-bench ARGS` with stdout and stderr one pipe (a CI log, `| tee`): its exit code, each line
    with the seconds since the command was started when it came, and the whole wall time."""
    import os

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "CUDA_VISIBLE_DEVICES": ""}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=cwd)
    lines = []
    try:
        for raw in iter(proc.stdout.readline, b""):
            lines.append((time.monotonic() - t0, raw.decode(errors="replace").rstrip()))
            assert time.monotonic() - t0 < timeout, f"past {timeout:.0f} s: {lines[-5:]}"
        code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, lines, time.monotonic() - t0


@cpu_only
@pytest.mark.timing
def test_a_model_run_in_a_pipe_says_its_whole_time_first_and_a_line_at_least_every_10_s(tmp_path):
    """`model` in a pipe printed its first line after 20-31 s, said "about 18 s" and took 93 s
    (start-up left out), and went 45 s without a line. Now: the first line within a few seconds (the
    CLI and torch imported, the workload counted: a new process's start-up on this host, scaled by
    the slowdown measured now), the estimate there says start-up is included and the run keeps
    within twice it, and no two lines are further apart than the heartbeat's 10 s (plus its 1 s
    tick; the stretches without one, start-up and end, scaled by the slowdown)."""
    from conftest import scaled

    from mgpu_bench.output.console import PLAIN_EVERY_S

    code, lines, wall = _timed_lines(["model", "--nproc", "2", "--steps", "10", "--warmup-steps", "2", "--no-store",
                                      "--json", str(tmp_path / "m.json")], tmp_path, scaled(600))
    text = "\n".join(f"{t:6.1f} {line}" for t, line in lines)
    assert code == 0, text
    first_s, first = lines[0]
    assert first_s < scaled(10), text
    assert first.startswith("model: about ") and "start-up included" in first, text
    m = re.match(r"model: about (\d+) (s|min)", first)
    estimate = int(m.group(1)) * (60 if m.group(2) == "min" else 1)
    assert wall <= 2 * estimate, f"{wall:.0f} s against an estimate of {estimate} s\n{text}"
    times = [0.0, *(t for t, _ in lines), wall]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) <= max(PLAIN_EVERY_S + 2.0, scaled(6.0)), text


def test_the_heartbeat_says_the_last_step_again_when_nothing_else_is_said():
    """Off a terminal, a command whose work goes on in child processes (a suite's probe, a model's
    ranks starting) says its last step again with the time elapsed whenever every_s passes without a
    line; before the first step, that it is starting."""
    import io

    from rich.console import Console

    from mgpu_bench.output.console import Progress

    err = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    with Progress(err, "suite", "lines", True, every_s=0.3) as bar:
        time.sleep(1.0)
        bar.say("round 1, 3/11: training step on one process")
        time.sleep(1.0)
    lines = err.file.getvalue().splitlines()
    assert lines[0].startswith("suite: starting, ") and lines[0].endswith(" s elapsed"), lines
    said = lines.index("suite: round 1, 3/11: training step on one process")
    again = [x for x in lines[said + 1:] if x.startswith("suite: round 1, 3/11: training step on one process, ")]
    assert len(again) >= 2 and all(x.endswith(" s elapsed") for x in again), lines
    quiet = Console(file=io.StringIO(), width=200, force_terminal=True, color_system=None)
    with Progress(quiet, "suite", "lines", True, every_s=0.3) as bar:
        bar.say("on a terminal")
        time.sleep(0.8)
    assert quiet.file.getvalue().splitlines() == ["suite: on a terminal"]  # a terminal shows the line as it is


@cpu_only
@pytest.mark.timing
def test_check_says_its_whole_time_start_up_included(tmp_path):
    """check's closing line said "ok in 8.2 s" of a command that took 22 s (its measuring alone):
    the estimate it says first and the closing line both count from the command's start, the
    interpreter's own start-up included, which --budget bounds; the measuring is said beside."""
    code, lines, wall = _timed_lines(["check", "--no-store", "--json", str(tmp_path / "c.json")], tmp_path, 300)
    text = "\n".join(f"{t:6.1f} {line}" for t, line in lines)
    assert code == 0, text
    first = next(line for _, line in lines if line.startswith("check: "))  # after the history's own notes
    assert first.startswith("check: about ") and "start-up included" in first, text
    assert first.endswith("at most 60 s (--budget)"), text
    closing = next(line for _, line in lines if line.startswith("check ") and " of --budget 60s" in line)
    m = re.search(r": ok in ([\d.]+) s \(([\d.]+) s of it measuring\) of --budget", closing)
    assert m, closing
    whole, measuring = float(m.group(1)), float(m.group(2))
    said_at = next(t for t, line in lines if line == closing)
    assert measuring < whole <= said_at + 0.5 and whole <= wall, text  # the command's time when it said it


@cpu_only
def test_the_gpts_estimate_is_said_before_torch_is_imported_and_rank_0_counts_its_flops(tmp_path):
    """The first line of `model` came after this process had imported torch and counted the FLOPs
    on meta (6-7 s idle, 41.6 s beside 8 busy processes). The built-in GPT's estimate needs only its
    formula: the line is said before torch is imported here, and rank 0 counts the FLOPs on meta
    (the document still has the count, the formula beside it)."""
    out = tmp_path / "m.json"
    code = ("import sys\n"
            "class Mark:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            sys.stderr.write('TORCH IMPORTED\\n'); sys.stderr.flush()\n"
            "            sys.meta_path.remove(self)\n"
            "        return None\n"
            "sys.meta_path.insert(0, Mark())\n"
            "from mgpu_bench.cli import main\n"
            f"sys.argv = ['mgpu-bench', 'model', '--nproc', '2', '--steps', '5', '--warmup-steps', '1', '--no-store',"
            f" '--json', {str(out)!r}]\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    said = next(i for i, line in enumerate(lines) if line.startswith("model: about "))
    assert "TORCH IMPORTED" in lines[said + 1:], proc.stderr[-3000:]
    flops = json.loads(out.read_text())["workload"]
    assert flops["flops"]["device"] == "meta" and flops["flops"]["dense_ops"] > 0, flops
    assert abs(flops["flops"]["per_sample"] / flops["formula_per_sample"] - 1) < 0.1, flops
