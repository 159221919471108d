"""`mgpu-bench model`: full training steps of the built-in GPT, timed per phase, on 1..N GPUs.

One process per GPU (gloo processes on CPU) started through torch's elastic launcher, or joined
when an outer torchrun/srun already started them. Each rank runs `worker()`: warm-up steps,
then timed steps with CUDA events at the phase boundaries (data wait, forward, backward,
optimizer; host clocks on CPU), read back once at the end so the loop stays asynchronous; then,
for DDP on more than one rank, the same number of steps under `no_sync()` (no gradient
all-reduce) to measure exposed communication, and a few profiled steps for the split of
kernel time between communication and compute. The parent turns the raw seconds into a stable
window, throughput, MFU and a verdict.

FLOPs per token: 6*N + 12*L*d*T (models.flops_per_token); MFU = achieved FLOP/s per GPU / the
dtype's dense peak from the hardware database (refused for an unknown GPU unless the user
gives --peak-tflops).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mgpu_bench.errors import InputError, MgpuError, interruption

from .analyse import PHASES, ModelRun, analyse, kernel_split


@dataclass(frozen=True)
class ModelConfig:
    model: str = "tiny"
    seq_len: int = 128
    batch_size: int = 4  # per GPU (per rank) and micro-batch
    grad_accum: int = 1
    steps: int = 30
    warmup_steps: int = 5
    parallel: str = "ddp"  # ddp | fsdp
    data: str = "synthetic"  # synthetic | loader
    num_workers: int = 2
    preprocess_ms: float = 0.0
    data_dir: str | None = None
    checkpointing: bool = False
    compile: bool = False  # torch.compile the model; its compile time is the first warm-up step's
    exposed_comm: bool = True
    profile: bool = True
    device: str = "cuda"  # cuda | cpu
    seed: int = 1234
    progress: bool = False


# ------------------------------------------------------------------------------------ analysis


# ------------------------------------------------------------------------------------ worker

def _token_file(data_dir: str, vocab: int, tokens: int, seed: int) -> Path:
    import numpy as np

    path = Path(data_dir) / f"mgpu_bench_tokens_{vocab}_{tokens}_{seed}.u16"
    if not path.exists() or path.stat().st_size != tokens * 2:
        rng = np.random.default_rng(seed)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        rng.integers(0, vocab, size=tokens, dtype=np.uint16).tofile(tmp)
        os.replace(tmp, path)
    return path


class _TokenDataset:
    """Samples of seq_len + 1 tokens from a uint16 token file, with an optional simulated
    per-sample preprocessing cost (sleep) standing in for decoding and augmentation."""

    def __init__(self, path: Path, seq_len: int, preprocess_ms: float, length: int):
        self.path, self.seq_len, self.preprocess_ms, self.length = path, seq_len, preprocess_ms, length
        self._data = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        import numpy as np
        import torch

        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint16, mode="r")
        span = len(self._data) - self.seq_len - 1
        off = (i * 7919 * self.seq_len) % span
        chunk = torch.from_numpy(self._data[off:off + self.seq_len + 1].astype(np.int64))
        if self.preprocess_ms > 0:
            time.sleep(self.preprocess_ms / 1000.0)
        return chunk[:-1], chunk[1:]


def worker(cfg_dict: dict) -> dict:
    """One rank: returns raw per-step seconds and facts (never raises for an OOM: the error and
    the steps measured so far come back instead)."""
    import torch
    import torch.distributed as dist

    from mgpu_bench import models

    cfg = ModelConfig(**cfg_dict)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = cfg.device == "cuda"
    if on_gpu:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    owns_group = world > 1 and not dist.is_initialized()  # under a launcher the group outlives us
    if owns_group:
        dist.init_process_group("nccl" if on_gpu else "gloo", device_id=device if on_gpu else None)
    out: dict[str, Any] = {"rank": rank, "world": world, "device": str(device), "error": None,
                           "gpu_name": torch.cuda.get_device_name(device) if on_gpu else None,
                           "torch": torch.__version__}
    spec = models.get_model_spec(cfg.model)
    torch.manual_seed(cfg.seed)
    model = models.GPT(spec, checkpointing=cfg.checkpointing, device=device)
    if world > 1:
        if cfg.parallel == "fsdp":
            model = _fsdp(model, on_gpu)
        else:
            # Gradients as views into the buckets (no copy in or out) and 100 MB buckets: on 2x H200
            # (350m, seq 2048) exposed communication 4.2% of the step against 5.0% with DDP's
            # defaults (25 MB, copies); benchmarks/RESULTS.md.
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[local] if on_gpu else None, gradient_as_bucket_view=True, bucket_cap_mb=100)
    opt = models.make_optimizer(model)
    if cfg.compile:
        # After the DDP/FSDP wrapper, as torch's DDP notes advise (DDPOptimizer splits the graph at
        # bucket boundaries so the all-reduce still overlaps); no_sync() and FSDP's gradient-sync switch
        # reach the wrapper through the compiled module's attribute forwarding.
        model = torch.compile(model)
    amp = torch.bfloat16 if on_gpu else None
    gen = torch.Generator(device=device).manual_seed(cfg.seed + rank)
    loader_iter = None
    if cfg.data == "loader":
        tokens_needed = max(1 << 20, 4 * cfg.batch_size * (cfg.seq_len + 1) * 64)
        path = _token_file(cfg.data_dir or "/tmp", spec.vocab, tokens_needed, cfg.seed)
        total = cfg.batch_size * cfg.grad_accum * (cfg.warmup_steps + 3 * cfg.steps + 16)
        ds = _TokenDataset(path, cfg.seq_len, cfg.preprocess_ms, total)
        dl = torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, num_workers=cfg.num_workers,
                                         pin_memory=on_gpu, persistent_workers=cfg.num_workers > 0,
                                         drop_last=True)
        loader_iter = iter(dl)

    def next_batch():
        if loader_iter is None:
            return models.synthetic_batch(spec, cfg.batch_size, cfg.seq_len, device, gen)
        x, y = next(loader_iter)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def clock():
        if on_gpu:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def between(a, b) -> float:
        return a.elapsed_time(b) / 1e3 if on_gpu else b - a

    live = sys.stderr.isatty()
    said = [0.0]

    def show(label: str, i: int, n: int) -> None:
        """Rank 0's step counter: rewritten in place on a terminal; in a log or pipe a line at
        the end of each pass and at most every 10 s."""
        if not (cfg.progress and rank == 0):
            return
        text = f"mgpu-bench model: {world} {'GPU(s)' if on_gpu else 'process(es)'}, {label}: step {i}/{n}"
        if live:
            print(f"\r{text}", end="" if i < n else "\n", flush=True, file=sys.stderr)
        elif i == n or time.monotonic() - said[0] >= 10.0:
            print(text, flush=True, file=sys.stderr)
            said[0] = time.monotonic()

    def run_steps(n: int, sync_grads: bool, label: str) -> list[dict]:
        """n optimizer steps; per step the clocks at: start, data ready, and per micro-batch
        forward start/end and backward end, then the optimizer's end."""
        marks = []
        for step in range(n):
            m: dict[str, Any] = {"start": clock()}
            micro = [next_batch() for _ in range(cfg.grad_accum)]
            m["data"] = clock()
            m["micro"] = []
            for a, (x, y) in enumerate(micro):
                sync = sync_grads and a == cfg.grad_accum - 1
                if world > 1 and cfg.parallel == "fsdp":
                    model.set_requires_gradient_sync(sync)  # FSDP2: no reduce-scatter of gradients
                skip = world > 1 and cfg.parallel == "ddp" and not sync
                with model.no_sync() if skip else contextlib.nullcontext():
                    f0 = clock()
                    with torch.autocast(device_type=device.type, dtype=amp) if amp else contextlib.nullcontext():
                        loss = model(x, y) / cfg.grad_accum
                    f1 = clock()
                    loss.backward()
                    m["micro"].append((f0, f1, clock()))
            opt.step()
            opt.zero_grad(set_to_none=True)
            m["end"] = clock()
            marks.append(m)
            show(label, step + 1, n)
        if on_gpu:
            torch.cuda.synchronize(device)
        return marks

    def phases(marks) -> dict[str, list[float]]:
        """Seconds per step and phase; a step runs from its start to the next step's start, so
        time the device waited between steps counts."""
        res: dict[str, list[float]] = {p: [] for p in (*PHASES, "step")}
        for i, m in enumerate(marks):
            res["data"].append(between(m["start"], m["data"]))
            res["forward"].append(sum(between(f0, f1) for f0, f1, _ in m["micro"]))
            res["backward"].append(sum(between(f1, b1) for _, f1, b1 in m["micro"]))
            res["optimizer"].append(between(m["micro"][-1][2], m["end"]))
            nxt = marks[i + 1]["start"] if i + 1 < len(marks) else m["end"]
            res["step"].append(between(m["start"], nxt))
        return res

    try:
        if cfg.compile:  # the first step compiles forward and backward: its wall is the compile time
            t0 = time.perf_counter()
            run_steps(1, True, "compiling (torch.compile, not timed)")
            out["compile_s"] = time.perf_counter() - t0
        warm = run_steps(cfg.warmup_steps - (1 if cfg.compile else 0), True, "warm-up (not timed)")
        del warm
        t0 = time.perf_counter()
        marks = run_steps(cfg.steps, True, "timed steps")
        out["wall_s"] = time.perf_counter() - t0
        out["phases"] = phases(marks)
        if on_gpu:
            out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
            out["total_memory"] = torch.cuda.get_device_properties(device).total_memory
        if cfg.exposed_comm and world > 1:
            t0 = time.perf_counter()  # DDP: no_sync(); FSDP: gradient sync off (no reduce-scatter)
            out["no_sync_phases"] = phases(run_steps(cfg.steps, False, "the same steps without gradient sync "
                                                               "(for the exposed communication)"))
            out["no_sync_wall_s"] = time.perf_counter() - t0
        if cfg.profile and on_gpu:
            out["profile"] = _profile_split(lambda: run_steps(3, True, "profiled steps"))
        if on_gpu:
            out["matmul_ceiling"] = _matmul_ceiling(spec, cfg.batch_size * cfg.seq_len, device)
    except torch.OutOfMemoryError as exc:
        out["error"] = "out of memory: " + str(exc).split("\n")[0][:300]
        out["peak_allocated"] = torch.cuda.max_memory_allocated(device) if on_gpu else None
    except InputError as exc:
        out["error"] = str(exc)
    if owns_group and dist.is_initialized():
        with contextlib.suppress(Exception):  # teardown of a failed group must not hide the result
            dist.destroy_process_group()
    return out


