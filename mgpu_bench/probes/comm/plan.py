"""The comm sweep before it runs: its config, the run it fills, the backend and ranks, and every
check a user's input must pass before any GPU work (InputError: exit code 2).

The flow: resolve the backend and ranks, expand the sweep into requests (ops x sizes x
placements), validate everything a user can get wrong (dtype support, memory), then measure.py
runs the requests in order and keeps every finished measurement whatever stops the sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mgpu_bench import _native
from mgpu_bench.core.errors import CommTimeoutError, InputError, MgpuError, NcclError, OutOfMemoryError, interruption
from mgpu_bench.machine import selection
from mgpu_bench.results.measurement import CommMeasurement, CommRequest, CommSpec, TimingOptions
from mgpu_bench.results.ops import OPS, buffer_bytes, op_counts
from mgpu_bench.results.sizes import format_bytes, format_gib

BACKENDS = ("auto", "native", "torch")
# Ops x dtypes the NCCL in use must support; fp8 needs NCCL >= 2.24, and its reductions sm_90+.
FP8 = ("fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class CommConfig:
    ops: tuple[str, ...]
    dtype: str
    redop: str
    sizes: tuple[int, ...]
    inplace: tuple[bool, ...] = (False, True)  # placements, in run order
    backend: str = "auto"
    gpus: str | None = None  # None: all visible; "N": the first N; "a,b,...": those indices
    nproc: int = 2  # ranks for torch on CPU
    timing: TimingOptions = TimingOptions()  # noqa: RUF009 - frozen, so one shared default is safe
    timeout_s: float = 120.0
    launch: str = "single"  # "processes": one process per GPU through torch's elastic launcher


@dataclass
class CommRun:
    """A sweep's outcome: what ran, what was measured, and why it stopped early if it did."""

    backend: str  # native, torch-nccl or torch-gloo
    devices: list[str]
    requests: list[CommRequest]
    measurements: list[CommMeasurement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    theory: object | None = None  # theory.RingTheory for the ranks, when the topology is known
    topology: dict | None = None  # the topo snapshot behind the theory
    transports: dict | None = None  # "src->dst" ranks -> {transport: channels}, from NCCL's log
    # "op@bytes" -> "Algorithm/Protocol" NCCL's tuning model rates fastest (a model, not a trace)
    algorithms: dict[str, str] | None = None
    findings: list[str] = field(default_factory=list)  # printed at the top
    # Under a launcher on more than one node: "world" / "intra-node" / "inter-node" -> the
    # theory (theory.RingTheory at run time, its dict once loaded); None otherwise.
    scope_theory: dict | None = None
    nnodes: int | None = None  # under a launcher: the nodes the ranks ran on
    stopped: str | None = None  # None, "out_of_memory", "nccl_error", "timeout", "interrupted"
    stop_message: str | None = None
    wall_seconds: float = 0.0
    process_seconds: float | None = None  # the whole process when the run ended: start-up (Python, torch, CUDA) included

    @property
    def nranks(self) -> int:
        return len(self.devices)

    @property
    def total_wrong(self) -> int:
        return sum(m.total_wrong for m in self.measurements)


def resolve_backend(cfg: CommConfig) -> tuple[str, list[str], list[int]]:
    """-> (backend name, one device label per rank, CUDA indices for native/torch-nccl)."""
    if cfg.backend not in BACKENDS:
        raise InputError(f"unknown backend '{cfg.backend}': choose from {', '.join(BACKENDS)}")
    ngpu = selection.visible_gpu_count()
    le = launcher()
    if le is not None:  # one rank of a job torchrun / srun / mpirun started: one GPU per process
        if le.world_size < 2:
            raise InputError(f"{le.launcher} started {le.world_size} process: collectives need at least 2 ranks")
        if cfg.backend == "native" and ngpu == 0:
            native_error_as_input()
        labels = [f"rank {r}" for r in range(le.world_size)]
        if not ngpu:
            return "torch-gloo", labels, []
        if le.local_rank < ngpu:
            gpu = le.local_rank  # every GPU of the node visible: the local rank's
        elif ngpu == 1:
            gpu = 0  # one GPU per task (srun --gpus-per-task=1, a per-rank CUDA_VISIBLE_DEVICES)
        else:
            raise InputError(f"local rank {le.local_rank} has no GPU: {ngpu} visible on {le.host} (give each "
                             "process all of the node's GPUs, or exactly one)")
        return ("native" if cfg.backend in ("auto", "native") else "torch-nccl"), labels, [gpu]
    if cfg.backend == "native" and ngpu == 0:
        native_error_as_input()
    if ngpu == 0:
        if cfg.gpus is not None:
            raise selection.gpus_without_gpus()
        if cfg.nproc < 2:
            raise InputError(f"--nproc {cfg.nproc}: collectives need at least 2 ranks")
        from mgpu_bench.results.probe import within

        within("--nproc", cfg.nproc, 2, 256, "gloo processes on this machine's CPUs")
        return "torch-gloo", ["cpu"] * cfg.nproc, []
    gpus = selection.parse_gpus(cfg.gpus, ngpu)
    if len(gpus) < 2 and ngpu < 2:
        raise InputError(
            "1 GPU visible: collectives need at least 2 ranks (on one GPU per node, run comm across nodes "
            "under torchrun or srun, one process per GPU; or on CPU processes with CUDA_VISIBLE_DEVICES='')"
        )
    if len(gpus) < 2:
        raise InputError(
            f"{len(gpus)} GPU selected: collectives need at least 2 ranks (use --gpus 2 or more; "
            f"{ngpu} visible)"
        )
    backend = "native" if cfg.backend in ("auto", "native") else "torch-nccl"
    return backend, [f"cuda:{i}" for i in gpus], gpus


def launcher():
    """The launcher this process runs under (launch.LaunchEnv), or None."""
    from mgpu_bench.core import launch

    return launch.detect()


def native_error_as_input() -> None:
    try:
        _native.device_count()
    except MgpuError as exc:
        reason = str(exc).split(" [", 1)[0]
        raise InputError(f"--backend native needs NVIDIA GPUs: {reason}; use --backend torch for CPU ranks") from None
    raise InputError("--backend native needs NVIDIA GPUs: none visible; use --backend torch for CPU ranks")


def check_dtype_support(cfg: CommConfig, backend: str, gpus: list[int]) -> None:
    if cfg.dtype in FP8 and backend in ("native", "torch-nccl"):
        reducing = [op for op in cfg.ops if OPS[op].reduces]
        for g in gpus if reducing else []:
            cc = tuple(_native.device_info(g)["compute_capability"])
            if cc < (9, 0):
                raise InputError(
                    f"{cfg.dtype} reductions ({reducing[0]}) need compute capability 9.0+; "
                    f"GPU {g} is {cc[0]}.{cc[1]}: use bf16, or ops that do not reduce"
                )
    if backend == "native":
        if cfg.dtype in FP8 and (not _native.HAVE_NCCL_FP8 or _native.nccl_version() < 22400):
            raise InputError(f"{cfg.dtype} needs NCCL >= 2.24 (this build/run uses an older NCCL); use fp16 or bf16")
        return
    from .torch_backend import unsupported_reason

    device = "cuda" if backend == "torch-nccl" else "cpu"
    for op in cfg.ops:
        reason = unsupported_reason(op, cfg.dtype, cfg.redop if OPS[op].reduces else None, device)
        if reason:
            raise InputError(reason)


# What an estimate on GPUs assumes: per size a fixed cost (buffers, warm-up, the check) and the
# timed iterations at a typical bus bandwidth. A guess to say how long to wait, never a figure.
# On CPU processes the sweep is sized to its estimate (cpu_sizing.py).
_GUESS_RATE = 100e9  # B/s: GPUs over NVLink or PCIe
_GUESS_FIXED_S = 0.05


def estimate_seconds(cfg: CommConfig, on_gpu: bool) -> str | None:
    """"about N s/min: ..." for the sweep's sizes, ops and placements (see _GUESS_RATE and, on CPU
    processes, cpu_sizing)."""
    shape = f"{len(cfg.ops)} op(s) x {len(cfg.sizes)} size(s) x {len(cfg.inplace)} placement(s)"
    if not on_gpu:
        return _cpu_estimate(cfg, shape)
    t = cfg.timing
    calls = max(2, t.warmup_iters) + 2 * (t.iters if t.iters > 0 else max(t.min_iters, 1)) + 1
    per_size = [_GUESS_FIXED_S + calls * max(size / _GUESS_RATE, t.min_time_s / calls if t.iters <= 0 else 0.0)
                for size in cfg.sizes]
    total = sum(per_size) * len(cfg.ops) * len(cfg.inplace) + 3.0
    when = f"about {total:.0f} s" if total < 120 else f"about {total / 60:.0f} min"
    return f"{when} for {shape} (a guess from the sizes at {_GUESS_RATE / 1e9:g} GB/s)"


def _cpu_estimate(cfg: CommConfig, shape: str) -> str | None:
    """The first estimate on CPU processes: the sum of the requests' allotments (cpu_sizing), which
    the sweep keeps within by leaving out sizes that the measured rate says cannot fit."""
    from . import cpu_sizing

    nranks = launcher().world_size if launcher() is not None else cfg.nproc
    try:
        requests, _notes = plan(cfg, nranks)
    except InputError:
        return None  # the run says what is wrong
    nbytes = [op_counts(r.op, r.size, r.dtype, nranks)["bytes"] for r in requests]
    allot = cpu_sizing.allotments(nbytes, cfg.timing, cfg.timeout_s, cpu_sizing.host_slowdown(nranks)[0])
    total = cpu_sizing.startup_seconds(nranks) + sum(allot)
    out = sorted({r.size for r, a in zip(requests, allot, strict=True) if a == 0})
    left = (f"; at that rate {', '.join(format_bytes(s) for s in out)} would pass half of --timeout and "
            "run only if the sizes before leave room" if out else "")
    return (f"{cpu_sizing.format_seconds(total)} for {shape} (a guess at {cpu_sizing.GUESS_RATE / 1e9:g} GB/s on CPU "
            f"processes{cpu_sizing.slowdown_text(nranks)}; the sweep keeps within it, leaving out sizes the measured rate cannot fit{left})")


def plan(cfg: CommConfig, nranks: int) -> tuple[list[CommRequest], list[str]]:
    """Expand ops x sizes x placements; returns (requests, notes on rounding and skips).
    Sizes that round to the same bytes for an op are measured once."""
    requests: list[CommRequest] = []
    notes: list[str] = []
    for op in cfg.ops:
        info = OPS[op]
        placements = [p for p in cfg.inplace if info.inplace or not p]
        if len(placements) < len(cfg.inplace) or not placements:
            notes.append(f"{op}: no in-place form (received data would overwrite data not yet sent); "
                         f"{'out-of-place only' if placements else 'skipped: add --outofplace'}")
        seen: set[int] = set()
        for size in cfg.sizes:
            c = op_counts(op, size, cfg.dtype, nranks)
            if c["count"] == 0:
                notes.append(f"{op}: {format_bytes(size)} is below one {cfg.dtype} element per rank over {nranks} ranks; skipped")
                continue
            if c["bytes"] in seen:
                notes.append(f"{op}: {size} B rounds to {c['bytes']} B, already measured; skipped")
                continue
            seen.add(c["bytes"])
            if c["bytes"] != size:
                rule = "whole elements" if c["count"] == c["send_count"] == c["recv_count"] else \
                    f"whole elements, a multiple of {nranks} ranks"
                notes.append(f"{op}: {size} B rounded down to {c['bytes']} B ({rule} of {cfg.dtype})")
            for inplace in placements:
                requests.append(CommRequest(op, cfg.dtype, cfg.redop if info.reduces else None, size, inplace))
    if not requests:
        raise InputError("nothing to measure: " + "; ".join(notes) if notes else "nothing to measure")
    return requests, notes


def check_memory(requests: list[CommRequest], nranks: int, gpus: list[int]) -> None:
    """Refuses a sweep whose largest measurement cannot fit (bad input, exit code 2): in the
    free memory of every GPU (native), or in the host's available memory (CPU ranks, all on
    this host)."""
    def need(r: CommRequest) -> int:
        return buffer_bytes(r.op, r.size, r.dtype, nranks, r.inplace)

    worst = max(requests, key=need)
    if gpus:
        for g in gpus:
            free, _total = _native.mem_get_info(g)
            if need(worst) > free:
                raise InputError(
                    f"{worst.op} at {format_bytes(worst.size)} needs {format_gib(need(worst))} of buffers per GPU; "
                    f"GPU {g} has {format_gib(free)} free: lower the largest --sizes"
                )
        return
    avail = selection.host_available_memory()
    total = need(worst) * nranks
    if avail is not None and total > avail:
        raise InputError(
            f"{worst.op} at {format_bytes(worst.size)} needs {format_gib(total)} over {nranks} CPU ranks; "
            f"this host has {format_gib(avail)} available: lower the largest --sizes"
        )


def ring_theory_for(gpus: list[int]):
    """(theory.RingTheory for these CUDA devices, the topo snapshot behind it)."""
    from mgpu_bench.machine import theory, topo

    snapshot = topo.collect()
    return theory.ring_theory(snapshot, theory.cuda_devices(gpus)), snapshot


def nvlink_rank_pairs(snapshot: dict | None, gpus: list[int]) -> set[tuple[int, int]]:
    """Ordered rank pairs (rank = position in `gpus`) that NVLink joins, per the snapshot."""
    from mgpu_bench.machine import theory

    return {(gpus.index(a), gpus.index(b)) for (a, b), h in theory.pair_hops(snapshot, gpus).items()
            if h.kind == "nvlink"}


ProgressFn = Callable[..., None]  # (i, total, the request next) and, on CPU processes, a note: the estimate revised


def spec_of(req: CommRequest, counts: dict, backend: str, devices: list[str], graph: bool) -> CommSpec:
    return CommSpec(
        op=req.op, dtype=req.dtype, redop=req.redop, size=req.size, bytes=int(counts["bytes"]),
        count=int(counts["count"]), nranks=len(devices), inplace=req.inplace, backend=backend,
        devices=tuple(devices), graph=graph, root=req.root,
    )


def native_args(req: CommRequest, t: TimingOptions) -> _native.MeasureArgs:
    a = _native.MeasureArgs()
    a.op, a.dtype, a.redop, a.bytes = req.op, req.dtype, req.redop or "sum", req.size
    a.inplace, a.root = req.inplace, req.root
    a.warmup_iters, a.iters, a.min_time_s = t.warmup_iters, t.iters, t.min_time_s
    a.min_iters, a.max_iters, a.sample_target_s = t.min_iters, t.max_iters, t.sample_target_s
    a.graph, a.check = t.graph, t.check
    return a


def stop(run: CommRun, exc: BaseException, req: CommRequest, kept: str | None = None) -> None:
    """run.stopped and its one-line message; `kept` says where the measurements are (default:
    how many this process keeps)."""
    where = f"{req.op} {format_bytes(req.size)} {'in-place' if req.inplace else 'out-of-place'}"
    kept = kept or f"{len(run.measurements)} measurement(s) kept"
    if isinstance(exc, OutOfMemoryError):
        run.stopped = "out_of_memory"
    elif isinstance(exc, CommTimeoutError):
        run.stopped = "timeout"
    elif isinstance(exc, KeyboardInterrupt):
        run.stopped = "interrupted"
        run.stop_message = f"{interruption(exc)} at {where}; {kept}"
        return
    else:
        run.stopped = "nccl_error" if isinstance(exc, NcclError) else "error"
    detail = str(exc) if isinstance(exc, MgpuError) else f"{type(exc).__name__}: {exc}"
    run.stop_message = f"stopped at {where}: {detail}; {kept}"
