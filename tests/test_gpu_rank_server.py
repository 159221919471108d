"""The rank server on a GPU (run with `pytest -m gpu` on a GPU machine): ranks forked from
multiprocessing's fork server, which imported torch, torch.distributed and torch._dynamo, can
still use CUDA. CUDA is not fork-safe once the driver is initialised in the forking process (a
rank's first CUDA call fails), so the server must never initialise it nor hold a context. It may
map the driver's library: on one H100 (torch 2.11.0+cu130, 2026-12-07) the server had libcuda
mapped while the ranks it forked computed correctly. The launching process may have used CUDA
before (the server is exec'd, not forked from it)."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server and /proc are Linux's")]


def _gpu_rank() -> dict:
    import torch

    from mgpu_bench.core import children

    torch.cuda.set_device(0)  # every rank on GPU 0: one GPU is enough to prove the fork is CUDA-clean
    a = torch.full((1024, 1024), 1.0, device="cuda")
    total = float((a @ a).sum().item())  # each entry 1024
    return {"server": children.forked_by_server(os.getppid()), "total": total,
            "name": torch.cuda.get_device_name(0)}


def _with_context() -> set[int]:
    """The processes holding a CUDA context on GPU 0, as the driver lists them (NVML)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    finally:
        pynvml.nvmlShutdown()


def test_ranks_forked_from_the_rank_server_use_the_gpu_and_the_server_holds_no_context():
    import torch
    from torch.distributed.launcher.api import LaunchConfig

    from mgpu_bench.core import children, launch

    torch.zeros(1, device="cuda")  # the launching process has used CUDA already: no matter
    assert children.rank_start_method() == "forkserver"
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=f"gpu-server-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="forkserver")
    got = launch.run_elastic(lc, _gpu_rank, children="die")
    assert sorted(got) == [0, 1]
    for facts in got.values():
        assert facts["server"], facts
        assert facts["total"] == 1024.0 ** 3, facts
    from multiprocessing import forkserver

    server = forkserver._forkserver._forkserver_pid
    holding = _with_context()
    assert os.getpid() in holding, holding  # NVML sees contexts here (this process made one)
    assert server and server not in holding, "the rank server holds a CUDA context: its forked ranks cannot use CUDA"
