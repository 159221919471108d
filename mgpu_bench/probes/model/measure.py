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
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mgpu_bench.errors import InputError, MgpuError, interruption

PHASES = ("data", "forward", "backward", "optimizer")
EXPOSED_COMM_LIMIT = 0.10  # healthy is under 10% of the step
INPUT_LIMIT = 0.10
STABLE_TOLERANCE = 0.05
STABLE_K = 5


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
    exposed_comm: bool = True
    profile: bool = True
    device: str = "cuda"  # cuda | cpu
    seed: int = 1234
    progress: bool = False


# ------------------------------------------------------------------------------------ analysis

def stable_window(times: Sequence[float], warmup: int, tol: float = STABLE_TOLERANCE,
                  k: int = STABLE_K) -> tuple[int, int, bool]:
    """(start, end, stable) of the window the figures are taken over: after `warmup`, from the
    first step after which every rolling median of k steps stays within `tol` of the median of
    the last half. stable is False when fewer than k steps qualify (the figures then use every
    step after warm-up, and say so)."""
    n = len(times)
    xs = list(times[warmup:])
    if len(xs) < k:
        return warmup, n, False
    ref = statistics.median(xs[len(xs) // 2:])
    start = 0
    for i in range(len(xs) - k + 1):
        if abs(statistics.median(xs[i:i + k]) / ref - 1.0) > tol:
            start = i + 1
    if len(xs) - start < k:
        return warmup, n, False
    return warmup + start, n, True


def scaling_efficiency(tokens_per_s: dict[int, float]) -> dict[int, float]:
    """T_N / (N * T_1) for each GPU count N (T = total tokens/s); needs the 1-GPU figure."""
    base = tokens_per_s.get(1)
    if not base:
        return {}
    return {n: t / (n * base) for n, t in sorted(tokens_per_s.items())}


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
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        else:
            # Gradients as views into the buckets (no copy in or out) and 100 MB buckets: on 2x H200
            # (350m, seq 2048) exposed communication 4.2% of the step against 5.0% with DDP's
            # defaults (25 MB, copies); benchmarks/RESULTS.md.
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[local] if on_gpu else None, gradient_as_bucket_view=True, bucket_cap_mb=100)
    opt = models.make_optimizer(model)
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

    def run_steps(n: int, sync_grads: bool) -> list[dict]:
        """n optimizer steps; per step the clocks at: start, data ready, and per micro-batch
        forward start/end and backward end, then the optimizer's end."""
        marks = []
        for step in range(n):
            m: dict[str, Any] = {"start": clock()}
            micro = [next_batch() for _ in range(cfg.grad_accum)]
            m["data"] = clock()
            m["micro"] = []
            for a, (x, y) in enumerate(micro):
                skip = world > 1 and cfg.parallel == "ddp" and (not sync_grads or a < cfg.grad_accum - 1)
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
            if cfg.progress and rank == 0:
                print(f"\rmgpu-bench model: step {step + 1}/{n}", end="", flush=True, file=sys.stderr)
        if on_gpu:
            torch.cuda.synchronize(device)
        if cfg.progress and rank == 0:
            print(file=sys.stderr)
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
        warm = run_steps(cfg.warmup_steps, True)
        del warm
        t0 = time.perf_counter()
        marks = run_steps(cfg.steps, True)
        out["wall_s"] = time.perf_counter() - t0
        out["phases"] = phases(marks)
        if on_gpu:
            out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
            out["total_memory"] = torch.cuda.get_device_properties(device).total_memory
        if cfg.exposed_comm and world > 1 and cfg.parallel == "ddp":
            t0 = time.perf_counter()
            out["no_sync_phases"] = phases(run_steps(cfg.steps, False))
            out["no_sync_wall_s"] = time.perf_counter() - t0
        if cfg.profile and on_gpu and world > 1:
            out["profile"] = _profile_split(lambda: run_steps(3, True))
    except torch.OutOfMemoryError as exc:
        out["error"] = "out of memory: " + str(exc).split("\n")[0][:300]
        out["peak_allocated"] = torch.cuda.max_memory_allocated(device) if on_gpu else None
    except InputError as exc:
        out["error"] = str(exc)
    if owns_group and dist.is_initialized():
        with contextlib.suppress(Exception):  # teardown of a failed group must not hide the result
            dist.destroy_process_group()
    return out


def _profile_split(run) -> dict:
    """Kernel time in NCCL kernels against all other kernels over a few steps (torch.profiler)."""
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            marks = run()
    comm = compute = 0.0
    for evt in prof.events():
        if evt.device_type.name != "CUDA":
            continue
        t = evt.device_time_total / 1e6 if hasattr(evt, "device_time_total") else evt.cuda_time_total / 1e6
        if "nccl" in evt.name.lower():
            comm += t
        else:
            compute += t
    del torch
    steps = len(marks)
    return {"steps": steps, "comm_kernel_s": comm, "compute_kernel_s": compute}


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
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"mgpu-bench-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launcher.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn")
    from mgpu_bench.errors import restore_sigterm

    try:
        results = elastic_launch(lc, worker)(asdict(cfg))
    finally:
        restore_sigterm()  # the agent replaced the SIGTERM handler and leaves its own behind
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


