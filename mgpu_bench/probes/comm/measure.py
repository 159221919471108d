"""`mgpu-bench comm`: collective bandwidth sweeps, whatever the backend.

The flow: resolve the backend and ranks, expand the sweep into requests (ops x sizes x
placements), validate everything a user can get wrong before any GPU work, then run the
requests in order and keep every finished measurement whatever stops the sweep (out of memory
at one size, an NCCL error or timeout, Ctrl-C).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mgpu_bench import _native
from mgpu_bench.errors import CommTimeoutError, InputError, MgpuError, NcclError, OutOfMemoryError, interruption
from mgpu_bench.measurement import CommMeasurement, CommRequest, CommSpec, TimingOptions
from mgpu_bench.ops import OPS, buffer_bytes, op_counts
from mgpu_bench.sizes import format_bytes, format_gib

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

    @property
    def nranks(self) -> int:
        return len(self.devices)

    @property
    def total_wrong(self) -> int:
        return sum(m.total_wrong for m in self.measurements)


# -- resolution and validation (everything here raises InputError: exit code 2) --------------


def visible_gpu_count() -> int:
    """0 when there is no driver or no GPU."""
    try:
        return _native.device_count()
    except MgpuError:
        return 0


def require_gpus(command: str, spec: str | None) -> tuple[list[int], list[dict]]:
    """The GPUs --gpus names and their device_info; InputError (exit code 2) naming what is
    missing when the machine has no usable NVIDIA GPU."""
    n = visible_gpu_count()
    if n == 0:
        try:
            _native.device_count()
        except MgpuError as exc:
            raise InputError(f"{command} needs NVIDIA GPUs: {str(exc).split(' [', 1)[0]}") from None
        raise InputError(f"{command} needs NVIDIA GPUs: none visible (check CUDA_VISIBLE_DEVICES)")
    gpus = parse_gpus(spec, n)
    return gpus, [_native.device_info(g) for g in gpus]


def launcher():
    """The launcher this process runs under (launch.LaunchEnv), or None."""
    from mgpu_bench import launch

    return launch.detect()


def parse_gpus(spec: str | None, available: int) -> list[int]:
    """None -> all; "N" -> the first N; "a,b" -> those indices."""
    if spec is None or spec.strip().lower() == "all":
        return list(range(available))
    text = spec.strip()
    try:
        if "," not in text:
            n = int(text)
            if n < 1:
                raise InputError(f"--gpus {text}: give a GPU count of at least 1, or indices like 0,1")
            if n > available:
                raise InputError(f"--gpus {text}: only {available} GPU(s) visible (indices 0..{available - 1})")
            return list(range(n))
        idx = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise InputError(f"--gpus '{spec}': write a count (2) or comma-separated indices (0,1)") from None
    bad = [i for i in idx if i < 0 or i >= available]
    if bad:
        raise InputError(f"--gpus: GPU {bad[0]} does not exist; visible GPUs are 0..{available - 1}")
    if len(set(idx)) != len(idx):
        raise InputError(f"--gpus '{spec}' names a GPU twice")
    return idx


def resolve_backend(cfg: CommConfig) -> tuple[str, list[str], list[int]]:
    """-> (backend name, one device label per rank, CUDA indices for native/torch-nccl)."""
    if cfg.backend not in BACKENDS:
        raise InputError(f"unknown backend '{cfg.backend}': choose from {', '.join(BACKENDS)}")
    ngpu = visible_gpu_count()
    le = launcher()
    if le is not None:  # one rank of a job torchrun / srun / mpirun started: one GPU per process
        if le.world_size < 2:
            raise InputError(f"{le.launcher} started {le.world_size} process: collectives need at least 2 ranks")
        if cfg.backend == "native" and ngpu == 0:
            _native_error_as_input()
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
        _native_error_as_input()
    if ngpu == 0:
        if cfg.gpus is not None:
            raise InputError("--gpus given but no NVIDIA GPU is visible here")
        if cfg.nproc < 2:
            raise InputError(f"--nproc {cfg.nproc}: collectives need at least 2 ranks")
        return "torch-gloo", ["cpu"] * cfg.nproc, []
    gpus = parse_gpus(cfg.gpus, ngpu)
    if len(gpus) < 2:
        raise InputError(
            f"{len(gpus)} GPU selected: collectives need at least 2 ranks (use --gpus 2 or more; "
            f"{ngpu} visible)"
        )
    backend = "native" if cfg.backend in ("auto", "native") else "torch-nccl"
    return backend, [f"cuda:{i}" for i in gpus], gpus


def _native_error_as_input() -> None:
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
    avail = host_available_memory()
    total = need(worst) * nranks
    if avail is not None and total > avail:
        raise InputError(
            f"{worst.op} at {format_bytes(worst.size)} needs {format_gib(total)} over {nranks} CPU ranks; "
            f"this host has {format_gib(avail)} available: lower the largest --sizes"
        )


def host_available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is none."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def ring_theory_for(gpus: list[int]):
    """(theory.RingTheory for these CUDA devices, the topo snapshot behind it)."""
    from mgpu_bench import theory, topo

    snapshot = topo.collect()
    return theory.ring_theory(snapshot, theory.cuda_devices(gpus)), snapshot


def nvlink_rank_pairs(snapshot: dict | None, gpus: list[int]) -> set[tuple[int, int]]:
    """Ordered rank pairs (rank = position in `gpus`) that NVLink joins, per the snapshot."""
    from mgpu_bench import theory

    return {(gpus.index(a), gpus.index(b)) for (a, b), h in theory.pair_hops(snapshot, gpus).items()
            if h.kind == "nvlink"}


# -- running ---------------------------------------------------------------------------------

ProgressFn = Callable[[int, int, CommRequest], None]


def _spec(req: CommRequest, counts: dict, backend: str, devices: list[str], graph: bool) -> CommSpec:
    return CommSpec(
        op=req.op, dtype=req.dtype, redop=req.redop, size=req.size, bytes=int(counts["bytes"]),
        count=int(counts["count"]), nranks=len(devices), inplace=req.inplace, backend=backend,
        devices=tuple(devices), graph=graph, root=req.root,
    )


def _native_args(req: CommRequest, t: TimingOptions) -> _native.MeasureArgs:
    a = _native.MeasureArgs()
    a.op, a.dtype, a.redop, a.bytes = req.op, req.dtype, req.redop or "sum", req.size
    a.inplace, a.root = req.inplace, req.root
    a.warmup_iters, a.iters, a.min_time_s = t.warmup_iters, t.iters, t.min_time_s
    a.min_iters, a.max_iters, a.sample_target_s = t.min_iters, t.max_iters, t.sample_target_s
    a.graph, a.check = t.graph, t.check
    return a


def _stop(run: CommRun, exc: BaseException, req: CommRequest, kept: str | None = None) -> None:
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


def run_comm(cfg: CommConfig, progress: ProgressFn | None = None) -> CommRun:
    """Validates `cfg` (InputError on bad input) and runs the sweep. Faults end the sweep with
    `stopped` set and the measurements taken so far kept; they are not raised."""
    if not cfg.ops:
        raise InputError("no ops given")
    if not (0 < cfg.timeout_s <= 1e6):
        raise InputError("--timeout must be a positive number of seconds (at most 1e6)")
    backend, devices, gpus = resolve_backend(cfg)
    if cfg.timing.graph and backend != "native":
        raise InputError("--graph needs the native backend (CUDA graphs of NCCL calls); drop --graph for torch")
    check_dtype_support(cfg, backend, gpus)
    requests, notes = plan(cfg, len(devices))
    check_memory(requests, len(devices), gpus if backend == "native" else [])
    run = CommRun(backend=backend, devices=devices, requests=requests, notes=notes)
    le = launcher()
    if gpus and le is None:
        run.theory, run.topology = ring_theory_for(gpus)
    t0 = time.perf_counter()
    try:
        if le is not None:
            _run_joined(run, cfg, le, gpus, progress)
        elif backend == "native":
            _run_native(run, cfg, gpus, progress)
        else:
            _run_torch(run, cfg, gpus, progress)
    finally:
        run.wall_seconds = time.perf_counter() - t0
    return run


def _run_native(run: CommRun, cfg: CommConfig, gpus: list[int], progress: ProgressFn | None) -> None:
    from mgpu_bench import nccl_log

    n = len(gpus)
    req = run.requests[0]
    session = None
    capture = nccl_log.Capture()
    try:
        session = _native.CommSession(gpus, n, 0, _native.nccl_unique_id(), cfg.timeout_s)
        capture.release_environment()  # NCCL has read it
        for i, req in enumerate(run.requests):
            if progress:
                progress(i, len(run.requests), req)
            raw = session.measure(_native_args(req, cfg.timing))
            spec = _spec(req, raw["counts"], run.backend, run.devices, cfg.timing.graph)
            run.measurements.append(CommMeasurement.from_raw(spec, raw, cfg.timing.check))
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - any fault: keep what was measured, say why
        _stop(run, exc, req)
    finally:
        if session is not None:
            del session  # communicators destroyed (or left aborted) here
        _read_transports(run, capture, gpus)


def _read_transports(run: CommRun, capture, gpus: list[int]) -> None:
    """NCCL's own account of the transports, set against what the topology allows."""
    from mgpu_bench import nccl_log

    if capture.path is None:
        run.notes.append(capture.reason)
        return
    log = capture.read()
    capture.close()
    found = nccl_log.transports(log)
    if not found:
        run.notes.append(f"NCCL's log named no transports ({len(log.splitlines())} lines read)")
    run.transports = {f"{a}->{b}": dict(c) for (a, b), c in sorted(found.items())}
    run.findings += nccl_log.transport_findings(log, nvlink_rank_pairs(run.topology, gpus))
    run.notes += [f"NCCL warning: {w}" for w in nccl_log.warnings_in(log)]
    table = nccl_log.tuning_table(log)
    if table:
        run.algorithms = {}
        for m in run.measurements:
            algo = nccl_log.predicted_algorithm(table, m.spec.op, m.spec.bytes)
            if algo:
                run.algorithms[f"{m.spec.op}@{m.spec.bytes}"] = algo
    run.findings += explain_above_theory(run)


