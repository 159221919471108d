"""`mgpu-bench suite`: the three rounds of a throughput stress test, one command.

Round 1, single-GPU baseline; round 2, multi-GPU scaling; round 3, limit throughput. The plan is
what every registered probe contributes (probe.suite_steps), ordered by round and the probe's own
place in it; the suite knows no probe by name.

Each step is the tool's own command run as a child process (`python -m mgpu_bench.cli ...
--json FILE`): a probe that fails, runs out of memory or hangs past its time limit is recorded
with its reason and the suite goes on; its GPU state (CUDA context, NCCL communicators) dies with
it. The suite document holds every probe's own result document unchanged. The children get the
user's environment as it is (NCCL_* included): the suite sets no variable of its own but the mark
that binds each child to it (children.py: a child dies with the suite, and its workers with it).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_bench.core import children
from mgpu_bench.core.errors import (
    InputError,
    defer_sigterm,
    interruption,
    is_sigterm,
    signal_name,
    terminated,
    termination_signal,
)
from mgpu_bench.results import probe as registry
from mgpu_bench.results.document import envelope
from mgpu_bench.results.probe import PlanContext, Step

from .judge import ROUND_TITLES


@dataclass(frozen=True)
class SuiteConfig:
    quick: bool = False
    rounds: tuple[int, ...] = (1, 2, 3)
    duration_s: float = 300.0  # round 3's sustained runs, each
    gpus: tuple[int, ...] = ()  # the selected CUDA devices; () on CPU ranks
    tolerance: float = 0.05  # against the baseline
    model: str | None = None  # --model: the workload of the model and max-batch steps


@dataclass
class SuiteRun:
    config: SuiteConfig
    probes: list[dict] = field(default_factory=list)  # one entry per probe (see document())
    interrupted: bool = False
    stop_message: str | None = None
    wall_seconds: float = 0.0

    @property
    def failed(self) -> list[dict]:
        return [p for p in self.probes if p["status"] in ("failed", "interrupted")]


def parse_rounds(text: str) -> tuple[int, ...]:
    try:
        rounds = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise InputError(f"--rounds '{text}': write round numbers like 1,2 or 1,2,3") from None
    if not rounds or any(r not in ROUND_TITLES for r in rounds):
        raise InputError(f"--rounds '{text}': the rounds are 1, 2 and 3")
    return rounds


def plan(cfg: SuiteConfig) -> list[Step]:
    """Every registered probe's steps for the chosen rounds on cfg.gpus ([]: CPU ranks, where
    the GPU steps stay in the plan and are recorded as skipped), by round and order."""
    ctx = PlanContext(cfg.quick, tuple(cfg.gpus), cfg.duration_s, cfg.model)
    steps = [s for name in registry.names() if name != "suite" for s in registry.get(name).suite_steps(ctx)]
    return sorted((s for s in steps if s.round in cfg.rounds), key=lambda s: (s.round, s.order))


def estimate(cfg: SuiteConfig) -> str:
    """"about N min for K of M probes, start-up included": this process's start-up so far, each
    step that runs here configured from its own arguments and estimated by its probe
    (Probe.estimate) as the command a new process runs (startup.as_new_process(): its start-up
    counted as a new process's on this host now, which a probe whose estimate leaves it out gets
    added), or STEP_GUESS_S where the probe says nothing."""
    import click

    from mgpu_bench.core import startup

    spent = startup.spent_s()
    steps = [s for s in plan(cfg) if len(cfg.gpus) >= s.min_gpus]
    total = spent
    for s in steps:
        seconds, said = STEP_GUESS_S, ""
        with contextlib.suppress(Exception), startup.as_new_process():  # a step whose probe cannot say is guessed
            probe = registry.get(s.args[0])
            params = click.Command(s.args[0], params=probe.options()).make_context(s.args[0], list(s.args[1:])).params
            said = probe.estimate(probe.configure(params)) or ""
            m = re.search(r"about (\d+) (s|min)", said)
            if m:
                seconds = int(m.group(1)) * (60 if m.group(2) == "min" else 1)
        total += seconds + (0.0 if "start-up included" in said else startup.process_s(1))
    return (f"{startup.seconds_text(total)} for {len(steps)} of {len(plan(cfg))} probe(s), start-up included ({spent:.0f} s "
            f"before this line, each probe's process on this host now; their own estimates, {STEP_GUESS_S:.0f} s where "
            "none)")


STEP_GUESS_S = 30.0  # a probe that does not estimate itself


def child_args(step: Step, out: Path | None = None) -> list[str]:
    """The step's command line as the suite runs it: its result document to `out`, no progress
    display, nothing stored (the suite stores the whole run)."""
    return [*step.args, "--json", str(out or "x.json"), "--no-progress", "--no-store"]


def user_command(step: Step) -> list[str]:
    """The step's command as a user would type it again: the probe's hidden options (what the
    suite hands from one of its steps to the next, such as overlap's --model-figures JSON) left
    out; the probe's own result document keeps its whole command line."""
    hidden: dict[str, bool] = {}  # flag -> takes no value
    with contextlib.suppress(Exception):  # a step of no known probe is shown as it is
        for o in registry.get(step.args[0]).options():
            if getattr(o, "hidden", False):
                hidden.update({flag: bool(o.is_flag) for flag in o.opts})
    out, args = ["mgpu-bench"], list(step.args)
    i = 0
    while i < len(args):
        flag, eq, _ = args[i].partition("=")
        if flag in hidden:
            i += 1 if eq or hidden[flag] else 2
            continue
        out.append(args[i])
        i += 1
    return out


def skip_reason(step: Step, ngpu: int) -> str:
    """Why a step does not run on `ngpu` selected GPUs; for a probe that runs on CPU processes by
    itself (Probe.cpu), that the suite runs it on GPUs only, and the command that runs it here."""
    need = f"{step.min_gpus} NVIDIA GPU(s), {ngpu} selected" if ngpu or step.min_gpus > 1 else "an NVIDIA GPU"
    name = step.args[0] if step.args else step.name
    if not ngpu and name in registry.names() and registry.get(name).cpu is True:
        return f"the suite runs {name} on {need.replace(', 0 selected', '')} only; `mgpu-bench {name}` runs on CPU processes"
    return f"needs {need}"


def run_probe(probe: Step, ngpu: int, work: Path, bus_ids: dict[int, str] | None = None, last: bool = False) -> dict:
    """Runs one probe as a child process in its own process group; its entry in the suite
    document. Past probe.timeout_s, or on Ctrl-C (forwarded to the group), the probe gets SIGINT
    and writes what it measured (SIGKILL after 60 s; later Ctrl-Cs are only noted, and the ones
    that abandon the suite kill it: errors.py); after a Ctrl-C, KeyboardInterrupt is raised again
    once the entry is complete. `last`: the suite's last step; once its process has ended, a stop
    signal waits while its entry and the suite's document are written."""
    entry = {"round": probe.round, "name": probe.name, "title": probe.title,
             "command": user_command(probe), "status": "skipped", "error": None, "seconds": 0.0,
             "document": None, "telemetry": None}
    if ngpu < probe.min_gpus:
        entry["error"] = skip_reason(probe, ngpu)
        return entry
    out = work / f"{probe.round}-{probe.name}.json"
    cmd = [sys.executable, "-m", "mgpu_bench.cli", *child_args(probe, out)]
    sampler = None
    if probe.telemetry and bus_ids:
        from mgpu_bench.machine import telemetry

        sampler = telemetry.Sampler(bus_ids, interval_s=0.5)
        sampler.start()
    t0 = time.monotonic()
    log = work / f"{probe.round}-{probe.name}.log"
    interrupted: BaseException | None = None
    timed_out = False
    # Its own session and process group: a stop reaches every process the probe started (torch
    # ranks, DataLoader workers), and its output goes to a file, which no orphan can hold open.
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                env=children.child_env())
        try:
            try:
                proc.wait(timeout=probe.timeout_s)
                if last:  # the last probe has written what it measured: nothing left to measure
                    defer_sigterm()
            except subprocess.TimeoutExpired:
                timed_out = True
                children.stop_group(proc)
            except KeyboardInterrupt as exc:
                interrupted = exc
                children.stop_group(proc)
        finally:
            if proc.poll() is None:  # an error of ours while it was stopping
                children.signal_group(proc, signal.SIGKILL)
                proc.wait()
            children.signal_group(proc, signal.SIGKILL)  # no worker of it outlives it to hold a GPU
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
    elif interrupted is not None or proc.returncode in (129, 130, 143):  # Ctrl-C, SIGHUP, SIGTERM
        how = ("terminated (SIGHUP)" if proc.returncode == 129 else
               interruption(interrupted) if is_sigterm(interrupted) else
               "terminated (SIGTERM)" if proc.returncode == 143 else "interrupted (Ctrl-C)")
        entry["status"], entry["error"] = "interrupted", f"{how}; what it measured is kept"
    else:
        entry["status"] = "ok" if proc.returncode == 0 else "failed"
        if proc.returncode != 0:
            entry["error"] = f"exit code {proc.returncode}: {_last_error(output)}"
    if interrupted is not None:
        raise _Interrupted(entry)
    return entry


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    ours = [ln for ln in lines if ln.startswith("mgpu-bench:")]
    return (ours or lines or ["no message"])[-1][:400]


