"""The `mgpu-bench` command line: options and dispatch only.

One command per registered probe (probe.REGISTRY), its options declared by the probe and the
common ones (outputs, history, progress) here; runner.run does the rest. Plus `report` (render a
stored result again), `topo`, and the history commands (history/cli.py).

Exit codes: 0 success; 1 a measurement failed (wrong elements, an NCCL error or timeout, out of
memory) after writing what was gathered; 2 bad input (one line naming the fix); 130 Ctrl-C,
143 SIGTERM (scancel, a launcher stopping its job) and 129 SIGHUP (the terminal or ssh session
closed), after writing what was gathered.
"""

from __future__ import annotations

import inspect
import sys

import click

from .core.errors import InputError, Terminated, terminated, termination_code, termination_signal
from .history.cli import register as register_history
from .history.cli_common import HelpGroup
from .machine import selection
from .output.console import safe_text
from .results import probe as registry
from .results.probe import Probe, option
from .run import runner


class _Group(HelpGroup):
    """Every usage or input error becomes one line on stderr and exit code 2; no command at all
    prints the help (HelpGroup)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            _check_cwd()
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            msg = exc.format_message().replace("\n", " ")
            ctx_hint = ""
            if isinstance(exc, click.UsageError) and exc.ctx is not None:
                ctx_hint = f" (see '{exc.ctx.command_path} --help')"
            click.echo(safe_text(f"mgpu-bench: error: {msg}{ctx_hint}"), err=True)  # may quote stored text
            code = exc.exit_code
        except InputError as exc:
            click.echo(safe_text(f"mgpu-bench: error: {exc}"), err=True)
            code = runner.EXIT_INPUT
        except click.exceptions.Abort:
            stop = Terminated(signum=termination_signal()) if terminated() else "interrupted"
            click.echo(f"mgpu-bench: {stop}", err=True)
            code = runner.EXIT_INTERRUPTED
        else:
            code = rv if isinstance(rv, int) else 0
        if terminated() and code in (0, runner.EXIT_INTERRUPTED):  # SIGTERM or SIGHUP, perhaps while writing
            code = termination_code()  # 143 SIGTERM, 129 SIGHUP
        elif code == 0:
            from .core.errors import interrupted

            if interrupted():  # Ctrl-C while the results were written (they were)
                code = runner.EXIT_INTERRUPTED
        from .output.console import stdout_verdict

        code = stdout_verdict(code)  # a stdout the reader closed or filled: said here, once
        if standalone_mode:
            sys.exit(code)
        return code


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="mgpu-bench")
def cli() -> None:
    """Multi-GPU throughput stress tests: is this box delivering what it should, and if not,
    where is it lost?

    \b
    mgpu-bench comm --sizes 1M-1G     collective bus bandwidth (NCCL), checked
    mgpu-bench links                  GPU-to-GPU and host copy bandwidth, latency, the slow pair
    mgpu-bench topo                   GPUs, NVLinks, PCIe, NICs as data, with findings
    mgpu-bench gemm --dtype bf16,fp8  achievable TFLOP/s per GPU (cuBLASLt), the slow GPU named
    mgpu-bench memory --bandwidth     fragmentation per allocator, HBM bandwidth, torch allocator
    mgpu-bench model --scaling 1,2    training steps: tokens/s, MFU, exposed communication, verdict
    mgpu-bench sdc                    silent data corruption: the same deterministic work on every GPU
    mgpu-bench overlap                allreduce and GEMM together: how much each slows the other
    mgpu-bench comm --tune            which NCCL setting beats the default, per size band
    mgpu-bench fleet                  under srun/torchrun: the bad node, GPU, rail or link of a cluster
    mgpu-bench check --drain          this node fit for jobs, within 60 s: Slurm, NHC, node-problem-detector
    mgpu-bench suite --quick          the three rounds in one report, stored and compared
    mgpu-bench plan --tokens 300B     will it fit, how many GPUs, how many days: from the history
    mgpu-bench history list           stored runs; compare RUN gates on regressions (exit 1)
    """


_OUTPUTS = {
    "json": ("--json", "json_path", click.Path(dir_okay=False), "Write the result document."),
    "csv": ("--csv", "csv_path", click.Path(dir_okay=False), "Write one row per measurement, base units."),
    "report": ("--report", "report_dir", click.Path(file_okay=False),
               "Write PNGs, a self-contained HTML page and a Markdown summary into this folder."),
}


def _check_cwd() -> None:
    """A current folder that was deleted (or moved away) under the shell: every relative path, and
    the libraries that look for their files from it, would fail later with a traceback."""
    import os

    try:
        os.getcwd()
    except OSError as exc:
        raise InputError(f"the current folder is gone ({exc.strerror or exc}: deleted or moved away since the shell "
                         "entered it): cd to an existing folder and run the command again") from None


def _text_options(params: list, values: dict) -> None:
    """Every option whose text the command parses itself (numbers.AsciiText: sizes, lists, durations,
    names) is refused as bad input when it is given but blank (`--duration ''` ran the default), or
    when it is a comma list with an empty entry (`--rounds 1,,2`, `--scaling ,2`; one comma at the
    end stays allowed: `--gpus 2,` is GPU 2, where `--gpus 2` is the first two): one mechanism for
    every command, before any of them reads the value. JSON text (`[...]`, `{...}`) is left to its
    reader."""
    from .results.numbers import AsciiText

    for p in params:
        if not isinstance(p, click.Option) or not isinstance(p.type, AsciiText) or p.multiple:
            continue
        value = values.get(p.name)
        if not isinstance(value, str) or value == p.default:
            continue
        flag = max(p.opts, key=len)
        if not value.strip():
            raise InputError(f"{flag} {value!r} is blank: give a value (see --help), or leave {flag} out for its "
                             "default")
        items = value.split(",")
        inner = items[:-1] if len(items) > 2 or items[0].strip() else items  # "2," (one GPU index) ends in one
        if len(items) > 1 and value.lstrip()[:1] not in ("[", "{") and any(not x.strip() for x in inner):
            kept = [x.strip() for x in items if x.strip()]
            raise InputError(f"{flag} {value!r} has an empty entry between its commas: separate the entries with "
                             "single commas" + (f", as in {','.join(kept)}" if len(kept) > 1 else ""))


def _path_options(params: list, values: dict) -> None:
    """Every file or folder option (click.Path: --json, --csv, --report, --out, --prometheus,
    --data-dir, ...) given as an empty or blank name is refused (paths.check_name): `--report ''`
    wrote into the working folder, `--report ' '` made a folder named with a space."""
    from .core.paths import check_name

    for p in params:
        if isinstance(p, click.Option) and isinstance(p.type, click.Path) and not p.multiple:
            value = values.get(p.name)
            if isinstance(value, str) and value != p.default:
                check_name(value, max(p.opts, key=len))


def _checking_text(command: click.Command) -> None:
    """Has `command` (and, for a group, every command below it) check its text and path options
    (_text_options, _path_options) before it runs."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _checking_text(sub)
        return
    callback = command.callback
    if callback is None or getattr(callback, "_checks_text", False):
        return

    def checked(*args, **kwargs):
        _text_options(command.params, kwargs)
        _path_options(command.params, kwargs)
        return callback(*args, **kwargs)

    checked._checks_text = True  # type: ignore[attr-defined]
    checked.__wrapped__ = callback  # type: ignore[attr-defined]
    command.callback = checked


