"""The silent-data-corruption probe: deterministic work on every GPU, repeated, hashed, compared.

The native probe (``_native.SdcProbe``, one per GPU) runs a GEMM with one pinned cuBLASLt
algorithm on inputs generated from the seed, hashing every output on the GPU, and an HBM pattern
check; the native comm session (``_native.CommSession``) runs an allreduce of exact integers that
it checks element by element. This module plans the repetitions, drives every GPU at once (a
thread per GPU, the GIL released while a GPU works), and records each check; when a result
differs it copies the two buffers to the host and locates the first differing element with
analyse.locate_gemm. Which GPU disagrees with which, and the verdicts, are analyse.py's; the
config, checks and run it fills are result.py's (also importable from here).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mgpu_bench.core.errors import OutOfMemoryError, defer_sigterm
from mgpu_bench.machine.per_gpu import Stopped, faults_end_the_run, on_gpus

from .analyse import locate_element, locate_gemm, locate_word, peer_groups, peer_mismatches
from .result import (
    COMM_DTYPE,
    DEFAULT_COMM_BYTES,
    DEFAULT_GEMMS,
    DEFAULT_MEMORY_FRACTION,
    DEFAULT_REPETITIONS,
    DEFAULT_SEED,
    DEFAULT_SHAPE,
    MAX_COMM_BYTES,
    MEMORY_FRACTION_RANGE,
    Check,
    SdcConfig,
    SdcRun,
    parse_shape,
    shape_text,
)
from .shape import DTYPES, MAX_DIM, WORKS

# What this module offers: the run, and the config, records and names it fills them with (defined
# in result.py and shape.py, imported from here by the command, the tests and benchmarks).
__all__ = ["COMM_DTYPE", "DEFAULT_COMM_BYTES", "DEFAULT_GEMMS", "DEFAULT_MEMORY_FRACTION", "DEFAULT_REPETITIONS",
           "DEFAULT_SEED", "DEFAULT_SHAPE", "DTYPES", "HBM_GRANULE", "HBM_TRIES", "MAX_COMM_BYTES", "MAX_DIM",
           "MEMORY_FRACTION_RANGE", "WORKS", "Check", "SdcConfig", "SdcRun", "hex64", "parse_shape", "run_sdc",
           "shape_text"]

HBM_GRANULE = 2 << 20  # the HBM buffer is a multiple of the driver's large page
HBM_TRIES = 3  # allocation attempts, each 10% smaller, when another allocation raced ours


def hex64(value: int) -> str:
    return f"0x{value & (2**64 - 1):016x}"


# ------------------------------------------------------------------------------------ running

def run_sdc(cfg: SdcConfig, devices: Sequence[dict], progress: Callable[[str], None] | None = None,
            inject: Mapping[str, tuple[int, int, int]] | None = None) -> SdcRun:
    """Every repetition on every GPU; Ctrl-C stops after the current work and keeps the checks
    gathered (run.stopped = 'interrupted'); a CUDA, cuBLASLt or NCCL error stops the run
    (run.stopped = 'failed') with them kept too.

    inject: a test hook planting corruption in the product's real path, {work: (gpu, repetition,
    item)}: gemm flips the lowest bit of output element `item` of that repetition's second GEMM
    (its first in repetitions after the first), hbm flips word `item` between write and read,
    collective overwrites the first element of that GPU's output (comm's corrupt_rank)."""
    from mgpu_bench import _native

    run = SdcRun(cfg, [dict(d) for d in devices])
    inject = dict(inject or {})
    t_start = time.monotonic()
    probes: dict[int, Any] = {}
    session = None
    say = progress or (lambda _text: None)
    try:
        with faults_end_the_run(run, probes, "the checks gathered so far are kept"):
            say(f"{cfg.dtype} GEMM {shape_text(cfg.shape)}: inputs generated on every GPU")
            m, n, k = cfg.shape

            def make(dev: dict) -> None:
                probes[dev["index"]] = _native.SdcProbe(dev["index"], cfg.dtype, m, n, k, cfg.seed)

            on_gpus(devices, make, probes)
            _pin_algorithms(run, probes)
            if cfg.comm_bytes:
                gpus = [d["index"] for d in devices]
                session = _native.CommSession(gpus, len(gpus), 0, _native.nccl_unique_id(), cfg.timeout_s)
            t_checks = time.monotonic()
            rep = 0
            while True:
                rep += 1
                _repetition(run, cfg, devices, probes, session, rep, inject, say)
                run.repetitions = rep
                if rep == 1:
                    _compare_peers(run, probes)
                run.check_seconds = time.monotonic() - t_checks
                if (cfg.duration_s > 0 and run.check_seconds >= cfg.duration_s) or \
                        (cfg.duration_s <= 0 and rep >= cfg.repetitions):
                    break
            defer_sigterm()  # measured: a stop signal now waits while the probes and communicators go
    finally:
        if not run.references:  # stopped in the first repetition: the hashes made so far still count
            run.references = {g: hex64(p.reference_hash) for g, p in probes.items() if p.has_reference}
        # Free the GPU memory now (a stopped worker's traceback can hold a probe in a cycle).
        probes.clear()
        session = None
        gc.collect()
    run.wall_seconds = time.monotonic() - t_start
    return run


def _pin_algorithms(run: SdcRun, probes: Mapping[int, Any]) -> None:
    """One algorithm per GPU model (name and SM count): chosen on the model's first GPU, pinned on
    the others. run.algo is the first model's; another model's is said in the notes (its hash is
    compared only among its own GPUs anyway)."""
    for i, gpus in enumerate(peer_groups(run.devices).values()):
        algo = probes[gpus[0]].select_algo()
        for g in gpus[1:]:
            probes[g].set_algo(algo["blob"])
        record = {**algo, "blob": bytes(algo["blob"]).hex(), "chosen_on": gpus[0]}
        if i == 0:
            run.algo = record
        else:
            run.notes.append(f"GPU(s) {', '.join(map(str, gpus))} ({run.device(gpus[0]).get('name')}) are another "
                             f"model: their own algorithm was pinned, algo {algo['algo_id']} tile {algo['tile']} "
                             f"stages {algo['stages']} (blob {record['blob']})")


def _what(cfg: SdcConfig, rep: int, run: SdcRun) -> str:
    if cfg.duration_s > 0:
        return f"repetition {rep} ({run.check_seconds:.0f} s of {cfg.duration_s:g} s)"
    return f"repetition {rep}/{cfg.repetitions}"


def _repetition(run: SdcRun, cfg: SdcConfig, devices: Sequence[dict], probes: Mapping[int, Any], session,
                rep: int, inject: Mapping[str, tuple[int, int, int]], say: Callable[[str], None]) -> None:
    """GEMMs on every GPU, then the collective, then the HBM check (on the first repetition the
    HBM buffer is sized after the other buffers exist). Each work's checks are kept as it ends."""
    where = _what(cfg, rep, run)
    say(f"{where}: {cfg.gemms} GEMMs per GPU")

    def gemm(dev: dict) -> Check:
        g = dev["index"]
        p = probes[g]
        hit = inject.get("gemm")
        corrupt = (1 if rep == 1 and cfg.gemms > 1 else 0, hit[2]) if hit and hit[:2] == (g, rep) else (-1, 0)
        raw = p.gemm(cfg.gemms, *corrupt)
        hashes = list(raw["hashes"])
        check = Check(g, rep, "gemm", len(hashes), len(hashes) * 2 * cfg.output_elements, float(sum(raw["seconds"])),
                      hash=hex64(p.reference_hash))
        if raw["differs"]:
            check.wrong, check.hash = 1, hex64(hashes[-1])
            check.first = locate_gemm(p.output(False), p.output(True), cfg.shape[0], cfg.dtype,
                                      "its own first result (repetition 1, GEMM 1)")
            check.first["gemm"] = len(hashes)
        if p.stopped:
            raise Stopped()
        return check

    _keep(run, devices, on_gpus(devices, gemm, probes))

    if session is not None:
        say(f"{where}: {COMM_DTYPE} allreduce of exact integers")
        _collective(run, cfg, devices, session, rep, inject)

    say(f"{where}: HBM pattern written and read back")

    def hbm(dev: dict) -> Check:
        g = dev["index"]
        p = probes[g]
        if not p.hbm_bytes:
            run.hbm_bytes[g] = _allocate_hbm(p, g, cfg.memory_fraction)
        hit = inject.get("hbm")
        word = hit[2] if hit and hit[:2] == (g, rep) else -1
        raw = p.hbm_check(cfg.seed + rep, word)
        check = Check(g, rep, "hbm", raw["bytes"] // 8, raw["bytes"], raw["write_seconds"] + raw["read_seconds"],
                      wrong=int(raw["mismatches"]))
        if check.wrong:
            check.first = locate_word(raw["first_word"], raw["first_got"], raw["first_want"], raw["bytes"])
        if p.stopped:
            raise Stopped()
        return check

    _keep(run, devices, on_gpus(devices, hbm, probes))


