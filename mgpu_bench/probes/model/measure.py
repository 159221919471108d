"""`mgpu-bench model`: full training steps of a workload (workloads.resolve: the built-in GPT,
torchvision, transformers, the user's module), timed per phase, on 1..N GPUs.

One process per GPU (gloo processes on CPU, each pinned to its share of the cores when this
command started them: pin_cpu) started through torch's elastic launcher, or joined when an outer
torchrun/srun already started them. Each rank runs `worker()`: warm-up steps, then timed steps
with CUDA events at the phase boundaries (data wait, forward, backward, optimizer; host clocks on
CPU; every event made before the timed steps, the host clock beside each step's first and last
so that how far the GPU ran behind the host is known), read back once at the end so the loop
stays asynchronous. Synthetic batches come from a small pool made before timing (SYNTHETIC_POOL,
cycled): a launch-bound step is never slowed by the tool's own data. Under DDP the gradient
all-reduce runs through torch's default communication hook with marks (gradsync): when each
rank reached it, and how long it ran, per step; then,
for DDP on more than one rank, the same number of steps under `no_sync()` (no gradient
all-reduce) to measure exposed communication, and a few profiled steps for the split of
kernel time between communication and compute. The parent turns the raw seconds into a stable
window, throughput, MFU and a verdict.

FLOPs per step: counted by FlopCounterMode over one forward and backward (workloads.flops), in
the parent on the meta device, or by the ranks on their device where the model does not run on
meta; MFU = achieved FLOP/s per GPU / the dtype's dense peak from the hardware database
(refused for an unknown GPU unless the user gives --peak-tflops).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from mgpu_bench.core.errors import InputError, MgpuError, defer_sigterm, interruption

from .analyse import kernel_split, reconcile
from .config import ModelConfig, ModelPlan
from .figures import PHASES, ModelRun, analyse

__all__ = ["ModelConfig", "ModelPlan", "launch", "run_model", "worker"]


# ------------------------------------------------------------------------------------ worker

# Synthetic batches made before the timed steps and cycled: a few distinct ones, so that no step
# reuses the one before it, at most SYNTHETIC_POOL_BYTES of them (one at least).
SYNTHETIC_POOL = 4
SYNTHETIC_POOL_BYTES = 1 << 30
NOISE_WINDOW = 10  # --noise-scale: steps per window of summed gradient norms (its uncertainty over them)
HOOK_STEPS = 5  # DDP: steps after the timed ones with the all-reduce in its communication hook (its bandwidth)


def _cycle(loader):
    """Batches from `loader` without end: a new epoch when one ends."""
    while True:
        yield from loader


def _nbytes(batch) -> int:
    """Bytes of the tensors in a batch (tensors, tuples, lists, dicts)."""
    if hasattr(batch, "element_size") and hasattr(batch, "numel"):
        return batch.element_size() * batch.numel()
    if isinstance(batch, dict):
        return sum(_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(_nbytes(v) for v in batch)
    return 0


def pin_cpu(local: int, nlocal: int) -> dict:
    """This rank's share of the cores: local rank k of nlocal on the k-th of nlocal equal slices
    of the cores this process may run on (round-robin where ranks outnumber cores), its threads as
    many as its cores (an OMP_NUM_THREADS the user set is kept). Ranks that each spread threads
    over every core fight for them: on a 2-core machine 2 ranks unpinned gave exposed
    communication of 7% to 63% in four identical runs. Returns what was done (for the notes)."""
    import torch

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cores or nlocal < 1:
        return {}
    if nlocal <= len(cores):
        per = len(cores) // nlocal
        mine = cores[local * per:(local + 1) * per]
    else:
        mine = [cores[local % len(cores)]]
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, mine)
    user = os.environ.get("OMP_NUM_THREADS")
    threads = torch.get_num_threads() if user else len(mine)
    torch.set_num_threads(threads)
    return {"cores": mine, "threads": threads, "threads_from": "OMP_NUM_THREADS" if user else "cores"}


DENSE_OPS_KEY = "_dense_ops"  # a rank's counted matmuls and convolutions, handed back (not in the document)


def _count_on_meta(cfg: ModelConfig):
    """(the workload's FlopCount on the meta device, None), or (None, why not in one line) where
    the model does not run on meta; (None, None) for bad input, which the rank says where it
    resolves the workload again."""
    from mgpu_bench import workloads

    try:
        wl = workloads.resolve(cfg.workload_text, seq_len=cfg.seq_len, image_size=cfg.image_size)
        return wl.count_flops(cfg.batch_size, "meta"), None
    except InputError:
        return None, None
    except Exception as exc:  # noqa: BLE001 - an op without a meta kernel: the rank counts on its device
        return None, workloads.last_line(exc)


def worker(cfg_dict: dict, dense_ops: Sequence[dict] | None = None, pin: bool = False,
           count_on: str = "device") -> dict:
    """One rank: returns raw per-step seconds and facts (never raises for an OOM: the error and
    the steps measured so far come back instead). `dense_ops`: the workload's matmuls and
    convolutions as counted on meta (the ceiling replays them on GPUs); None: this rank counts
    the FLOPs first (on GPUs every rank, for its ceiling; on CPU processes rank 0) and returns
    the count: `count_on` "meta" (the command did not count before the ranks started: no memory,
    no step) or "device" (the model does not run on meta: one extra forward and backward).
    `pin`: on CPU processes this command started, pin this rank to its share of the cores."""
    import torch
    import torch.distributed as dist

    from mgpu_bench import workloads

    cfg = ModelConfig(**cfg_dict)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = cfg.device == "cuda"
    pinned = pin_cpu(local, int(os.environ.get("LOCAL_WORLD_SIZE", world))) if pin and not on_gpu else {}
    counting = dense_ops is None and (on_gpu or rank == 0)  # this rank counts the FLOPs
    # The count on meta first, before this rank touches CUDA, in the order the command's own count
    # had before its ranks started. With the count after the model was built on the GPU, the GPT's
    # 1-GPU rows of the smoke run took 4-15 s longer than the run before (one H100, 2026-12-07; rows
    # the change did not touch 0-5 s longer): whether the order was the cause is not measured yet.
    meta_count, meta_failed = _count_on_meta(cfg) if counting and count_on == "meta" else (None, None)
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
    if pinned:
        out["cpu_pin"] = pinned
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device=device).manual_seed(cfg.seed + rank)
    try:
        wl = workloads.resolve(cfg.workload_text, seq_len=cfg.seq_len, image_size=cfg.image_size)
        amp = wl.autocast_dtype(device)
        model = wl.build(device, checkpointing=cfg.checkpointing)
        if counting:
            count = meta_count
            if count is None:  # the model does not run on meta: one counted step here, gradients dropped
                why = "the model does not run on the meta device" + (f" ({meta_failed})" if meta_failed else "")
                count = workloads.count_flops(model, wl.batch(cfg.batch_size, device, gen), wl.loss, cfg.batch_size,
                                              str(device), amp, f"counted on the ranks' device: {why}")
            dense_ops = count.dense_ops
            out["flop_count"] = {**count.to_dict(), "dense_ops": len(count.dense_ops)}
            out[DENSE_OPS_KEY] = list(dense_ops)  # for the next configurations; run_model takes it out
    except (torch.OutOfMemoryError, InputError) as exc:
        oom = isinstance(exc, torch.OutOfMemoryError)
        out["error"] = ("out of memory: " + str(exc).split("\n")[0][:300]) if oom else str(exc)
        out["peak_allocated"] = torch.cuda.max_memory_allocated(device) if oom and on_gpu else None
        return _leave(out, owns_group)
    if world > 1:
        if cfg.parallel == "fsdp":
            if wl.kind != "module":  # a built-in loss never changes the root's outputs in place
                warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
            model = _fsdp(model, wl.blocks(model), on_gpu)
        else:
            # Gradients as views into the buckets (no copy in or out) and 100 MB buckets: on 2x H200
            # (350m, seq 2048) exposed communication 4.2% of the step against 5.0% with DDP's
            # defaults (25 MB, copies); benchmarks/RESULTS.md.
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[local] if on_gpu else None, gradient_as_bucket_view=True, bucket_cap_mb=100)
    sync = None
    if world > 1 and cfg.parallel == "ddp":  # the marks; the communication hook only for the noise scale's norms
        from mgpu_bench.training.gradsync import GradMarks, GradSync

        sync = GradSync(on_gpu, noise=True) if cfg.noise_scale else GradMarks(on_gpu)
        if isinstance(sync, GradSync):
            sync.attach(model)
        elif not sync.attach(model):
            sync = None
    opt = wl.optimizer(model)
    if cfg.compile:
        # After the DDP/FSDP wrapper, as torch's DDP notes advise (DDPOptimizer splits the graph at
        # bucket boundaries so the all-reduce still overlaps); no_sync() and FSDP's gradient-sync switch
        # reach the wrapper through the compiled module's attribute forwarding.
        model = torch.compile(model)
    loader_iter = None
    if cfg.data == "loader":
        total = cfg.batch_size * cfg.grad_accum * (cfg.warmup_steps + 3 * cfg.steps + 16)
        loader_iter = _cycle(wl.loader(cfg.batch_size, num_workers=cfg.num_workers, preprocess_ms=cfg.preprocess_ms,
                                       data_dir=cfg.data_dir, seed=cfg.seed, samples=total, pin_memory=on_gpu))

    pool: list = []
    if loader_iter is None:  # made before any step: the timed steps never wait for the tool's data
        pool.append(wl.batch(cfg.batch_size, device, gen))
        while len(pool) < SYNTHETIC_POOL and (len(pool) + 1) * _nbytes(pool[0]) <= SYNTHETIC_POOL_BYTES:
            pool.append(wl.batch(cfg.batch_size, device, gen))
    turn = itertools.cycle(range(len(pool))) if pool else None

    def next_batch():
        if loader_iter is None:
            return pool[next(turn)]
        return wl.prepare(next(loader_iter), device)

    def between(a, b) -> float:
        return a.elapsed_time(b) / 1e3 if on_gpu else b - a

    live = sys.stderr.isatty()
    said = [0.0]

    def show(label: str, i: int, n: int) -> None:
        """Rank 0's step counter: rewritten in place on a terminal; in a log or pipe a line at
        the end of each pass and at most every 10 s."""
        if not (cfg.progress and rank == 0):
            return
        text = f"model: {world} {'GPU(s)' if on_gpu else 'process(es)'}, {label}: step {i}/{n}"
        if live:
            print(f"\r{text}", end="" if i < n else "\n", flush=True, file=sys.stderr)
        elif i == n or time.monotonic() - said[0] >= 10.0:
            print(text, flush=True, file=sys.stderr)
            said[0] = time.monotonic()

    marks_per_step = 3 + 3 * cfg.grad_accum  # start, data, each micro-batch's three, end
    buckets = [0]  # DDP's gradient buckets per step, as the hook saw them (warm-up: the slots' marks made ahead)

    def clocks(n: int) -> list[list]:
        """The marks of n steps, made before they run: CUDA events on GPUs, host seconds on CPU."""
        if on_gpu:
            return [[torch.cuda.Event(enable_timing=True) for _ in range(marks_per_step)] for _ in range(n)]
        return [[0.0] * marks_per_step for _ in range(n)]

    def run_steps(n: int, sync_grads: bool, label: str) -> list[dict]:
        """n optimizer steps; per step the clocks at: start, data ready, and per micro-batch
        forward start/end and backward end, then the optimizer's end; the host clock beside
        the start and the end; under DDP with sync the step's gradient all-reduce marks."""
        made = clocks(n)
        slots = sync.slots(n, buckets[0]) if sync is not None and sync_grads else None
        perf = time.perf_counter
        if on_gpu:
            def clock(ev):
                ev.record()
                return ev
        else:
            def clock(_):
                return perf()
        marks = []
        for step in range(n):
            ev = made[step]
            m: dict[str, Any] = {"host_start": perf(), "start": clock(ev[0])}
            micro = [next_batch() for _ in range(cfg.grad_accum)]
            m["data"] = clock(ev[1])
            m["micro"] = []
            if slots is not None:
                sync.slot = slots[step]
            for a, batch in enumerate(micro):
                sync_now = sync_grads and a == cfg.grad_accum - 1
                if world > 1 and cfg.parallel == "fsdp":
                    model.set_requires_gradient_sync(sync_now)  # FSDP2: no reduce-scatter of gradients
                skip = world > 1 and cfg.parallel == "ddp" and not sync_now
                with model.no_sync() if skip else contextlib.nullcontext():
                    f0 = clock(ev[2 + 3 * a])
                    with torch.autocast(device_type=device.type, dtype=amp) if amp else contextlib.nullcontext():
                        loss = wl.loss(model, batch) / cfg.grad_accum
                    f1 = clock(ev[3 + 3 * a])
                    loss.backward()
                    m["micro"].append((f0, f1, clock(ev[4 + 3 * a])))
            opt.step()
            opt.zero_grad(set_to_none=True)
            m["end"] = clock(ev[-1])
            m["host_end"] = perf()
            if slots is not None:
                if sync.noise is not None:
                    sync.noise.end_step(cfg.batch_size * cfg.grad_accum)
                    if (step + 1) % NOISE_WINDOW == 0:
                        sync.noise.rotate()
                sync.slot = None
                m["sync"] = slots[step]
                buckets[0] = max(buckets[0], slots[step].k)
            marks.append(m)
            show(label, step + 1, n)
        if on_gpu:
            torch.cuda.synchronize(device)
        return marks

    def phases(marks) -> dict[str, list[float]]:
        """Seconds per step and phase; a step runs from its start to the next step's start, so
        time the device waited between steps counts; compute is the data's readiness to the
        optimizer's end (forward, backward, optimizer)."""
        res: dict[str, list[float]] = {p: [] for p in (*PHASES, "compute", "step")}
        for i, m in enumerate(marks):
            res["data"].append(between(m["start"], m["data"]))
            res["forward"].append(sum(between(f0, f1) for f0, f1, _ in m["micro"]))
            res["backward"].append(sum(between(f1, b1) for _, f1, b1 in m["micro"]))
            res["optimizer"].append(between(m["micro"][-1][2], m["end"]))
            res["compute"].append(between(m["data"], m["end"]))
            nxt = marks[i + 1]["start"] if i + 1 < len(marks) else m["end"]
            res["step"].append(between(m["start"], nxt))
        return res

    def extras(marks, into: dict) -> None:
        """The GPU's lag behind the host at each step's end (stalls.queue_depths) and the gradient
        all-reduce's figures per step (gradsync.read)."""
        from .stalls import queue_depths

        if on_gpu and marks:
            first, h0 = marks[0]["start"], marks[0]["host_start"]
            gpu, host = [], []
            for m in marks:
                gpu += [between(first, m["start"]), between(first, m["end"])]
                host += [m["host_start"] - h0, m["host_end"] - h0]
            into["queue"] = queue_depths(gpu, host)[1::2]
        if marks and "sync" in marks[0]:
            got = [sync.read(m["sync"], m["data"], between) for m in marks]
            if any(got):
                into["sync"] = {k: [g[key] if g else None for g in got]
                                for k, key in (("arrival", "arrival_s"), ("exposed", "exposed_s"), ("busy", "busy_s"),
                                               ("bytes", "bytes"))}

    try:
        if cfg.compile:  # the first step compiles forward and backward: its wall is the compile time
            t0 = time.perf_counter()
            run_steps(1, True, "compiling (torch.compile, not timed)")
            out["compile_s"] = time.perf_counter() - t0
        warm = run_steps(cfg.warmup_steps - (1 if cfg.compile else 0), True, "warm-up (not timed)")
        steps = _keep_to_deadline(cfg, warm, world, out)
        del warm
        t0 = time.perf_counter()
        marks = run_steps(steps, True, "timed steps")
        out["wall_s"] = time.perf_counter() - t0
        out["phases"] = phases(marks)
        extras(marks, out)
        if sync is not None and sync.noise is not None:
            out["noise"] = sync.noise.figures(max((m["sync"].nbytes for m in marks if "sync" in m), default=0), device)
        if on_gpu:
            out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
            out["total_memory"] = torch.cuda.get_device_properties(device).total_memory
        if cfg.exposed_comm and world > 1:
            t0 = time.perf_counter()  # DDP: no_sync(); FSDP: gradient sync off (no reduce-scatter)
            out["no_sync_phases"] = phases(run_steps(steps, False, "the same steps without gradient sync "
                                                           "(for the exposed communication)"))
            out["no_sync_wall_s"] = time.perf_counter() - t0
        if cfg.profile and on_gpu:
            out["profile"] = _profile_split(lambda: run_steps(3, True, "profiled steps"))
        if sync is not None and sync.noise is None:  # the all-reduce's time and bandwidth: a short pass in its hook
            from mgpu_bench.training.gradsync import GradSync

            timed = GradSync(on_gpu)
            timed.attach(model)
            sync, marks_sync = timed, out.get("sync")
            bw: dict = {}
            extras(run_steps(HOOK_STEPS, True, "the all-reduce timed in its communication hook (not in the figures)"), bw)
            if bw.get("sync"):
                out["sync_hooked"] = bw["sync"]
            if marks_sync:
                out["sync"] = marks_sync
        if on_gpu:
            from mgpu_bench.workloads import flops

            out["matmul_ceiling"] = flops.ceiling(dense_ops, device, wl.channels_last(device))
    except torch.OutOfMemoryError as exc:
        out["error"] = "out of memory: " + str(exc).split("\n")[0][:300]
        out["peak_allocated"] = torch.cuda.max_memory_allocated(device) if on_gpu else None
    except InputError as exc:
        out["error"] = str(exc)
    from mgpu_bench.core.launch import keep_result

    keep_result(out)  # kept before the group's teardown: a stop signal during it does not lose the figures
    return _leave(out, owns_group)


def _keep_to_deadline(cfg: ModelConfig, warm: list[dict], world: int, out: dict) -> int:
    """The timed steps to run: cfg.steps, or on CPU processes with a deadline as many as fit
    before it at the slowest rank's warm-up step (the ranks agree: every rank runs as many), at
    least sizing.MIN_TIMED_STEPS; a cut is recorded in out["steps_cut"]."""
    from .sizing import timed_steps

    if cfg.deadline is None or cfg.device == "cuda" or not warm:
        return cfg.steps
    later = warm[1:] or warm  # the first warm-up step builds what the others reuse
    step_s = (later[-1]["end"] - later[0]["start"]) / len(later)
    passes = 2 if world > 1 and cfg.exposed_comm else 1
    n = timed_steps(cfg.steps, passes, step_s, cfg.deadline - time.time() - 1.0)
    if world > 1:
        import torch
        import torch.distributed as dist

        agreed = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # between warm-up and the timed steps: outside any timing
        n = int(agreed.item())
    if n < cfg.steps:
        out["steps_cut"] = {"asked": cfg.steps, "ran": n, "step_s": step_s}
    return n


def _leave(out: dict, owns_group: bool) -> dict:
    import torch.distributed as dist

    if owns_group and dist.is_initialized():
        with contextlib.suppress(Exception):  # teardown of a failed group must not hide the result
            dist.destroy_process_group()
    return out


def _fsdp(model, blocks: list, on_gpu: bool):
    """FSDP2 as torchtitan sets it up: each repeated block (Workload.blocks) its own unit, then
    the root; bf16 parameters with fp32 gradient reduction on GPUs; blocks resharded after forward
    except the last (its backward follows at once); the next block's all-gather issued ahead in
    forward and the previous one's in backward. No blocks: the root alone, one unit."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_gpu else \
        MixedPrecisionPolicy()
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
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            marks = run()
    return {"steps": len(marks), **kernel_split(profiled_kernels(prof))}


def profiled_kernels(prof) -> list[tuple[float, float, str]]:
    """The CUDA kernels of a finished torch.profiler run as (start us, end us, name), read from
    its chrome trace (the kernels' own device intervals)."""
    import json

    from mgpu_bench.core import children

    with children.temp_folder("mgpu-prof-") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents") or []
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0.0), str(e.get("name")))
            for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


