"""The `torch` backend of `mgpu-bench comm`: the native core's sweep, run through torch.distributed.

One process per rank (torch_rank.py, forked from the rank server: children.rank_start_method; this module, the
parent's side, does not import torch): backend "gloo" on CPU
processes (so the tool runs without GPUs) or "nccl" with one process per GPU (to show the
framework's overhead beside the native figures). Each process runs the same loop as the native
core's Worker::measure (csrc/comm_session.cpp) and writes the same data pattern
(csrc/comm_data.cu), so the raw result dicts have the shape CommSession.measure returns and the
caller builds CommMeasurement.from_raw the same way for both backends.

Differences from the native core, forced by torch's API:
- all_reduce, reduce and broadcast exist in torch only in place. An out-of-place request runs
  them on the receive buffer, loaded from the send buffer before the warm-up and before the
  check (copies that are not timed), so both placements time the same call for these ops.
- CUDA graphs are not captured (TimingOptions.graph is refused).
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mgpu_bench.core import children
from mgpu_bench.core.errors import CommTimeoutError, InputError, MgpuError
from mgpu_bench.results.measurement import CommRequest, TimingOptions
from mgpu_bench.results.ops import OPS, op_counts

from . import cpu_sizing

# The dtypes and reductions the ranks map onto torch's (torch_rank.TORCH_DTYPES, _REDOPS).
DTYPES = ("fp32", "fp16", "bf16", "fp64", "int32", "int8", "fp8_e4m3", "fp8_e5m2")
REDOPS = ("sum", "max", "min", "avg")

# Spawning the processes, importing torch and the rendezvous are not a request: they get at
# least this long whatever timeout_s is.
STARTUP_TIMEOUT_S = 120.0


def unsupported_reason(op: str, dtype: str, redop: str | None, device: str) -> str | None:
    """None if torch.distributed with this device's backend ("cpu": gloo, "cuda": nccl) runs
    `op` on `dtype` with `redop`; otherwise a one-line reason that names the fix. Pure: starts
    nothing.

    What gloo does in torch 2.13 was found by trying every op, dtype and reduction
    (tests/test_torch_backend.py runs the supported ones): every op on fp32, fp16, bf16, fp64,
    int32 and int8 with sum, max and min; avg on the floating types; fp8 only through
    point-to-point (sendrecv): its collectives fail with "Invalid scalar type". nccl (torch 2.11
    with NCCL 2.28 on H200, tried) runs every op, dtype and reduction, fp8 included.
    (sendrecv has no in-place form, as in the native core: on gloo a send starts only once its
    peer has posted the receive, so a one-buffer ring always receives over data not yet sent.)
    """
    if device not in ("cpu", "cuda"):
        return f"the torch backend runs on 'cpu' (gloo) or 'cuda' (nccl), not '{device}'"
    if op not in OPS:
        return f"unknown op '{op}'"
    if dtype not in DTYPES:
        return f"unknown dtype '{dtype}'"
    reduces = OPS[op].reduces
    if reduces and (redop or "sum") not in REDOPS:
        return f"unknown reduction '{redop}': use sum, max, min or avg"
    fp8 = dtype.startswith("fp8")
    if device == "cpu":
        if fp8 and op != "sendrecv":
            return (f"gloo has no fp8 collectives (only point-to-point): use --backend native "
                    f"for {op} on {dtype}, or another --dtype")
        if reduces and redop == "avg" and dtype in ("int32", "int8"):
            return f"gloo cannot average {dtype} tensors: use --redop sum or --backend native"
        return None
    if fp8 and reduces and _torch_nccl_version() < (2, 24, 0):
        # Older NCCLs have no fp8 type: torch would reduce the bytes as uint8.
        have = ".".join(map(str, _torch_nccl_version())) or "none"
        return f"{dtype} reductions need NCCL >= 2.24 (torch's NCCL: {have}): use --backend native, or bf16"
    return None


def _torch_nccl_version() -> tuple[int, ...]:
    """The NCCL this torch was built with, as (2, 28, 9); () when it has none (a CPU build)."""
    try:
        import torch  # the parent of GPU ranks only

        return tuple(torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a CPU build of torch has no NCCL
        return ()


@dataclass
class TorchSweep:
    results: list[dict] = field(default_factory=list)  # raw dicts, request order, completed only
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (request index, why): sized out on CPU
    error: BaseException | None = None  # the first failure; None if every request completed
    interrupted: bool = False  # Ctrl-C or SIGTERM in the parent stopped the sweep
    interruption: KeyboardInterrupt | None = None  # which (errors.Terminated for SIGTERM)


# -- the parent ------------------------------------------------------------------------------------


def _describe(req: CommRequest) -> str:
    redop = f" {req.redop}" if req.redop else ""
    where = "in-place" if req.inplace else "out-of-place"
    return f"{req.op} ({req.dtype}{redop}, {where}) at {req.size} bytes"


def _plan(req: CommRequest, nproc: int, device: str) -> dict:
    """What every process needs for one request (plain data: no native calls in the children)."""
    reason = unsupported_reason(req.op, req.dtype, req.redop, device)
    if reason:
        raise InputError(reason)
    info = OPS[req.op]
    if req.inplace and not info.inplace:
        raise InputError(f"{req.op} has no in-place form")
    if info.rooted and not 0 <= req.root < nproc:
        raise InputError(f"root {req.root} is not a rank of {nproc}")
    if req.op == "sendrecv" and nproc == 1 and device == "cpu":
        raise InputError("gloo cannot send to its own rank: sendrecv needs --nproc 2 or more")
    return {
        "op": req.op,
        "dtype": req.dtype,
        "redop": (req.redop or "sum") if info.reduces else None,
        "inplace": req.inplace,
        "root": req.root,
        "reduces": info.reduces,
        "counts": op_counts(req.op, req.size, req.dtype, nproc),
    }


def cpu_allotments(requests: list[CommRequest], nproc: int, timing: TimingOptions, timeout_s: float) -> list[float]:
    """Each request's share of the first estimate on CPU processes (cpu_sizing.allotments), at
    the bytes the op's rounding gives, on this host as busy as it is (cpu_sizing.host_slowdown)."""
    return cpu_sizing.allotments([op_counts(r.op, r.size, r.dtype, nproc)["bytes"] for r in requests], timing,
                                 timeout_s, cpu_sizing.host_slowdown(nproc)[0])