def explain_above_theory(run: CommRun) -> list[str]:
    """busbw above the link theory is never printed bare: say whether NCCL's model picks an
    algorithm the ring formula overstates (NVLS, CollNet), or that the theory must be wrong."""
    from mgpu_bench import nccl_log
    from mgpu_bench.sizes import format_bytes

    from .render import theory_dict

    t = theory_dict(run.theory)
    if not t or not t.get("bandwidth"):
        return []
    out = []
    for m in run.measurements:
        if m.busbw <= t["bandwidth"]:
            continue
        algo = (run.algorithms or {}).get(f"{m.spec.op}@{m.spec.bytes}")
        what = f"{m.spec.op} {format_bytes(m.spec.bytes)} {m.spec.placement}: busbw {m.busbw / 1e9:.1f} GB/s " \
               f"is above the link theory {t['bandwidth'] / 1e9:.0f} GB/s"
        if nccl_log.overstating(algo):
            out.append(f"{what}: NCCL's model picks {algo}, whose in-switch reduction moves less data than the "
                       f"ring busbw formula assumes")
        else:
            out.append(f"{what} with no in-switch algorithm in NCCL's model: check the theory ({t['summary']})")
    return out


def _run_torch(run: CommRun, cfg: CommConfig, gpus: list[int], progress: ProgressFn | None) -> None:
    from .torch_backend import run_sweep

    device = "cuda" if run.backend == "torch-nccl" else "cpu"

    def on_result(i: int, raw: dict) -> None:
        req = run.requests[i]
        spec = _spec(req, raw["counts"], run.backend, run.devices, False)
        run.measurements.append(CommMeasurement.from_raw(spec, raw, cfg.timing.check))
        if progress and i + 1 < len(run.requests):
            progress(i + 1, len(run.requests), run.requests[i + 1])

    if progress:
        progress(0, len(run.requests), run.requests[0])
    sweep = run_sweep(run.requests, nproc=run.nranks, device=device, timing=cfg.timing,
                      timeout_s=cfg.timeout_s, on_result=on_result, gpus=gpus or None)
    failed_at = run.requests[min(len(run.measurements), len(run.requests) - 1)]
    if sweep.interrupted:
        _stop(run, sweep.interruption or KeyboardInterrupt(), failed_at)
    elif sweep.error is not None:
        _stop(run, sweep.error, failed_at)


