"""`mgpu-bench comm`: runs the sweep plan.py prepared on its backend: the native core (one
process driving every GPU through CommSession), torch.distributed worker processes
(torch_backend.py), or one rank of a launcher's job (joined.py).

Every finished measurement is kept whatever stops the sweep (out of memory at one size, an NCCL
error or timeout, Ctrl-C); the fault becomes run.stopped and its one-line message.
"""

from __future__ import annotations

import os
import time

from mgpu_bench import _native
from mgpu_bench.core.errors import InputError, defer_sigterm
from mgpu_bench.machine.env import process_seconds
from mgpu_bench.results.measurement import CommMeasurement

from .analyse import explain_above_theory, nvls_note
from .joined import run_joined
from .plan import (
    CommConfig,
    CommRun,
    ProgressFn,
    check_dtype_support,
    check_memory,
    launcher,
    native_args,
    nvlink_rank_pairs,
    plan,
    resolve_backend,
    ring_theory_for,
    spec_of,
    stop,
)


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
        note = nvls_note(run.topology, dict(os.environ))
        if note:
            run.notes.append(note)
    t0 = time.perf_counter()
    try:
        try:
            if le is not None:
                run_joined(run, cfg, le, gpus, progress)
            elif backend == "native":
                _run_native(run, cfg, gpus, progress)
            else:
                _run_torch(run, cfg, gpus, progress)
            defer_sigterm()  # inside the try: a stop signal raises in it (and is kept below) or waits
        except KeyboardInterrupt as exc:  # a stop where the backend does not catch it (its teardown): kept
            if run.stopped is None:
                stop(run, exc, run.requests[min(len(run.measurements), len(run.requests) - 1)])
    finally:
        run.wall_seconds = time.perf_counter() - t0
        run.process_seconds = process_seconds()
    return run


def _run_native(run: CommRun, cfg: CommConfig, gpus: list[int], progress: ProgressFn | None) -> None:
    from mgpu_bench.machine import nccl_log

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
            raw = session.measure(native_args(req, cfg.timing))
            spec = spec_of(req, raw["counts"], run.backend, run.devices, cfg.timing.graph)
            run.measurements.append(CommMeasurement.from_raw(spec, raw, cfg.timing.check))
        defer_sigterm()  # measured: a stop signal from here on waits while the communicators go
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - any fault: keep what was measured, say why
        stop(run, exc, req)
    finally:
        if session is not None:
            del session  # communicators destroyed (or left aborted) here
        _read_transports(run, capture, gpus)


def _read_transports(run: CommRun, capture, gpus: list[int]) -> None:
    """NCCL's own account of the transports, set against what the topology allows."""
    from mgpu_bench.machine import nccl_log

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


def sized_out_notes(requests: list, skipped: list[tuple[int, str]]) -> list[str]:
    """One note per series (op, dtype, placement) whose largest sizes were not started on CPU
    processes, naming the sizes, the projection and what runs them."""
    from mgpu_bench.results.sizes import format_bytes

    series: dict[tuple, list[tuple[int, str]]] = {}
    for i, why in skipped:
        r = requests[i]
        series.setdefault((r.op, r.dtype, r.redop, r.inplace), []).append((r.size, why))
    out = []
    for (op, dtype, redop, inplace), items in series.items():
        sizes = [format_bytes(size) for size, _ in items]
        named = sizes[0] if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]} ({len(sizes)} sizes)"
        kind = f"{dtype}{' ' + redop if redop else ''}, {'in-place' if inplace else 'out-of-place'}"
        out.append(f"{op} ({kind}): {named} not run on these CPU processes (gloo): {items[0][1]}")
    return out


def _run_torch(run: CommRun, cfg: CommConfig, gpus: list[int], progress: ProgressFn | None) -> None:
    from .torch_backend import cpu_allotments, run_sweep

    device = "cuda" if run.backend == "torch-nccl" else "cpu"
    allot = cpu_allotments(run.requests, run.nranks, cfg.timing, cfg.timeout_s) if device == "cpu" else None
    revision = _Revision(allot, run.nranks) if allot is not None else None

    def advance(i: int) -> None:
        if i + 1 >= len(run.requests):  # the last one measured (or left out): a stop signal waits while the
            defer_sigterm()  # ranks end (seconds on a busy host); it no longer raises into run_sweep's teardown
        note = revision.after(i) if revision is not None else None
        if progress and i + 1 < len(run.requests):
            progress(i + 1, len(run.requests), run.requests[i + 1], note)

    def on_result(i: int, raw: dict) -> None:
        req = run.requests[i]
        spec = spec_of(req, raw["counts"], run.backend, run.devices, False)
        run.measurements.append(CommMeasurement.from_raw(spec, raw, cfg.timing.check))
        advance(i)

    if progress:
        progress(0, len(run.requests), run.requests[0])
    sweep = run_sweep(run.requests, nproc=run.nranks, device=device, timing=cfg.timing,
                      timeout_s=cfg.timeout_s, on_result=on_result, gpus=gpus or None,
                      on_skip=lambda i, _why: advance(i), allot=allot,
                      on_ready=revision.ready if revision is not None else None)
    run.notes += sized_out_notes(run.requests, sweep.skipped)
    failed_at = run.requests[min(len(run.measurements) + len(sweep.skipped), len(run.requests) - 1)]
    if sweep.interrupted:
        stop(run, sweep.interruption or KeyboardInterrupt(), failed_at)
    elif sweep.error is not None:
        stop(run, sweep.error, failed_at)


class _Revision:
    """The first estimate revised as the measured rate says (cpu_sizing.revised_seconds): a
    progress note when it moves by more than a fifth (and 5 s) from the figure last said, and
    once when the rate is well below the guess, that sizes will be left out."""

    def __init__(self, allot: list[float], nranks: int) -> None:
        from .cpu_sizing import startup_seconds

        self.allot = allot
        self.said = startup_seconds(nranks) + sum(allot)  # the first estimate
        self.started: float | None = None
        self.startup = 0.0
        self.slow_said = False
        self.note: str | None = None

    def ready(self) -> None:
        self.started = time.monotonic()
        self.startup = process_seconds() or 0.0

    def after(self, done: int) -> str | None:
        """The note for the progress line after requests 0..done (the last one said, if any)."""
        from .cpu_sizing import format_seconds, revised_seconds

        if self.started is None:
            return self.note
        used = time.monotonic() - self.started
        revised = revised_seconds(self.allot, done, used, self.startup)
        so_far = sum(self.allot[: done + 1])
        if revised is None or so_far < 1.0:  # too little measured to say
            return self.note
        if abs(revised - self.said) > max(0.2 * self.said, 5.0):
            self.said = revised
            self.note = f"revised to {format_seconds(revised)} in all at the measured rate"
        elif not self.slow_said and used > 1.5 * so_far:
            self.slow_said = True
            self.note = (f"the measured rate is {used / so_far:.1f}x below the estimate's guess: sizes that do not "
                         f"fit their share are left out, to keep within {format_seconds(self.said)}")
        return self.note