def _fsdp(model, on_gpu: bool):
    """FSDP2 as torchtitan sets it up: each block its own unit, then the root; bf16 parameters
    with fp32 gradient reduction on GPUs; blocks resharded after forward except the last (its
    backward follows at once); the next block's all-gather issued ahead in forward and the
    previous one's in backward."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_gpu else \
        MixedPrecisionPolicy()
    blocks = list(model.blocks)
    for i, block in enumerate(blocks):
        fully_shard(block, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    for prev, block in itertools.pairwise(blocks):
        prev.set_modules_to_forward_prefetch([block])
        block.set_modules_to_backward_prefetch([prev])
    return model


def _profile_split(run) -> dict:
    """Where a few steps' GPU time goes, from the CUDA kernels' own intervals (torch.profiler's
    trace): analyse.kernel_split of them, so that overlapping streams are counted once."""
    import json
    import warnings

    from torch.profiler import ProfilerActivity, profile

    from mgpu_bench import children

    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            marks = run()
    with children.temp_folder("mgpu-prof-") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents") or []
    kernels = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0.0), str(e.get("name")))
               for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    return {"steps": len(marks), **kernel_split(kernels)}


def _matmul_ceiling(spec, tokens: int, device) -> dict:
    """What this GPU's matmuls reach on the model's own shapes (models.matmul_shapes): each shape
    timed alone in bf16 (torch.matmul, CUDA events, the median of 5 bursts), and the rate of all
    of a micro-batch's matmuls together (FLOP-weighted): the ceiling the step's matmuls could run
    at."""
    import statistics as st

    import torch

    from mgpu_bench import models

    gen = torch.Generator(device=device).manual_seed(7)
    rows, flops_total, seconds_total = [], 0.0, 0.0
    for m, n, k, count in models.matmul_shapes(spec, tokens):
        a = torch.rand((m, k), device=device, dtype=torch.bfloat16, generator=gen) - 0.5
        b = torch.rand((k, n), device=device, dtype=torch.bfloat16, generator=gen) - 0.5
        for _ in range(3):
            torch.matmul(a, b)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        reps = max(1, min(200, int(0.01 / max(start.elapsed_time(end) / 1e3, 1e-6))))
        samples = []
        for _ in range(5):
            start.record()
            for _ in range(reps):
                torch.matmul(a, b)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / reps)
        secs = st.median(samples)
        flops = 2.0 * m * n * k
        rows.append({"m": m, "n": n, "k": k, "count": count, "seconds": secs, "flops_per_s": flops / secs})
        flops_total += flops * count
        seconds_total += secs * count
        del a, b
    torch.cuda.empty_cache()
    return {"flops_per_s": flops_total / seconds_total, "shapes": rows}


# ------------------------------------------------------------------------------------ launching

def launch(cfg: ModelConfig, nprocs: int) -> list[dict]:
    """Runs worker() on nprocs local processes through torch's elastic launcher (a c10d
    rendezvous on localhost) and returns each rank's result, rank order. Under an outer
    launcher (RANK and WORLD_SIZE set) it runs this process's rank only."""
    from mgpu_bench import launch as launcher

    le = launcher.detect()
    if le is not None:
        return _joined(cfg, le)
    if nprocs == 1:
        return [worker(asdict(cfg))]
    from torch.distributed.launcher.api import LaunchConfig

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"mgpu-bench-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launcher.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn")
    # the ranks die with this process, and at once on Ctrl-C (the agent stops them with SIGINT)
    results = launcher.run_elastic(lc, worker, asdict(cfg), children="die")
    return [results[r] for r in sorted(results)]


