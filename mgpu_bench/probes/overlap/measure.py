"""`mgpu-bench overlap` measurement: on every rank at once, an allreduce stream and a GEMM stream,
each alone and then together.

One process per GPU (gloo processes on CPU) started through torch's elastic launcher, or joined
when an outer torchrun/srun already started them, as `model` does. Each rank runs `worker()`:

    warm-up      --warmup iterations of each side
    calibration  3 timed iterations of each side alone; the allreduce's seconds are agreed on
                 every rank (the largest), as every rank must run the same number of collectives
    comm_alone   ceil(duration / allreduce seconds) allreduces
    gemm_alone   ceil(duration / GEMM seconds) GEMMs
    together     the same allreduces on one stream and, on another, as many GEMMs as last as
                 long as they did alone, enqueued interleaved by their expected time so that
                 both streams stay fed; analyse.window() keeps the iterations that ended while
                 both ran

On GPUs the sides are torch.distributed.all_reduce (NCCL, fp32, in place, on a stream of its
own: NCCL's internal stream waits for it, and work.wait() makes it wait for NCCL's end) and
torch.matmul (bf16) on another stream, both released by one event; a CUDA event after every
iteration on its stream gives its end, read once at the end of the phase. On CPU processes the
sides are gloo's all_reduce in a thread and torch.matmul (fp32) in the main thread (both release
the GIL), timed by the host clock. On one rank NCCL's in-place allreduce does nothing (it is a
no-op for a single rank), so the comm side is an elementwise kernel over the same bytes
(src * 1 -> dst): the SM and memory work of a collective without the link.

NVML samples the rank's own GPU every 0.1 s through all phases (telemetry.Sampler), and NCCL's
INFO log of the communicator's set-up (nccl_log.Capture, unless the user set NCCL_DEBUG) says how
many channels, so CTAs and SMs, a collective takes. After every phase a rank writes what it has
to a file in `sink`, so that a run stopped by a fault or a signal keeps its finished phases.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mgpu_bench.core.errors import InputError, MgpuError, defer_sigterm, interruption

from .analyse import NCCL_CTA_VARIABLES, PHASE_TITLES, OverlapConfig, OverlapRun, nccl_channels, ranks_text

CALIBRATION_ITERS = 3
MIN_ITERS = 10  # per side and phase: enough for a noise estimate from 5+ chunks
MAX_ITERS = 200_000
TELEMETRY_INTERVAL_S = 0.1


def _count(seconds: float, each_s: float) -> int:
    return int(min(MAX_ITERS, max(MIN_ITERS, math.ceil(seconds / max(each_s, 1e-7)))))


def _bus_id(props) -> str | None:
    """The GPU's PCI bus id from torch's device properties ('00000000:18:00.0'), None where torch
    does not give it."""
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return f"{int(getattr(props, 'pci_domain_id', 0) or 0):08x}:{int(bus):02x}:{int(getattr(props, 'pci_device_id', 0) or 0):02x}.0"


def _agree_max(device, world: int, value: float) -> float:
    """The largest of every rank's `value`, over the job's process group (itself on one rank)."""
    if world < 2:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


class _Sides:
    """The two streams of work on one rank and their timed loops (GPU: CUDA events; CPU: host
    clock, the comm side in a thread of its own when both run)."""

    def __init__(self, cfg: OverlapConfig, device, world: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.device, self.world = torch, dist, device, world
        self.on_gpu = device.type == "cuda"
        gen = torch.Generator(device=device).manual_seed(cfg.seed)
        dt = torch.bfloat16 if self.on_gpu else torch.float32
        # the allreduce's buffer stays zero: a sum of zeros never overflows, however many calls
        self.buf = torch.zeros(cfg.count, dtype=torch.float32, device=device)
        self.dst = torch.empty_like(self.buf) if world < 2 else None
        self.a = (torch.rand((cfg.m, cfg.k), device=device, generator=gen) * 2 - 1).to(dt)
        self.b = (torch.rand((cfg.k, cfg.n), device=device, generator=gen) * 2 - 1).to(dt)
        self.c = torch.empty((cfg.m, cfg.n), device=device, dtype=dt)
        self.streams = {"comm": torch.cuda.Stream(device), "gemm": torch.cuda.Stream(device)} if self.on_gpu else {}

    def comm(self) -> None:
        if self.world < 2:
            self.torch.mul(self.buf, 1.0, out=self.dst)  # one rank: the stand-in (module docs)
        else:
            self.dist.all_reduce(self.buf, async_op=True).wait()

    def gemm(self) -> None:
        self.torch.matmul(self.a, self.b, out=self.c)

    def agree_max(self, value: float) -> float:
        """The largest of every rank's `value` (all ranks must size their collective loops alike)."""
        return _agree_max(self.device, self.world, value)

    def meet(self) -> None:
        """Every rank here before a phase starts (a small allreduce; the GPU drained first)."""
        if self.on_gpu:
            self.torch.cuda.synchronize(self.device)
        if self.world >= 2:
            self.agree_max(0.0)

    def timed(self, plan: dict[str, tuple[int, float]]) -> dict[str, dict]:
        """Runs `plan` {side: (iterations, expected seconds each)}, all sides at once; per side
        {"start_s": when it began, "seconds": [per iteration]}, times from the common start."""
        return self._timed_gpu(plan) if self.on_gpu else self._timed_cpu(plan)

    def _timed_gpu(self, plan: dict[str, tuple[int, float]]) -> dict[str, dict]:
        torch = self.torch
        Event = torch.cuda.Event
        torch.cuda.synchronize(self.device)
        ref = Event(enable_timing=True)
        ref.record()
        starts, marks = {}, {side: [] for side in plan}
        for side in plan:
            s = self.streams[side]
            s.wait_event(ref)  # both released by one event
            starts[side] = Event(enable_timing=True)
            starts[side].record(s)
        done = dict.fromkeys(plan, 0)
        fn = {"comm": self.comm, "gemm": self.gemm}
        while True:  # enqueue the side whose queued work ends first in expected time
            left = [s for s in plan if done[s] < plan[s][0]]
            if not left:
                break
            side = min(left, key=lambda s: done[s] * plan[s][1])
            stream = self.streams[side]
            with torch.cuda.stream(stream):
                fn[side]()
            e = Event(enable_timing=True)
            e.record(stream)
            marks[side].append(e)
            done[side] += 1
        torch.cuda.synchronize(self.device)
        out = {}
        for side in plan:
            t = [ref.elapsed_time(starts[side]) / 1e3] + [ref.elapsed_time(e) / 1e3 for e in marks[side]]
            out[side] = {"start_s": t[0], "seconds": [b - a for a, b in itertools.pairwise(t)]}
        return out

    def _timed_cpu(self, plan: dict[str, tuple[int, float]]) -> dict[str, dict]:
        fn = {"comm": self.comm, "gemm": self.gemm}
        gate = threading.Barrier(len(plan))  # both sides start together
        out: dict[str, dict] = {}
        failed: list[BaseException] = []

        def loop(side: str) -> None:
            try:
                gate.wait()
                clock = time.perf_counter
                t = [clock()]
                for _ in range(plan[side][0]):
                    fn[side]()
                    t.append(clock())
                out[side] = {"start": t[0], "seconds": [b - a for a, b in itertools.pairwise(t)]}
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                failed.append(exc)

        if len(plan) == 1:
            loop(next(iter(plan)))
        else:  # the collective in a thread of its own, the GEMM in this one
            comm = threading.Thread(target=loop, args=("comm",), daemon=True, name="overlap-comm")
            comm.start()
            loop("gemm")
            comm.join()
        if failed:
            raise failed[0]
        t0 = min(v["start"] for v in out.values())
        return {side: {"start_s": v["start"] - t0, "seconds": v["seconds"]} for side, v in out.items()}