class _Interrupted(KeyboardInterrupt):
    def __init__(self, entry: dict) -> None:
        super().__init__()
        self.entry = entry


def _telemetry(sampler, t0: float) -> dict:
    from mgpu_bench.machine import telemetry

    return {"error": sampler.error, "interval_s": sampler.interval_s,
            "gpus": {str(i): {"static": sampler.static.get(i), "series": telemetry.series(s, t0),
                              "summary": telemetry.summarize(s, sampler.static.get(i))}
                     for i, s in sampler.samples.items()}}


def run_suite(cfg: SuiteConfig, bus_ids: dict[int, str], say: Callable[[str], None] | None = None) -> SuiteRun:
    """Every step of the plan in order; Ctrl-C ends the suite after the running probe has
    written what it measured (the rest are recorded as skipped)."""
    run = SuiteRun(cfg)
    t0 = time.monotonic()
    ngpu = len(cfg.gpus)
    # named with our pid: a later run removes it should we be killed (children.clean_stale)
    with children.temp_folder("mgpu-bench-suite-") as tmp:
        steps = plan(cfg)
        if say:  # a first line at once; the estimate configures every step's probe, which takes seconds
            here = sum(len(cfg.gpus) >= s.min_gpus for s in steps)
            say(f"{here} of {len(steps)} probe(s) run here, each in a process of its own; estimating how long they take")
            say(estimate(cfg))
        for i, step in enumerate(steps):
            try:
                if step.prepare is not None:  # a step planned from what ran before it
                    step = step.prepare(step, run.probes, lambda s: run_probe(s, ngpu, Path(tmp)))
                if say:
                    say(f"round {step.round} ({ROUND_TITLES[step.round]}), {i + 1}/{len(steps)}: {step.title}")
                entry = run_probe(step, ngpu, Path(tmp), bus_ids, last=i == len(steps) - 1)
                if i == len(steps) - 1:  # measured (or the last step skipped): a stop signal now waits
                    defer_sigterm()
            except KeyboardInterrupt as stop:  # in a probe (_Interrupted: its entry), or between two of them
                if isinstance(stop, _Interrupted):
                    run.probes.append(stop.entry)
                run.interrupted = True
                how = f"terminated ({signal_name(termination_signal())})" if terminated() else "interrupted (Ctrl-C)"
                run.stop_message = f"{how}; the probes measured so far are in the report"
                for rest in steps[i + (1 if isinstance(stop, _Interrupted) else 0):]:
                    run.probes.append({**_skipped(rest), "error": "not run: the suite was interrupted"})
                break
            run.probes.append(entry)
            if say:
                say(f"  {entry['status']} in {entry['seconds']:.1f} s" + (f": {entry['error']}" if entry["error"] else ""))
    run.wall_seconds = time.monotonic() - t0
    return run