# ------------------------------------------------------------------------------------ launching

def launch(cfg: ModelConfig, nprocs: int, dense_ops: Sequence[dict] | None = None, last: bool = False,
           count_on: str = "device") -> list[dict]:
    """Runs worker() on nprocs local processes through torch's elastic launcher (a c10d
    rendezvous on localhost) and returns each rank's result, rank order. Under an outer
    launcher (RANK and WORLD_SIZE set) it runs this process's rank only. dense_ops, count_on: as worker().
    `last`: the run's last configuration (run_elastic's `last`)."""
    from mgpu_bench.core import launch as launcher

    le = launcher.detect()
    if le is not None:
        return _joined(cfg, le, dense_ops, count_on)
    if nprocs == 1:
        return [worker(asdict(cfg), dense_ops, count_on=count_on)]
    from torch.distributed.launcher.api import LaunchConfig

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"mgpu-bench-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launcher.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="forkserver")  # run_elastic: children.rank_start_method
    # the ranks die with this process, and at once on Ctrl-C (the agent stops them with SIGINT)
    results = launcher.run_elastic(lc, worker, asdict(cfg), dense_ops, True, count_on, children="die", last=last)
    return [results[r] for r in sorted(results)]


def _joined(cfg: ModelConfig, le, dense_ops: Sequence[dict] | None = None, count_on: str = "device") -> list[dict]:
    """This process as one rank of a launcher's job: one process group for every configuration
    (formed once, through the store that names a rank that never arrives), the ranks' arguments
    checked to agree, and every rank's result gathered so that rank 0 reports the whole job."""
    import torch.distributed as dist

    from mgpu_bench.core import launch as launcher
    from mgpu_bench.core import ranks

    launcher.export_env(le)
    if not dist.is_initialized():
        if cfg.device == "cuda":
            import torch

            torch.cuda.set_device(le.local_rank)
            _STORE[:] = [ranks.init_group(le, "nccl", 600.0, torch.device("cuda", le.local_rank))]
        else:
            _STORE[:] = [ranks.init_group(le, "gloo", 600.0)]
    all_gather = ranks.all_gatherer(le.world_size)
    members = None
    try:
        ranks.agree(repr({**asdict(cfg), "deadline": None}), all_gather)  # each rank's own clock sets its deadline
        device = f"cuda:{le.local_rank}" if cfg.device == "cuda" else "cpu"
        members = all_gather(ranks.Member(le.rank, le.host, le.node_rank, le.local_rank, device))
        mine = worker(asdict(cfg), dense_ops, count_on=count_on)
        return all_gather(mine)
    except (Exception, KeyboardInterrupt) as exc:
        # a training step's collective failing (DDP's all-reduce, FSDP's gathers) is the group
        # breaking as much as the control messages failing: the roll call names who left
        told = ranks.account(exc, _STORE[0] if _STORE else None, le, members)
        if told is exc:
            raise
        raise told from None


