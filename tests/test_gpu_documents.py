"""Every result document a GPU run writes is stored, compared, shown and drawn (issue 23): on one
H200 `memory`, `gemm --dtype bf16,fp16,tf32,fp8,fp32,fp64` and `suite --quick` measured well and
were then refused by their own declared shapes, and no CPU test had seen such a document.

Two sources, both taken through the real CLI (`history add`, `compare` against itself, `history
show`, `report`) into a database of their own:
- the documents recorded on GPU machines: every JSON document in tests/fixtures/gpu/ (the lead
  drops there the set benchmarks/gpu_smoke.sh records, trimmed by benchmarks/trim_fixture.py)
  and the two-GPU result documents beside it (comm_2x_h200.json);
- documents built here on the CPU by the probes' own writers (document.py), fed with raw results
  of the form and magnitude the native module and the GPU workers return on an H200 (csrc/module.cpp,
  mgpu_bench/_native.pyi, the measure.py workers): memory's churn with its latency events, gemm
  candidates whose split-K cuBLASLt gives as -1, every GEMM dtype, --search and --duration,
  model runs with a profile, a matmul ceiling, torch.compile and no_sync phases, links, sdc,
  overlap on one GPU, a suite embedding them with its NVML samples. The figures are invented
  but the shapes are the writers', so a shape that refuses what a GPU run writes fails here.

benchmarks/gpu_smoke.sh, the GPU run that records the real set, is checked here too: its syntax,
and its loop of store, show, report and compare on CPU processes (its CPU mode)."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.machine import hardware, telemetry
from mgpu_bench.results.probe import headline, validate

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).with_name("fixtures")
GPU_FIX = FIX / "gpu"
GIB, MIB = 1 << 30, 1 << 20
H200 = "NVIDIA H200"
# Probes that write no report.html ("report" writes their PNGs only: `mgpu-bench report --help`).
NO_HTML = {"links"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _is_result(doc) -> bool:
    return isinstance(doc, dict) and doc.get("schema") == "mgpu-bench/result"


def recorded() -> list[Path]:
    """The result documents recorded on GPU machines: tests/fixtures/gpu/*.json and the two-GPU
    ones in tests/fixtures (the other JSON files there are no result documents: topo, a trace)."""
    paths = sorted(GPU_FIX.glob("*.json")) + sorted(FIX.glob("*_2x_*.json"))
    return [p for p in paths if _is_result(_load(p))]


# -- what an H200 run writes, built by the probes' own writers -------------------------------------

ENV_1 = _load(GPU_FIX / "gemm-shared.json")["environment"]  # a real 1x H200 fingerprint
ENV_2 = _load(FIX / "comm_2x_h200.json")["environment"]  # a real 2x H200 fingerprint
DEVICE = {"index": 0, "name": H200, "uuid": "GPU-03544be8-957d-9de4-0687-fe974b0e723b",
          "pci_bus_id": "0000:00:06.0", "total_memory": 150109880320, "compute_capability": [9, 0],
          "multiprocessors": 132}
DEVICES_2 = [DEVICE, {**DEVICE, "index": 1, "uuid": "GPU-bc52127a-d389-8155-6a61-f933d01e2ccf",
                      "pci_bus_id": "0000:00:07.0"}]
# What NVML's static facts of an H200 are as telemetry.Sampler reads them (name and bus id included).
STATIC = {"name": H200, "pci_bus_id": "00000000:00:06.0", "sm_max_hz": 1.98e9, "power_limit_w": 700.0,
          "power_default_w": 700.0, "power_max_w": 700.0}


def _occupancy(gpus: int = 1) -> dict:
    """occupancy.Watch.to_dict() on an H200 nobody else uses: our own process only."""
    snap = {"error": None, "warnings": [], "gpus": {
        str(g): {"processes": [{"gpu": g, "pid": 4242, "name": "python3", "used_bytes": 545259520, "owner": "ours"}],
                 "memory_used": 1202716672, "memory_total": 150754820096, "utilization": 0} for g in range(gpus)}}
    return {"before": copy.deepcopy(snap), "after": snap, "foreign": []}


def _samples(t0: float, n: int, dt: float = 0.1, power_capped: bool = True) -> list[telemetry.Sample]:
    """NVML readings of an H200 under load: SM clock near 1.6 GHz, 690 W of 700, the software
    power cap (bit 0x4) set, one query that failed (None) as NVML sometimes does."""
    rng = random.Random(n)
    out = []
    for i in range(n):
        out.append(telemetry.Sample(t0 + dt * i, sm_hz=1.605e9 - 15e6 * rng.randint(0, 6), mem_hz=3.201e9,
                                    power_w=None if i == n // 2 else 680.0 + rng.random() * 14,
                                    temp_c=55.0 + i % 4, reasons=0x4 if power_capped else 0))
    return out


def _noisy(value: float, n: int, rel: float = 0.01, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [value * (1 + rel * (rng.random() - 0.5)) for _ in range(n)]


# gemm: TFLOP/s an H200 reaches per dtype at 8192^3 (benchmarks/RESULTS.md and ANCHORS-like figures).
GEMM_TFLOPS = {"fp64": 58.0, "fp32": 49.0, "tf32": 372.0, "fp16": 718.0, "bf16": 725.8, "fp8": 1390.8}


def _native_candidates(dtype: str, seconds: float, n: int = 8, samples: int = 5, check: bool = True) -> list[dict]:
    """GemmProbe.measure()["candidates"] as csrc/module.cpp builds them: cuBLASLt's config
    attributes as read (split-K -1 for some H200 candidates, issue 23), a failed candidate's error
    with no seconds and iters_per_sample 0, max_error None where unchecked."""
    from mgpu_bench.probes.gemm.measure import TOLERANCE

    out = []
    for i in range(n):
        failed = dtype == "fp8" and i == n - 1
        out.append({
            "index": i, "algo_id": 66 if dtype in ("bf16", "fp16", "fp8") else 21 + i, "tile": 248 - i, "stages": 35,
            "split_k": -1 if i % 3 == 1 else (4 if i % 3 == 2 else 1), "reduction": 0 if i % 3 == 0 else 2,
            "swizzle": i % 2, "custom": 7 - i % 4, "cluster": 5 if i % 2 == 0 else 0, "workspace": 4 << (i % 3),
            "waves": 12.606060981750488 + i, "seconds": [] if failed else _noisy(seconds * (1 + 0.03 * i), samples, seed=i),
            "iters_per_sample": 0 if failed else 7,
            "max_error": None if failed or not check else TOLERANCE[dtype] * 0.3,
            "error": "cublasLtMatmul: CUBLAS_STATUS_NOT_SUPPORTED: the functionality requested is not supported"
            if failed else None})
    return out


def _gemm_result(dtype: str, shape, phase: str = "shape", candidates: int = 8, samples: int = 5, check: bool = True):
    from mgpu_bench.probes.gemm import measure as gm

    secs = shape.flops / (GEMM_TFLOPS[dtype] * 1e12)
    raw = {"candidates": _native_candidates(dtype, secs, candidates, samples, check), "buffer_sets": 1,
           "checked_elements": 1024 if check else 0}
    return gm.GemmResult(
        gpu=0, gpu_name=H200, dtype=dtype, shape=shape, layout=gm.layout_for(dtype, "auto"),
        candidates=[gm.Candidate.from_native(c) for c in raw["candidates"]], buffer_sets=raw["buffer_sets"],
        checked_elements=raw["checked_elements"], seconds_wall=1.36, peak=gm.peak_for(H200, dtype, {}),
        telemetry=telemetry.summarize(_samples(100.0, 13), STATIC), phase=phase)


def gemm_documents() -> dict[str, dict]:
    from mgpu_bench.probes.gemm import document as gd
    from mgpu_bench.probes.gemm import measure as gm

    square = gm.Shape(8192, 8192, 8192)
    out = {}
    cfg = gm.GemmConfig(dtypes=gm.GEMM_DTYPES)
    run = gm.GemmRun(cfg, [DEVICE], wall_seconds=14.2)
    run.results = [_gemm_result(d, square) for d in cfg.dtypes]
    out["gemm-all-dtypes"] = gd.document(run, ENV_1, ["mgpu-bench", "gemm", "--dtype", ",".join(cfg.dtypes)],
                                         _occupancy())
    grid = (4096, 8192)
    cfg = gm.GemmConfig(dtypes=("bf16",), search=grid, search_refine=2)
    run = gm.GemmRun(cfg, [DEVICE], wall_seconds=6.0)
    for m in grid:
        for n in grid:
            for k in grid:
                run.results.append(_gemm_result("bf16", gm.Shape(m, n, k), "search", 1, 2, False))
    run.results += [_gemm_result("bf16", gm.Shape(8192, 8192, 4096), "search-best"),
                    _gemm_result("bf16", square, "search-best")]
    out["gemm-search"] = gd.document(run, ENV_1, ["mgpu-bench", "gemm", "--search", "--search-range", "4096:8192:4096"],
                                     _occupancy())
    cfg = gm.GemmConfig(dtypes=("bf16",), duration_s=5.0, interval_s=0.5)
    run = gm.GemmRun(cfg, [DEVICE], wall_seconds=7.1)
    r = _gemm_result("bf16", square)
    t0 = 500.0
    r.series = [(0.5 * (i + 1), s) for i, s in enumerate(_noisy(r.best.median_s, 10, 0.02, seed=3))]
    got = _samples(t0, 50, 0.1)
    r.series_telemetry = {"summary": telemetry.summarize(got, STATIC), **telemetry.series(got, t0)}
    run.results = [r]
    out["gemm-duration"] = gd.document(run, ENV_1, ["mgpu-bench", "gemm", "--duration", "5s"], _occupancy())
    # two GPUs, two shapes; one candidate's output wrong (its error NaN: the check met a NaN), and
    # the run stopped by Ctrl-C before fp16's second shape: exit 1 and 130, both stored
    cfg = gm.GemmConfig(dtypes=("bf16", "fp16"), shapes=(gm.Shape(4096, 8192, 1024), square), gpus=(0, 1))
    run = gm.GemmRun(cfg, DEVICES_2, wall_seconds=4.4, stopped="interrupted",
                     stop_message="interrupted (Ctrl-C): the results gathered so far are kept")
    for dtype, shape in (("bf16", cfg.shapes[0]), ("bf16", square), ("fp16", cfg.shapes[0])):
        for gpu in (0, 1):
            r = _gemm_result(dtype, shape)
            r.gpu = gpu
            run.results.append(r)
    run.results[1].candidates[2].max_error = float("nan")
    out["gemm-shapes-2x"] = gd.document(run, ENV_2, ["mgpu-bench", "gemm", "--dtype", "bf16,fp16", "--shape",
                                                     "4096x8192x1024,8192"], _occupancy(2))
    return out


def _churn_raw(allocator: str, pattern: str) -> dict:
    """_native.memory_churn's result: the simulated arena's (the same C++ pattern code and dict,
    no CUDA call) with an H200's capacity, under the allocator's own name, the pool's figures for
    "async", and host seconds per call as an H200's allocator takes them."""
    from mgpu_bench import _native

    raw = dict(_native._memory_churn_simulated(pattern, 20261129, 0.9, 150109880320))
    rng = random.Random(f"{allocator}{pattern}")
    raw["allocator"] = allocator
    raw["events"] = [(kind, nbytes, (2e-5 if kind == "free" else 4e-5 + nbytes / 2**40) * (1 + rng.random()))
                     for kind, nbytes, _s in raw["events"]]
    if allocator == "async":
        raw["pool_reserved"], raw["pool_used"] = raw["held_bytes"] + 3 * GIB, raw["held_bytes"]
    raw["search_seconds"] = 3.37 if allocator == "async" else 0.2
    return raw


def _workload(setting: str, conf: str | None) -> dict:
    """torch_memory.run_setting's dict on an H200 (run_workload's keys plus the parent's)."""
    steps, native = 12, setting != "async"
    lens = [1024, 256, 2048, 512, 1792, 768, 2048, 256, 1536, 1024, 512, 2048]
    alloc = [int(2.4 * GIB + n * 6 * MIB) for n in lens]
    return {"kind": "workload", "model": "125m", "params": 123587328, "max_seq": 2048, "batch": 8,
            "seq_lens": "256-2048", "steps": steps, "seed": 20261129, "device": "cuda:0", "gpu_name": H200,
            "total_memory_bytes": 150109880320,
            "allocator_backend": "native" if native else "cudaMallocAsync",
            "alloc_conf": {"PYTORCH_CUDA_ALLOC_CONF": conf, "PYTORCH_ALLOC_CONF": None},
            "torch_version": "2.11.0+cu130", "step_seq_lens": lens, "step_ok": [True] * steps,
            "step_allocated_bytes": alloc, "step_reserved_bytes": [a + 3 * GIB for a in alloc], "seconds": 3.1,
            "peak_allocated_bytes": int(24.7 * GIB), "peak_reserved_bytes": int(30.6 * GIB),
            "reserved_unallocated_at_peak_bytes": int(5.9 * GIB), "end_allocated_bytes": alloc[-1],
            "end_reserved_bytes": alloc[-1] + 3 * GIB, "end_reserved_unallocated_bytes": 3 * GIB,
            "inactive_split_peak_bytes": int(1.2 * GIB) if native else None,
            "inactive_split_current_bytes": int(0.4 * GIB) if native else None,
            "num_alloc_retries": 0 if native else None, "num_ooms": 0 if native else None, "caught_ooms": 0,
            "oom_messages": [], "largest_free_block_bytes": int(2.88 * GIB) if native else None,
            "free_in_segments_bytes": int(26.5 * GIB) if native else None, "segments": 41 if native else None,
            "returncode": 0, "wall_s": 12.4, "setting": setting, "conf": conf}


def _max_batch(checkpointing: bool) -> dict:
    """run_memory's max-batch entry: torch_memory.find_max_batch's dict with the parent's keys."""
    best = 135 if checkpointing else 54
    trials = [{"batch": b, "ok": b <= best, "seconds": 0.4 + b / 100, "peak_allocated_bytes": int(b * 2.3 * GIB),
               **({} if b <= best else {"error": "CUDA out of memory. Tried to allocate 2.00 GiB."})}
              for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 192, 160, 144, 136, best)]
    return {"model": "350m", "seq_len": 2048, "checkpointing": checkpointing, "kind": "maxbatch", "params": 355919872,
            "limit": None, "time_budget_s": None, "device": "cuda:0", "gpu_name": H200,
            "total_memory_bytes": 150109880320, "allocator_backend": "native",
            "alloc_conf": {"PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": None},
            "torch_version": "2.11.0+cu130", "max_batch": best, "first_oom_batch": best + 1, "complete": True,
            "tokens_per_step": best * 2048, "peak_allocated_bytes": int(131.2 * GIB), "trials": trials,
            "setup_seconds": 2.1, "seconds": 35.2 if checkpointing else 13.7, "returncode": 0, "wall_s": 40.7,
            "setting": "default", "conf": None}


def memory_documents() -> dict[str, dict]:
    from mgpu_bench.probes.memory import document as md
    from mgpu_bench.probes.memory import measure as mm

    out = {}
    cfg = mm.MemoryConfig(bandwidth=True)
    run = mm.MemoryRun(cfg, [DEVICE], wall_seconds=15.9)
    for kind, tbs, rd, wr in (("copy_ce", 4.27, 4, 4), ("copy_sm", 3.92, 4, 4), ("read", 4.0, 4, 0),
                              ("write", 4.02, 0, 4)):
        secs = (rd + wr) * GIB / (tbs * 1e12)
        raw = {"seconds": _noisy(secs, 10, seed=rd), "bytes_read": rd * GIB,
               "bytes_written": wr * GIB if kind != "read" else 4 * 132 * 4}
        run.hbm.append(mm.HbmResult(0, kind, int(raw["bytes_read"]), int(raw["bytes_written"]), list(raw["seconds"]),
                                    4.8e12))
    for allocator in mm.ALLOCATORS:
        for pattern in mm.PATTERNS:
            run.churn.append(mm.ChurnResult(0, allocator, pattern, _churn_raw(allocator, pattern)))
    out["memory-bandwidth"] = md.document(run, ENV_1, ["mgpu-bench", "memory", "--bandwidth"])
    out["memory"] = md.document(mm.MemoryRun(mm.MemoryConfig(), [DEVICE], churn=run.churn, wall_seconds=9.8),
                                ENV_1, ["mgpu-bench", "memory"])
    cfg = mm.MemoryConfig(churn=False, torch_settings=("default", "expandable", "async"), max_batch_model="350m")
    run = mm.MemoryRun(cfg, [DEVICE], wall_seconds=97.0)
    run.torch = {"default": _workload("default", None),
                 "expandable_segments:True": _workload("expandable_segments:True", "expandable_segments:True"),
                 "backend:cudaMallocAsync": _workload("async", "backend:cudaMallocAsync")}
    run.max_batch = [_max_batch(False), _max_batch(True)]
    out["memory-torch-allocators"] = md.document(
        run, ENV_1, ["mgpu-bench", "memory", "--no-churn", "--torch-allocators", "default,expandable,async",
                     "--max-batch", "350m"])
    # a child that failed: torch_memory._run_child's error dict where the result would be
    cfg = mm.MemoryConfig(churn=False, torch_settings=("default",), max_batch_model="1.3b", max_batch_seq=4096)
    run = mm.MemoryRun(cfg, [DEVICE], wall_seconds=600.4)
    run.torch = {"default": {"error": "RuntimeError: CUDA error: an illegal memory access was encountered",
                             "returncode": 1, "wall_s": 9.2, "setting": "default", "conf": None}}
    run.max_batch = [{"model": "1.3b", "seq_len": 4096, "checkpointing": False, "error": "timed out after 600 s",
                      "returncode": None, "wall_s": 600.0, "setting": "default", "conf": None}]
    out["memory-children-failed"] = md.document(run, ENV_1, ["mgpu-bench", "memory", "--no-churn", "--torch-allocators",
                                                             "default", "--max-batch", "1.3b", "--seq-len", "4096"])
    return out


def _model_rank(rank: int, world: int, steps: int, step_s: float, *, loader: bool = False,
                compile_s: float | None = None, no_sync: bool = False, fsdp: bool = False) -> dict:
    """model.measure.worker()'s dict on an H200: per-phase seconds from CUDA events, the
    allocator's peaks, the profile of three steps (the recorded 350m trace's split, with NCCL
    kernels on two ranks) and the matmul ceiling on the model's own shapes."""
    from mgpu_bench.probes.model.analyse import kernel_split

    data = 0.012 if loader else 4.8e-6

    def phases(scale: float) -> dict:
        step = _noisy(step_s * scale + data, steps, 0.01, seed=rank)
        return {"data": _noisy(data, steps, 0.1, seed=5), "forward": [s * 0.32 for s in step],
                "backward": [s * 0.65 for s in step], "optimizer": _noisy(0.0029, steps, seed=7), "step": step}

    with gzip.open(GPU_FIX / "kernels_350m_1xh200.json.gz", "rt") as f:
        kernels = [tuple(k) for k in json.load(f)["kernels"]]
    if world > 1:  # an all-reduce kernel beside the backward pass of each step, the last of it alone
        t0, t1 = kernels[0][0], kernels[-1][1]
        kernels += [(t0 + (t1 - t0) * (0.3 + i / 3), t0 + (t1 - t0) * (0.3 + i / 3 + 0.08),
                     "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") for i in range(3)]
    shapes = [{"op": op["op"], "shapes": [a["tensor"] for a in op["args"] if isinstance(a, dict) and "tensor" in a],
               "count": op["count"], "flops": op["flops"], "seconds": op["flops"] / 7.05e14, "flops_per_s": 7.05e14}
              for op in _count_350m().dense_ops]
    out = {"rank": rank, "world": world, "device": f"cuda:{rank}", "error": None, "gpu_name": H200,
           "torch": "2.11.0+cu130", "wall_s": steps * step_s, "phases": phases(1.0),
           "peak_allocated": 27916489216 // (2 if fsdp else 1), "peak_reserved": 30089936896, "total_memory": 150109880320,
           "profile": {"steps": 3, **kernel_split(kernels)},
           "matmul_ceiling": {"flops_per_s": 7.05e14, "shapes": shapes}}
    if compile_s is not None:
        out["compile_s"] = compile_s
    if no_sync:
        out["no_sync_phases"] = phases(0.95)
        out["no_sync_wall_s"] = steps * step_s * 0.95
    return out


def _count_350m():
    """The 350m's FLOPs at batch 8, seq 2048, counted on the meta device as `model` counts them."""
    from mgpu_bench import workloads

    if not _COUNT:
        w = workloads.resolve("350m")
        _COUNT.append((w.facts(), w.count_flops(8)))
    return _COUNT[0][1]


_COUNT: list = []


def _model_document(name: str, cfg_changes: dict, counts: list[int], modes: list[str], **rank) -> dict:
    from mgpu_bench.probes.model import document as dd
    from mgpu_bench.probes.model.analyse import ModelRun, analyse
    from mgpu_bench.probes.model.measure import ModelConfig, flop_facts

    cfg = ModelConfig(**{"model": "350m", "seq_len": 2048, "batch_size": 8, "steps": 12, "warmup_steps": 3,
                         **cfg_changes})
    peak = hardware.peak_flops(H200, "bf16")
    count = _count_350m()
    run = ModelRun(cfg, counts, modes, H200, peak, wall_seconds=31.0,
                   workload={**_COUNT[0][0], "flops": flop_facts(count)})
    for n in counts:
        for mode in modes:
            c = replace(cfg, data=mode)
            ranks = [_model_rank(r, n, cfg.steps, 0.1056 * (1.3 if cfg.checkpointing else 1), loader=mode == "loader",
                                 no_sync=n > 1, fsdp=cfg.parallel == "fsdp", **rank) for r in range(n)]
            run.stats.append(analyse(c, n, ranks, peak.value, count.per_sample, 2048))
    args = ["mgpu-bench", "model", *name.split()]
    return dd.document(run, ENV_2 if max(counts) > 1 else ENV_1, args, _occupancy(max(counts)))


def _model_oom() -> dict:
    """`model --model 1.3b --batch-size 512` on one H200: the worker's out-of-memory result (no
    phases, the allocator's peak), exit 1, stored with what it says."""
    from mgpu_bench.probes.model import document as dd
    from mgpu_bench.probes.model.analyse import ModelRun, analyse
    from mgpu_bench.probes.model.measure import ModelConfig

    cfg = ModelConfig(model="1.3b", seq_len=2048, batch_size=512, steps=2, warmup_steps=1)
    peak = hardware.peak_flops(H200, "bf16")
    rank = {"rank": 0, "world": 1, "device": "cuda:0", "gpu_name": H200, "torch": "2.11.0+cu130",
            "error": "out of memory: CUDA out of memory. Tried to allocate 96.00 GiB. GPU 0 has a total capacity of "
                     "139.81 GiB of which 71.50 GiB is free.", "peak_allocated": 21474836480}
    run = ModelRun(cfg, [1], ["synthetic"], H200, peak, wall_seconds=14.0)
    run.stats.append(analyse(cfg, 1, [rank], peak.value, 6 * 1.3e9 * 2048, 2048))
    return dd.document(run, ENV_1, ["mgpu-bench", "model", "--model", "1.3b", "--batch-size", "512"], _occupancy())


def model_documents() -> dict[str, dict]:
    return {
        "model-oom": _model_oom(),
        "model": _model_document("--model 350m --gpus 1", {}, [1], ["synthetic"]),
        "model-compile": _model_document("--model 350m --gpus 1 --compile", {"compile": True}, [1], ["synthetic"],
                                         compile_s=5.4),
        "model-data-both": _model_document("--data both --num-workers 4", {"data": "both", "num_workers": 4}, [1],
                                           ["synthetic", "loader"]),
        "model-checkpointing": _model_document("--checkpointing", {"checkpointing": True}, [1], ["synthetic"]),
        "model-fsdp-2x": _model_document("--parallel fsdp --scaling 1,2", {"parallel": "fsdp"}, [1, 2],
                                         ["synthetic"]),
    }


def links_documents() -> dict[str, dict]:
    """`links` on one H200 (host copies only: no pair) and on two (every pair both engines)."""
    from mgpu_bench.machine.theory import Hop
    from mgpu_bench.probes.links import document as ld
    from mgpu_bench.probes.links.result import LinkMeasurement, LinkSpec, LinksRun

    size = 256 << 20
    out = {}
    for name, gpus, env in (("links", [0], ENV_1), ("links-2x", [0, 1], ENV_2)):
        run = LinksRun(gpus=gpus, wall_seconds=2.4, per_pair_seconds=0.9 if len(gpus) > 1 else 0.0, host_seconds=0.4)
        hops = {}
        for a in gpus:
            for b in gpus:
                if a == b:
                    continue
                run.peer_access[(a, b)] = True
                hops[(a, b)] = Hop(a, b, "nvlink", 450e9, "NVLink 4 x18 via NVSwitch")
                for engine in ("ce", "sm"):
                    for bidir in (False, True):
                        run.measurements.append(LinkMeasurement(LinkSpec("copy", a, b, engine, bidir, None, size),
                                                                tuple(_noisy(size / 390e9, 10, seed=a))))
                run.measurements.append(LinkMeasurement(LinkSpec("latency", a, b), tuple(_noisy(0.86e-6, 5))))
        for g in gpus:
            for direction in ("h2d", "d2h"):
                run.measurements.append(LinkMeasurement(LinkSpec("host", g, None, direction=direction, bytes=size),
                                                        tuple(_noisy(size / 55.3e9, 10, seed=g))))
        out[name] = ld.document(run, hops, env, ["mgpu-bench", "links"])
    return out


def sdc_document() -> dict:
    """`sdc` on one H200 with its defaults: SdcProbe.select_algo()'s record as measure.py keeps
    it (split-K and reduction as cuBLASLt gives them), GEMM, collective and HBM checks."""
    from mgpu_bench.probes.sdc import document as sd
    from mgpu_bench.probes.sdc.result import Check, SdcConfig, SdcRun

    cfg = SdcConfig(repetitions=3)
    algo = {"blob": "42" * 64, "algo_id": 66, "tile": 248, "stages": 35, "split_k": 1, "reduction": 0, "swizzle": 0,
            "custom": 7, "cluster": 5, "workspace": 0, "chosen_on": 0}
    run = SdcRun(cfg, [DEVICE], algo=algo, references={0: "0x0664b124fefaa2f6"}, hbm_bytes={0: 133043798016},
                 repetitions=3, wall_seconds=4.4, check_seconds=1.6)
    for rep in (1, 2, 3):
        run.checks += [Check(0, rep, "gemm", 64, 64 * 2 * 8192 * 8192, 0.0977, hash="0x0664b124fefaa2f6"),
                       Check(0, rep, "collective", 134217728, 256 << 20, 0.0021),
                       Check(0, rep, "hbm", 133043798016 // 8, 133043798016, 0.0616)]
    return sd.document(run, ENV_1, ["mgpu-bench", "sdc"], _occupancy())


def overlap_document() -> dict:
    """`overlap` on one H200: measure.measure()'s rank with the elementwise stand-in, CUDA-event
    seconds per iteration, NVML telemetry per phase and the series with the phases' bounds."""
    from mgpu_bench.probes.overlap import document as od
    from mgpu_bench.probes.overlap.analyse import OverlapConfig, OverlapRun

    cfg = OverlapConfig(size=256 << 20, m=8192, n=8192, k=8192, duration_s=5.0, device="cuda")
    comm_s, gemm_s = 2 * (256 << 20) / 2.06e12, cfg.flops / 6.645e14
    t0 = 1000.0
    windows = {"comm_alone": (t0, t0 + 5.2), "gemm_alone": (t0 + 5.3, t0 + 10.4), "together": (t0 + 10.5, t0 + 16.0)}
    samples = _samples(t0, 160, 0.1)
    rank = {"rank": 0, "world": 1, "device": "cuda:0", "host": "vm", "error": None, "comm_op": "elementwise stand-in",
            "nccl_env": {}, "gpu_name": H200, "sm_count": 132, "bus_id": "00000000:00:06.0", "nccl": {},
            "calibration": {"comm_s": comm_s, "gemm_s": gemm_s},
            "phases": {"comm_alone": {"comm": {"start_s": 1.2e-5, "seconds": _noisy(comm_s, 20)}, "host_s": 5.2},
                       "gemm_alone": {"gemm": {"start_s": 9.0e-6, "seconds": _noisy(gemm_s, 20)}, "host_s": 5.1},
                       "together": {"comm": {"start_s": 1.1e-5, "seconds": _noisy(comm_s * 2.38, 20)},
                                    "gemm": {"start_s": 0.0, "seconds": _noisy(gemm_s * 1.47, 30)}, "host_s": 5.5}},
            "telemetry": {p: telemetry.summarize([s for s in samples if a <= s.t <= b], STATIC)
                          for p, (a, b) in windows.items()},
            "telemetry_series": {**telemetry.series(samples, t0),
                                 "phases": {p: [a - t0, b - t0] for p, (a, b) in windows.items()}}}
    run = OverlapRun(cfg, [rank], (0,), None, ["overlap needs 2 GPUs to measure interference"], wall_seconds=21.6)
    return od.document(run, ENV_1, ["mgpu-bench", "overlap", "--gpus", "1"], _occupancy())


def suite_document(parts: dict[str, dict]) -> dict:
    """`suite --quick` on one H200: each probe's own document in its entry, round 2 skipped (it
    needs 2 GPUs), the round-3 probes with the suite's own NVML samples (suite.run._telemetry:
    Sampler.static as it is, its name and bus id included)."""
    from mgpu_bench.suite import run as sr

    samples = _samples(900.0, 40, 0.5)
    tel = {"error": None, "interval_s": 0.5, "gpus": {"0": {"static": STATIC, "series": telemetry.series(samples, 900.0),
                                                            "summary": telemetry.summarize(samples, STATIC)}}}

    def entry(rnd: int, name: str, doc: dict | None, seconds: float, status: str = "ok", error: str | None = None,
              sampled: bool = False) -> dict:
        return {"round": rnd, "name": name, "title": name, "command": ["mgpu-bench", *(doc or {}).get("command", [])[1:]],
                "status": status, "error": error, "seconds": seconds, "document": doc,
                "telemetry": tel if sampled else None}

    probes = [entry(1, "gemm", parts["gemm-all-dtypes"], 3.0), entry(1, "hbm+memory", parts["memory-bandwidth"], 8.3),
              entry(1, "model-1gpu", parts["model"], 12.9), entry(1, "sdc", parts["sdc"], 9.1),
              *[entry(2, n, None, 0.0, "skipped", "needs 2 NVIDIA GPU(s), 1 selected")
                for n in ("comm", "links", "model-scaling", "overlap")],
              entry(3, "max-batch", parts["memory-torch-allocators"], 63.6, sampled=True),
              entry(3, "gemm-sustained", parts["gemm-duration"], 22.6, sampled=True),
              entry(3, "model-sustained", parts["model-compile"], 32.3, sampled=True)]
    run = sr.SuiteRun(sr.SuiteConfig(quick=True, duration_s=20.0, gpus=(0,)), probes=probes, wall_seconds=158.0)
    return sr.document(run, ENV_1, ["mgpu-bench", "suite", "--quick"])


# The names of what built() makes (its fixture's would-be names): collected without building them.
BUILT_NAMES = ("gemm-all-dtypes", "gemm-duration", "gemm-search", "gemm-shapes-2x", "links", "links-2x", "memory",
               "memory-bandwidth", "memory-children-failed", "memory-torch-allocators", "model", "model-checkpointing",
               "model-compile", "model-data-both", "model-fsdp-2x", "model-oom", "overlap", "sdc", "suite-quick")


@functools.cache
def built() -> dict[str, dict]:
    """Every GPU-shaped document, by the name its fixture would have; as the file holds it."""
    docs = {**gemm_documents(), **memory_documents(), **model_documents(), **links_documents(),
            "sdc": sdc_document(), "overlap": overlap_document()}
    docs["suite-quick"] = suite_document(docs)
    return {k: json.loads(json.dumps(v)) for k, v in docs.items()}


# -- through the CLI ---------------------------------------------------------------------------------

def _cli(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    return result.exit_code, result.output + (repr(result.exception) if result.exception and
                                              not isinstance(result.exception, SystemExit) else "")


def _shared(doc: dict) -> bool:
    """Whether the run shared its GPU with another job that ran kernels: compare refuses such a
    run, even against itself, with exit code 1 ("not comparable", `compare --help`)."""
    from mgpu_bench.machine.occupancy import competing, from_document

    return bool(competing(from_document(doc)))


def through_the_cli(path: Path, db: Path, out: Path) -> None:
    """history add (stored as rN), compare rN with itself (exit 0, no regression; exit 1 "not
    comparable" for a run beside another job, and for a run without a headline figure, as runs
    that share no metric cannot be compared), history show rN, report rN: each exit 0;
    report.html where the probe writes one."""
    code, text = _cli("history", "add", str(path), "--db", str(db))
    assert code == 0, text
    found = re.search(r"\bstored (r\d+): (\w+)", text)
    assert found, text
    run, kind = found.groups()
    code, text = _cli("compare", run, "--baseline", run, "--db", str(db))
    doc = _load(path)
    if not headline(doc):  # it measured nothing (every child failed, out of memory): nothing to compare
        assert code == 1 and "share no metric" in text, text  # runs that cannot be compared: exit 1
    elif _shared(doc):
        assert code == 1 and "not comparable" in text and "shared with pid" in text, text
    else:
        assert code == 0 and re.search(r"^0 regression", text, re.MULTILINE), text
    code, text = _cli("history", "show", run, "--db", str(db))
    assert code == 0 and f"run {run}: {kind}" in text, text
    code, text = _cli("report", run, "--db", str(db), "--out", str(out))
    assert code == 0, text
    assert kind in NO_HTML or (out / "report.html").is_file(), sorted(p.name for p in out.iterdir())


@pytest.mark.parametrize("name", BUILT_NAMES)
def test_what_a_gpu_run_writes_is_stored_compared_shown_and_drawn(tmp_path, name):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(built()[name]))
    through_the_cli(path, tmp_path / "h.sqlite3", tmp_path / "rep")


@pytest.mark.parametrize("path", recorded(), ids=lambda p: str(p.relative_to(FIX)))
def test_every_recorded_gpu_document_is_stored_compared_shown_and_drawn(tmp_path, path):
    through_the_cli(path, tmp_path / "h.sqlite3", tmp_path / "rep")


def test_every_built_document_is_checked():
    assert tuple(sorted(built())) == BUILT_NAMES


def test_the_built_documents_hold_what_the_issue_found_refused():
    """The two reported failures and the suite's, present in what is checked above: latency
    per size class, split-K -1, and a suite embedding both with NVML's static facts (name, bus id)."""
    churn = built()["memory"]["churn"][0]
    stats = next(iter(churn["latency"]["alloc"].values()))
    assert set(stats) == {"count", "p50", "p99", "max"} and stats["count"] > 0
    splits = {c["split_k"] for r in built()["gemm-all-dtypes"]["results"] for c in r["candidates"]}
    assert -1 in splits and {r["dtype"] for r in built()["gemm-all-dtypes"]["results"]} == {
        "bf16", "fp16", "tf32", "fp8", "fp32", "fp64"}
    suite = built()["suite-quick"]
    kinds = {p["document"]["kind"] for p in suite["probes"] if p["document"]}
    assert {"gemm", "memory", "model", "sdc"} <= kinds
    assert any(isinstance(g["static"].get("name"), str) for p in suite["probes"] if p["telemetry"]
               for g in p["telemetry"]["gpus"].values())


def test_a_memory_document_read_back_keeps_its_latency():
    """report and the suite rewrite a stored document from the run read back: the latency per
    size class (computed from calls a document does not keep) is written again, not lost."""
    from mgpu_bench.probes.memory import document as md

    doc = built()["memory"]
    again = json.loads(json.dumps(md.document(md.run_from_document(doc), doc["environment"], doc["command"])))
    assert [c["latency"] for c in again["churn"]] == [c["latency"] for c in doc["churn"]]
    validate(again)


# -- benchmarks/gpu_smoke.sh -------------------------------------------------------------------------

SMOKE = ROOT / "benchmarks" / "gpu_smoke.sh"


def _smoke_rows() -> list[list[str]]:
    text = SMOKE.read_text()
    table = text.split("TABLE='", 1)[1].split("'", 1)[0]
    return [[c.strip() for c in line.split("|")] for line in table.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_smoke_scripts_table_names_commands_and_options_that_exist():
    """Every row: a unique name, the GPUs it needs, the README's exit code, a limit, and a command
    whose options the CLI parses (click's own parser, nothing run) or a function of the script."""
    assert subprocess.run(["bash", "-n", str(SMOKE)], check=False).returncode == 0
    rows = _smoke_rows()
    names = [r[0] for r in rows]
    assert len(names) == len(set(names)) and len(rows) >= 20, names
    text = SMOKE.read_text()
    ctx = cli.make_context("mgpu-bench", ["history", "list"])
    for name, gpus, want, limit, stores, cmd in rows:
        assert (gpus.isdigit() or gpus == "cpu") and set(want.split(",")) <= {"0", "1", "2"}, name  # codes: 0 or 0,1
        assert limit.isdigit() and stores in ("yes", "no"), name
        if cmd.startswith(":"):
            assert f"{cmd[1:]}() {{" in text, cmd
            continue
        args = [*cmd.replace("{dir}", "rep").split(), "--json", "x.json"]
        sub = cli.get_command(ctx, args[0])
        assert sub is not None, cmd
        sub.make_context(args[0], args[1:])  # an unknown option or a bad value raises here
    covered = {r[5].split()[0] for r in rows if not r[5].startswith(":")}
    assert covered >= {"comm", "links", "gemm", "memory", "model", "sdc", "overlap", "suite", "topo"}, covered
    assert not any("--no-store" in r[5] for r in rows)  # the store is what it checks


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_smoke_loop_stores_shows_reports_compares_and_says_what_failed(tmp_path):
    """The script's CPU mode on a table of three rows: comm on gloo processes (stored as r1, then
    history show, report with its report.html, compare with itself: ok), a command that exits 2
    where the README says 0 (FAIL, with its message), one that needs a GPU (skipped); the summary
    counts them, the exit code is 1, the document and the tarball are there."""
    table = tmp_path / "table.txt"
    # one op (allreduce), not comm's default several: the loop is what is checked, not the sweep
    table.write_text("comm-small | cpu | 0 | 300 | yes | comm --sizes 4K --ops allreduce\n"
                     "comm-bad   | 0 | 0 | 60  | yes | comm --sizes 4K --ops nope\n"
                     "gemm-dtypes | 1 | 0 | 60 | yes | gemm --dtype bf16\n")
    out = tmp_path / "out"
    env = {**os.environ, "MGPU_SMOKE_CPU": "1", "MGPU_SMOKE_TABLE": str(table), "PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(SMOKE), str(out)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=ROOT, check=False)
    summary = (out / "summary.txt").read_text()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = {ln.split()[0]: ln for ln in summary.splitlines()[1:-1]}
    assert re.search(r"exit 0 .* r1 +ok$", lines["comm-small"]), summary
    assert "FAIL: exit 2, the README says 0: mgpu-bench: error:" in lines["comm-bad"] and "nope" in lines["comm-bad"]
    assert "skipped: needs 1 GPU(s), 0 present" in lines["gemm-dtypes"]
    assert summary.splitlines()[-1].startswith("gpu_smoke: 1 ok, 1 FAIL, 1 skipped in ")
    doc = _load(out / "docs" / "comm-small-cpu.json")
    validate(doc)
    assert (out / "logs" / "comm-small-stored-report" / "report.html").is_file()
    listed = subprocess.run(["tar", "tzf", str(out / "smoke.tgz")], capture_output=True, text=True, check=True).stdout
    assert "docs/comm-small-cpu.json" in listed and "summary.txt" in listed and "logs/history.sqlite3" in listed
    assert not list(tmp_path.glob("mgpu-smoke-*"))  # its temporary database folder is gone


# -- benchmarks/trim_fixture.py ----------------------------------------------------------------------

def _shape_of(value, path: str = "") -> set[tuple[str, str]]:
    """(path, JSON type) of every value, list positions collapsed: what trimming must keep."""
    out = {(path, type(value).__name__)}
    if isinstance(value, dict):
        for k, v in value.items():
            out |= _shape_of(v, f"{path}.{k}")
    elif isinstance(value, list):
        for v in value:
            out |= _shape_of(v, f"{path}[]")
    return out


def test_trimming_keeps_every_field_and_its_type_and_cuts_the_samples(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import trim_fixture
    finally:
        sys.path.pop(0)
    docs = {**built(), **{p.stem: _load(p) for p in recorded()}}
    for name, doc in docs.items():
        small = trim_fixture.trim(doc, 3)
        assert _shape_of(small) == _shape_of(doc), name
        validate(json.loads(json.dumps(small)))
    small = trim_fixture.trim(built()["suite-quick"], 3)
    memory = next(p["document"] for p in small["probes"] if p["name"] == "hbm+memory")
    assert all(len(h["seconds"]) == 3 for h in memory["hbm"])
    gemm = next(p["document"] for p in small["probes"] if p["name"] == "gemm-sustained")
    tel = gemm["results"][0]["series_telemetry"]
    assert len(gemm["results"][0]["series"]) == 3
    # the first 3 readings and the one where NVML gave no power: columns cut alike, None kept
    assert len(tel["t"]) == len(tel["sm_hz"]) == len(tel["power_w"]) == 4 and None in tel["power_w"]
    comm = trim_fixture.trim(_load(FIX / "comm_2x_h200.json"), 3)
    assert {len(r) for m in comm["measurements"] for r in m["samples"]} == {3}  # each rank's row alike
    assert all(len(m["burst_seconds"]) == 2 for m in comm["measurements"])  # per rank: kept whole
    search = trim_fixture.trim(built()["gemm-search"], 3)["results"]
    assert [r["phase"] for r in search] == ["search"] * 3 + ["search-best"] * 2
    # the command line: a fixture per document, a suite's parts as their own
    paths = []
    for name in ("suite-quick", "model"):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(built()[name], indent=1))
    assert trim_fixture.main([*map(str, paths), "--out", str(tmp_path / "fix"), "--parts"]) == 0
    made = sorted(p.name for p in (tmp_path / "fix").iterdir())
    assert "model.json" in made and "suite-quick.json" in made and "suite-quick--gemm.json" in made, made
    for p in (tmp_path / "fix").iterdir():
        validate(_load(p))
        # a suite holds every probe's document: about 70 KB for one H200; the others under 50 KB
        assert p.stat().st_size < (100_000 if p.name == "suite-quick.json" else 50_000), (p.name, p.stat().st_size)


def test_slow_tests_run_only_when_asked_for():
    """conftest's rule for the `slow` marker: `-m gpu` (and a plain run) leaves them out, a -m
    expression that names slow or --run-slow keeps them."""
    from conftest import _slow_wanted

    class Config:
        def __init__(self, markexpr: str, run_slow: bool = False) -> None:
            self.options = {"markexpr": markexpr, "--run-slow": run_slow}

        def getoption(self, name):
            return self.options[name]

    assert not _slow_wanted(Config("")) and not _slow_wanted(Config("gpu"))
    assert not _slow_wanted(Config("gpu and slowness"))
    assert _slow_wanted(Config("slow")) and _slow_wanted(Config("gpu or slow")) and _slow_wanted(Config("", True))