def _say(cfg: OverlapConfig, rank: int, world: int, text: str) -> None:
    if cfg.progress and rank == 0:
        print(f"mgpu-bench overlap: {ranks_text(world, cfg.device == 'cuda')}, {text}", file=sys.stderr, flush=True)


def _write(sink: str | None, rank: int, out: dict) -> None:
    """The rank's result so far, written atomically (a stopped run keeps its finished phases)."""
    if not sink:
        return
    path = Path(sink) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(out))
        tmp.replace(path)


def worker(cfg_dict: dict, sink: str | None = None) -> dict:
    """One rank (the elastic launcher's entry): its process group, then measure()."""
    import torch
    import torch.distributed as dist

    from mgpu_bench.machine import nccl_log

    cfg = OverlapConfig(**cfg_dict)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = cfg.device == "cuda"
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    capture = None
    owns_group = world > 1 and not dist.is_initialized()
    if on_gpu:
        torch.cuda.set_device(local)
        if owns_group:
            capture = nccl_log.Capture()  # before NCCL reads its environment
    if owns_group:
        dist.init_process_group("nccl" if on_gpu else "gloo", device_id=device if on_gpu else None)
    try:
        from mgpu_bench.core.launch import keep_result

        result = measure(cfg, rank, world, device, sink, capture)
        keep_result(result)  # kept before the group's teardown: a stop signal during it does not lose the figures
        return result
    finally:
        if owns_group and dist.is_initialized():
            with contextlib.suppress(Exception):  # teardown of a failed group must not hide the result
                dist.destroy_process_group()


