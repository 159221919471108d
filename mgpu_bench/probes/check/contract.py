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

The verdict comes only from this run: the measuring process hands its document over in a file of
the command's own new temporary folder (hand_over), never through --json, which may hold an
earlier run's document when the process dies before writing. A process that handed nothing over
is unknown (exit 2), or a problem where it was stopped at its deadline inside GPU work. The exit
code is the verdict's even when stdout cannot take the line (closed, full): said on stderr. With
--format npd, bad input is a line on stdout too ("error: ..."), as the condition's message.
Every outside text printed (a reason Slurm holds, a process or GPU name in a finding) is escaped.
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
HANDED = "document.json"  # beside the state file: the measuring process's document, handed over
COMMAND_ENV = "MGPU_BENCH_CHECK_COMMAND"  # the command as typed (JSON list), for the stored run
HISTORY_FALLBACK_ENV = "MGPU_BENCH_HISTORY_FALLBACK"  # history.store.FALLBACK_ENV: store elsewhere if need be
GPU_PARTS = ("gemm", "hbm", "allreduce", "sdc")  # stopped inside one of these: GPU work that never returned
# (the CPU ranks of a host without GPUs stopped at the deadline say only that the host was too slow: unknown)
ERROR_PREFIX = "mgpu-bench: error: "  # the CLI's line for bad input (cli.py)
TERM_GRACE_S = 1.0  # after SIGTERM, for the measuring process to write what it has (at most)
EXIT_S = 0.3  # the command's own end after its last line: the interpreter's exit, measured 0.1-0.2 s here
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
        from mgpu_bench.core.launch import strip_options

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


def _pump(stream, out, errors: list[str] | None = None) -> threading.Thread:
    """Copies the measuring process's lines to `out`; `errors` gets the lines that are its own
    one-line refusals ("mgpu-bench: error: ...")."""

    def copy() -> None:
        for line in iter(stream.readline, ""):
            if errors is not None and line.startswith(ERROR_PREFIX):
                errors.append(line[len(ERROR_PREFIX):].strip())
            with contextlib.suppress(ValueError, OSError):  # our stream closed (a test's runner ended)
                out.write(line)
                out.flush()
        stream.close()

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    return t


def run(cfg) -> int:
    """The whole command: the measuring process within the budget, the verdict, the contract."""
    from mgpu_bench.core import children, slurm

    t_end = time.time() + cfg.budget_s - plan.process_age_s()
    child_end = t_end - plan.reserve_s(cfg.budget_s)
    npd = cfg.format == "npd"
    with children.temp_folder("mgpu-bench-check-") as tmp:
        state_path = os.path.join(tmp, "state")
        # under srun every task checks its own node, as a command of its own: no launcher variables
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        env[plan.CHILD_ENV] = f"{child_end!r} {state_path}"
        env[COMMAND_ENV] = json.dumps([_text(a) for a in sys.argv])
        proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", "check", *user_args()],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=children.child_env(env, mode="keep"), stdin=subprocess.DEVNULL)
        said_error: list[str] = []
        pumps = [_pump(proc.stdout, sys.stderr if npd else _Stdout()), _pump(proc.stderr, sys.stderr, said_error)]
        killed = None
        try:
            proc.wait(timeout=max(0.1, child_end - time.time()))
        except subprocess.TimeoutExpired:
            killed = time.time()
            proc.terminate()
            try:  # its grace comes out of the command's own reserve, never past the budget
                proc.wait(timeout=max(0.1, min(TERM_GRACE_S, (t_end - time.time() - EXIT_S) / 2)))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the measuring process got it too, and writes what it has
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(TERM_GRACE_S, child_end - time.time()))
            if proc.poll() is None:
                proc.kill()
            raise
        for t in pumps:  # its last lines, within what is left
            t.join(timeout=max(0.05, min(1.0, t_end - time.time() - EXIT_S)))
        doc = _read(os.path.join(tmp, HANDED))
        state_part = _read_text(state_path)
    if killed is not None and (doc or {}).get("status", {}).get("stopped") == "interrupted":
        doc = None  # what it handed over as this command stopped it is a run cut short: judged as not handed over
    node = (doc or {}).get("node") or slurm.this_node()
    verdict = _verdict(doc, proc.returncode, killed, state_part, cfg, said_error[-1] if said_error else None)
    if killed is None and proc.returncode in (130, 143) and doc is None:  # Ctrl-C or SIGTERM from outside
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
            _err(f"mgpu-bench: could not drain {node}: {exc}")
    if cfg.resume and state == "ok":
        try:
            said.append(f"{node} in Slurm: {slurm.resume(node, timeout_s=left())}")
        except slurm.SlurmError as exc:
            failed = True
            _err(f"mgpu-bench: could not resume {node}: {exc}")
    out = _Stdout()
    if npd:
        for line in said:
            _err(line)
        out.line(verdict["npd"])
    else:
        if doc is None:  # the measuring process said nothing conclusive itself
            out.line(f"check {node}: {state}: {verdict['reason'] or verdict.get('fix') or ''}")
        for line in said:
            out.line(line)
    out.settle(code)
    if failed and state == "ok":
        return EXIT["unknown"]  # asked to resume, and could not: the scheduler was not told
    return code


