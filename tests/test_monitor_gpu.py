"""StepMonitor on GPUs (skipped without them): the CUDA-event pool, the profiled window split into
kernels, the ceiling timed on the counted shapes, MFU against the datasheet; on two GPUs under DDP
over NCCL, every rank's record on rank 0 and the NCCL share of the step."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _loop(mon, model, opt, spec, device, steps, batch=8, seq=512):
    from mgpu_bench.workloads import gpt as models

    gen = torch.Generator(device=device).manual_seed(0)
    for _ in range(steps):
        with mon.step(samples=batch):
            x, y = models.synthetic_batch(spec, batch, seq, device, gen)
            with mon.compute():
                models.train_step(model, opt, x, y, torch.bfloat16)


def test_one_gpu_profile_ceiling_and_mfu(tmp_path):
    from mgpu_bench import StepMonitor
    from mgpu_bench.results.probe import validate
    from mgpu_bench.workloads import gpt as models

    dev = torch.device("cuda", 0)
    spec = models.get_model_spec("125m")
    model = models.GPT(spec, device=dev)
    opt = models.make_optimizer(model)
    mon = StepMonitor("gpu-125m", tokens_per_sample=512, model=model, optimizer=opt, window=10,
                      db=str(tmp_path / "h.sqlite3"))
    _loop(mon, model, opt, spec, dev, 5 + 3 + 30)
    doc = mon.finish()
    validate(json.loads(json.dumps(doc)), "the monitor's document")
    d = doc["runs"][0]["derived"]
    assert d["gpu_idle_share"] is not None and d["matmul_share"] > 0.05  # the profiled window's kernels (125m at seq 512: 18% on an H200, the host keeps it half idle)
    assert d["matmul_ceiling"] > 0 and 0 < d["of_ceiling"] < 1.5
    assert d["mfu"] is not None and 0 < d["mfu"] < 1 and d["peak_reserved"] > 0
    assert doc["job"]["ceiling"]["source"].startswith("the step's own matmul")
    assert doc["runs"][0]["ranks"][0]["profile"]["steps"] == 3


def _two_gpu_job(db: str) -> dict:
    import os

    import torch.distributed as dist

    from mgpu_bench import StepMonitor
    from mgpu_bench.workloads import gpt as models

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    spec = models.get_model_spec("125m")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(models.GPT(spec, device=dev), device_ids=[local])
    opt = models.make_optimizer(model)
    mon = StepMonitor("gpu-125m-ddp", tokens_per_sample=512, model=model, optimizer=opt, window=10, db=db,
                      print=dist.get_rank() == 0)
    _loop(mon, model, opt, spec, dev, 5 + 3 + 30)
    doc = mon.finish()
    dist.destroy_process_group()
    return doc


@pytest.mark.multi_gpu(2)
def test_two_gpus_under_ddp(tmp_path):
    import uuid

    from torch.distributed.launcher.api import LaunchConfig

    from mgpu_bench.core import launch

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=f"monitor-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn")
    docs = launch.run_elastic(lc, _two_gpu_job, str(tmp_path / "h.sqlite3"), children="die")
    doc = docs[0]
    assert doc["created"] == docs[1]["created"] and doc["config"]["parallel"] == "ddp"
    d = doc["runs"][0]["derived"]
    assert d["comm_kernel_share"] > 0  # the gradient all-reduce's NCCL kernels, seen in the profile
    assert len(doc["job"]["ranks"]) == 2 and doc["job"]["straggler"] is not None