def _stop(procs: list, graceful: bool) -> None:
    """Joins every child; a child still running (after a grace period when `graceful`) is
    terminated, then killed."""
    procs = [p for p in procs if p.pid is not None]  # started ones only
    if graceful:
        deadline = time.monotonic() + 30.0
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def _rank(env: dict, *args) -> None:
    """The ranks' entry point: its environment and binding (children.enter_rank), then
    torch_rank.worker, imported in the rank: torch stays out of this process."""
    children.enter_rank(env)
    from .torch_rank import worker

    worker(*args)


def run_sweep(requests: list[CommRequest], *, nproc: int, device: str, timing: TimingOptions,
              timeout_s: float, on_result: Callable[[int, dict], None] | None = None,
              gpus: list[int] | None = None, on_skip: Callable[[int, str], None] | None = None,
              allot: list[float] | None = None, on_ready: Callable[[], None] | None = None) -> TorchSweep:
    """Runs `requests` in order on `nproc` processes ("cpu": gloo; "cuda": nccl, process r on
    cuda:gpus[r], by default cuda:r). Each completed request's raw dict goes to on_result(index, raw) as soon as it is
    done. On CPU the sweep is sized to the machine (cpu_sizing): `allot` gives each request its share of the
    first estimate (default: cpu_allotments), and a request left out goes to on_skip(index, why). on_ready() is
    called when every rank has met. A request that yields no result within timeout_s seconds stops the sweep with
    a CommTimeoutError; a failing rank stops it with its exception; Ctrl-C stops it with interrupted=True. The
    children are always gone when this returns."""
    if device not in ("cpu", "cuda"):
        raise InputError(f"the torch backend runs on 'cpu' (gloo) or 'cuda' (nccl), not '{device}'")
    if nproc < 1:
        raise InputError(f"--nproc must be at least 1 (got {nproc})")
    if device == "cuda":
        import torch  # the parent of GPU ranks only (torch on GPUs counts them as the ranks will)

        if nproc > torch.cuda.device_count():
            raise InputError(f"{nproc} processes need {nproc} GPUs; {torch.cuda.device_count()} visible")
    if timing.graph:
        raise InputError("the torch backend does not capture CUDA graphs: drop --graph or use --backend native")
    gpus = list(range(nproc)) if gpus is None else list(gpus)
    if device == "cuda" and len(gpus) != nproc:
        raise InputError(f"{nproc} processes but {len(gpus)} GPUs given")
    plans = [_plan(req, nproc, device) for req in requests]
    if device == "cpu":
        allot = cpu_allotments(requests, nproc, timing, timeout_s) if allot is None else allot
        for p, a in zip(plans, allot, strict=True):
            p["allot_s"] = float(a)
    sweep = TorchSweep()
    if not plans:
        return sweep

    with children.temp_folder("mgpu-bench-comm-") as folder:
        # The ranks meet through a file store in this run's own folder: no port, and no torch in this
        # process (it would serve the store; the ranks import torch, this process only waits for them).
        # forked from the rank server, which imports torch once for the run (children.rank_start_method)
        ctx = multiprocessing.get_context(children.rank_start_method(("torch", "torch.distributed")))
        messages = ctx.Queue()
        store = os.path.join(folder, "store")
        procs: list = []
        ready = 0
        deadline = time.monotonic() + max(timeout_s, STARTUP_TIMEOUT_S)
        died_at = None  # when a child was first seen dead without having reported an error
        try:
            with children.spawning("ignore", block_sigint=True):  # they die with us and leave Ctrl-C to us
                env = children.launch_env()
                procs += [ctx.Process(target=_rank, daemon=True,
                                      args=(env, rank, nproc, device, gpus[rank] if device == "cuda" else -1, store,
                                            plans, timing, timeout_s, STARTUP_TIMEOUT_S, messages))
                          for rank in range(nproc)]
                for p in procs:
                    p.start()
            while len(sweep.results) + len(sweep.skipped) < len(plans) and sweep.error is None:
                try:
                    msg = messages.get(timeout=0.1)
                except queue_module.Empty:
                    now = time.monotonic()
                    current = requests[len(sweep.results) + len(sweep.skipped)]
                    if now > deadline and ready < nproc:
                        sweep.error = CommTimeoutError(
                            f"torch backend: the {nproc} worker processes did not start and rendezvous "
                            f"within {max(timeout_s, STARTUP_TIMEOUT_S):g} s; they were stopped")
                    elif now > deadline:
                        sweep.error = CommTimeoutError(
                            f"torch backend: {_describe(current)} did not finish within {timeout_s:g} s "
                            f"(--timeout); the worker processes were stopped")
                    elif died_at is None and any(p.exitcode not in (None, 0) for p in procs):
                        died_at = now  # its error message may still be on the way: wait a second
                    elif died_at is not None and now > died_at + 1.0:
                        rank, code = next((r, p.exitcode) for r, p in enumerate(procs)
                                          if p.exitcode not in (None, 0))
                        sweep.error = MgpuError(
                            f"torch backend: rank {rank} exited with code {code} during {_describe(current)}")
                    continue
                if msg[0] == "ready":
                    ready += 1
                    if ready == nproc:
                        deadline = time.monotonic() + timeout_s
                        if on_ready is not None:
                            on_ready()
                elif msg[0] == "result":
                    sweep.results.append(msg[2])
                    deadline = time.monotonic() + timeout_s
                    if on_result is not None:
                        on_result(msg[1], msg[2])
                elif msg[0] == "skipped":
                    sweep.skipped.append((msg[1], msg[2]))
                    deadline = time.monotonic() + timeout_s
                    if on_skip is not None:
                        on_skip(msg[1], msg[2])
                elif msg[0] == "error":
                    sweep.error = msg[2]
        except KeyboardInterrupt as exc:
            sweep.interrupted, sweep.interruption = True, exc
        finally:
            complete = sweep.error is None and not sweep.interrupted and len(sweep.results) + len(sweep.skipped) == len(plans)
            _stop(procs, graceful=complete)
            messages.close()
            messages.cancel_join_thread()
        return sweep