_STORE: list = []  # the launcher's store of this process's job, once its group is formed


def run_model(cfg: ModelConfig, gpu_counts: Sequence[int], data_modes: Sequence[str], peak: Any = None,
              say=None, workload: dict | None = None, count: Any = None, budgets: Sequence[float] = (),
              count_on: str = "device") -> ModelRun:
    """Every GPU count (ascending) with every data mode; a failed configuration (out of memory,
    say) is recorded and the rest still run; Ctrl-C keeps what was measured. `workload`: the
    workload's facts (Workload.facts()) and `count` its FlopCount on meta; both None: resolved and
    counted here; count None with facts given: the ranks count, on `count_on` (worker()). `budgets`: each
    configuration's guessed seconds (sizing.seconds), kept to from its start (CPU processes)."""
    if workload is None:
        from mgpu_bench import workloads

        wl = workloads.resolve(cfg.workload_text, seq_len=cfg.seq_len, image_size=cfg.image_size)
        workload, count = wl.facts(), wl.count_flops(cfg.batch_size)
    run = ModelRun(cfg, sorted(gpu_counts), list(data_modes), None, peak, workload=dict(workload))
    if count is not None:
        run.workload["flops"] = flop_facts(count)
    t0 = time.monotonic()
    budget = iter(budgets)
    left = len(run.gpu_counts) * len(run.data_modes)  # configurations still to measure
    try:
        for n in run.gpu_counts:
            for mode in run.data_modes:
                if say:
                    say(f"{n} {'GPU(s)' if cfg.device == 'cuda' else 'process(es)'}, {mode} data")
                # this process's own start-up (the launcher, a rank run here): said first, kept out of the deadline
                import torch  # noqa: F401

                share = next(budget, None)
                c = ModelConfig(**{**asdict(cfg), "data": mode,
                                   "deadline": time.time() + share if share is not None else None})
                left -= 1
                ranks = launch(c, n, count.dense_ops if count is not None else None, last=left == 0,
                               count_on=count_on)
                if left == 0:  # measured: a stop signal now waits while the ranks' group goes and the run is written
                    defer_sigterm()
                run.gpu_name = run.gpu_name or ranks[0].get("gpu_name")
                ops = [r.pop(DENSE_OPS_KEY, None) for r in ranks]
                counter = next((i for i, r in enumerate(ranks) if r.get("flop_count")), None)
                if "per_sample" not in (run.workload.get("flops") or {}) and counter is not None:
                    from mgpu_bench.workloads import FlopCount

                    made = FlopCount.from_dict({**ranks[counter]["flop_count"], "dense_ops": ops[counter]})
                    run.workload["flops"] = flop_facts(made)
                    if made.device == "meta":  # the same count serves the configurations that follow
                        count = made
                per_sample = (run.workload.get("flops") or {}).get("per_sample")
                run.stats.append(analyse(c, n, ranks, peak.value if peak is not None else None, per_sample,
                                         run.workload.get("tokens_per_sample")))
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
    reconcile(run)
    _pin_note(run)
    cut = [(s.world, s.data, r["steps_cut"]) for s in run.stats for r in s.ranks[:1] if r.get("steps_cut")]
    for world, data, c in cut:
        run.notes.append(f"{world} {'GPU(s)' if cfg.device == 'cuda' else 'process(es)'}, {data} data: {c['ran']} of "
                         f"the {c['asked']} timed steps, to keep to the estimate (warm-up steps took "
                         f"{c['step_s']:.2f} s each, slower than guessed; give --steps to choose)")
    return run