def _joined(cfg: ModelConfig, le) -> list[dict]:
    """This process as one rank of a launcher's job: one process group for every configuration
    (formed once, through the store that names a rank that never arrives), the ranks' arguments
    checked to agree, and every rank's result gathered so that rank 0 reports the whole job."""
    import torch.distributed as dist

    from mgpu_bench import launch as launcher

    launcher.export_env(le)
    if not dist.is_initialized():
        if cfg.device == "cuda":
            import torch

            torch.cuda.set_device(le.local_rank)
            _STORE[:] = [launcher.init_group(le, "nccl", 600.0, torch.device("cuda", le.local_rank))]
        else:
            _STORE[:] = [launcher.init_group(le, "gloo", 600.0)]
    all_gather = launcher.all_gatherer(le.world_size)
    members = None
    try:
        launcher.agree(repr(asdict(cfg)), all_gather)
        device = f"cuda:{le.local_rank}" if cfg.device == "cuda" else "cpu"
        members = all_gather(launcher.Member(le.rank, le.host, le.node_rank, le.local_rank, device))
        mine = worker(asdict(cfg))
        return all_gather(mine)
    except (Exception, KeyboardInterrupt) as exc:
        # a training step's collective failing (DDP's all-reduce, FSDP's gathers) is the group
        # breaking as much as the control messages failing: the roll call names who left
        told = launcher.account(exc, _STORE[0] if _STORE else None, le, members)
        if told is exc:
            raise
        raise told from None