def _text(arg: str) -> str:
    """An argument as JSON can carry it: bytes that are not UTF-8 (argv keeps them as lone
    surrogates) as their escapes."""
    return arg.encode("utf-8", "backslashreplace").decode("utf-8")


def _err(line: str) -> None:
    from mgpu_bench.output.console import safe_text

    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(safe_text(line), file=sys.stderr, flush=True)


class _Stdout:
    """The command's stdout, whose failure (closed, full) costs the line and never the verdict's
    exit code: the CLI's own rule (exit 1 where stdout failed, output/console.stdout_verdict) is
    for commands whose 1 means nothing else; here 1 means "drain this node"."""

    def write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stdout.write(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stdout.flush()

    def line(self, text: str) -> None:
        from mgpu_bench.output.console import safe_text

        self.write(safe_text(text) + "\n")
        self.flush()

    @staticmethod
    def settle(code: int) -> None:
        """After the last line: a stdout that failed is said once on stderr, and taken off the
        CLI's account, so that the exit code stays the verdict's `code`."""
        from mgpu_bench.output import console

        failure = console.stdout_failure()
        if failure is None:
            return
        if not isinstance(failure, BrokenPipeError):
            _err(f"mgpu-bench: could not write to stdout ({failure.strerror or failure}): the exit code is the "
                 f"verdict's all the same ({code}: {next(k for k, v in EXIT.items() if v == code)})")
        sys.stdout.failure = None  # said here, once; its later writes are still dropped


def hand_over(doc, state_path: str | None) -> None:
    """In the measuring process: its document, for the command that started it (beside the state
    file, in that command's own new folder), written whole or not at all."""
    if not state_path:
        return
    from mgpu_bench.core.paths import write_json

    with contextlib.suppress(OSError, TypeError, ValueError):
        write_json(os.path.join(os.path.dirname(state_path), HANDED), doc)


def typed_command(fallback: list[str]) -> list[str]:
    """In the measuring process: the command as the user typed it (the command that started it
    passes its argv), else `fallback`."""
    try:
        got = json.loads(os.environ.get(COMMAND_ENV) or "null")
    except ValueError:
        got = None
    return [str(a) for a in got] if isinstance(got, list) and got else fallback


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


def _verdict(doc: dict | None, code: int | None, killed: float | None, part: str | None, cfg,
             error: str | None = None) -> dict:
    """The verdict: the document's; or, when the measuring process handed none over, what is known
    of why: killed at its deadline inside GPU work is a problem of that work; anything else (bad
    input, a crash or a kill before it handed its document over) is unknown."""
    from .analyse import _fit

    if doc is not None:
        return doc["verdict"]
    if killed is not None and part in GPU_PARTS:
        reason = (f"the {part} part did not finish within --budget {cfg.budget_s:g}s: the measuring process was "
                  "stopped inside GPU work that never returned")
        return {"state": "problem", "reason": reason, "npd": _fit(f"{part} hung: killed at --budget {cfg.budget_s:g}s",
                                                                  80), "fix": None}
    if killed is not None:
        # what to do first, as the budget verdict of a check that finished says it (the 80-byte line keeps it)
        fix = (f"give --budget {2 * cfg.budget_s:.0f}s or more: the check did not finish within --budget "
               f"{cfg.budget_s:g}s (in its {part or 'start-up'})")
    elif code == 2:
        if error:
            return {"state": "unknown", "reason": None, "npd": _fit(f"error: {error}", 80), "fix": error}
        fix = "the check refused its input (its line above says why)"
    elif code is not None and code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        fix = (f"the measuring process was killed by {name} {f'in its {part} part ' if part else ''}before it "
               "handed over a result: nothing of this run judged the node")
    else:
        fix = f"the measuring process ended with exit code {code} before writing its result (its lines above say why)"
    return {"state": "unknown", "reason": None, "npd": _fit(f"unknown: {fix}", 80), "fix": fix}


# -- before the measuring: where the history goes, and the npd form of a refusal ---------------------


def history_place() -> None:
    """In the command (not the measuring process), before the runner checks the history: when no
    --db, --no-store or MGPU_BENCH_DB is given, the check asks the history for its fallback
    (history.store.default_place: where the default place cannot take a run, as with no HOME, an
    empty, read-only or special one, it stores in $XDG_STATE_HOME/mgpu-bench, or
    /var/lib/mgpu-bench for root, and says so in the run's notes), through the environment that the
    runner's own check of the history and the measuring process both read. A probe imports no
    history module: this is how it asks."""
    import click

    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx is not None else {}
    _shipped_folder(params)
    if os.environ.get(plan.CHILD_ENV) or params.get("db_path") or params.get("no_store") \
            or "MGPU_BENCH_DB" in os.environ:
        return
    os.environ[HISTORY_FALLBACK_ENV] = "check"


SHIPPED_DB = "/var/lib/mgpu-bench/history.sqlite3"  # the shipped NHC and NPD configurations' --db (and root's fallback)


def _shipped_folder(params) -> None:
    """The folder of SHIPPED_DB, made (0755) when root's --db names it: a new node does not have it
    yet."""
    if params.get("db_path") and os.path.abspath(str(params["db_path"])) == SHIPPED_DB and os.geteuid() == 0:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(SHIPPED_DB), mode=0o755, exist_ok=True)


