"""The check's parts on one node, each inside its slot of the budget (budget.py).

On GPUs, in this order (cheapest and most telling first):
  health     NVML per GPU (health.py): uncorrected ECC errors, retired pages pending, remapped
             rows pending or failed, PCIe generation and width against the maximum, NVLinks down,
             a power limit below the default; the driver against the CUDA runtime
  processes  the other processes on the GPUs before the check touched them (occupancy.py)
  gemm       on every GPU at once, the native cuBLASLt bf16 GEMM the gemm probe uses (the
             heuristic's first algorithm, its result checked on a sample against fp64), with NVML's
             clock-event reasons sampled beside it
  hbm        on every GPU at once, a device-to-device copy by the copy engine (read + written)
  allreduce  the node's own NCCL allreduce over all its GPUs (2 or more), checked element by element
  sdc        a short silent-data-corruption pass: the same bf16 GEMMs with one pinned algorithm on
             every GPU, hashed, repeated (a GPU whose hash changes is unstable, one whose hash differs
             from its peers' of the same model wrong), and a pattern written over half of the free
             HBM and read back
On CPU processes (no GPU): health (the host's own facts) and the ranks part (cpu.py): --nproc
gloo processes, each timing a GEMM and a copy in turn, then their allreduce.

GPU work runs in a thread per GPU; the main thread waits until the part's slot ends. Work that
has not returned by then is stopped where it can be (the GEMM probe's stop(), the communicator's
abort) and otherwise abandoned: the part is "hung", the GPU parts after it are skipped (they
would queue behind it), and the check ends with what it has.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from mgpu_bench.core.errors import MgpuError, defer_sigterm

from .budget import Budget
from .result import CheckConfig, CheckRun, Part

__all__ = ["CheckConfig", "CheckRun", "Part", "gpu_devices", "on_gpus_until", "run_check"]

GEMM_N = 8192  # bf16 8192^3: 1.1 TFLOP, about 1.5 ms on an H200; the size the gemm probe's default measures
GEMM_TOLERANCE = 1e-2  # the gemm probe's bf16 bound on the checked sample's relative error
GEMM_WORKSPACE = 32 << 20  # cuBLAS's recommendation for Hopper, as the gemm probe uses
HBM_BYTES = 1 << 30  # per buffer: 2 GiB moved per copy
ALLREDUCE_BYTES = 256 << 20  # fp32: NCCL's rings are within 20% of their plateau from 256 MiB (ANCHORS)
SDC_SHAPE = 4096  # bf16 4096^3: a fifth of a millisecond per GEMM on an H200
SDC_GEMMS = 16
SDC_HBM_FRACTION = 0.5  # of the free memory, in whole 2 MiB pages
SEED = 20261201
GRACE_S = 1.0  # after a slot: for work told to stop to return


def gpu_devices(gpus: Sequence[int]) -> list[dict]:
    from mgpu_bench import _native

    out = []
    for g in gpus:
        info = _native.device_info(g)
        out.append({"name": f"gpu{g}", "index": g, "model": str(info["name"]), "bus_id": str(info["pci_bus_id"]),
                    "multiprocessors": int(info["multiprocessors"]), "memory": int(info["total_memory"])})
    return out


def run_check(cfg: CheckConfig, node: str, budget: Budget, environment: Mapping, occupancy=None,
              say: Callable[[str], None] | None = None, state: Callable[[str], None] | None = None) -> CheckRun:
    """Every part that fits in the budget, in order; Ctrl-C and SIGTERM end the check with the
    parts done kept (run.stopped). `state(part)` is told each part as it starts (the command's
    account of where a killed check was)."""
    say = say or (lambda _t: None)
    state = state or (lambda _p: None)
    t0 = time.monotonic()
    devices = gpu_devices(cfg.gpus) if cfg.gpus else [{"name": f"rank{r}", "index": r, "model": "cpu"}
                                                     for r in range(cfg.nproc)]
    run = CheckRun(cfg, node, devices)
    if cfg.gpus:
        steps: list[tuple[str, Callable[[CheckRun, Budget, Part], None]]] = [
            ("health", lambda r, b, p: _health_gpu(r, p, environment)),
            ("processes", lambda r, b, p: _processes(r, p, occupancy)),
            ("gemm", _gemm), ("hbm", _hbm), ("allreduce", _allreduce), ("sdc", _sdc)]
    else:
        from .cpu import ranks

        steps = [("health", lambda r, b, p: _health_cpu(r, p, environment)),
                 ("processes", lambda r, b, p: _no_gpu(p)), ("ranks", ranks)]
    hung = None
    try:
        for name, fn in steps:
            part = Part(name, expected_s=round(budget.expected(name), 2))
            run.parts.append(part)
            if name == "allreduce" and len(devices) < 2:
                part.status, part.why = "skipped", "one GPU: no allreduce within the node"
                continue
            if hung is not None and name in ("gemm", "hbm", "allreduce", "sdc"):
                part.status, part.why = "skipped", f"the {hung} part's GPU work never returned"
                continue
            why = budget.fits(name)
            if why:
                part.status, part.why = "skipped", why
                continue
            say(f"{name}: {', '.join(d['name'] for d in devices) if name not in ('health', 'processes') else 'node'}")
            state(name)
            started = time.monotonic()
            try:
                fn(run, budget, part)
            except MgpuError as exc:  # a GPU fault outside any one GPU's work (the communicator, NVML)
                part.status, part.why = "failed", str(exc).split(" [", 1)[0]
                part.errors["node"] = part.why
            except Exception as exc:  # noqa: BLE001 - the check's own failure: said, and the verdict is unknown
                part.status, part.why = "error", f"{type(exc).__name__}: {exc}"
            part.seconds = time.monotonic() - started
            budget.done(name, part.seconds)
            if part.status == "hung":
                hung = name
        defer_sigterm()  # measured: a stop signal now waits while the verdict is reached and the run is written
    except KeyboardInterrupt as exc:
        from mgpu_bench.core.errors import interruption

        run.stopped, run.stop_message = "interrupted", f"{interruption(exc)}: the parts done so far are kept"
    run.wall_seconds = time.monotonic() - t0
    return run


# -- threads per GPU, bounded ----------------------------------------------------------------------


def on_gpus_until(devices: Sequence[dict], fn: Callable[[dict], Any], until: float,
                  stop: Callable[[], None] = lambda: None) -> tuple[dict[str, Any], dict[str, BaseException], list[str]]:
    """fn(device) on every GPU at once, each in a daemon thread, the main thread waiting until
    `until` (time.monotonic()). -> (results, errors, hung), keyed by device name: a thread still
    working then is told to stop (`stop()`), given GRACE_S, and otherwise left behind as hung.
    Ctrl-C stops the work the same way and is raised."""
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}
    done = {d["name"]: threading.Event() for d in devices}

    def work(dev: dict) -> None:
        try:
            results[dev["name"]] = fn(dev)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors[dev["name"]] = exc
        finally:
            done[dev["name"]].set()

    for d in devices:
        threading.Thread(target=work, args=(d,), daemon=True, name=f"check-{d['name']}").start()
    try:
        for d in devices:
            while not done[d["name"]].wait(min(0.1, max(0.0, until - time.monotonic()))):
                if time.monotonic() >= until:
                    break
    except KeyboardInterrupt:
        stop()
        for ev in done.values():
            ev.wait(GRACE_S)
        raise
    if not all(ev.is_set() for ev in done.values()):
        stop()
        for ev in done.values():
            ev.wait(GRACE_S)
    hung = [name for name, ev in done.items() if not ev.is_set()]
    return results, errors, hung


def _settle(part: Part, errors: Mapping[str, BaseException], hung: Sequence[str], what: str) -> None:
    """Per-GPU errors into the part (a GPU fault is the GPU's; anything else the check's own) and
    the hung GPUs into its status."""
    for name, exc in errors.items():
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        if isinstance(exc, MgpuError):
            part.errors[name] = str(exc).split(" [", 1)[0]
        else:
            part.status, part.why = "error", f"{type(exc).__name__}: {exc}"
    if part.errors and part.status == "measured":
        part.status = "failed"
        part.why = "; ".join(f"{n}: {e}" for n, e in part.errors.items())
    if hung:
        part.status = "hung"
        part.why = f"{what} on {', '.join(hung)} did not return within the part's slot"


# -- the parts on GPUs -----------------------------------------------------------------------------


def _health_gpu(run: CheckRun, part: Part, environment: Mapping) -> None:
    from mgpu_bench.machine import health

    for d in run.devices:
        facts = health.facts(d["bus_id"])
        part.facts[d["name"]] = {"facts": facts, "findings": health.findings(facts)}
    part.facts["versions"] = {k: environment.get(k) for k in ("nvidia_driver", "cuda_driver", "cuda_runtime", "nccl",
                                                               "cublaslt")}


def _processes(run: CheckRun, part: Part, occupancy) -> None:
    """The foreign processes on the GPUs before the check touched them (the runner's snapshot)."""
    from mgpu_bench.machine import occupancy as occ

    before = getattr(occupancy, "before", None)
    if before is None:  # no watch (run outside the runner): look now
        before = occ.snapshot({d["index"]: d["bus_id"] for d in run.devices})
    if before.get("error"):
        part.status, part.why = "failed", f"NVML: {before['error']}"
        return
    names = {d["index"]: d["name"] for d in run.devices}
    part.facts["foreign"] = [{**asdict(p), "device": names.get(p.gpu, f"gpu{p.gpu}")} for p in occ.foreign(before)]
    part.facts["memory"] = {names.get(int(g), f"gpu{g}"): {"used": v.get("memory_used"), "total": v.get("memory_total"),
                                                           "utilization": v.get("utilization")}
                            for g, v in (before.get("gpus") or {}).items()}


def _gemm(run: CheckRun, budget: Budget, part: Part) -> None:
    from mgpu_bench import _native
    from mgpu_bench.machine import telemetry

    until = budget.slot("gemm")
    probes: dict[str, Any] = {}
    flops = 2.0 * GEMM_N**3

    def one(dev: dict) -> dict:
        p = _native.GemmProbe(dev["index"], "bf16", "NN", GEMM_N, GEMM_N, GEMM_N, GEMM_WORKSPACE, SEED, False, 0)
        probes[dev["name"]] = p
        left = until - time.monotonic()
        samples = 10 if left > 2.0 else 5
        sample_s = min(0.05, max(0.005, left / (4 * samples)))
        raw = p.measure(GEMM_N, GEMM_N, GEMM_N, 1, samples, sample_s, 2, True)
        return dict(raw["candidates"][0])

    bus = {d["index"]: d["bus_id"] for d in run.devices}
    with telemetry.Sampler(bus, interval_s=0.1) as sampler:
        t0 = time.monotonic()
        got, errors, hung = on_gpus_until(run.devices, one, until, lambda: [p.stop() for p in probes.values()])
        t1 = time.monotonic()
    for d in run.devices:
        c = got.get(d["name"])
        if not c:
            continue
        seconds = [s for s in c.get("seconds") or [] if s > 0]
        if not seconds:
            part.errors[d["name"]] = c.get("error") or "the GEMM gave no timing"
            continue
        tele = None if sampler.error else telemetry.summarize(sampler.window(d["index"], t0, t1, 0.1),
                                                              sampler.static.get(d["index"]))
        part.figures.append({"device": d["name"], "kind": "gemm", "value": flops / statistics.median(seconds),
                             "unit": "FLOP/s", "samples": [flops / s for s in seconds],
                             "detail": {"shape": f"{GEMM_N}x{GEMM_N}x{GEMM_N}", "dtype": "bf16",
                                        "max_error": c.get("max_error"), "tolerance": GEMM_TOLERANCE,
                                        "algo": c.get("algo_id"), "telemetry": tele}})
    probes.clear()
    _settle(part, errors, hung, "the GEMM")


def _hbm(run: CheckRun, budget: Budget, part: Part) -> None:
    from mgpu_bench import _native

    until = budget.slot("hbm")

    def one(dev: dict) -> dict:
        return dict(_native.hbm_bandwidth(dev["index"], "copy_ce", HBM_BYTES, 2, 20))

    got, errors, hung = on_gpus_until(run.devices, one, until)
    for d in run.devices:
        raw = got.get(d["name"])
        if not raw:
            continue
        moved = int(raw["bytes_read"]) + int(raw["bytes_written"])
        seconds = [s for s in raw["seconds"] if s > 0]
        part.figures.append({"device": d["name"], "kind": "copy", "value": moved / statistics.median(seconds),
                             "unit": "B/s", "samples": [moved / s for s in seconds],
                             "detail": {"bytes": HBM_BYTES, "engine": "copy engine"}})
    _settle(part, errors, hung, "the copy")


def _allreduce(run: CheckRun, budget: Budget, part: Part) -> None:
    from mgpu_bench import _native
    from mgpu_bench.machine import theory, topo
    from mgpu_bench.results.measurement import CommMeasurement, CommSpec

    until = budget.slot("allreduce")
    gpus = [d["index"] for d in run.devices]
    box: dict[str, Any] = {}

    def work(_dev: dict) -> dict:
        session = _native.CommSession(gpus, len(gpus), 0, _native.nccl_unique_id(), max(1.0, until - time.monotonic()))
        box["session"] = session
        a = _native.MeasureArgs()
        a.op, a.dtype, a.redop, a.bytes, a.inplace = "allreduce", "fp32", "sum", ALLREDUCE_BYTES, False
        a.warmup_iters, a.iters, a.min_iters, a.max_iters = 3, 0, 10, 200
        a.min_time_s = max(0.02, min(0.2, (until - time.monotonic()) / 4))
        a.sample_target_s, a.check = 0.5e-3, True
        return session.measure(a)

    def abort() -> None:
        if "session" in box:
            box["session"].abort()

    got, errors, hung = on_gpus_until(run.devices[:1], work, until, abort)
    raw = got.get(run.devices[0]["name"])
    if raw is not None:
        counts = raw["counts"]
        spec = CommSpec("allreduce", "fp32", "sum", ALLREDUCE_BYTES, int(counts["bytes"]), int(counts["count"]),
                        len(gpus), False, "native", tuple(f"cuda:{g}" for g in gpus))
        m = CommMeasurement.from_raw(spec, raw, True)
        ring = theory.ring_theory(topo.collect(), theory.cuda_devices(gpus))
        samples = [m.spec.bytes / s * 2 * (len(gpus) - 1) / len(gpus) for s in m.per_sample if s > 0]
        part.figures.append({"device": "node", "kind": "allreduce", "value": m.busbw, "unit": "B/s", "samples": samples,
                             "detail": {"bytes": m.spec.bytes, "ranks": len(gpus), "wrong": m.total_wrong,
                                        "iters": m.iters, "theory": ring.bandwidth, "path": ring.summary}})
    box.clear()
    _settle(part, {("node" if k == run.devices[0]["name"] else k): v for k, v in errors.items()}, hung and ["node"],
            "the allreduce")


def _sdc(run: CheckRun, budget: Budget, part: Part) -> None:
    from mgpu_bench import _native

    until = budget.slot("sdc")
    probes: dict[str, Any] = {}
    n = SDC_SHAPE

    def make(dev: dict) -> None:
        probes[dev["name"]] = _native.SdcProbe(dev["index"], "bf16", n, n, n, SEED)

    _, errors, hung = on_gpus_until(run.devices, make, until, lambda: [p.stop() for p in probes.values()])
    ready = [d for d in run.devices if d["name"] in probes and d["name"] not in errors and d["name"] not in hung]
    groups: dict[tuple[str, int], list[dict]] = {}
    for d in ready:
        groups.setdefault((d["model"], d["multiprocessors"]), []).append(d)
    for members in groups.values():  # one algorithm per model, so that peers' hashes may be compared
        blob = probes[members[0]["name"]].select_algo()["blob"]
        for d in members[1:]:
            probes[d["name"]].set_algo(blob)

    def check(dev: dict) -> dict:
        p = probes[dev["name"]]
        raw = p.gemm(SDC_GEMMS)
        free = _native.mem_get_info(dev["index"])[0]
        size = int(free * SDC_HBM_FRACTION) // (2 << 20) * (2 << 20)
        hbm = None
        if size and time.monotonic() < until:
            p.hbm_allocate(size)
            hbm = dict(p.hbm_check(SEED))
            p.hbm_release()
        return {"gemms": len(raw["hashes"]), "differs": bool(raw["differs"]), "hash": f"0x{p.reference_hash:016x}",
                "hbm_bytes": size if hbm else 0, "hbm_mismatches": int(hbm["mismatches"]) if hbm else None}

    done, errors2, hung2 = on_gpus_until(ready, check, until, lambda: [p.stop() for p in probes.values()])
    for d in run.devices:
        if d["name"] in done:
            part.facts[d["name"]] = {**done[d["name"]], "peers": [x["name"] for x in groups[(d["model"], d["multiprocessors"])]]}
    probes.clear()
    _settle(part, {**errors, **errors2}, [*hung, *hung2], "the sdc pass")


# -- CPU processes ---------------------------------------------------------------------------------


def _health_cpu(run: CheckRun, part: Part, environment: Mapping) -> None:
    """What a host without GPUs tells: NVML's absence (a note), its load and memory."""
    import os

    from mgpu_bench.machine.selection import host_available_memory, no_gpu_reason

    part.facts["host"] = {"cpus": os.cpu_count(), "load_1m": (environment.get("host_load") or {}).get("load_1m"),
                          "memory_available": host_available_memory(), "gpus": no_gpu_reason()}


def _no_gpu(part: Part) -> None:
    part.status, part.why = "skipped", "no GPU: nothing else runs on one"