_STORE: list = []  # the launcher's store of this process's job, once its group is formed






def run_model(cfg: ModelConfig, gpu_counts: Sequence[int], data_modes: Sequence[str], peak: Any = None,
              say=None) -> ModelRun:
    """Every GPU count (ascending) with every data mode; a failed configuration (out of memory,
    say) is recorded and the rest still run; Ctrl-C keeps what was measured."""
    run = ModelRun(cfg, sorted(gpu_counts), list(data_modes), None, peak)
    t0 = time.monotonic()
    try:
        for n in run.gpu_counts:
            for mode in run.data_modes:
                if say:
                    say(f"{n} {'GPU(s)' if cfg.device == 'cuda' else 'process(es)'}, {mode} data")
                c = ModelConfig(**{**asdict(cfg), "data": mode})
                ranks = launch(c, n)
                run.gpu_name = run.gpu_name or ranks[0].get("gpu_name")
                run.stats.append(analyse(c, n, ranks, peak.value if peak is not None else None))
    except KeyboardInterrupt as exc:
        run.stopped = "interrupted"
        run.stop_message = f"{interruption(exc)}: the configurations measured so far are kept"
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - a launcher failure (a rank died) ends the run, results kept
        if type(exc).__name__ == "SignalException":  # torch's elastic agent turns Ctrl-C and SIGTERM into it
            run.stopped = "interrupted"
            run.stop_message = f"{interruption(exc)}: the configurations measured so far are kept"
        else:
            run.stopped = "failed"
            text = str(exc).splitlines()[0] if str(exc) else ""
            run.stop_message = (text if isinstance(exc, MgpuError) else f"{type(exc).__name__}: {text}")[:600]
    finally:
        _leave_group(clean=run.stopped is None)
    run.wall_seconds = time.monotonic() - t0
    return run


def _leave_group(clean: bool) -> None:
    """Under a launcher the process group lives for the whole run; it is destroyed before the
    interpreter exits, or gloo's threads outlive it and abort the process. After a clean run the
    ranks first meet, so nobody tears down while a peer still talks to it; a rank that stops
    early (interrupted, failed) must not wait for peers that are blocked in a step it left:
    it goes, and their collectives fail at once."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if clean:
            with contextlib.suppress(Exception):
                dist.barrier()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    _STORE.clear()  # the store's connection too, before the interpreter's teardown


@dataclass(frozen=True)
class ModelPlan:
    """What `mgpu-bench model` runs: the training config, the GPU counts (ascending), the data
    sources, the peak MFU is measured against (None: no MFU) and the CUDA devices chosen
    (() on CPU processes)."""

    config: ModelConfig
    counts: tuple[int, ...]
    modes: tuple[str, ...]
    peak: Any
    gpus: tuple[int, ...]
