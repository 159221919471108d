"""`mgpu-bench suite`: the three rounds of a throughput stress test, one command.

Round 1, single-GPU baseline: GEMM per dtype on every GPU, HBM bandwidth and fragmentation, the
model's training step on one GPU. Round 2, multi-GPU scaling: collective sweeps, GPU-to-GPU links,
the model over 1..N GPUs. Round 3, limit throughput: the largest batch that fits, then a sustained
GEMM and a sustained training run with clocks, power, temperature and throttle reasons over time.

Each probe is the tool's own command run as a child process (`python -m mgpu_bench.cli ...
--json FILE`): a probe that fails, runs out of memory or hangs past its time limit is recorded
with its reason and the suite goes on; its GPU state (CUDA context, NCCL communicators) dies with
it. The suite document holds every probe's own result document unchanged.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_bench.errors import InputError, is_sigterm

ROUNDS = {1: "single-GPU baseline", 2: "multi-GPU scaling", 3: "limit throughput"}
QUIET_COMMANDS = ("comm", "gemm", "memory", "model")  # those with a progress display to turn off
SUITE_MODEL = "350m"  # the model of round 1 and 3 on GPUs (ANCHORS: 40% MFU on one H200)


@dataclass(frozen=True)
class Probe:
    round: int
    name: str
    title: str
    args: tuple[str, ...]  # the mgpu-bench command line after "mgpu-bench"
    min_gpus: int = 1  # 0: runs on CPU ranks too
    telemetry: bool = False  # the suite samples NVML while it runs (round 3)
    timeout_s: float = 900.0


@dataclass(frozen=True)
class SuiteConfig:
    quick: bool = False
    rounds: tuple[int, ...] = (1, 2, 3)
    duration_s: float = 300.0  # round 3's sustained runs, each
    gpus: str | None = None  # as every command's --gpus


@dataclass
class SuiteRun:
    config: SuiteConfig
    probes: list[dict] = field(default_factory=list)  # one entry per probe (see document())
    interrupted: bool = False
    wall_seconds: float = 0.0

    @property
    def failed(self) -> list[dict]:
        return [p for p in self.probes if p["status"] in ("failed", "interrupted")]


def parse_rounds(text: str) -> tuple[int, ...]:
    try:
        rounds = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise InputError(f"--rounds '{text}': write round numbers like 1,2 or 1,2,3") from None
    if not rounds or any(r not in ROUNDS for r in rounds):
        raise InputError(f"--rounds '{text}': the rounds are 1, 2 and 3")
    return rounds


def gpu_spec(gpus: list[int]) -> str:
    """--gpus for exactly these CUDA devices: "N" for the first N, else indices ("3," for one)."""
    if gpus == list(range(len(gpus))):
        return str(len(gpus))
    return ",".join(map(str, gpus)) + ("," if len(gpus) == 1 else "")


def _counts(n: int) -> str:
    """1, 2, 4, ... up to n, and n itself."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return ",".join(map(str, [*out, n]))