# ------------------------------------------------------------------------------------ results

@dataclass
class StepStats:
    """One configuration (GPU count, data source) as measured."""

    world: int
    data: str
    ranks: list[dict]
    window: tuple[int, int, bool] = (0, 0, False)
    samples_per_step: int = 0
    tokens_per_step: int = 0
    flops_per_token: float = 0.0
    error: str | None = None
    derived: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"world": self.world, "data": self.data, "window": list(self.window),
                "samples_per_step": self.samples_per_step, "tokens_per_step": self.tokens_per_step,
                "flops_per_token": self.flops_per_token, "error": self.error, "derived": self.derived,
                "ranks": self.ranks}


def analyse(cfg: ModelConfig, world: int, ranks: list[dict], peak_flops: float | None) -> StepStats:
    """Per-step seconds (slowest rank per step) -> window, throughput, MFU, shares."""
    from mgpu_bench import models

    spec = models.get_model_spec(cfg.model)
    st = StepStats(world=world, data=cfg.data, ranks=ranks)
    st.samples_per_step = cfg.batch_size * cfg.grad_accum * world
    st.tokens_per_step = st.samples_per_step * cfg.seq_len
    st.flops_per_token = models.flops_per_token(spec, cfg.seq_len)
    errors = [r["error"] for r in ranks if r.get("error")]
    if errors:
        st.error = errors[0]
    good = [r for r in ranks if r.get("phases")]
    if not good:
        return st
    steps = [max(r["phases"]["step"][i] for r in good) for i in range(len(good[0]["phases"]["step"]))]
    start, end, stable = stable_window(steps, 0)
    st.window = (start, end, stable)
    win = steps[start:end]
    step_s = statistics.median(win)
    d: dict[str, Any] = {"step_s": step_s, "step_mean_s": statistics.fmean(win), "window_steps": len(win)}
    d["samples_per_s"] = st.samples_per_step / step_s
    d["tokens_per_s"] = st.tokens_per_step / step_s
    d["tokens_per_s_per_gpu"] = d["tokens_per_s"] / world
    d["flops_per_s_per_gpu"] = d["tokens_per_s_per_gpu"] * st.flops_per_token
    d["mfu"] = d["flops_per_s_per_gpu"] / peak_flops if peak_flops else None
    r0 = good[0]["phases"]
    for p in PHASES:
        d[f"{p}_s"] = statistics.median(r0[p][start:end])
    d["data_share"] = d["data_s"] / step_s
    nosync = [r.get("no_sync_phases") for r in good if r.get("no_sync_phases")]
    if nosync:
        ns = [max(x["step"][i] for x in nosync) for i in range(len(nosync[0]["step"]))]
        s2, e2, _ = stable_window(ns, 0)
        d["no_sync_step_s"] = statistics.median(ns[s2:e2])
        d["exposed_comm_share"] = max(0.0, (step_s - d["no_sync_step_s"]) / step_s)
    prof = good[0].get("profile")
    if prof and prof["steps"]:
        d["comm_kernel_share"] = prof["comm_kernel_s"] / prof["steps"] / step_s
    mems = [r.get("peak_allocated") for r in good if r.get("peak_allocated") is not None]
    if mems:
        d["peak_allocated"] = max(mems)
        d["peak_reserved"] = max(r.get("peak_reserved") or 0 for r in good)
        d["total_memory"] = good[0].get("total_memory")
    st.derived = d
    return st


