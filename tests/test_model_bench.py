"""`mgpu-bench model` on CPU: window detection, scaling and throughput arithmetic, verdicts, a
real two-process gloo run of the tiny model through the command line, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.probes.model import analyse as model_analyse
from mgpu_bench.probes.model import figures as model_figures
from mgpu_bench.probes.model import measure as mb
from mgpu_bench.workloads import gpt as models


def test_stable_window_skips_a_slow_start_and_a_drift():
    steady = [0.100 + 0.001 * (i % 3) for i in range(20)]
    assert model_figures.stable_window(steady, 0) == (0, 20, True)
    slow_start = [0.5, 0.3, 0.2, 0.15, 0.12] + steady
    start, end, stable = model_figures.stable_window(slow_start, 0)
    assert stable and end == 25 and 3 <= start <= 5
    assert model_figures.stable_window(slow_start, 2)[0] >= 3  # never inside the warm-up
    drifting = [0.1 * (1.03 ** i) for i in range(20)]  # 3% slower every step: never stable
    assert model_figures.stable_window(drifting, 0)[2] is False
    assert model_figures.stable_window([0.1, 0.1], 0) == (0, 2, False)  # too short to tell


def test_scaling_efficiency():
    eff = model_figures.scaling_efficiency({1: 1000.0, 2: 1900.0, 4: 3000.0})
    assert eff == {1: 1.0, 2: pytest.approx(0.95), 4: pytest.approx(0.75)}
    assert model_figures.scaling_efficiency({2: 1900.0}) == {}


def ranks(step_s, world=1, data_s=0.001, nosync_s=None, oom=False):
    n = 12
    phases = {"data": [data_s] * n, "forward": [step_s * 0.3] * n, "backward": [step_s * 0.6] * n,
              "optimizer": [step_s * 0.1] * n, "step": [step_s] * n}
    out = []
    for r in range(world):
        d = {"rank": r, "world": world, "error": None, "phases": phases, "peak_allocated": 10 << 30,
             "peak_reserved": 12 << 30, "total_memory": 140 << 30}
        if nosync_s is not None:
            d["no_sync_phases"] = {**phases, "step": [nosync_s] * n}
        if oom:
            d = {"rank": r, "world": world, "error": "out of memory: CUDA out of memory", "peak_allocated": None}
        out.append(d)
    return out


def test_analyse_throughput_mfu_and_exposed_comm():
    cfg = mb.ModelConfig(model="350m", seq_len=2048, batch_size=8)
    fpt = models.flops_per_token(models.get_model_spec("350m"), 2048)
    st = model_figures.analyse(cfg, 2, ranks(0.2, world=2, nosync_s=0.17), 989e12, fpt * 2048, 2048)
    d = st.derived
    assert st.tokens_per_step == 8 * 2 * 2048
    assert d["samples_per_s"] == pytest.approx(8 * 2 / 0.2)
    assert d["tokens_per_s"] == pytest.approx(8 * 2 * 2048 / 0.2)
    assert d["mfu"] == pytest.approx(8 * 2048 / 0.2 * fpt / 989e12)
    assert d["exposed_comm_share"] == pytest.approx(0.15)
    assert model_analyse.verdict(st).startswith("communication-bound: exposed communication is 15.0%")


def test_verdicts():
    cfg = mb.ModelConfig(model="tiny", seq_len=128, batch_size=4)

    def analyse(r):
        return model_figures.analyse(cfg, 1, r, None, 2.6e9, 128)

    assert model_analyse.verdict(analyse(ranks(0.1))) == (
        "compute-bound (CPU processes: no profile or matmul ceiling to hold it against)")
    assert model_analyse.verdict(analyse(ranks(0.1, data_s=0.03))).startswith("input-bound")
    assert model_analyse.verdict(analyse(ranks(0.1, oom=True))).startswith("memory-bound")
    eff, gross = analyse(ranks(0.1)), analyse(ranks(0.125))
    assert model_analyse.input_loss(eff, gross) == pytest.approx(0.2)
    assert "input pipeline costs 20.0%" in model_analyse.verdict(eff, gross)


def test_two_gloo_processes_end_to_end(tmp_path):
    """A real run: the tiny GPT on 2 CPU processes (gloo) through torch's elastic launcher."""
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("on GPU machines the GPU tests cover this")
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "model", "--steps", "4", "--warmup-steps", "1",
                           "--nproc", "2", "--batch-size", "2", "--seq-len", "64", "--json", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tiny training steps" in proc.stdout and "6N + 12 L d T" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["kind"] == "model" and doc["status"]["completed"]
    (run,) = doc["runs"]
    assert run["world"] == 2 and len(run["ranks"]) == 2
    assert run["tokens_per_step"] == 2 * 64 * 2
    assert all(len(r["phases"]["step"]) == 4 for r in run["ranks"])
    d = run["derived"]
    # the wall clock's rate: every timed step's tokens over the longest rank's time; the median step's beside it
    elapsed = max(sum(r["phases"]["step"]) for r in run["ranks"])
    assert d["elapsed_s"] == pytest.approx(elapsed) and d["measured_steps"] == 4
    assert d["tokens_per_s"] == pytest.approx(4 * run["tokens_per_step"] / elapsed)
    assert d["steady_tokens_per_s"] == pytest.approx(run["tokens_per_step"] / d["step_s"])
    assert d["exposed_comm_share"] is not None  # the no_sync pass ran on both ranks
    assert run["comm_method"] == "no_sync" and d["sync_bytes"] > 0  # and the DDP hook timed the all-reduce
    cores = [set(r["cpu_pin"]["cores"]) for r in run["ranks"]]
    assert not cores[0] & cores[1] or len(os.sched_getaffinity(0)) < 2  # each rank its own share of the cores
    assert any(n.startswith("CPU ranks pinned to their share of the cores") for n in doc["notes"])


