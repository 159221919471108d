"""`mgpu-bench comm --tune`, the running part: each NCCL setting measured in a process of its own
(this module run as `python -m`, a trial), and the whole tuning run. Why a fresh process: this
folder's __init__; what is tried: trials.py; the rule that recommends: rule.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from mgpu_bench.results.measurement import CommMeasurement, CommRequest

from ..plan import CommConfig, CommRun
from .rule import Tuning
from .trials import (
    DEFAULT,
    SCOPED_SYNTAX,
    TAG,
    Candidate,
    Nvls,
    Trial,
    TuneConfig,
    channel_candidates,
    channels_in,
    cut_bands,
    first_candidates,
    nvls_after,
    nvls_before,
    tune_requests,
    unread,
)


def _child_main() -> int:
    """A trial: reads its spec (JSON) on stdin, measures each request on one fresh communicator
    over the GPUs, and prints each raw result as a TAG line on stdout as it is taken."""
    from mgpu_bench import _native
    from mgpu_bench.core.errors import CommTimeoutError, MgpuError, NcclError, OutOfMemoryError
    from mgpu_bench.machine import nccl_log
    from mgpu_bench.results.measurement import TimingOptions

    from ..plan import native_args

    def emit(**fields: Any) -> None:
        sys.stdout.write(TAG + json.dumps(fields) + "\n")
        sys.stdout.flush()

    spec = json.loads(sys.stdin.read())
    capture = nccl_log.Capture(subsys="INIT,ENV")  # set-up lines only: nothing logged per call
    timing = TimingOptions(**spec["timing"])
    session = None
    code = 0
    try:
        session = _native.CommSession(spec["gpus"], len(spec["gpus"]), 0, _native.nccl_unique_id(),
                                      float(spec["timeout_s"]))
        capture.release_environment()
        for i, r in enumerate(spec["requests"]):
            args = native_args(CommRequest(*r), timing)
            args.corrupt_rank = int(spec.get("corrupt_rank", -1))
            raw = session.measure(args)
            emit(kind="result", index=i, raw={"counts": dict(raw["counts"]), "iters": int(raw["iters"]),
                                             "batch": int(raw["batch"]),
                                             "burst_seconds": [float(x) for x in raw["burst_seconds"]],
                                             "samples": raw["samples"].tolist(), "wrong": [int(x) for x in raw["wrong"]]})
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - any fault ends the trial; the parent keeps what came before
        stopped = ("out_of_memory" if isinstance(exc, OutOfMemoryError) else "timeout"
                   if isinstance(exc, CommTimeoutError) else "nccl_error" if isinstance(exc, NcclError) else "error")
        emit(kind="error", stopped=stopped,
             message=str(exc) if isinstance(exc, MgpuError) else f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        if session is not None:
            del session
        log = capture.read()
        capture.close()
    channels, nvls = channels_in(log)
    emit(kind="log", channels=channels, nvls_channels=nvls, warnings=nccl_log.warnings_in(log), read=bool(log))
    return code


def run_trial(candidate: Candidate, requests: Sequence[CommRequest], gpus: Sequence[int], devices: Sequence[str],
              cfg: CommConfig, run: int = 1, corrupt_rank: int = -1, keep: list[Trial] | None = None) -> Trial:
    """Runs one trial in a child process with the environment plus the candidate's variables.
    Faults of the trial (an NCCL error, a timeout, a crash) end it with `error` set and what it
    measured kept; Ctrl-C and SIGTERM here end the child and propagate, the trial marked
    interrupted and already in `keep` (where it is appended first). corrupt_rank: a test hook
    (that rank overwrites an element after the checked call)."""
    import select
    import subprocess
    import tempfile

    from ..plan import spec_of

    trial = Trial(candidate, run)
    if keep is not None:
        keep.append(trial)
    todo = [r for r in requests if r.op in candidate.ops]
    spec = {"gpus": list(gpus), "requests": [[r.op, r.dtype, r.redop, r.size, r.inplace, r.root] for r in todo],
            "timing": {k: getattr(cfg.timing, k) for k in cfg.timing.__dataclass_fields__},
            "timeout_s": cfg.timeout_s, "corrupt_rank": corrupt_rank}
    from mgpu_bench.core import children

    env = {**os.environ, **dict(candidate.env)}
    # A backstop beyond the session's own timeout (set-up and every size), for a child that hangs.
    deadline = time.monotonic() + cfg.timeout_s * (len(todo) + 2) + 60.0
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as errfile:
        proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.probes.comm.tune.run"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errfile,
                                env=children.child_env(env))  # the trial dies with this process
        try:
            proc.stdin.write(json.dumps(spec).encode())
            proc.stdin.close()
            buf = b""
            fd = proc.stdout.fileno()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    trial.error, trial.stopped = (f"no answer within {cfg.timeout_s * (len(todo) + 2) + 60:.0f} s: "
                                                  "the trial was killed"), "timeout"
                    break
                if not select.select([fd], [], [], min(left, 0.5))[0]:
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    _take(trial, line.decode(errors="replace"), todo, devices, cfg, spec_of)
            if trial.stopped != "timeout":  # its output is closed: let it finish exiting
                try:
                    proc.wait(timeout=max(5.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    trial.error, trial.stopped = "the trial process did not exit: it was killed", "timeout"
        except KeyboardInterrupt:
            trial.error, trial.stopped = "interrupted", "interrupted"
            trial.wall_seconds = time.perf_counter() - t0
            raise
        finally:
            if proc.poll() is None:
                _end(proc)
            proc.stdout.close()
        code = proc.wait()
        if trial.error is None and code != 0:
            errfile.seek(0)
            said = [ln for ln in errfile.read().decode(errors="replace").splitlines() if ln.strip()]
            trial.error = f"the trial process ended with exit code {code}" + (f": {said[-1].strip()}" if said else "")
            trial.stopped = "error"
    trial.wall_seconds = time.perf_counter() - t0
    return trial


def _take(trial: Trial, line: str, todo: Sequence[CommRequest], devices: Sequence[str], cfg: CommConfig,
          spec_of: Callable) -> None:
    """One line of a trial's stdout: a result, its error or NCCL's log facts (other lines, such
    as NCCL's own output when the user set NCCL_DEBUG, are not the trial's)."""
    if not line.startswith(TAG):
        return
    msg = json.loads(line[len(TAG):])
    if msg["kind"] == "result":
        req, raw = todo[msg["index"]], msg["raw"]
        spec = spec_of(req, raw["counts"], "native", list(devices), cfg.timing.graph)
        trial.measurements.append(CommMeasurement.from_raw(spec, raw, cfg.timing.check))
    elif msg["kind"] == "error":
        trial.error, trial.stopped = msg["message"], msg["stopped"]
    elif msg["kind"] == "log":
        trial.channels, trial.nvls_channels, trial.warnings = msg["channels"], msg["nvls_channels"], msg["warnings"]


def _end(proc) -> None:
    """Ends a trial process: SIGTERM, then SIGKILL after a few seconds."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_tune(cfg: TuneConfig, progress: Callable[[int, int, str], None] | None = None) -> tuple[CommRun, Tuning]:
    """Plans and runs the trials in order; the first default trial's measurements are the run's
    (comm's tables, history and headline read them). Faults keep what was measured: the
    default's failure stops the run, a setting's is that setting's; Ctrl-C stops the run."""
    from mgpu_bench import _native
    from mgpu_bench.core.errors import interruption

    from ..analyse import nvls_note
    from ..plan import check_memory, resolve_backend, ring_theory_for

    backend, devices, gpus = resolve_backend(cfg)
    bands = cut_bands(cfg.sizes, cfg.sizes_per_band)
    requests = tune_requests(cfg, bands)
    check_memory(requests, len(devices), gpus)
    run = CommRun(backend=backend, devices=devices, requests=requests)
    run.theory, run.topology = ring_theory_for(gpus)
    note = nvls_note(run.topology, dict(os.environ))
    if note:
        run.notes.append(note)
    version = int(_native.nccl_version())
    early = nvls_before(os.environ)
    tuning = Tuning(tuple(cfg.ops), bands, version, early or Nvls(False, "not known before the default ran"))
    if version < SCOPED_SYNTAX:
        tuning.notes.append(f"NCCL {version} predates per-collective NCCL_ALGO/NCCL_PROTO (2.24): those settings "
                            "apply to every collective")
    set_ = sorted({k for k in os.environ if k in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS",
                                                  "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_NVLS_ENABLE")})
    if set_:
        tuning.notes.append("the default is this environment as it is, with "
                            + ", ".join(f"{k}={os.environ[k]}" for k in set_) + " set")
    default = Candidate((), DEFAULT, tuple(cfg.ops))
    t0 = time.perf_counter()
    cand = default
    queue: list[tuple[Candidate, int]] = [(default, 1)]
    planned = 1 + len(first_candidates(cfg.ops, version, early or Nvls(False, ""))) + 2 + 1
    i = 0
    try:
        while queue:
            cand, n = queue.pop(0)
            if progress:
                progress(i, max(planned, i + 1 + len(queue)), cand.label + (" (again)" if n == 2 else ""))
            trial = run_trial(cand, requests, gpus, devices, cfg, n, keep=tuning.trials)
            i += 1
            if cand.group == DEFAULT and n == 1:
                run.measurements = list(trial.measurements)
                if trial.error:
                    run.stopped = trial.stopped or "error"
                    run.stop_message = f"the default settings failed: {trial.error}; nothing to tune against"
                    break
                tuning.nvls = early or nvls_after(trial.nvls_channels, os.environ)
                more = first_candidates(cfg.ops, version, tuning.nvls) + channel_candidates(cfg.ops, trial.channels)
                if trial.channels is None:
                    tuning.notes.append(f"the default's channel count is unknown ({unread(os.environ)}): channel "
                                        "settings not tried")
                queue += [(c, 1) for c in more] + [(default, 2)]
                planned = i + len(queue)
            elif cand.group == DEFAULT:
                together = tuning.advice().combined
                if together is not None:
                    queue.append((together, 1))
                    planned += 1
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the trials measured so far are kept
        run.measurements = list(tuning.trials[0].measurements) if tuning.trials else []
        run.stopped = "interrupted"
        done = sum(1 for t in tuning.trials if t.stopped != "interrupted")
        run.stop_message = (f"{interruption(exc)} while measuring {cand.label}; the {done} setting(s) measured before "
                            "are kept")
    run.wall_seconds = time.perf_counter() - t0
    for t in tuning.wrong:
        run.findings.append(f"{t.candidate.label} gave {t.wrong} wrong element(s): NCCL returned wrong data with "
                            "this setting; it is never recommended")
    return run, tuning


if __name__ == "__main__":
    sys.exit(_child_main())
