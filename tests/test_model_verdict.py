"""The training-step verdict read from kernel intervals and the measured matmul ceiling: shares that
cannot pass 100% however many streams overlap, and a bound named from the profile, never
compute-bound by default."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mgpu_bench.probes.model.analyse import IDLE_LIMIT, kernel_split, verdict
from mgpu_bench.probes.model.figures import StepStats


def test_overlapping_nccl_streams_are_counted_once():
    """FSDP's all-gather and reduce-scatter run on two streams at once: summing their kernel times
    gave "NCCL kernels 116.1% of the step"; the intervals' union cannot pass 100%."""
    kernels = [
        (0, 600, "ncclDevKernel_AllGather_RING_LL"),  # us
        (200, 800, "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"),
        (100, 500, "sm90_xmma_gemm_bf16bf16_bf16f32"),
        (500, 700, "void at::native::vectorized_elementwise_kernel"),
        (900, 1000, "flash_bwd_kernel"),
    ]
    s = kernel_split(kernels)
    assert s["window_s"] == pytest.approx(1000e-6)
    assert s["nccl_s"] == pytest.approx(800e-6)  # 0..800 once, not 600 + 600
    assert s["nccl_exposed_s"] == pytest.approx(100e-6 + 100e-6)  # 0..100 and 700..800
    assert s["matmul_s"] == pytest.approx(400e-6) and s["other_s"] == pytest.approx(200e-6)
    assert s["attention_s"] == pytest.approx(100e-6)
    assert s["idle_s"] == pytest.approx(100e-6)  # 800..900
    assert s["busy_s"] + s["idle_s"] == pytest.approx(s["window_s"])


def _stats(**derived) -> StepStats:
    d = {"step_s": 0.1, "tokens_per_s": 1e5, "data_share": 0.0, "mfu": 0.40, **derived}
    return StepStats(world=1, data="synthetic", ranks=[], derived=d)


def _profiled(idle=0.02, matmul=0.47, attention=0.2, other=0.3, nccl_alone=0.0, **more) -> StepStats:
    return _stats(gpu_idle_share=idle, matmul_share=matmul, attention_share=attention, other_kernel_share=other,
                  comm_exposed_kernel_share=nccl_alone, comm_kernel_share=nccl_alone, matmul_ceiling=780e12,
                  of_ceiling=0.51, **more)


def test_a_busy_gpu_is_compute_bound_with_its_split_and_ceiling():
    text = verdict(_profiled())
    assert text.startswith("compute-bound: the GPU is busy 98% of the step: matmuls 47%")
    assert "MFU 40.0%" in text and "51% of the 780 TFLOP/s this GPU's matmuls reach" in text


def test_an_idle_gpu_is_launch_bound():
    text = verdict(_profiled(idle=IDLE_LIMIT + 0.15))
    assert text.startswith("launch-bound: the GPU idles 25.0% of the step")


def test_nccl_running_alone_is_communication_bound_even_when_gradient_sync_hides_nothing():
    text = verdict(_profiled(nccl_alone=0.31, exposed_comm_share=0.03))
    assert text.startswith("communication-bound: NCCL kernels run with nothing else beside them 31.0%")


def test_without_a_profile_only_near_the_ceiling_is_compute_bound():
    far = verdict(_stats(matmul_ceiling=780e12, of_ceiling=0.34))
    assert far.startswith("unexplained gap of 66% below what this GPU's matmuls reach") and "--profile" in far
    near = verdict(_stats(matmul_ceiling=780e12, of_ceiling=0.8))
    assert near.startswith("compute-bound: MFU 40.0%, 80% of the 780 TFLOP/s")


def test_cpu_processes_say_what_they_could_not_check():
    text = verdict(StepStats(world=2, data="synthetic", ranks=[], derived={"step_s": 0.1, "exposed_comm_share": 0.02}))
    assert text.startswith("compute-bound (CPU processes: no profile or matmul ceiling")


def test_fsdp_on_cpu_processes_measures_exposed_communication(tmp_path):
    """FSDP2 through the elastic launcher on 2 gloo processes; the pass with gradient sync off
    gives FSDP an exposed-communication figure too."""
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "model", "--parallel", "fsdp", "--nproc", "2",
                           "--steps", "4", "--warmup-steps", "1", "--json", str(out), "--no-progress", "--no-store"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["world"] == 2 and run["error"] is None
    assert run["derived"]["exposed_comm_share"] is not None
    assert "no_sync_phases" in run["ranks"][0]