def verdict(stats: StepStats, gross: StepStats | None = None) -> str:
    """compute-bound / communication-bound / input-bound / memory-bound, with the figure."""
    d = stats.derived
    if stats.error and "out of memory" in stats.error:
        return "memory-bound: the batch does not fit (out of memory); lower --batch-size or use checkpointing"
    if not d:
        return f"no verdict: {stats.error or 'no steps measured'}"
    exposed = d.get("exposed_comm_share")
    if exposed is not None and exposed > EXPOSED_COMM_LIMIT:
        return (f"communication-bound: exposed communication is {100 * exposed:.1f}% of the step "
                f"(healthy is under {100 * EXPOSED_COMM_LIMIT:.0f}%)")
    loss = input_loss(stats, gross)
    if loss is not None and loss > INPUT_LIMIT:
        return (f"input-bound: the input pipeline costs {100 * loss:.1f}% of the step "
                "(raise --num-workers, or make per-sample preprocessing cheaper)")
    if d.get("data_share", 0) > INPUT_LIMIT:
        return f"input-bound: waiting for data is {100 * d['data_share']:.1f}% of the step (raise --num-workers)"
    mem = d.get("peak_reserved")
    if mem and d.get("total_memory") and mem > 0.95 * d["total_memory"]:
        return f"memory-bound: {100 * mem / d['total_memory']:.0f}% of device memory reserved at peak"
    mfu = d.get("mfu")
    return ("compute-bound" + (f": MFU {100 * mfu:.1f}%" if mfu is not None else "")
            + (f", exposed communication {100 * exposed:.1f}%" if exposed is not None else ""))


def input_loss(effective: StepStats, gross: StepStats | None) -> float | None:
    """1 - gross tokens/s (real DataLoader) / effective tokens/s (synthetic data on the device)."""
    if gross is None or not gross.derived or not effective.derived:
        return None
    return max(0.0, 1.0 - gross.derived["tokens_per_s"] / effective.derived["tokens_per_s"])



# ------------------------------------------------------------------------------------ a whole run

@dataclass
class ModelRun:
    config: ModelConfig
    gpu_counts: list[int]
    data_modes: list[str]
    gpu_name: str | None
    peak: Any  # hardware.Figure or None
    stats: list[StepStats] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None
    stop_message: str | None = None
    wall_seconds: float = 0.0

    def get(self, world: int, data: str) -> StepStats | None:
        return next((s for s in self.stats if s.world == world and s.data == data), None)

    def effective(self, world: int) -> StepStats | None:
        """Synthetic data (compute only) where it ran, else the loader's."""
        for mode in ("synthetic", "loader"):
            s = self.get(world, mode)
            if s is not None and s.derived:
                return s
        return self.get(world, "synthetic") or self.get(world, "loader")

    def scaling(self) -> dict[int, float]:
        tps = {n: s.derived["tokens_per_s"] for n in self.gpu_counts
               if (s := self.effective(n)) is not None and s.derived}
        return scaling_efficiency(tps)


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
                    say(f"{n} {'GPU' if cfg.device == 'cuda' else 'process'}(es), {mode} data")
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


def findings(run: ModelRun) -> list[str]:
    lines = []
    for n in run.gpu_counts:
        eff, gross = run.get(n, "synthetic"), run.get(n, "loader")
        main = eff or gross
        if main is None:
            continue
        where = f"{n} GPU(s)" if run.config.device == "cuda" else f"{n} process(es)"
        for st in (eff, gross):
            if st is not None and st.error:
                lines.append(f"{where}, {st.data} data: {st.error}")
        lines.append(f"{where}: {verdict(main, gross if eff is not None else None)}")
        loss = input_loss(eff, gross) if eff is not None else None
        if loss is not None:
            lines.append(f"{where}: input-pipeline loss {100 * loss:.1f}% (loader {gross.derived['tokens_per_s']:.0f} "
                         f"against synthetic {eff.derived['tokens_per_s']:.0f} tokens/s)")
        if main.derived and not main.window[2]:
            lines.append(f"{where}: no stable window (step times kept moving by more than "
                         f"{100 * STABLE_TOLERANCE:.0f}%): figures over every step after warm-up; add --steps")
    for n, e in run.scaling().items():
        if n > 1:
            s = run.effective(n)
            exposed = s.derived.get("exposed_comm_share") if s else None
            why = f"; exposed communication {100 * exposed:.1f}% of the step" if exposed is not None else ""
            lines.append(f"scaling 1 -> {n}: efficiency {100 * e:.1f}% (T_{n} / ({n} x T_1)){why}")
    return lines