def measure(cfg: OverlapConfig, rank: int, world: int, device, sink: str | None, capture=None) -> dict:
    """The phases on this rank (module docs); an out-of-memory error is returned with the phases
    done so far, not raised."""
    import torch

    on_gpu = device.type == "cuda"
    out: dict[str, Any] = {"rank": rank, "world": world, "device": str(device), "host": socket.gethostname(),
                           "error": None, "phases": {}, "telemetry": {}, "nccl": {},
                           "comm_op": "allreduce" if world > 1 else "elementwise stand-in",
                           "nccl_env": {k: os.environ[k] for k in NCCL_CTA_VARIABLES if k in os.environ}}
    sampler = None
    if on_gpu:
        props = torch.cuda.get_device_properties(device)
        out.update(gpu_name=props.name, sm_count=int(props.multi_processor_count), bus_id=_bus_id(props))
    else:
        torch.set_num_threads(1)  # the two sides are threads already; intra-op threads would spin against them
    windows: dict[str, tuple[float, float]] = {}
    try:
        try:
            sides = _Sides(cfg, device, world)
        except torch.OutOfMemoryError as exc:
            out["error"] = "out of memory: " + str(exc).split("\n")[0][:300]
            sides = None
        # every rank learns whether all have their buffers: one that stops here alone would leave
        # the others waiting in their first collective until NCCL's timeout
        if _agree_max(device, world, 1.0 if sides is None else 0.0) > 0:
            out["error"] = out["error"] or "another rank could not allocate its buffers (out of memory there)"
            return out
        _say(cfg, rank, world, f"warm-up ({cfg.warmup} of each) and calibration")
        sides.meet()
        for side in ("comm", "gemm"):
            sides.timed({side: (cfg.warmup, 0.0)})
        if capture is not None:
            capture.release_environment()  # NCCL has read it: child processes must not inherit it
        cal = {side: sides.timed({side: (CALIBRATION_ITERS, 0.0)})[side]["seconds"] for side in ("comm", "gemm")}
        comm_s = sides.agree_max(sum(cal["comm"]) / len(cal["comm"]))
        gemm_s = sum(cal["gemm"]) / len(cal["gemm"])
        n_comm, n_gemm = _count(cfg.duration_s, comm_s), _count(cfg.duration_s, gemm_s)
        n_together = _count(n_comm * comm_s, gemm_s)  # the GEMM loop as long as the collective loop
        out["calibration"] = {"comm_s": comm_s, "gemm_s": gemm_s}
        if on_gpu and not out.get("bus_id"):
            out["telemetry_error"] = "clock and power telemetry: torch gives no PCI bus id for the GPU"
        elif on_gpu:
            from mgpu_bench.machine import telemetry

            sampler = telemetry.Sampler({0: out["bus_id"]}, interval_s=TELEMETRY_INTERVAL_S)
            sampler.start()
            if sampler.error:
                out["telemetry_error"] = f"clock and power telemetry: {sampler.error}"
        plans = {"comm_alone": {"comm": (n_comm, comm_s)}, "gemm_alone": {"gemm": (n_gemm, gemm_s)},
                 "together": {"comm": (n_comm, comm_s), "gemm": (n_together, gemm_s)}}
        names = {"comm": "allreduces" if world > 1 else "stand-in kernels", "gemm": "GEMMs"}
        for i, (phase, plan) in enumerate(plans.items()):
            what = " and ".join(f"{n} {names[s]}" for s, (n, _) in plan.items())
            _say(cfg, rank, world, f"phase {i + 1}/3, {PHASE_TITLES[phase]}: {what}")
            sides.meet()
            t0 = time.monotonic()
            out["phases"][phase] = sides.timed(plan)
            windows[phase] = (t0, time.monotonic())
            out["phases"][phase]["host_s"] = windows[phase][1] - t0
            _write(sink, rank, out)
    except torch.OutOfMemoryError as exc:
        out["error"] = "out of memory: " + str(exc).split("\n")[0][:300]
    finally:
        if sampler is not None:
            sampler.stop()
            _telemetry(out, sampler, windows)
        if capture is not None:
            log = capture.read()
            out["nccl"] = {**nccl_channels(log), **({"capture": capture.reason} if capture.reason else {})}
            capture.close()
        elif on_gpu and world > 1:
            out["nccl"] = {"capture": "NCCL_DEBUG is set by the environment, or NCCL started before: channels not read"}
        _write(sink, rank, out)
    return out