def plan(cfg: SuiteConfig, gpus: list[int], sustained_steps: int = 0) -> list[Probe]:
    """The probes of the chosen rounds on the selected CUDA devices `gpus` ([]: CPU ranks, where
    the GPU probes stay in the plan and are recorded as skipped). `sustained_steps`: the
    sustained model run's steps, from round 1's step time (0: a default)."""
    q = cfg.quick
    ngpu = len(gpus)
    g = ("--gpus", gpu_spec(gpus)) if ngpu else ()
    one = ("--gpus", gpu_spec(gpus[:1])) if ngpu else ()  # the first selected GPU
    dur = f"{cfg.duration_s:g}s"
    if ngpu:
        model = ("--model", SUITE_MODEL, "--seq-len", "2048", "--batch-size", "8")
        steps = ("--steps", "12", "--warmup-steps", "3") if q else ("--steps", "30", "--warmup-steps", "5")
        probes = [
            Probe(1, "gemm", "GEMM per GPU and dtype",
                  ("gemm", "--dtype", "bf16,fp8" if q else "fp64,tf32,fp16,bf16,fp8", *g)),
            Probe(1, "memory", "HBM bandwidth and fragmentation",
                  ("memory", "--bandwidth", "--pattern", "grow-shrink" if q else "all", "--allocator",
                   "cudaMalloc,async" if q else "all", *g)),
            Probe(1, "model-1gpu", "training step on one GPU",
                  ("model", *model, *steps, *one, *(("--data", "both") if not q else ()))),
            Probe(2, "comm", "collective bus bandwidth",
                  ("comm", "--ops", "allreduce,allgather,reducescatter" if q else
                   "allreduce,allgather,reducescatter,alltoall,broadcast,sendrecv",
                   "--sizes", "1M-1G", "--factor", "4" if q else "2", "--outofplace", *g), min_gpus=2),
            Probe(2, "links", "GPU-to-GPU links", ("links", *(("--iters", "5") if q else ()), *g), min_gpus=2),
            Probe(2, "model-scaling", "training steps over GPU counts",
                  ("model", *model, *steps, "--scaling", _counts(ngpu), "--no-profile" if q else "--profile", *g),
                  min_gpus=2),
            Probe(3, "max-batch", "largest batch that fits",
                  ("memory", "--no-churn", "--max-batch", SUITE_MODEL, "--seq-len", "2048", *one)),
            Probe(3, "gemm-sustained", "sustained GEMM",
                  ("gemm", "--dtype", "bf16", "--duration", dur, *g), telemetry=True,
                  timeout_s=cfg.duration_s + 600),
            Probe(3, "model-sustained", "sustained training",
                  ("model", *model, "--steps", str(sustained_steps or 50), "--warmup-steps", "3",
                   "--no-exposed-comm", "--no-profile", *g), telemetry=True, timeout_s=cfg.duration_s * 3 + 600),
        ]
    else:  # CPU ranks: what needs no GPU runs (gloo, the tiny model), the rest is skipped
        tiny = ("--model", "tiny", "--steps", "8" if q else "20", "--warmup-steps", "2")
        probes = [
            Probe(1, "gemm", "GEMM per GPU and dtype", ("gemm",)),
            Probe(1, "memory", "HBM bandwidth and fragmentation", ("memory", "--bandwidth")),
            Probe(1, "model-1gpu", "training step on one process", ("model", *tiny, "--nproc", "1"), min_gpus=0),
            Probe(2, "comm", "collective bus bandwidth",
                  ("comm", "--backend", "torch", "--nproc", "2", "--ops", "allreduce,allgather", "--sizes",
                   "1K-1M", "--factor", "32", "--outofplace"), min_gpus=0),
            Probe(2, "links", "GPU-to-GPU links", ("links",), min_gpus=2),
            Probe(2, "model-scaling", "training steps over process counts",
                  ("model", *tiny, "--scaling", "1,2"), min_gpus=0),
            Probe(3, "max-batch", "largest batch that fits", ("memory", "--no-churn", "--max-batch", "tiny")),
            Probe(3, "gemm-sustained", "sustained GEMM", ("gemm", "--duration", dur)),
            Probe(3, "model-sustained", "sustained training",
                  ("model", "--model", "tiny", "--steps", str(sustained_steps or 40), "--warmup-steps", "2",
                   "--nproc", "1", "--no-exposed-comm", "--no-profile"), min_gpus=0,
                  timeout_s=cfg.duration_s * 3 + 600),
        ]
    return [p for p in probes if p.round in cfg.rounds]


def sustained_steps(model_doc: dict | None, duration_s: float) -> int:
    """Steps that fill `duration_s` at the median step time of an earlier model run with the
    most GPUs (at least 20); 0 when there is none."""
    try:
        run = max((r for r in model_doc["runs"] if r.get("derived")), key=lambda r: r.get("world", 1))
        return max(20, int(duration_s / run["derived"]["step_s"]))
    except (TypeError, KeyError, ValueError, ZeroDivisionError):
        return 0