def _keep(run: SdcRun, devices: Sequence[dict], checks: Mapping[int, Check]) -> None:
    run.checks.extend(checks[d["index"]] for d in devices if d["index"] in checks)


def _collective(run: SdcRun, cfg: SdcConfig, devices: Sequence[dict], session, rep: int,
                inject: Mapping[str, tuple[int, int, int]]) -> None:
    """One allreduce (sum) of comm's exact-integer data, its result checked element by element on
    every GPU (the timed iteration count is 1: the check is what counts here)."""
    from mgpu_bench import _native

    gpus = [d["index"] for d in devices]
    a = _native.MeasureArgs()
    a.op, a.dtype, a.redop, a.bytes = "allreduce", COMM_DTYPE, "sum", cfg.comm_bytes
    a.iters, a.warmup_iters, a.min_iters, a.check = 1, 2, 1, True
    hit = inject.get("collective")
    if hit and hit[1] == rep and hit[0] in gpus:
        a.corrupt_rank = gpus.index(hit[0])
    raw = session.measure(a)
    counts = raw["counts"]
    for slot, g in enumerate(gpus):
        check = Check(g, rep, "collective", int(counts["count"]), int(counts["bytes"]), float(raw["burst_seconds"][slot]),
                      wrong=int(raw["wrong"][slot]))
        if check.wrong:
            check.first = locate_element(int(raw["first_wrong"][slot]), float(raw["first_wrong_got"][slot]),
                                         float(raw["first_wrong_want"][slot]))
        run.checks.append(check)


