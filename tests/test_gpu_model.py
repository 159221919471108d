"""`mgpu-bench model` on real GPUs (run with `pytest -m gpu` on a GPU machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def _run(tmp_path, *args, timeout=600):
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "model", *args, "--json", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    """One run that the one-GPU tests share (one launch of about half a minute instead of two):
    350m at seq 2048 on one GPU with both data sources, the profile and the matmul ceiling. Stored
    in a database of its own (the per-test one of conftest is not set up yet at module scope)."""
    tmp = tmp_path_factory.mktemp("model")
    return _run(tmp, "--model", "350m", "--steps", "12", "--warmup-steps", "3", "--gpus", "1", "--data", "both",
                "--num-workers", "2", "--db", str(tmp / "history.sqlite3"))


def test_one_gpu_with_both_data_sources(one_gpu):
    doc, stdout = one_gpu
    assert {r["data"] for r in doc["runs"]} == {"synthetic", "loader"}
    for r in doc["runs"]:
        d = r["derived"]
        assert d["tokens_per_s"] > 0 and 0 < d["mfu"] < 1
        assert d["peak_allocated"] > 0 and d["forward_s"] > 0 and d["backward_s"] > d["forward_s"] * 0.8
    # the loader's cost is said: its own line, or the verdict itself when it is what bounds the step
    assert any("input-pipeline loss" in f or "input-bound: the input pipeline costs" in f for f in doc["findings"])
    assert "MFU" in stdout


def test_one_gpu_verdict_reads_the_profile_and_the_matmul_ceiling(one_gpu):
    """The profile's shares lie in [0, 1] and add up with the idle time; the model's own matmul
    shapes reach a ceiling between the model's rate and the datasheet peak; the verdict says
    where the step goes (a loader that keeps 8 sequences of 2048 tokens per step fed costs the
    350m step nothing that bounds it)."""
    doc, stdout = one_gpu
    r = next(r for r in doc["runs"] if r["data"] == "synthetic")
    d = r["derived"]
    parts = [d["gpu_idle_share"], d["matmul_share"], d["attention_share"], d["other_kernel_share"]]
    assert all(0 <= x <= 1 for x in parts) and sum(parts) + d["comm_exposed_kernel_share"] == pytest.approx(1.0)
    assert d["flops_per_s_per_gpu"] < d["matmul_ceiling"] < doc["peak"]["value"]
    assert 0 < d["of_ceiling"] < 1
    verdict = next(f for f in doc["findings"] if f.startswith("1 GPU(s): "))
    assert verdict.split(": ", 1)[1].startswith(("compute-bound: the GPU is busy", "launch-bound"))
    assert "matmul ceiling" in stdout


@pytest.mark.multi_gpu(2)
def test_ddp_scaling_and_exposed_communication(tmp_path):
    doc, _ = _run(tmp_path, "--model", "125m", "--seq-len", "1024", "--batch-size", "8", "--steps", "12",
                  "--warmup-steps", "3", "--scaling", "1,2")
    assert doc["gpu_counts"] == [1, 2]
    two = next(r for r in doc["runs"] if r["world"] == 2)
    assert two["derived"]["exposed_comm_share"] is not None
    assert 0 <= two["derived"].get("comm_kernel_share", 0) < 1
    assert 0.5 < doc["scaling"]["2"] <= 1.05


@pytest.mark.multi_gpu(2)
def test_fsdp_two_gpus(tmp_path):
    doc, _ = _run(tmp_path, "--model", "125m", "--seq-len", "512", "--batch-size", "4", "--steps", "8",
                  "--warmup-steps", "2", "--parallel", "fsdp")
    (r,) = doc["runs"]
    assert r["world"] == 2 and r["derived"]["tokens_per_s"] > 0 and r["error"] is None
    d = r["derived"]
    assert d["exposed_comm_share"] is not None and 0 <= d["comm_kernel_share"] <= 1
    assert 0 <= d["comm_exposed_kernel_share"] <= d["comm_kernel_share"]


def test_oom_is_reported_exit_1(tmp_path):
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "model", "--model", "1.3b", "--batch-size",
                           "512", "--steps", "2", "--warmup-steps", "1", "--gpus", "1", "--json", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 1
    assert "out of memory" in proc.stderr and "--max-batch" in proc.stderr and "Traceback" not in proc.stderr
    doc = json.loads(out.read_text())
    assert doc["runs"][0]["error"].startswith("out of memory")
