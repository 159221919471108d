"""Rules checked on CPU against what the GPU machine recorded (tests/fixtures/gpu, 1x H200, driver
580.159.04, torch 2.11.0+cu130, 2026-12-01): the kernels of three 350m training steps, NVML's
process list with another job on the GPU, and the gemm and model documents of runs beside it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from mgpu_bench.machine import occupancy
from mgpu_bench.probes.model.analyse import kernel_split
from mgpu_bench.results import probe as registry

GPU = Path(__file__).parent / "fixtures" / "gpu"


def _doc(name: str) -> dict:
    return json.loads((GPU / name).read_text())


def test_the_recorded_350m_step_splits_into_matmuls_attention_and_the_rest():
    with gzip.open(GPU / "kernels_350m_1xh200.json.gz", "rt") as f:
        trace = json.load(f)
    assert trace["gpu"] == "NVIDIA H200" and len(trace["kernels"]) > 4000
    s = kernel_split([tuple(k) for k in trace["kernels"]])
    w = s["window_s"]
    assert s["nccl_s"] == 0 and s["idle_s"] / w < 0.10  # one GPU, eager, fed: busy
    assert 0.35 < s["matmul_s"] / w < 0.65  # the nvjet (cuBLAS) kernels
    assert 0.10 < s["attention_s"] / w < 0.30  # cuDNN's fused SDPA, though its name has "wgmma"
    assert s["matmul_s"] + s["attention_s"] + s["other_s"] + s["nccl_exposed_s"] + s["idle_s"] == pytest.approx(w)


def test_another_job_on_the_gpu_is_named_first_and_as_the_cause():
    gemm, model = _doc("gemm-shared.json"), _doc("model-shared.json")
    (proc,) = occupancy.from_document(gemm)
    assert proc.owner in ("foreign", "unknown") and proc.used_bytes > 20 * 2**30
    (line,) = occupancy.findings_text([proc], gemm["occupancy"]["before"])
    assert line.startswith(f"GPU 0 shared with pid {proc.pid} (python3, 24.9 GiB)")
    probe = registry.get("model")
    v = probe.verdict(model)
    assert v.bound == "shared" and v.severity == "problem"
    assert v.text.startswith(f"shared GPU: GPU 0 shared with pid {proc.pid} (python3, 24.9 GiB)")
    healthy = probe.verdict(_doc("model-healthy.json"))
    assert healthy.bound == "compute" and "the GPU is busy" in healthy.text


def test_the_recorded_power_limits_make_the_cap_information():
    from mgpu_bench.machine.telemetry import concerns

    nv = _doc("nvml-processes.json")
    summary = {"power_limit_w": nv["enforced_mw"] / 1000, "power_default_w": nv["default_limit_mw"] / 1000,
               "power_max_w": nv["constraints_mw"][1] / 1000, "limiting": ["power cap (software)"]}
    assert concerns(summary) == []
    gemm = _doc("gemm-shared.json")
    assert (gemm["results"][0]["telemetry"] or {}).get("limiting") == ["power cap (software)"]
    assert not [f for f in gemm["findings"] if "power cap" in f]
