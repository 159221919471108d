"""The fleet's node pass on a real GPU (what every rank runs before the link pass): bf16 GEMM and
copy bandwidth at figures an H100/H200-class GPU reaches, NVML's health facts read, and another
job on the GPU named with its cost. Two nodes need two GPUs (README: Finding the bad node); this
is the part one GPU proves. Run with `pytest -m gpu` on a GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mgpu_bench.machine.selection import require_gpus
from mgpu_bench.probes.fleet.measure import FleetConfig, node_pass

pytestmark = pytest.mark.gpu

HOG = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_hog.py"


def _cfg() -> FleetConfig:
    return FleetConfig(size=256 << 20, iters=20, warmup=2, rounds=0, seed=0, timeout_s=60, gemm_n=8192,
                       copy_bytes=1 << 30, phases=("node",), device="cuda")


def _pass():
    import torch

    _gpus, devices = require_gpus("fleet", "1")
    torch.cuda.set_device(0)
    return node_pass(_cfg(), torch.device("cuda", 0), str(devices[0]["pci_bus_id"])), devices[0]


def test_the_node_pass_measures_a_gpu_and_reads_its_health():
    figs, _dev = _pass()
    assert figs["name"] and figs["flops_per_s"] > 300e12, figs["flops_per_s"]  # bf16 8192^3: H100/H200 class
    assert figs["copy_bytes_per_s"] > 1.5e12, figs["copy_bytes_per_s"]  # read + written, HBM3/3e
    assert len(figs["flops_samples"]) >= 5 and len(figs["copy_samples"]) >= 5
    problems = [h for h in figs["health"] if h["severity"] == "problem"]
    assert problems == [], problems  # a healthy GPU: nothing that drains the node


def test_another_job_on_the_gpu_is_named_and_costs_its_gemm(tmp_path):
    alone, _dev = _pass()
    log = tmp_path / "hog.out"
    # started by a shell that exits at once: not this process's child, as another job's would not be
    pid = int(subprocess.run(["sh", "-c", f"{sys.executable} {HOG} 0 60 4 > {log} 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True).stdout)
    try:
        deadline = time.monotonic() + 60
        while "hog pid" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # its loop running
        shared, _dev = _pass()
    finally:
        os.kill(pid, 9)
    told = [h for h in shared["health"] if str(pid) in h["text"]]
    assert told and all(h["severity"] == "warning" for h in told), shared["health"]
    assert shared["flops_per_s"] < 0.8 * alone["flops_per_s"], (shared["flops_per_s"], alone["flops_per_s"])