def common_options(probe: Probe) -> list:
    """The file outputs the probe writes, its progress display and, when it stores, the history
    database and the Prometheus textfile."""
    out = [option(flag, dest, default=None, type=kind, help=probe.output_help.get(key, text))
           for key, (flag, dest, kind, text) in _OUTPUTS.items() if key in probe.outputs]
    out.append(option("--progress/--no-progress", default=probe.progress_default,
                      show_default=probe.progress_default is not None,
                      help=probe.output_help.get("progress", "Progress on stderr: a live display on a terminal, "
                                                 "a plain line every 10 s in a log or pipe [default: on].")))
    if probe.stores:
        out += [
            option("--db", "db_path", default=None, type=click.Path(dir_okay=False),
                   help="History database [default: $MGPU_BENCH_DB, else $XDG_DATA_HOME/mgpu-bench/history.sqlite3]."),
            option("--no-store", is_flag=True, help="Do not keep this run in the history database."),
            option("--prometheus", "prometheus_path", default=None, type=click.Path(dir_okay=False),
                   help="Also write the headline figures in Prometheus' text format here (for node_exporter's "
                        "textfile collector)."),
        ]
    return out


def command(probe: Probe) -> click.Command:
    """The probe's command: its options, the common ones, and the runner's flow."""
    return click.Command(probe.name, params=[*probe.options(), *common_options(probe)], help=probe.help,
                         callback=lambda **opts: runner.run(probe, opts))


for _name in registry.names():
    cli.add_command(command(registry.get(_name)))


@cli.command("report")
@click.argument("result")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Folder for the PNGs, report.html and summary.md [default: RESULT-report, beside a file "
                   "or in the current folder for a stored run].")
@click.option("--db", default=None, type=click.Path(dir_okay=False),
              help="History database holding a stored run given as RESULT [default: the user's].")
def report_command(result, out_dir, db) -> int:
    """Renders a result again as PNGs, and for all but links as HTML and Markdown. RESULT is a
    file (any command's --json, or a suite's suite.json) or a stored run (r12, 12 or latest, as
    `mgpu-bench history list` shows them)."""
    return runner.render_again(result, out_dir, db)


@cli.command("topo")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Write the snapshot (the data behind the view) as JSON.")
def topo_command(json_path) -> int:
    """The node as data: GPUs, NVLinks, PCIe links (current vs maximum), the path between
    every pair of GPUs (as nvidia-smi topo -m names it), InfiniBand/RoCE ports; findings on
    top. Without NVIDIA GPUs it says so and shows the host part."""
    return runner.topo(json_path)


register_history(cli)
_checking_text(cli)
_without = selection.without_gpu()  # from the probes' own Probe.cpu
cli.help = f"{inspect.cleandoc(cli.help or '')}\n\n{_without[0].upper()}{_without[1:]}."


def main() -> None:
    from .core.children import hand_down_command
    from .core.errors import handle_stop_signals
    from .core.paths import private_caches
    from .output.console import guard_stdio

    guard_stdio()  # a closed or full stdout never costs a run (output/console.py)
    hand_down_command()  # a run a child stores records what the user typed (children.user_command)
    private_caches()  # HOME=/dev or a read-only HOME: the libraries' caches go elsewhere (paths.py)
    handle_stop_signals()  # SIGTERM and Ctrl-C keep what was measured; repeated ones do not break that
    cli.main(prog_name="mgpu-bench")


if __name__ == "__main__":
    main()