def _telemetry(out: dict, sampler, windows: dict[str, tuple[float, float]]) -> None:
    """Per phase the summary of the rank's GPU samples inside it, and the whole series with the
    phases' bounds (seconds since the first phase began) for the report's plot."""
    from mgpu_bench.machine import telemetry

    if sampler.error or not windows:
        return
    t0 = min(a for a, _ in windows.values())
    for phase, (a, b) in windows.items():
        out["telemetry"][phase] = telemetry.summarize(sampler.window(0, a, b, TELEMETRY_INTERVAL_S / 2),
                                                      sampler.static.get(0))
    out["telemetry_series"] = {**telemetry.series(sampler.samples.get(0, []), t0),
                               "phases": {p: [a - t0, b - t0] for p, (a, b) in windows.items()}}


# ------------------------------------------------------------------------------------ launching

def launch(cfg: OverlapConfig, nprocs: int, sink: str) -> list[dict]:
    """worker() on nprocs local processes through torch's elastic launcher (a c10d rendezvous on
    localhost), each rank's result in rank order; under an outer launcher this process's rank
    only, every rank's result gathered to all. One process measures in place."""
    from mgpu_bench.core import launch as launcher

    le = launcher.detect()
    if le is not None:
        return _joined(cfg, le, sink)
    if nprocs == 1:
        return [worker(asdict(cfg), sink)]
    from torch.distributed.launcher.api import LaunchConfig

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"mgpu-bench-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launcher.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="forkserver")  # run_elastic: children.rank_start_method
    # The ranks die with this process, and end at once on Ctrl-C (their finished phases are on disk).
    results = launcher.run_elastic(lc, worker, asdict(cfg), sink, children="die", last=True)  # the run's one launch
    return [results[r] for r in sorted(results)]