def format_option(*decls: str, **attrs):
    """The --format option: with --format npd, a command that ends in a refusal (a bad value, an
    unknown option, bad input found before measuring) prints the refusal as one line on stdout too
    ("error: ..."), which node-problem-detector shows as the condition's message; the CLI's own
    line on stderr is unchanged. (Registered when click builds the command's parser, so it sees
    refusals of every option, its own value's included.)"""
    import click

    class _Format(click.Option):
        def add_to_parser(self, parser, ctx):
            root = ctx.find_root()
            if not root.meta.get("mgpu_bench.check.npd_refusal"):
                root.meta["mgpu_bench.check.npd_refusal"] = True
                root.call_on_close(lambda: _npd_refusal(ctx))
            return super().add_to_parser(parser, ctx)

    from mgpu_bench.results.numbers import ascii_type

    attrs["type"] = ascii_type(attrs.get("type"), attrs.get("default"), False)  # as probe.option() declares
    return _Format(list(decls), **attrs)


def _asks_npd(ctx, argv: list[str]) -> bool:
    if ctx.params.get("format_name") == "npd":
        return True
    args = argv[argv.index("check") + 1:] if "check" in argv else []
    return any(a == "--format=npd" or (a == "--format" and i + 1 < len(args) and args[i + 1] == "npd")
               for i, a in enumerate(args))


def _npd_refusal(ctx) -> None:
    """The root context's close, as the command ends: the refusal it ends with, on stdout."""
    import click

    from mgpu_bench.core.errors import InputError

    from .analyse import NPD_MAX, _fit

    exc = sys.exc_info()[1]
    if not isinstance(exc, (click.ClickException, InputError)) or not _asks_npd(ctx, sys.argv):
        return
    text = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
    _Stdout().line(_fit(f"error: {text}", NPD_MAX))