def test_a_rank_that_cannot_count_on_meta_counts_on_its_device_and_says_why(monkeypatch):
    """Rank 0 counts the GPT's FLOPs on meta (the command said its estimate from the formula); an
    op without a meta kernel there must not fail the run: the rank counts one step on its own
    device instead and the count says why."""
    from dataclasses import asdict

    from mgpu_bench.probes.model.config import ModelConfig
    from mgpu_bench.workloads.gpt_workload import GptWorkload

    def no_meta(self, batch_size, device="meta"):
        raise NotImplementedError("aten::odd_op has no meta kernel")

    monkeypatch.setattr(GptWorkload, "count_flops", no_meta)
    cfg = ModelConfig(steps=2, warmup_steps=1, device="cpu", profile=False, exposed_comm=False, batch_size=2,
                      seq_len=32)
    out = mb.worker(asdict(cfg), None, count_on="meta")
    assert out["error"] is None, out["error"]
    counted = out["flop_count"]
    assert counted["device"] == "cpu" and counted["dense_ops"] > 0, counted
    assert "does not run on the meta device (NotImplementedError: aten::odd_op has no meta kernel)" in counted["note"]
    formula = models.flops_per_token(models.MODELS["tiny"], 32) * 32 * 2
    assert abs(counted["flops"] / formula - 1) < 0.1, counted  # the same count as on meta, within the formula's 10%
    assert len(out[mb.DENSE_OPS_KEY]) == counted["dense_ops"]


@pytest.mark.parametrize("args,text", [
    (["--model", "gpt5"], "unknown model"),
    (["--seq-len", "4096"], "does not fit tiny"),
    (["--batch-size", "0"], "--batch-size"),
    (["--scaling", "1,3", "--nproc", "2"], "--scaling"),
    (["--data", "loader", "--data-dir", "/nonexistent/dir"], "not a writable folder"),
    (["--peak-tflops", "-1"], "--peak-tflops"),
])
def test_cli_bad_input_is_one_line_exit_2(args, text):
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0 and "--seq-len" in args:
        pytest.skip("GPU defaults differ")
    res = CliRunner().invoke(cli, ["model", *args])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and text in lines[0]