def _pin_note(run: ModelRun) -> None:
    """Say how CPU ranks were pinned (pin_cpu), once per run."""
    pins = {(s.world, r.get("rank")): r["cpu_pin"] for s in run.stats for r in s.ranks if r.get("cpu_pin")}
    if not pins:
        return
    by_world: dict[int, list[str]] = {}
    for (world, rank), pin in sorted(pins.items()):
        by_world.setdefault(world, []).append(f"rank {rank} cores {','.join(map(str, pin['cores']))}")
    threads = {p["threads"] for p in pins.values()}
    source = {p["threads_from"] for p in pins.values()}
    run.notes.append("CPU ranks pinned to their share of the cores, " + "; ".join(
        f"{w} processes: {', '.join(v)}" for w, v in by_world.items())
        + f"; {'/'.join(map(str, sorted(threads)))} thread(s) each"
        + (" (OMP_NUM_THREADS)" if "OMP_NUM_THREADS" in source else ""))


def flop_facts(count) -> dict:
    """A FlopCount as the document records it: FLOPs per sample, the batch and the device it was
    counted at, why not on meta, how many distinct matmuls and convolutions it saw."""
    return {"per_sample": count.per_sample, "batch_size": count.batch_size, "device": count.device,
            "note": count.note, "dense_ops": len(count.dense_ops)}


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