def _skipped(p: Step) -> dict:
    return {"round": p.round, "name": p.name, "title": p.title, "command": user_command(p),
            "status": "skipped", "error": None, "seconds": 0.0, "document": None, "telemetry": None}


def document(run: SuiteRun, environment: dict, command: list[str] | None = None) -> dict:
    return {
        **envelope("suite", environment, command), "quick": run.config.quick,
        "rounds": list(run.config.rounds), "duration_s": run.config.duration_s,
        "status": {"completed": not run.interrupted, "stopped": "interrupted" if run.interrupted else None,
                   "message": run.stop_message, "failed": [p["name"] for p in run.failed]},
        "wall_seconds": run.wall_seconds, "probes": run.probes, "findings": [],
    }


def default_report_dir(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now()
    return f"mgpu-bench-suite-{now:%Y%m%d-%H%M%S}"


# The headline metrics whose history the report plots, by the start of their names.
TREND_PREFIXES = ("gemm.", "comm.allreduce.", "memory.", "model.")


TREND_LIMIT = 30


def history_trend(history, doc: dict, per_prefix: int = 2) -> dict[str, list[tuple[str, float, str]]]:
    """metric name -> [(created ISO time, value, unit), ...] oldest first, for a few of this
    suite's headline metrics (the first `per_prefix` of each kind), from the history database."""
    from mgpu_bench.results.probe import headline

    out: dict[str, list[tuple[str, float, str]]] = {}
    taken: dict[str, int] = {}
    for m in headline(doc):
        prefix = next((p for p in TREND_PREFIXES if m.name.startswith(p)), None)
        if prefix is None or taken.get(prefix, 0) >= per_prefix:
            continue
        points = history.trend(m.name, TREND_LIMIT)
        if len(points) >= 2:
            taken[prefix] = taken.get(prefix, 0) + 1
            out[m.name] = [(p.created, p.value, m.unit) for p in points]
    return out