def document(run: ModelRun, environment: dict, command: list[str] | None = None) -> dict:
    import datetime as _dt

    from mgpu_bench import __version__
    from mgpu_bench.probes.comm.render import RESULT_SCHEMA, RESULT_SCHEMA_VERSION

    peak = run.peak
    return {
        "schema": RESULT_SCHEMA, "schema_version": RESULT_SCHEMA_VERSION, "kind": "model",
        "tool_version": __version__, "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command, "environment": environment, "config": asdict(run.config),
        "gpu_counts": run.gpu_counts, "data_modes": run.data_modes, "gpu_name": run.gpu_name,
        "peak": None if peak is None else {"value": peak.value, "unit": peak.unit, "source": peak.source},
        "status": {"completed": run.stopped is None, "stopped": run.stopped, "message": run.stop_message},
        "notes": run.notes, "wall_seconds": run.wall_seconds, "findings": findings(run),
        "scaling": {str(n): e for n, e in run.scaling().items()},
        "runs": [s.to_dict() for s in run.stats],
    }


def render_terminal(run: ModelRun, console) -> None:
    from rich.table import Table

    unit = "GPU" if run.config.device == "cuda" else "proc"
    t = Table(title=f"{run.config.model} training steps ({run.config.parallel}, seq {run.config.seq_len}, batch "
                    f"{run.config.batch_size} x {run.config.grad_accum} per {unit}); median over the stable window",
              title_justify="left", pad_edge=False, box=None, header_style="bold")
    for name in (f"{unit}s", "data", "step\nms", "tok/s\ntotal", f"tok/s\nper {unit}", "TFLOP/s\nper GPU",
                 "MFU\n%", "data\n%", "fwd\nms", "bwd\nms", "opt\nms", "exposed\ncomm %", "peak mem\nGiB"):
        t.add_column(name, justify="left" if name == "data" else "right")
    for s in run.stats:
        d = s.derived
        if not d:
            t.add_row(str(s.world), s.data, f"failed: {s.error}", *[""] * 10)
            continue

        def f(key, scale=1.0, fmt=".1f", d=d):
            v = d.get(key)
            return "-" if v is None else format(v * scale, fmt)

        t.add_row(str(s.world), "synth" if s.data == "synthetic" else s.data, f("step_s", 1e3), f("tokens_per_s", 1, ".0f"),
                  f("tokens_per_s_per_gpu", 1, ".0f"), f("flops_per_s_per_gpu", 1e-12), f("mfu", 100),
                  f("data_share", 100), f("forward_s", 1e3), f("backward_s", 1e3), f("optimizer_s", 1e3),
                  f("exposed_comm_share", 100), f("peak_reserved", 2**-30, ".2f"))
    console.print(t)
    for s in run.stats:
        if s.derived:
            console.print(f"  {s.world} {unit}(s), {s.data}: window steps {s.window[0]}-{s.window[1] - 1} of "
                          f"{len(s.ranks[0].get('phases', {}).get('step', []))} after {run.config.warmup_steps} warm-up"
                          f"{'' if s.window[2] else ' (not stable)'}; {s.tokens_per_step} tokens per step; "
                          f"{s.flops_per_token / 1e9:.3f} GFLOP per token (6N + 12 L d T)"
                          + (f"; profiler: NCCL kernels {100 * s.derived['comm_kernel_share']:.1f}% of the step"
                             if s.derived.get("comm_kernel_share") is not None else ""),
                          highlight=False, soft_wrap=True)