# -- one rank of a launcher's job --------------------------------------------------------------


def _run_joined(run: CommRun, cfg: CommConfig, le, gpus: list[int], progress: ProgressFn | None) -> None:
    """This process as one rank of a job torchrun / srun / mpirun started (one GPU each, the
    local rank's). The ranks meet at the launcher's store, check that they run the same sweep
    and learn where each runs; the native backend takes its NCCL unique ids from that store,
    the torch backend forms its process group there. Every rank measures, rank 0 keeps the
    combined results (joined.sweep). A fault on any rank stops every rank with the measurements
    so far kept on rank 0."""
    import torch
    import torch.distributed as dist

    from mgpu_bench import launch
    from mgpu_bench.probes.comm import joined

    launch.export_env(le)
    native = run.backend == "native"
    gpu = gpus[0] if gpus else None
    if gpu is not None:
        torch.cuda.set_device(gpu)
    pg_backend = "nccl" if run.backend == "torch-nccl" else "gloo"  # native: gloo carries control only
    device = torch.device("cuda", gpu) if gpu is not None else torch.device("cpu")
    req = run.requests[0]
    sessions: dict[str, object] = {}
    try:
        store = launch.init_group(le, pg_backend, cfg.timeout_s, device if pg_backend == "nccl" else None)
    except CommTimeoutError as exc:
        _stop(run, exc, req)
        return
    members: list[launch.Member] | None = None
    try:
        all_gather = launch.all_gatherer(le.world_size)
        launch.agree(repr((run.backend, run.requests, cfg.timing)), all_gather)
        bus = "" if gpu is None else str(_native.device_info(gpu)["pci_bus_id"])
        me = launch.Member(le.rank, le.host, le.node_rank, le.local_rank, "cpu" if gpu is None else f"cuda:{gpu}",
                           bus)
        members = all_gather(me)
        if le.launcher == "mpi":  # no node index exported: number the nodes by host
            members = launch.nodes_by_host(members)
            me = members[le.rank]
        groups = launch.scopes(members)
        run.nnodes = len({m.node for m in members})
        multinode = run.nnodes > 1
        run.devices = [f"{m.host}:{m.device}" if multinode else m.device for m in members]
        if le.rank == 0 and gpu is not None:
            _joined_theory(run, members, groups)
        if native:
            measure = _native_measure(cfg, store, me, members, gpu, sessions)
        else:
            measure = _torch_measure(cfg, members, groups, device)
        def emit(index: int, scope: str, group, raw: dict) -> None:
            r = run.requests[index]
            devices = run.devices if group is None else [run.devices[x] for x in group.ranks]
            spec = _spec(r, raw["counts"], run.backend, devices, cfg.timing.graph)
            if group is not None:
                from dataclasses import replace

                spec = replace(spec, scope=scope, group=group.label)
            run.measurements.append(CommMeasurement.from_raw(spec, raw, cfg.timing.check))
            if progress and scope == "world" and index + 1 < len(run.requests):
                progress(index + 1, len(run.requests), run.requests[index + 1])

        if progress:
            progress(0, len(run.requests), run.requests[0])

        def measure_tracked(r: CommRequest, group, place: int, size: int) -> dict:
            nonlocal req
            req = r
            return measure(r, group, place, size)

        joined.sweep(run.requests, me, members, groups, measure_tracked, all_gather, emit)
        if le.rank == 0:
            run.findings += joined.stragglers(run.measurements, [m.host for m in members])
            run.findings += explain_above_theory(run)
            if native:
                run.notes.append("under a launcher NCCL's transports are not read from its log")
    except InputError:
        raise
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - any fault: keep what was measured, say why
        told = launch.account(exc, store, le, members, min(5.0, cfg.timeout_s), told=(joined.RankFailure,))
        kept = None
        if le.rank != 0:  # the measurements live on rank 0 alone
            rank0_gone = isinstance(told, launch.RankLost) and str(told).startswith("rank 0 ")
            kept = ("rank 0, which held the measurements, is gone: none were written" if rank0_gone
                    else "rank 0 keeps the measurements")
        _stop(run, told, req, kept)
    finally:
        for key in list(sessions):
            del sessions[key]  # communicators destroyed (or left aborted) here
        import contextlib

        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _joined_theory(run: CommRun, members, groups) -> None:
    """Theory per scope from this node's topology (every node is assumed to look like it)."""
    from mgpu_bench import theory, topo

    # by PCI bus id, which NVML knows whatever each process's CUDA_VISIBLE_DEVICES hides
    local = [(m.local_rank, m.bus_id) for m in members if m.node == members[0].node]
    run.topology = topo.collect()
    if groups:
        run.scope_theory = theory.hierarchy_theory(run.topology, local)
        run.theory = run.scope_theory["world"]
    else:
        run.theory = theory.ring_theory(run.topology, local)