def _with_steps(args: tuple[str, ...], steps: int, warmup: int) -> tuple[str, ...]:
    """A model command line with its --steps and --warmup-steps values replaced."""
    out = list(args)
    for flag, value in (("--steps", steps), ("--warmup-steps", warmup)):
        out[out.index(flag) + 1] = str(value)
    return tuple(out)


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    ours = [ln for ln in lines if ln.startswith("mgpu-bench:")]
    return (ours or lines or ["no message"])[-1][:400]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # as the host requires; the user's value wins
    return env


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop_group(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGINT to the probe's process group (it writes what it measured and exits), SIGKILL to
    the group after `grace_s`."""
    _signal_group(proc, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
    _signal_group(proc, signal.SIGKILL)  # anything of it still alive after the probe itself ended


def run_probe(probe: Probe, ngpu: int, work: Path, bus_ids: dict[int, str] | None = None) -> dict:
    """Runs one probe as a child process in its own process group; its entry in the suite
    document. Past probe.timeout_s, or on Ctrl-C (forwarded to the group), the probe gets SIGINT
    and writes what it measured (SIGKILL after 60 s); after a Ctrl-C, KeyboardInterrupt is
    raised again once the entry is complete."""
    entry = {"round": probe.round, "name": probe.name, "title": probe.title,
             "command": ["mgpu-bench", *probe.args], "status": "skipped", "error": None, "seconds": 0.0,
             "document": None, "telemetry": None}
    if ngpu < probe.min_gpus:
        entry["error"] = (f"needs {probe.min_gpus} NVIDIA GPU(s), {ngpu} selected" if ngpu or probe.min_gpus > 1
                          else "needs an NVIDIA GPU")
        return entry
    out = work / f"{probe.round}-{probe.name}.json"
    quiet = ("--no-progress",) if probe.args[0] in QUIET_COMMANDS else ()
    cmd = [sys.executable, "-m", "mgpu_bench.cli", *probe.args, "--json", str(out), *quiet, "--no-store"]
    sampler = None
    if probe.telemetry and bus_ids:
        from mgpu_bench import telemetry

        sampler = telemetry.Sampler(bus_ids, interval_s=0.5)
        sampler.start()
    t0 = time.monotonic()
    log = work / f"{probe.round}-{probe.name}.log"
    interrupted: BaseException | None = None
    timed_out = False
    # Its own session and process group: a stop reaches every process the probe started (torch
    # ranks, DataLoader workers), and its output goes to a file, which no orphan can hold open.
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=_child_env(), start_new_session=True)
        try:
            try:
                proc.wait(timeout=probe.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop_group(proc)
            except KeyboardInterrupt as exc:
                interrupted = exc
                _stop_group(proc)
        finally:
            if proc.poll() is None:  # a second Ctrl-C while it was stopping
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            _signal_group(proc, signal.SIGKILL)  # no worker of it outlives it to hold a GPU
            entry["seconds"] = time.monotonic() - t0
            if sampler is not None:
                sampler.stop()
                entry["telemetry"] = _telemetry(sampler, t0)
    output = log.read_text(errors="replace")
    if out.exists():
        try:
            entry["document"] = json.loads(out.read_text())
        except (OSError, ValueError) as exc:
            entry["error"] = f"its result file could not be read: {exc}"
    if timed_out:
        entry["status"], entry["error"] = "failed", f"did not finish within {probe.timeout_s:g} s; stopped"
    elif interrupted is not None or proc.returncode in (130, 143):
        how = "terminated (SIGTERM)" if is_sigterm(interrupted) or proc.returncode == 143 else "interrupted (Ctrl-C)"
        entry["status"], entry["error"] = "interrupted", f"{how}; what it measured is kept"
    else:
        entry["status"] = "ok" if proc.returncode == 0 else "failed"
        if proc.returncode != 0:
            entry["error"] = f"exit code {proc.returncode}: {_last_error(output)}"
    if interrupted is not None:
        raise _Interrupted(entry)
    return entry


class _Interrupted(KeyboardInterrupt):
    def __init__(self, entry: dict) -> None:
        super().__init__()
        self.entry = entry


def _telemetry(sampler, t0: float) -> dict:
    from mgpu_bench import telemetry

    return {"error": sampler.error, "interval_s": sampler.interval_s,
            "gpus": {str(i): {"static": sampler.static.get(i), "series": telemetry.series(s, t0),
                              "summary": telemetry.summarize(s, sampler.static.get(i))}
                     for i, s in sampler.samples.items()}}


def run_suite(cfg: SuiteConfig, gpus: list[int], bus_ids: dict[int, str],
              say: Callable[[str], None] | None = None) -> SuiteRun:
    """Every probe of the plan in order; Ctrl-C ends the suite after the running probe has
    written what it measured (the rest are recorded as skipped)."""
    run = SuiteRun(cfg)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mgpu-bench-suite-") as tmp:
        probes = plan(cfg, gpus)
        i = 0
        while i < len(probes):
            p = probes[i]
            if p.name == "model-sustained":  # as many steps as fill --duration, from an earlier step time
                steps = next((n for e in reversed(run.probes) if e["name"].startswith("model")
                              and (n := sustained_steps(e["document"], cfg.duration_s))), 0)
                if not steps:  # no earlier model run (round 1 not asked for, or it failed): time a few
                    calib = run_probe(Probe(3, "model-calibration", "step time for the sustained run",
                                            _with_steps(p.args, 5, 2), min_gpus=p.min_gpus), len(gpus), Path(tmp))
                    steps = sustained_steps(calib["document"], cfg.duration_s)
                p = next(x for x in plan(cfg, gpus, steps) if x.name == "model-sustained")
            if say:
                say(f"round {p.round} ({ROUNDS[p.round]}), {i + 1}/{len(probes)}: {p.title}")
            try:
                entry = run_probe(p, len(gpus), Path(tmp), bus_ids)
            except _Interrupted as stop:
                run.probes.append(stop.entry)
                run.interrupted = True
                for rest in probes[i + 1:]:
                    run.probes.append({**_skipped(rest), "error": "not run: the suite was interrupted"})
                break
            run.probes.append(entry)
            if say:
                say(f"  {entry['status']} in {entry['seconds']:.1f} s" + (f": {entry['error']}" if entry["error"] else ""))
            i += 1
    run.wall_seconds = time.monotonic() - t0
    return run


def _skipped(p: Probe) -> dict:
    return {"round": p.round, "name": p.name, "title": p.title, "command": ["mgpu-bench", *p.args],
            "status": "skipped", "error": None, "seconds": 0.0, "document": None, "telemetry": None}


def document(run: SuiteRun, environment: dict, command: list[str] | None = None) -> dict:
    from mgpu_bench import __version__
    from mgpu_bench.probes.comm.render import RESULT_SCHEMA, RESULT_SCHEMA_VERSION

    return {
        "schema": RESULT_SCHEMA, "schema_version": RESULT_SCHEMA_VERSION, "kind": "suite",
        "tool_version": __version__, "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command, "environment": environment, "quick": run.config.quick,
        "rounds": list(run.config.rounds), "duration_s": run.config.duration_s,
        "status": {"completed": not run.interrupted, "stopped": "interrupted" if run.interrupted else None,
                   "failed": [p["name"] for p in run.failed]},
        "wall_seconds": run.wall_seconds, "probes": run.probes, "findings": [],
    }


def default_report_dir(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now()
    return f"mgpu-bench-suite-{now:%Y%m%d-%H%M%S}"


def write_document(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    tmp.replace(path)


# The headline metrics whose history the report plots, by the start of their names.
TREND_PREFIXES = ("gemm.", "comm.allreduce.", "memory.", "model.")
TREND_LIMIT = 30


def history_trend(history, doc: dict, per_prefix: int = 2) -> dict[str, list[tuple[str, float, str]]]:
    """metric name -> [(created ISO time, value, unit), ...] oldest first, for a few of this
    suite's headline metrics (the first `per_prefix` of each kind), from the history database."""
    from mgpu_bench.metrics import metrics_from_document

    out: dict[str, list[tuple[str, float, str]]] = {}
    taken: dict[str, int] = {}
    for m in metrics_from_document(doc):
        prefix = next((p for p in TREND_PREFIXES if m.name.startswith(p)), None)
        if prefix is None or taken.get(prefix, 0) >= per_prefix:
            continue
        points = history.trend(m.name, TREND_LIMIT)
        if len(points) >= 2:
            taken[prefix] = taken.get(prefix, 0) + 1
            out[m.name] = [(p.created, p.value, m.unit) for p in points]
    return out
