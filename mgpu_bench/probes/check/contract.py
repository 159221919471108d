"""The command `mgpu-bench check` as the scheduler sees it: one process that keeps the budget,
tells the scheduler the verdict, and exits 0 ok, 1 problem, 2 unknown.

It measures in a process of its own (the same command, marked with budget.CHILD_ENV: the
runner's whole flow, stored in the history and written like every probe's run), for three
reasons a single process cannot serve:
- the budget holds even when GPU work never returns (a hung GPU holds its thread in the driver):
  the measuring process is stopped at its deadline (SIGTERM, then SIGKILL), and the command still
  answers within its budget; a check killed inside GPU work names that part as the problem;
- the exit code says ok, problem or unknown (the node-problem-detector plugin contract; the NHC
  check file reads it), whatever the runner's own codes mean;
- with --format npd, stdout holds one line, the condition's message: the measuring process's
  output goes to stderr.
Then the scheduler's contract: --drain on a problem (scontrol update NodeName=<this node>
State=DRAIN Reason="mgpu-bench: <reason>"), --resume on ok (only a node whose reason mgpu-bench
wrote). A check that could not tell (unknown) never drains anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time

from . import budget as plan

EXIT = {"ok": 0, "problem": 1, "unknown": 2}
GPU_PARTS = ("gemm", "hbm", "allreduce", "sdc", "ranks")
TERM_GRACE_S = 1.0  # after SIGTERM, for the measuring process to write what it has
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_STEP_ID",
                 "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def user_args() -> list[str]:
    """The command line as given, without the contract's own options (--drain, --resume,
    --format): from click's parsed parameters where the command runs under click, else argv."""
    import click

    skip = {"drain", "resume", "format_name", "help"}
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.command.name != "check":
        argv = sys.argv[sys.argv.index("check") + 1:] if "check" in sys.argv else []
        from mgpu_bench.launch import strip_options

        return [a for a in strip_options(argv, ("--format",)) if a not in ("--drain", "--resume")]
    out: list[str] = []
    for p in ctx.command.params:
        if p.name in skip or not isinstance(p, click.Option):
            continue
        if ctx.get_parameter_source(p.name) in (click.core.ParameterSource.DEFAULT, None):
            continue
        value = ctx.params.get(p.name)
        if p.is_flag:
            if p.secondary_opts:
                out.append(p.opts[0] if value else p.secondary_opts[0])
            elif value:
                out.append(p.opts[0])
        elif value is not None:
            out += [p.opts[0], str(value)]
    return out


def _pump(stream, out) -> threading.Thread:
    def copy() -> None:
        for line in iter(stream.readline, ""):
            with contextlib.suppress(ValueError, OSError):  # our stream closed (a test's runner ended)
                out.write(line)
                out.flush()
        stream.close()

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    return t


def run(cfg) -> int:
    """The whole command: the measuring process within the budget, the verdict, the contract."""
    from mgpu_bench import children, slurm

    t_end = time.time() + cfg.budget_s - plan.process_age_s()
    child_end = t_end - plan.reserve_s(cfg.budget_s)
    with children.temp_folder("mgpu-bench-check-") as tmp:
        args = user_args()
        json_path = _json_of(args) or os.path.join(tmp, "check.json")
        if _json_of(args) is None:
            args += ["--json", json_path]
        state_path = os.path.join(tmp, "state")
        # under srun every task checks its own node, as a command of its own: no launcher variables
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        env[plan.CHILD_ENV] = f"{child_end!r} {state_path}"
        npd = cfg.format == "npd"
        proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", "check", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=children.child_env(env, mode="keep"),
                                stdin=subprocess.DEVNULL)
        pumps = [_pump(proc.stdout, sys.stderr if npd else sys.stdout), _pump(proc.stderr, sys.stderr)]
        killed = None
        try:
            proc.wait(timeout=max(0.1, child_end - time.time()))
        except subprocess.TimeoutExpired:
            killed = time.time()
            proc.terminate()
            try:
                proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the measuring process got it too, and writes what it has
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(TERM_GRACE_S, child_end - time.time()))
            if proc.poll() is None:
                proc.kill()
            raise
        for t in pumps:
            t.join(timeout=1.0)
        doc = _read(json_path)
        state_part = _read_text(state_path)
    node = (doc or {}).get("node") or slurm.this_node()
    verdict = _verdict(doc, proc.returncode, killed, state_part, cfg)
    if proc.returncode in (130, 143) and doc is None:
        return proc.returncode
    if (doc or {}).get("status", {}).get("stopped") == "interrupted":
        return 130
    state = verdict["state"]
    code = EXIT[state]
    said: list[str] = []
    failed = False

    def left() -> float:  # the contract's share of the budget
        return max(1.0, t_end - time.time())

    if cfg.drain and state == "problem":
        try:
            why = slurm.drain(node, verdict["reason"], timeout_s=left())
            said.append(f"drained {node} in Slurm: {why}")
        except slurm.SlurmError as exc:
            failed = True
            print(f"mgpu-bench: could not drain {node}: {exc}", file=sys.stderr)
    if cfg.resume and state == "ok":
        try:
            said.append(f"{node} in Slurm: {slurm.resume(node, timeout_s=left())}")
        except slurm.SlurmError as exc:
            failed = True
            print(f"mgpu-bench: could not resume {node}: {exc}", file=sys.stderr)
    if npd:
        for line in said:
            print(line, file=sys.stderr)
        print(verdict["npd"], flush=True)
    else:
        if doc is None:  # the measuring process said nothing conclusive itself
            print(f"check {node}: {state}: {verdict['reason'] or verdict.get('fix') or ''}", flush=True)
        for line in said:
            print(line, flush=True)
    if failed and state == "ok":
        return EXIT["unknown"]  # asked to resume, and could not: the scheduler was not told
    return code


def _json_of(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--json" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--json="):
            return a.split("=", 1)[1]
    return None


def _read(path: str) -> dict | None:
    """The measuring process's document, when it wrote a whole one of this kind."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") != "check" or not isinstance(doc.get("verdict"), dict):
        return None
    return doc


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _verdict(doc: dict | None, code: int | None, killed: float | None, part: str | None, cfg) -> dict:
    """The verdict: the document's; or, when the measuring process wrote none, what is known of
    why: killed at its deadline inside GPU work is a problem of that work; anything else (bad
    input, a crash before its first part) is unknown."""
    from .analyse import _fit

    if doc is not None:
        return doc["verdict"]
    if killed is not None and part in GPU_PARTS:
        reason = (f"the {part} part did not finish within --budget {cfg.budget_s:g}s: the measuring process was "
                  "stopped inside GPU work that never returned")
        return {"state": "problem", "reason": reason, "npd": _fit(f"{part} hung: killed at --budget {cfg.budget_s:g}s",
                                                                  80), "fix": None}
    if killed is not None:
        fix = (f"the check did not finish within --budget {cfg.budget_s:g}s (in its {part or 'start-up'}): give a "
               "longer --budget")
    elif code == 2:
        fix = "the check refused its input (its line above says why)"
    else:
        fix = f"the measuring process ended with exit code {code} before writing its result (its lines above say why)"
    return {"state": "unknown", "reason": None, "npd": _fit(f"unknown: {fix}", 80), "fix": fix}