def _native_measure(cfg: CommConfig, store, me, members, gpu: int, sessions: dict):
    """measure() for joined.sweep on the native core: one CommSession per communicator this
    rank belongs to, created on first use; its NCCL unique id comes from the communicator's
    lowest rank through the launcher's store."""
    from mgpu_bench import launch

    prefix = launch._prefix()

    def session(group, place: int, size: int):
        key = "world" if group is None else f"{group.scope}/{group.label}"
        if key not in sessions:
            store_key = f"{prefix}/nccl-id/{key}"
            if place == 0:
                store.set(store_key, _native.nccl_unique_id())
            uid = store.get(store_key)  # waits up to the store's timeout (--timeout)
            sessions[key] = _native.CommSession([gpu], size, place, bytes(uid), cfg.timeout_s)
        return sessions[key]

    def measure(req: CommRequest, group, place: int, size: int) -> dict:
        raw = session(group, place, size).measure(_native_args(req, cfg.timing))
        return {"counts": raw["counts"], "iters": raw["iters"], "batch": raw["batch"],
                "burst": raw["burst_seconds"][0], "samples": list(raw["samples"][0]), "wrong": raw["wrong"][0],
                "estimate": raw["warmup_seconds_per_iter"]}

    return measure


def _torch_measure(cfg: CommConfig, members, groups, device):
    """measure() for joined.sweep on torch.distributed: the scopes' groups are formed once, by
    every rank in the same order, as torch requires."""
    from datetime import timedelta

    import torch.distributed as dist

    from .torch_backend import _measure, _plan

    # new_group does not inherit the world's timeout (torch gives gloo 30 min): --timeout here too
    pgs = {g.label + g.scope: dist.new_group(list(g.ranks), timeout=timedelta(seconds=cfg.timeout_s))
           for g in groups}
    kind = "cuda" if device.type == "cuda" else "cpu"

    def measure(req: CommRequest, group, place: int, size: int) -> dict:
        plan = _plan(req, size, kind)
        pg = None if group is None else pgs[group.label + group.scope]
        m = _measure(plan, place, size, device, cfg.timing, pg, None if group is None else group.ranks)
        return {"counts": plan["counts"], "iters": m["iters"], "batch": m["batch"], "burst": m["burst"],
                "samples": m["samples"], "wrong": m["wrong"], "estimate": m["estimate"]}

    return measure