def _allocate_hbm(probe, gpu: int, fraction: float) -> int:
    """The HBM buffer: `fraction` of the GPU's free memory now, in whole 2 MiB pages; 10% less
    on each out-of-memory (another process may have taken memory since it was measured)."""
    from mgpu_bench import _native

    free = _native.mem_get_info(gpu)[0]
    size = int(free * fraction) // HBM_GRANULE * HBM_GRANULE
    for attempt in range(HBM_TRIES):
        if size < HBM_GRANULE:
            break
        try:
            probe.hbm_allocate(size)
            return size
        except OutOfMemoryError:
            if attempt == HBM_TRIES - 1:
                raise
            size = int(size * 0.9) // HBM_GRANULE * HBM_GRANULE
    raise OutOfMemoryError(f"GPU {gpu}: {free / 2**30:.2f} GiB free, too little for an HBM check "
                           f"of {fraction:.0%} of it")


def _compare_peers(run: SdcRun, probes: Mapping[int, Any]) -> None:
    """After the first repetition: every GPU's first GEMM hash, and for each GPU whose hash
    differs from its peers' (analyse.peer_mismatches) the first differing element, located on
    the host from the two outputs."""
    run.references = {g: hex64(p.reference_hash) for g, p in probes.items() if p.has_reference}
    cfg = run.config
    for pm in peer_mismatches(run.references, run.devices):
        a, b = probes[pm["gpu"]].output(True), probes[pm["against"]].output(True)
        first = locate_gemm(a, b, cfg.shape[0], cfg.dtype, f"GPU {pm['against']}'s result")
        run.peer_differences.append({"gpu": pm["gpu"], "against": pm["against"], "work": "gemm", "first": first})