_STORE: list = []  # the launcher's store of this process's job, once its group is formed


def _joined(cfg: OverlapConfig, le, sink: str) -> list[dict]:
    """This process as one rank of a launcher's job (as model's): the group formed through the
    store that names a rank that never arrives, the ranks' arguments checked to agree, and every
    rank's result gathered so that rank 0 reports the whole job."""
    import torch
    import torch.distributed as dist

    from mgpu_bench.core import launch as launcher
    from mgpu_bench.core import ranks
    from mgpu_bench.machine import nccl_log

    launcher.export_env(le)
    capture = None
    device = torch.device("cuda", le.local_rank) if cfg.device == "cuda" else torch.device("cpu")
    if le.world_size > 1 and not dist.is_initialized():
        if cfg.device == "cuda":
            torch.cuda.set_device(le.local_rank)
            capture = nccl_log.Capture()
            _STORE[:] = [ranks.init_group(le, "nccl", 600.0, device)]
        else:
            _STORE[:] = [ranks.init_group(le, "gloo", 600.0)]
    elif cfg.device == "cuda":
        torch.cuda.set_device(le.local_rank)
    if le.world_size < 2:
        return [measure(cfg, le.rank, 1, device, sink, capture)]
    all_gather = ranks.all_gatherer(le.world_size)
    try:
        ranks.agree(repr({**asdict(cfg), "progress": None}), all_gather)  # rank 0 alone shows progress
        mine = measure(cfg, le.rank, le.world_size, device, sink, capture)
        return all_gather(mine)
    except (Exception, KeyboardInterrupt) as exc:
        told = ranks.account(exc, _STORE[0] if _STORE else None, le, None)
        if told is exc:
            raise
        raise told from None


def _leave_group(clean: bool) -> None:
    """As model's: after a clean run the ranks meet before the group is destroyed; a rank that
    stops early goes at once."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if clean:
            with contextlib.suppress(Exception):
                dist.barrier()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    _STORE.clear()


def _partial(sink: str) -> list[dict]:
    """The ranks' results written so far (a stopped run), rank order."""
    out = []
    for p in sorted(Path(sink).glob("rank*.json"), key=lambda p: int(p.stem[4:])):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(p.read_text()))
    return out


def run_overlap(cfg: OverlapConfig, nprocs: int, gpus: tuple[int, ...], say: Callable[[str], None] | None = None
                ) -> OverlapRun:
    """The whole measurement on nprocs ranks; a fault or a signal keeps the phases every rank
    finished (from its file in a temporary folder)."""
    from mgpu_bench.core import children

    run = OverlapRun(cfg, gpus=gpus)
    t0 = time.monotonic()
    # named by this pid: a dead run's folder is cleaned by a later run
    with children.temp_folder("mgpu-bench-overlap-") as sink:
        try:
            if say:
                say(f"{ranks_text(nprocs, cfg.device == 'cuda')}, 3 phases of {cfg.duration_s:g} s")
            run.ranks = launch(cfg, nprocs, sink)
            defer_sigterm()  # measured: a stop signal now waits while the ranks' group goes and the run is written
        except KeyboardInterrupt as exc:
            run.stopped, run.stop_message = "interrupted", f"{interruption(exc)}: the phases measured so far are kept"
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - a rank died or the group failed: the run ends, results kept
            if type(exc).__name__ == "SignalException":  # the elastic agent turns Ctrl-C and SIGTERM into it
                run.stopped, run.stop_message = "interrupted", f"{interruption(exc)}: the phases measured so far are kept"
            else:
                text = str(exc).splitlines()[0] if str(exc) else ""
                run.stopped = "failed"
                run.stop_message = (text if isinstance(exc, MgpuError) else f"{type(exc).__name__}: {text}")[:600]
        finally:
            _leave_group(clean=run.stopped is None)
            if not run.ranks:
                run.ranks = _partial(sink)
    run.wall_seconds = time.monotonic() - t0
    return run
