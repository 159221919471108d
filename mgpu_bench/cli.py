"""The `mgpu-bench` command line: a thin click layer over the library.

Exit codes: 0 success; 1 a measurement failed (wrong elements, an NCCL error or timeout, out of
memory) after writing what was gathered; 2 bad input (one line naming the fix); 130 Ctrl-C
and 143 SIGTERM (scancel, a launcher stopping its job), after writing what was gathered.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .errors import InputError, defer_sigterm, terminated
from .measurement import TimingOptions
from .paths import check_report_dir, check_writable

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
MAX_ITERS = 1_000_000


class _Group(click.Group):
    """Every usage or input error becomes one line on stderr and exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            msg = exc.format_message().replace("\n", " ")
            ctx_hint = ""
            if isinstance(exc, click.UsageError) and exc.ctx is not None:
                ctx_hint = f" (see '{exc.ctx.command_path} --help')"
            click.echo(f"mgpu-bench: error: {msg}{ctx_hint}", err=True)
            code = exc.exit_code
        except InputError as exc:
            click.echo(f"mgpu-bench: error: {exc}", err=True)
            code = EXIT_INPUT
        except click.exceptions.Abort:
            click.echo(f"mgpu-bench: {'terminated (SIGTERM)' if terminated() else 'interrupted'}", err=True)
            code = EXIT_INTERRUPTED
        else:
            code = rv if isinstance(rv, int) else 0
        if terminated() and code in (0, EXIT_INTERRUPTED):  # SIGTERM, perhaps while writing the results
            code = EXIT_TERMINATED
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
    mgpu-bench suite --quick          the three rounds in one report, stored and compared
    mgpu-bench history list           stored runs; compare RUN gates on regressions (exit 1)
    """


class _Store:
    """Where a finished run goes besides its output files: the history database (unless
    --no-store) and a Prometheus textfile (--prometheus)."""

    def __init__(self, db: str | None, no_store: bool, prometheus: str | None) -> None:
        self.db, self.no_store, self.prometheus = db, no_store, prometheus

    def check(self) -> None:
        """Before any measurement: a database that cannot be used, or a textfile that cannot be
        written, is bad input now, not a lost run later."""
        check_writable(self.prometheus)
        if not self.no_store:
            from mgpu_bench.history.store import History

            History.open(self.db).close()

    def record(self, make_doc, err) -> bool:
        """Stores the run's document and writes the textfile; one line on stderr each. True when
        either failed (the run's own outputs are already written)."""
        if self.no_store and not self.prometheus:
            return False
        doc = make_doc()
        run_id, failed = None, False
        if not self.no_store:
            from mgpu_bench.history.store import History

            try:
                with History.open(self.db) as h:
                    run_id = h.save(doc)
                    where = h.path
                err.print(f"stored as {run_id} in {where} (mgpu-bench history show {run_id})", highlight=False)
            except (InputError, OSError) as exc:
                err.print(f"mgpu-bench: the run was not stored: {exc}", highlight=False)
                failed = True
        return self.textfile(doc, run_id, err) or failed

    def textfile(self, doc: dict, run_id: str | None, err) -> bool:
        """The Prometheus textfile (--prometheus), if asked for; True when it failed."""
        if not self.prometheus:
            return False
        from mgpu_bench.output.prometheus import write_textfile

        from .metrics import metrics_from_document

        try:
            write_textfile(self.prometheus, metrics_from_document(doc), run_id, doc.get("environment") or {})
        except OSError as exc:
            err.print(f"mgpu-bench: could not write {self.prometheus}: {exc.strerror or exc}", highlight=False)
            return True
        return False


def _store_options(f):
    """--db, --no-store and --prometheus for a command that measures; it receives `store`."""
    import functools

    @functools.wraps(f)
    def wrapper(*args, db_path, no_store, prometheus_path, **kw):
        return f(*args, store=_Store(db_path, no_store, prometheus_path), **kw)

    wrapper = click.option("--prometheus", "prometheus_path", default=None, type=click.Path(dir_okay=False),
                           help="Also write the headline figures in Prometheus' text format here (for "
                                "node_exporter's textfile collector).")(wrapper)
    wrapper = click.option("--no-store", is_flag=True, help="Do not keep this run in the history database.")(wrapper)
    wrapper = click.option("--db", "db_path", default=None, type=click.Path(dir_okay=False),
                           help="History database [default: $MGPU_BENCH_DB, else "
                                "$XDG_DATA_HOME/mgpu-bench/history.sqlite3].")(wrapper)
    return wrapper


# -- comm ------------------------------------------------------------------------------------

_COMM_HELP = """Collective bandwidth sweeps: time, algbw and busbw per size, checked.

\b
Sizes mean what nccl-tests' size column means: the per-rank buffer for allreduce,
broadcast, reduce and sendrecv; the whole gathered output for allgather; the whole input
for reducescatter; the whole per-rank buffer for alltoall. They are rounded down to whole
elements (for allgather, reducescatter and alltoall, to a multiple of the rank count), and
the rounding is printed. alltoall and sendrecv run out-of-place only: with one buffer,
received data would overwrite data not yet sent.

\b
Stopping rule per size: max(2, --warmup-iters) warm-up iterations (the later ones give a
per-iteration estimate, the slowest rank's wins), then --iters iterations, or by default
enough to fill --min-time (0.03 s) at that estimate, at least 20 and at most 10000. The
burst is timed with CUDA events at its two ends only (time = burst / iterations, slowest
rank: nccl-tests' time column); a second pass of the same length records an event every
batch of iterations lasting >= 0.5 ms, which gives the median, p99 and CoV without event
overhead in the time column. --check (on) then runs the op once on known data and counts
wrong elements on the GPU; any wrong element makes the exit code 1.

\b
busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather, reducescatter, alltoall),
x 1 (broadcast, reduce, sendrecv). GB/s = 10^9 bytes/s.
"""


@cli.command("comm", help=_COMM_HELP)
@click.option("--ops", "ops_text", default="allreduce,allgather", show_default=True,
              help="Comma list of allreduce, allgather, reducescatter, broadcast, reduce, alltoall, "
                   "sendrecv, or 'all'.")
@click.option("--sizes", "sizes_text", default=None,
              help="A range 1M-1G (see --factor/--step) or a list 8,1K,64M; K/M/G = 1024^n. "
                   "Default 1M-1G on GPUs, 1K-4M on CPU ranks.")
@click.option("--factor", type=float, default=None, help="Multiply sizes by this over a range [default: 2].")
@click.option("--step", "step_text", default=None, help="Add this many bytes over a range instead.")
@click.option("--dtype", "dtype_text", default="fp32", show_default=True,
              help="fp32, fp16, bf16, fp64, int32, int8, fp8_e4m3, fp8_e5m2.")
@click.option("--redop", default="sum", show_default=True, help="sum, max, min or avg (reducing ops only).")
@click.option("--inplace", "only_inplace", is_flag=True, help="In-place only (default: both).")
@click.option("--outofplace", "only_outofplace", is_flag=True, help="Out-of-place only (default: both).")
@click.option("--gpus", default=None, help="N for the first N GPUs, or indices 0,1 [default: all visible].")
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "native", "torch"]),
              help="auto: native where NVIDIA GPUs are visible, else torch.distributed with gloo on "
                   "CPU processes. torch on GPUs: torch.distributed with NCCL, one process per GPU.")
@click.option("--nproc", default=2, show_default=True, type=int, help="Ranks for torch on CPU.")
@click.option("--iters", default=0, type=int, help="Fixed timed iterations per size (default: by --min-time).")
@click.option("--warmup-iters", default=5, show_default=True, type=int)
@click.option("--min-time", default=TimingOptions.min_time_s, show_default=True, type=float,
              help="Seconds of timed iterations per size when --iters is not given.")
@click.option("--graph", is_flag=True, help="Capture the timed iterations into CUDA graphs (native).")
@click.option("--check/--no-check", default=True, show_default=True, help="Count wrong elements.")
@click.option("--timeout", default=120.0, show_default=True, type=float,
              help="Seconds one size may take before the communicators are aborted.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Write the versioned result document (raw samples included).")
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False),
              help="Write one row per measurement, base units.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write busbw-vs-size PNGs with the theory line, a self-contained HTML page and a "
                   "Markdown summary into this folder.")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr [default: when a terminal].")
@click.option("--launch", "launch_mode", default="single", show_default=True,
              type=click.Choice(["single", "processes"]),
              help="processes: start one process per local GPU (--nproc on CPU) through torch's elastic "
                   "launcher and measure as torchrun would (native backend on GPUs, one communicator per "
                   "process); single: one process drives all GPUs.")
@_store_options
def comm_command(ops_text, sizes_text, factor, step_text, dtype_text, redop, only_inplace, only_outofplace,
                 gpus, backend, nproc, iters, warmup_iters, min_time, graph, check, timeout, json_path,
                 csv_path, report_dir, progress, launch_mode, store) -> int:

    from mgpu_bench.probes.comm import measure as comm
    from mgpu_bench.probes.comm import render as report

    from . import ops
    from .env import backend_versions, fingerprint
    from .sizes import parse_sizes

    op_names = ops.parse_ops(ops_text)
    dtype = ops.parse_dtype(dtype_text)
    redop = redop.strip().lower()
    if redop not in ops.REDOPS:
        raise InputError(f"unknown --redop '{redop}': choose from {', '.join(ops.REDOPS)}")
    if not (0 <= iters <= MAX_ITERS and 0 <= warmup_iters <= MAX_ITERS):
        raise InputError(f"--iters and --warmup-iters must be between 0 and {MAX_ITERS}")
    if not (0 < min_time <= 1e4):
        raise InputError("--min-time must be a positive number of seconds (at most 1e4)")
    if rank_of_launcher() == 0:  # rank 0 alone writes and stores; other nodes may lack its folders
        for path in (json_path, csv_path):
            check_writable(path)
        check_report_dir(report_dir)
        store.check()
    if only_inplace and only_outofplace:
        placements = (False, True)
    elif only_inplace:
        placements = (True,)
    elif only_outofplace:
        placements = (False,)
    else:
        placements = (False, True)
    if sizes_text is None:
        sizes_text = "1M-1G" if comm.visible_gpu_count() > 0 else "1K-4M"
    sizes = parse_sizes(sizes_text, factor, step_text)
    if launch_mode == "processes" and comm.launcher() is None:
        if backend == "native" and comm.visible_gpu_count() == 0:
            comm._native_error_as_input()
        return _relaunch(gpus, nproc, timeout)
    cfg = comm.CommConfig(
        ops=tuple(op_names), dtype=dtype, redop=redop, sizes=tuple(sizes), inplace=placements,
        backend=backend, gpus=gpus, nproc=nproc,
        timing=TimingOptions(warmup_iters=warmup_iters, iters=iters, min_time_s=min_time, graph=graph,
                             check=check),
        timeout_s=timeout,
    )
    out = _out_console()
    err = _err_console()
    show_progress = err.is_terminal if progress is None else progress

    environment = fingerprint()  # before the run: a device fault must not cost the results
    le = comm.launcher()
    if le is not None and le.rank != 0:
        show_progress = False
    run = _run_with_progress(comm.run_comm, cfg, err, show_progress)
    defer_sigterm()  # measured: a SIGTERM from here on waits for the results to be written
    if le is not None and le.rank != 0:  # under a launcher, rank 0 alone prints and writes
        if run.stopped == "interrupted":
            return EXIT_INTERRUPTED  # rank 0 says what was kept; the others hold nothing
        return _stopped(run, err, le.rank) if run.stopped else 0
    environment.update(backend_versions(run.backend))
    if le is not None:
        environment["launcher"] = {"kind": le.launcher, "world_size": le.world_size, "nnodes": run.nnodes or le.nnodes,
                                   "master": f"{le.master_addr}:{le.master_port}"}

    for finding in run.findings:
        out.print(f"finding: {finding}", highlight=False, soft_wrap=True, style="bold yellow")
    for note in run.notes:
        err.print(f"note: {note}", highlight=False)
    if run.measurements:
        report.render_terminal(run, out)
        for line in report.summary_lines(run):
            out.print(line, highlight=False, soft_wrap=True)  # one line each, for grep
    out.print(f"{len(run.measurements)} measurement(s) in {run.wall_seconds:.2f} s wall, "
              f"communicator set-up included", highlight=False)
    doc = _once(lambda: report.result_document(run, environment, sys.argv))
    write_failed = _write_outputs((
        (json_path, lambda p: report.write_json(p, doc())),
        (csv_path, lambda p: Path(p).write_text(report.render_csv(run))),
        (report_dir, lambda p: _write_comm_report(run, p, environment) if run.measurements else None)), err)
    write_failed |= store.record(doc, err) if run.measurements else False
    if run.stopped:
        return _stopped(run, err)
    if run.total_wrong:
        err.print(f"mgpu-bench: {run.total_wrong} wrong element(s): the data did not arrive intact",
                  style="bold red", highlight=False)
        return EXIT_FAILED
    return EXIT_FAILED if write_failed else 0


def _out_console():
    """stdout at 100 columns when not a terminal. markup=False: error texts carry "[file:line]"
    and other outside text that rich would otherwise read as markup tags."""
    from rich.console import Console

    return Console(width=100 if not sys.stdout.isatty() else None, soft_wrap=False, markup=False)


def _err_console():
    from rich.console import Console

    return Console(stderr=True, markup=False, soft_wrap=True)  # one line per message, whatever the width


def _pin_gpus(chosen: list[int]) -> None:
    """Child processes see only the chosen GPUs. The indices count within what is visible now,
    so they are mapped through an existing CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible[g] if g < len(visible) else str(g) for g in chosen)


def _relaunch(gpus: str | None, nproc: int, timeout: float) -> int:
    """The same command again in one process per local GPU (or --nproc CPU processes), started by
    torch's elastic launcher on a localhost rendezvous; the processes join as under torchrun and
    rank 0 prints and writes. Exit code: 0, or 1 when a process failed (it said why)."""
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from mgpu_bench.probes.comm import measure as comm

    from . import launch

    ngpu = comm.visible_gpu_count()
    if ngpu:
        chosen = comm.parse_gpus(gpus, ngpu)
        _pin_gpus(chosen)
        n = len(chosen)
    else:
        if gpus is not None:
            raise InputError("--gpus given but no NVIDIA GPU is visible here")
        n = nproc
    if n < 2:
        raise InputError(f"--launch processes needs at least 2 processes ({n} selected)")
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if arg == "--launch":
            skip = True
            continue
        if arg == "--gpus" or arg.startswith(("--launch=", "--gpus=")):
            skip = arg == "--gpus"  # the GPUs are chosen through CUDA_VISIBLE_DEVICES instead
            continue
        argv.append(arg)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=f"mgpu-bench-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn", rdzv_timeout=int(max(60, timeout)))
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from .errors import interruption, restore_sigterm

    try:
        elastic_launch(lc, sys.executable)("-m", "mgpu_bench.cli", *argv)
    except ChildFailedError as exc:  # the ranks said why; their exit code is ours (2: bad input)
        codes = {f.exitcode for f in exc.failures.values()}
        return next((c for c in (EXIT_INPUT, EXIT_TERMINATED, EXIT_INTERRUPTED) if c in codes), EXIT_FAILED)
    except (KeyboardInterrupt, SignalException) as exc:  # the agent turns Ctrl-C and SIGTERM into SignalException
        click.echo(f"mgpu-bench: {interruption(exc)}", err=True)
        return EXIT_INTERRUPTED
    finally:
        restore_sigterm()  # the agent's handler stays behind otherwise
    return 0


def _with_status(err, show: bool, name: str, fn):
    """fn(say) with a spinner on stderr that say(text) updates (say is None when not shown)."""
    if not show:
        return fn(None)
    with err.status(name) as status:
        return fn(lambda text: status.update(f"{name}: {text}"))


def _stopped(run, err, rank: int = 0) -> int:
    """A run that ended early (run.stopped "interrupted" or "failed"): one line, exit 130 or 1."""
    where = f"rank {rank}: " if rank else ""
    err.print(f"mgpu-bench: {where}{run.stop_message}", highlight=False, style="bold red")
    return EXIT_INTERRUPTED if run.stopped == "interrupted" else EXIT_FAILED


def rank_of_launcher() -> int:
    """This process's rank under torchrun / srun / mpirun, 0 otherwise (rank 0 alone stores)."""
    from .launch import detect

    le = detect()
    return 0 if le is None else le.rank


def _once(make):
    """make() the first time, the same object after (a document written and stored is one)."""
    cache: list = []

    def get():
        if not cache:
            cache.append(make())
        return cache[0]

    return get


def _write_outputs(outputs, err) -> bool:
    """Writes each (path, writer) whose path is set; a path that cannot be written is one line
    on stderr, not a lost run. True when any failed."""
    failed = False
    for path, write in outputs:
        if path:
            try:
                write(path)
            except OSError as exc:
                err.print(f"mgpu-bench: could not write {path}: {exc.strerror or exc}", highlight=False)
                failed = True
    return failed


def _write_comm_report(run, out_dir, environment) -> None:
    from mgpu_bench.probes.comm.report import write_report

    write_report(run, out_dir, environment)




@cli.command("report")
@click.argument("result", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the PNGs, report.html and summary.md.")
def report_command(result, out_dir) -> int:
    """Renders a result file again (any command's --json, or a suite's suite.json) as PNGs, and
    for all but links as HTML and Markdown."""
    import json as _json

    from mgpu_bench.probes.comm import report as comm_report
    from mgpu_bench.probes.gemm import report as gemm_report
    from mgpu_bench.probes.links import measure as links
    from mgpu_bench.probes.memory import report as memory_report
    from mgpu_bench.probes.model import report as model_report

    from .metrics import document_kind

    check_report_dir(out_dir)
    try:
        doc = _json.loads(Path(result).read_text())
    except OSError as exc:
        raise InputError(f"cannot read {result}: {exc.strerror or exc}") from None
    except ValueError:
        raise InputError(f"{result} is not JSON: give a file written by a command's --json") from None
    if not isinstance(doc, dict) or doc.get("schema") != "mgpu-bench/result":
        raise InputError(f"{result} is not an mgpu-bench result: give a file written by --json")
    environment = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    writers = {
        "comm": lambda: comm_report.write_report(comm_report.run_from_document(doc), out_dir, environment),
        "gemm": lambda: gemm_report.write_report(gemm_report.run_from_document(doc), out_dir, environment),
        "memory": lambda: memory_report.write_report(memory_report.run_from_document(doc), out_dir, environment),
        "model": lambda: model_report.write_report(model_report.run_from_document(doc), out_dir, environment),
        "links": lambda: links.write_report(links.run_from_document(doc)[0], out_dir),
    }
    kind = document_kind(doc)
    if kind == "suite":
        from mgpu_bench.suite.report import write_report as write_suite

        paths = write_suite(doc, out_dir)
    elif kind in writers:
        payload = {"comm": "measurements", "gemm": "results", "memory": "hbm", "model": "runs", "links": "measurements"}
        if not isinstance(doc.get(payload[kind]), list):
            raise InputError(f"{result} is a {kind} document without its {payload[kind]}: give a file written by "
                             f"mgpu-bench {kind} --json")
        try:
            paths = writers[kind]()
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{result} is a {kind} document that cannot be read back ({type(exc).__name__}: "
                             f"{exc}): give a file written by mgpu-bench {kind} --json") from None
    else:
        raise InputError(f"{result} is a {kind or 'result'} document of no known kind: give a file written by "
                         "comm, gemm, memory, model, links or suite")
    for p in paths:
        click.echo(str(p))
    return 0


@cli.command("topo")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Write the snapshot (the data behind the view) as JSON.")
def topo_command(json_path) -> int:
    """The node as data: GPUs, NVLinks, PCIe links (current vs maximum), the path between
    every pair of GPUs (as nvidia-smi topo -m names it), InfiniBand/RoCE ports; findings on
    top. Without NVIDIA GPUs it says so and shows the host part."""
    import json as _json

    from . import topo

    check_writable(json_path)
    snapshot = topo.collect()
    out = _out_console()
    topo.render(snapshot, out)
    if json_path:
        try:
            Path(json_path).write_text(_json.dumps(snapshot, indent=1))
        except OSError as exc:
            click.echo(f"mgpu-bench: could not write {json_path}: {exc.strerror or exc}", err=True)
            return EXIT_FAILED
    return 0


@cli.command("links")
@click.option("--gpus", default=None, help="N for the first N GPUs, or indices 0,1 [default: all visible].")
@click.option("--size", "size_text", default="256M", show_default=True, help="Bytes per copy (K/M/G = 1024^n).")
@click.option("--iters", default=10, show_default=True, type=int, help="Timed copies per figure (median reported).")
@click.option("--warmup", default=3, show_default=True, type=int, help="Untimed copies first.")
@click.option("--engines", default="ce,sm", show_default=True, help="ce (copy engines), sm (a kernel reading peer memory).")
@click.option("--latency/--no-latency", default=True, show_default=True, help="Dependent-read latency per pair.")
@click.option("--host/--no-host", default=True, show_default=True, help="Pinned host <-> GPU copies per GPU.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Write the result document.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write GPU x GPU heatmap PNGs into this folder.")
@_store_options
def links_command(gpus, size_text, iters, warmup, engines, latency, host, json_path, report_dir, store) -> int:
    """GPU-to-GPU copy bandwidth and latency for every ordered pair, host copies per GPU, and
    the slow pair or GPU named (each pair against the node's median: robust z-score below -3
    and 10% below the median; needs 3 pairs or more).

    \b
    GB/s = 10^9 bytes/s, per direction: a bidirectional copy moves --size each way.
    """

    from mgpu_bench.probes.comm import render as report
    from mgpu_bench.probes.links import measure as links

    from .env import fingerprint
    from .sizes import parse_size

    size = parse_size(size_text)
    engine_list = tuple(e.strip() for e in engines.split(",") if e.strip())
    if not (1 <= iters <= MAX_ITERS and 0 <= warmup <= MAX_ITERS):
        raise InputError(f"--iters must be between 1 and {MAX_ITERS}, --warmup between 0 and {MAX_ITERS}")
    check_writable(json_path)
    check_report_dir(report_dir)
    gpu_list = links.gpus_or_error(gpus)
    store.check()
    out = _out_console()
    environment = fingerprint()
    try:
        run = links.run_links(gpu_list, size=size, iters=iters, warmup=warmup, engines=engine_list,
                              latency=latency, host=host)
        defer_sigterm()  # measured: a SIGTERM from here on waits for the results to be written
    except KeyboardInterrupt:
        click.echo(f"mgpu-bench: {'terminated (SIGTERM)' if terminated() else 'interrupted'}", err=True)
        return EXIT_INTERRUPTED
    from . import theory, topo

    snapshot = topo.collect()
    hops = theory.pair_hops(snapshot, gpu_list)
    for line in links.findings(run, hops, topo.findings(snapshot)):
        out.print(f"finding: {line}", highlight=False, soft_wrap=True)
    links.render(run, out, hops)
    out.print(f"{len(run.measurements)} measurement(s) in {run.wall_seconds:.2f} s; one ordered pair took "
              f"{run.per_pair_seconds:.2f} s, so 8 GPUs (56 pairs) would take about {run.estimate_seconds(8):.0f} s",
              highlight=False, soft_wrap=True)
    doc = _once(lambda: {"schema": report.RESULT_SCHEMA, "schema_version": report.RESULT_SCHEMA_VERSION,
                         "command": sys.argv, "environment": environment, "topology": snapshot,
                         **links.document(run, hops)})
    err = _err_console()
    write_failed = _write_outputs(((report_dir, lambda p: links.write_report(run, p)),
                                   (json_path, lambda p: report.write_json(p, doc()))), err)
    write_failed |= store.record(doc, err)
    return EXIT_FAILED if write_failed else 0


# -- gemm ------------------------------------------------------------------------------------

_GEMM_HELP = """GEMM compute probe: achievable TFLOP/s per GPU and dtype, against the datasheet peak.

\b
Per dtype and shape, cuBLASLt's heuristic proposes --candidates algorithms; each one is run
once and its output checked on 1024 sampled elements against an fp64 reference (a wrong
algorithm is reported and not counted), then --warmup untimed GEMMs, then --samples bursts
of about --sample-time seconds, each timed with CUDA events at its two ends. The figure is
the fastest candidate's median burst: TFLOP/s = 2*M*N*K / seconds per GEMM / 10^12.
Inputs are random (--init; fp8: e4m3 scaled by 1/8, bf16 output) and rotate among as many
buffer sets as make one GEMM's operands leave L2 before they come round again.

\b
All GPUs run at once (the hotter, realistic case) unless --one-at-a-time; NVML samples
SM clock, power, temperature and throttle reasons every 0.1 s beside each figure. A GPU
below the node's median by more than max(2%, 3x its noise) is named with its likely cause.
--search sweeps M, N and K over --search-range (one short run per shape with the
heuristic's first choice), then measures the best --search-refine shapes in full.
--duration runs the best algorithm that long on every GPU: a TFLOP/s series with clocks,
power and temperature (the limit-throughput round).
"""


@cli.command("gemm", help=_GEMM_HELP)
@click.option("--dtype", "dtype_text", default="bf16", show_default=True,
              help="Comma-separated: fp64, fp32 (no TF32), tf32, fp16, bf16, fp8 (e4m3).")
@click.option("--shape", "shape_text", default="8192", show_default=True,
              help="N for NxNxN, or MxNxK; comma-separated for several.")
@click.option("--layout", default="auto", show_default=True,
              help="cuBLAS op(A) op(B), column-major: NN, NT, TN, TT; auto = NN (torch.matmul's), TN for fp8.")
@click.option("--gpus", default=None, help="N for the first N GPUs, or indices 0,1 [default: all visible].")
@click.option("--one-at-a-time", is_flag=True, help="Measure the GPUs one after another instead of together.")
@click.option("--candidates", default=8, show_default=True, type=int, help="Heuristic algorithms timed per shape.")
@click.option("--samples", default=5, show_default=True, type=int, help="Timed bursts per candidate.")
@click.option("--sample-time", default=0.02, show_default=True, type=float, help="Seconds per burst.")
@click.option("--warmup", default=3, show_default=True, type=int, help="Untimed GEMMs per candidate first.")
@click.option("--check/--no-check", default=True, show_default=True, help="Check each candidate's output.")
@click.option("--search", is_flag=True, help="Find the shape with the highest TFLOP/s over --search-range.")
@click.option("--search-range", default="2048:16384:2048", show_default=True,
              help="START:STOP:STEP for each of M, N and K (the grid is the cube of these values).")
@click.option("--search-refine", default=4, show_default=True, type=int,
              help="Best shapes of the search measured again with every candidate.")
@click.option("--duration", "duration_text", default=None, help="Sustained run per dtype, e.g. 60s, 5m.")
@click.option("--interval", default=0.5, show_default=True, type=float,
              help="Seconds per point of the sustained TFLOP/s series.")
@click.option("--peak", "peak_text", default=None,
              help="Your own dense peaks in TFLOP/s, e.g. bf16=989,fp8=1979 (for GPUs not in the database).")
@click.option("--fp8-fast-accum", is_flag=True, help="fp8: cuBLASLt's fast accumulation (faster, less exact).")
@click.option("--init", default="uniform", show_default=True, type=click.Choice(["uniform", "normal", "positive"]),
              help="Input values: uniform in [-1, 1), standard normal, or uniform in [0, 1). They change the "
                   "power drawn, so TFLOP/s on a power-capped GPU.")
@click.option("--workspace", "workspace_text", default="32M", show_default=True, help="cuBLASLt workspace per GPU.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Write the result document (every candidate's raw seconds, telemetry).")
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False), help="One row per GPU, dtype and shape.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write PNGs (TFLOP/s per GPU against the peak; sustained series), report.html, summary.md.")
@click.option("--progress/--no-progress", default=None, help="Progress on stderr [default: when a terminal].")
@_store_options
def gemm_command(dtype_text, shape_text, layout, gpus, one_at_a_time, candidates, samples, sample_time, warmup,
                 check, search, search_range, search_refine, duration_text, interval, peak_text, fp8_fast_accum,
                 init, workspace_text, json_path, csv_path, report_dir, progress, store) -> int:

    from mgpu_bench.probes.comm import render as report
    from mgpu_bench.probes.gemm import measure as gemm

    from . import _native, hardware
    from .env import fingerprint
    from .sizes import parse_size

    dtypes = gemm.parse_dtypes(dtype_text)
    shapes = gemm.parse_shapes(shape_text)
    layout = gemm.parse_layout(layout)
    for d in dtypes:
        gemm.layout_for(d, layout)
    if not (1 <= candidates <= 64):
        raise InputError("--candidates must be between 1 and 64")
    if not (1 <= samples <= 10_000 and 0 <= warmup <= MAX_ITERS):
        raise InputError(f"--samples must be between 1 and 10000, --warmup between 0 and {MAX_ITERS}")
    if not (0 < sample_time <= 60):
        raise InputError("--sample-time must be a positive number of seconds (at most 60)")
    if not (0.01 <= interval <= 3600):
        raise InputError("--interval must be between 0.01 and 3600 seconds")
    if not (1 <= search_refine <= 64):
        raise InputError("--search-refine must be between 1 and 64")
    grid = gemm.parse_range(search_range) if search else None
    duration = gemm.parse_duration(duration_text) if duration_text else 0.0
    peaks = hardware.parse_peak_overrides(peak_text) if peak_text else {}
    workspace = parse_size(workspace_text)
    if workspace > (4 << 30):
        raise InputError("--workspace above 4G is not useful: cuBLASLt asks for tens of MiB at most")
    for path in (json_path, csv_path):
        check_writable(path)
    check_report_dir(report_dir)
    store.check()
    gpu_list, devices = gemm.devices_or_error(gpus)
    free = {g: _native.mem_get_info(g)[0] for g in gpu_list}
    cfg = gemm.GemmConfig(dtypes=dtypes, shapes=shapes, layout=layout, gpus=tuple(gpu_list), candidates=candidates,
                          samples=samples, sample_s=sample_time, warmup=warmup, check=check,
                          one_at_a_time=one_at_a_time, search=grid, search_refine=search_refine,
                          duration_s=duration, interval_s=interval, workspace=workspace, peak_overrides=peaks,
                          fp8_fast_accum=fp8_fast_accum, init=init)
    gemm.validate(cfg, devices, free)

    out = _out_console()
    err = _err_console()
    show = err.is_terminal if progress is None else progress
    environment = fingerprint()
    run = _with_status(err, show, "gemm", lambda say: gemm.run_gemm(cfg, devices, say))
    defer_sigterm()  # measured: a SIGTERM from here on waits for the results to be written
    for dev in devices:
        for d in dtypes:
            if gemm.peak_for(dev["name"], d, peaks) is None:
                run.notes.append(f"GPU {dev['index']} ({dev['name']}) has no {d} peak in the hardware database: "
                                 f"% of peak is not shown; give one with --peak {d}=TFLOPS")
    if run.telemetry_error:
        run.notes.append(f"no clock/power telemetry: {run.telemetry_error}")
    lines = gemm.findings(run)
    for line in lines:
        out.print(f"finding: {line}", highlight=False, soft_wrap=True, style="bold yellow")
    for note in dict.fromkeys(run.notes):
        err.print(f"note: {note}", highlight=False)
    if run.results:
        gemm.render_terminal(run, out)
    out.print(f"{len(run.results)} measurement(s) in {run.wall_seconds:.2f} s wall, probe set-up and algorithm "
              "selection included", highlight=False)
    doc = _once(lambda: gemm.document(run, environment, sys.argv))
    write_failed = _write_outputs((
        (json_path, lambda p: report.write_json(p, doc())),
        (csv_path, lambda p: Path(p).write_text(gemm.render_csv(run))),
        (report_dir, lambda p: _write_gemm_report(run, p, environment) if run.results else None)), err)
    write_failed |= store.record(doc, err) if run.results else False
    if run.stopped:
        return _stopped(run, err)
    if any(r.wrong for r in run.results):
        err.print("mgpu-bench: wrong GEMM results (see the findings)", style="bold red", highlight=False)
        return EXIT_FAILED
    if any(r.best is None for r in run.results):
        err.print("mgpu-bench: no algorithm ran for some GEMMs (see the findings)", style="bold red",
                  highlight=False)
        return EXIT_FAILED
    return EXIT_FAILED if write_failed else 0


def _write_gemm_report(run, out_dir, environment) -> None:
    from mgpu_bench.probes.gemm.report import write_report

    write_report(run, out_dir, environment)


# -- memory ----------------------------------------------------------------------------------

_MEMORY_HELP = """Device memory: fragmentation per allocator, HBM bandwidth, PyTorch's caching allocator.

\b
Churn probe (on by default): each --pattern runs seeded allocations under each --allocator
(cudaMalloc; async = a stream-ordered pool that keeps freed memory; vmm = cuMemCreate/cuMemMap,
the mechanism behind expandable segments) until --budget of the free memory is used; then
the largest block that can really be allocated is found by allocation: one probe at the free
memory less max(64 MiB, 0.1%), and if that fails a binary search to 0.25% of it, each probe
freed at once. fragmentation = 1 - largest block / free memory (for the pool, free includes
what it keeps reserved but unused). Allocation and free latency per size class come from the
pattern's own calls.

\b
--bandwidth: HBM copy (copy engine; SM kernel with 16-byte accesses), read-only and
write-only kernels over 4 GiB buffers; TB/s = (bytes read + bytes written) / median time.
--torch-allocators default,expandable,async,split512 runs a variable-sequence-length GPT
training workload under each PYTORCH_CUDA_ALLOC_CONF setting in its own process.
--max-batch MODEL finds the largest per-GPU batch (forward, backward, optimizer) with and
without activation checkpointing.
"""


@cli.command("memory", help=_MEMORY_HELP)
@click.option("--pattern", "pattern_text", default="all", show_default=True,
              help="interleaved, grow-shrink, small-between-large, or all.")
@click.option("--allocator", "allocator_text", default="all", show_default=True, help="cudaMalloc, async, vmm, or all.")
@click.option("--churn/--no-churn", default=True, show_default=True, help="Run the native churn probe.")
@click.option("--budget", default=0.9, show_default=True, type=float,
              help="Share of free memory a pattern may allocate (near the limit fragmentation shows).")
@click.option("--seed", default=20261129, show_default=True, type=int)
@click.option("--bandwidth", is_flag=True, help="Also measure HBM bandwidth.")
@click.option("--torch-allocators", "torch_text", default=None,
              help="PyTorch allocator settings to compare: default, expandable, async, split512 or raw conf strings.")
@click.option("--model", "torch_model", default="125m", show_default=True, help="Workload model for --torch-allocators.")
@click.option("--batch-size", "torch_batch", default=8, show_default=True, type=int, help="Workload batch per GPU.")
@click.option("--seq-lens", default="256-2048", show_default=True, help="Workload sequence lengths (varied per step).")
@click.option("--steps", default=20, show_default=True, type=int, help="Workload steps per setting.")
@click.option("--max-batch", "max_batch_model", default=None, help="Find the largest batch that fits for this model.")
@click.option("--seq-len", default=2048, show_default=True, type=int, help="Sequence length for --max-batch.")
@click.option("--timeout", default=600.0, show_default=True, type=float, help="Seconds per child process.")
@click.option("--gpus", default=None, help="N for the first N GPUs, or indices 0,1 [default: all visible].")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Write the result document.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write PNGs (fragmentation, HBM, reserved vs allocated over the workload), report.html, summary.md.")
@click.option("--progress/--no-progress", default=None, help="Progress on stderr [default: when a terminal].")
@_store_options
def memory_command(pattern_text, allocator_text, churn, budget, seed, bandwidth, torch_text, torch_model, torch_batch,
                   seq_lens, steps, max_batch_model, seq_len, timeout, gpus, json_path, report_dir, progress,
                   store) -> int:

    from mgpu_bench.probes.comm import render as report
    from mgpu_bench.probes.memory import measure as memory

    from .env import fingerprint

    patterns = memory.parse_patterns(pattern_text)
    allocators = memory.parse_allocators(allocator_text)
    if not (0.05 <= budget <= 0.99):
        raise InputError("--budget must be between 0.05 and 0.99 (a share of the free memory)")
    if not (1 <= torch_batch <= 1_000_000 and 1 <= steps <= 100_000 and 16 <= seq_len <= 1_000_000):
        raise InputError("--batch-size and --steps must be at least 1, --seq-len at least 16")
    if not (0 < timeout <= 86400):
        raise InputError("--timeout must be a positive number of seconds (at most a day)")
    settings: tuple[str, ...] = ()
    if torch_text or max_batch_model:
        from mgpu_bench.probes.memory import torch_memory

        from . import models

        if torch_text:
            settings = tuple(torch_memory.parse_settings(torch_text))
            models.get_model_spec(torch_model)
            torch_memory.parse_seq_lens(seq_lens)
            spec = models.get_model_spec(torch_model)
            longest = max(torch_memory.parse_seq_lens(seq_lens))
            if longest > spec.max_seq:
                raise InputError(f"--seq-lens reaches {longest} tokens; {spec.name} takes at most {spec.max_seq}")
        if max_batch_model:
            spec = models.get_model_spec(max_batch_model)
            if seq_len > spec.max_seq:
                raise InputError(f"--seq-len {seq_len} does not fit {spec.name}: it takes at most {spec.max_seq} "
                                 "tokens")
    if not (churn or bandwidth or settings or max_batch_model):
        raise InputError("nothing to run: drop --no-churn, or add --bandwidth, --torch-allocators or --max-batch")
    check_writable(json_path)
    check_report_dir(report_dir)
    gpu_list, devices = memory.devices_or_error(gpus)
    store.check()
    cfg = memory.MemoryConfig(gpus=tuple(gpu_list), patterns=patterns, allocators=allocators, churn=churn,
                              budget=budget, seed=seed, bandwidth=bandwidth, torch_settings=settings,
                              torch_model=torch_model, torch_batch=torch_batch, torch_seq_lens=seq_lens,
                              torch_steps=steps, max_batch_model=max_batch_model, max_batch_seq=seq_len,
                              timeout_s=timeout)
    out = _out_console()
    err = _err_console()
    show = err.is_terminal if progress is None else progress
    environment = fingerprint()
    run = _with_status(err, show, "memory", lambda say: memory.run_memory(cfg, devices, say))
    defer_sigterm()  # measured: a SIGTERM from here on waits for the results to be written
    for line in memory.findings(run):
        out.print(f"finding: {line}", highlight=False, soft_wrap=True, style="bold yellow")
    for note in dict.fromkeys(run.notes):
        err.print(f"note: {note}", highlight=False)
    memory.render_terminal(run, out)
    out.print(f"memory: {run.wall_seconds:.1f} s wall", highlight=False)
    doc = _once(lambda: memory.document(run, environment, sys.argv))
    write_failed = _write_outputs((
        (json_path, lambda p: report.write_json(p, doc())),
        (report_dir, lambda p: _write_memory_report(run, p, environment))), err)
    write_failed |= store.record(doc, err)
    if run.stopped:
        return _stopped(run, err)
    failed = [k for k, d in run.torch.items() if d.get("error")] + [
        f"max batch ({'with' if m['checkpointing'] else 'without'} checkpointing)" for m in run.max_batch
        if m.get("error")]
    if failed:
        err.print(f"mgpu-bench: failed: {', '.join(failed)} (see the findings)", highlight=False, style="bold red")
        return EXIT_FAILED
    return EXIT_FAILED if write_failed else 0


def _write_memory_report(run, out_dir, environment) -> None:
    from mgpu_bench.probes.memory.report import write_report

    write_report(run, out_dir, environment)


# -- model -----------------------------------------------------------------------------------

_MODEL_HELP = """Full training steps of the built-in GPT: throughput, MFU, where the step time goes.

\b
One process per GPU (gloo processes on a machine without GPUs, --nproc of them), started
through torch's elastic launcher, or joined when torchrun/srun started this command. Each
configuration runs --warmup-steps untimed steps, then --steps timed ones with CUDA events at
the phase boundaries (data, forward, backward, optimizer), read back at the end. The figures
come from the stable window: after warm-up, from the first step after which every rolling
median of 5 steps stays within 5% of the median of the last half (its length is printed).
tokens/s = batch x grad-accum x GPUs x seq-len / median step time. MFU = tokens/s per GPU x
(6N + 12 L d T) FLOP per token / the bf16 dense peak of the GPU (hardware database, or
--peak-tflops). Exposed communication (DDP, 2+ GPUs) = 1 - step time under no_sync() /
step time; healthy is under 10%. --data both runs synthetic (effective) and a real
DataLoader (gross) and names the gap as input-pipeline loss. --scaling 1,2 repeats the run
at each GPU count with the same per-GPU batch: efficiency = T_N / (N x T_1).
"""


@cli.command("model", help=_MODEL_HELP)
@click.option("--model", "model_name", default=None, help="tiny, 125m, 350m, 760m, 1.3b [default: 350m on GPUs, tiny on CPU].")
@click.option("--seq-len", default=None, type=int, help="Tokens per sample [default: 2048 on GPUs, 128 on CPU].")
@click.option("--batch-size", default=None, type=int, help="Samples per GPU per micro-batch [default: 8 on GPUs, 4 on CPU].")
@click.option("--grad-accum", default=1, show_default=True, type=int, help="Micro-batches per optimizer step.")
@click.option("--steps", default=30, show_default=True, type=int, help="Timed steps per configuration.")
@click.option("--warmup-steps", default=5, show_default=True, type=int, help="Untimed steps first.")
@click.option("--parallel", default="ddp", show_default=True, type=click.Choice(["ddp", "fsdp"]))
@click.option("--data", "data_mode", default="synthetic", show_default=True,
              type=click.Choice(["synthetic", "loader", "both"]),
              help="synthetic: tokens made on the device (effective); loader: a DataLoader over a token file (gross).")
@click.option("--num-workers", default=2, show_default=True, type=int, help="DataLoader workers per GPU.")
@click.option("--preprocess-ms", default=0.0, show_default=True, type=float,
              help="Simulated preprocessing cost per sample in the DataLoader.")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False), help="Where the token file is written [default: /tmp].")
@click.option("--checkpointing", is_flag=True, help="Activation checkpointing per block.")
@click.option("--scaling", "scaling_text", default=None, help="GPU counts to run, e.g. 1,2 (same per-GPU batch).")
@click.option("--gpus", default=None, help="N for the first N GPUs, or indices 0,1 [default: all visible].")
@click.option("--nproc", default=2, show_default=True, type=int, help="Processes on a machine without GPUs.")
@click.option("--peak-tflops", default=None, type=float, help="Dense bf16 peak per GPU for MFU (GPUs not in the database).")
@click.option("--exposed-comm/--no-exposed-comm", default=True, show_default=True,
              help="Also run the steps under no_sync() to measure exposed communication (DDP).")
@click.option("--profile/--no-profile", default=True, show_default=True,
              help="Profile 3 steps for the NCCL-kernel share of the step (GPUs, 2+).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Write the result document.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write PNGs (step time, phases, scaling), report.html and summary.md.")
@click.option("--progress/--no-progress", default=None, help="Per-step progress on stderr [default: when a terminal].")
@_store_options
def model_command(model_name, seq_len, batch_size, grad_accum, steps, warmup_steps, parallel, data_mode, num_workers,
                  preprocess_ms, data_dir, checkpointing, scaling_text, gpus, nproc, peak_tflops, exposed_comm, profile,
                  json_path, report_dir, progress, store) -> int:

    from mgpu_bench.probes.comm import render as report
    from mgpu_bench.probes.comm.measure import parse_gpus, visible_gpu_count
    from mgpu_bench.probes.model import measure as model_bench

    from . import hardware, models
    from .env import fingerprint
    from .errors import MgpuError

    try:
        ngpu = visible_gpu_count()
    except MgpuError:
        ngpu = 0
    on_gpu = ngpu > 0
    model_name = model_name or ("350m" if on_gpu else "tiny")
    spec = models.get_model_spec(model_name)
    seq_len = (2048 if on_gpu else 128) if seq_len is None else seq_len
    batch_size = (8 if on_gpu else 4) if batch_size is None else batch_size
    if not (1 <= seq_len <= spec.max_seq):
        raise InputError(f"--seq-len {seq_len} does not fit {spec.name}: it takes 1..{spec.max_seq} tokens")
    if not (1 <= batch_size <= 1_000_000 and 1 <= grad_accum <= 10_000):
        raise InputError("--batch-size and --grad-accum must be at least 1")
    if not (1 <= steps <= 1_000_000 and 0 <= warmup_steps <= 1_000_000):
        raise InputError("--steps must be at least 1 and --warmup-steps at least 0")
    if not (0 <= num_workers <= 256 and 0 <= preprocess_ms <= 60_000):
        raise InputError("--num-workers must be 0..256 and --preprocess-ms 0..60000")
    if peak_tflops is not None and not (peak_tflops > 0 and peak_tflops < 1e6):
        raise InputError("--peak-tflops must be a positive number of TFLOP/s")
    if data_mode in ("loader", "both"):
        d = Path(data_dir or "/tmp")
        if not d.is_dir() or not os.access(d, os.W_OK):
            raise InputError(f"--data-dir {d} is not a writable folder: give one the token file can be written to")
    if rank_of_launcher() == 0:  # rank 0 alone writes and stores; other nodes may lack its folders
        check_writable(json_path)
        check_report_dir(report_dir)
        store.check()
    if on_gpu:
        chosen = parse_gpus(gpus, ngpu)
        _pin_gpus(chosen)
        available = len(chosen)
    else:
        if gpus is not None:
            raise InputError("--gpus needs NVIDIA GPUs; none are visible (use --nproc on CPU)")
        if not (1 <= nproc <= 64):
            raise InputError("--nproc must be between 1 and 64")
        available = nproc
    from . import launch

    le = launch.detect()
    if le is not None:  # the launcher decided the process count
        if scaling_text:
            raise InputError(f"--scaling starts its own processes: drop it under {le.launcher} "
                             f"(this job has {le.world_size})")
        available = le.world_size
    if scaling_text:
        try:
            counts = sorted({int(x) for x in scaling_text.split(",") if x.strip()})
        except ValueError:
            raise InputError(f"--scaling '{scaling_text}': write GPU counts like 1,2") from None
        if not counts or counts[0] < 1 or counts[-1] > available:
            raise InputError(f"--scaling '{scaling_text}': counts must be 1..{available} "
                             f"({'GPUs selected' if on_gpu else '--nproc'})")
    else:
        counts = [available]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rank = le.rank if le is not None else 0
    show = (sys.stderr.isatty() if progress is None else progress) and rank == 0
    cfg = model_bench.ModelConfig(model=spec.name, seq_len=seq_len, batch_size=batch_size, grad_accum=grad_accum,
                                  steps=steps, warmup_steps=warmup_steps, parallel=parallel,
                                  data="synthetic", num_workers=num_workers, preprocess_ms=preprocess_ms,
                                  data_dir=data_dir, checkpointing=checkpointing, exposed_comm=exposed_comm,
                                  profile=profile, device="cuda" if on_gpu else "cpu", progress=show)
    modes = ["synthetic", "loader"] if data_mode == "both" else [data_mode]
    peak = None
    if peak_tflops is not None:
        peak = hardware.Figure(peak_tflops * 1e12, "FLOP/s", hardware.USER_OVERRIDE)
    elif on_gpu:
        from . import _native

        name = _native.device_info(chosen[0])["name"]
        peak = hardware.peak_flops(name, "bf16")
    environment = fingerprint()
    err = _err_console()
    run = model_bench.run_model(cfg, counts, modes, peak, (lambda t: err.print(f"model: {t}", highlight=False))
                                if show else None)
    defer_sigterm()  # measured: a SIGTERM from here on waits for the results to be written
    if rank != 0:  # rank 0 reports the job; the others say only that it failed
        if run.stopped:
            return _stopped(run, err, rank)
        return EXIT_FAILED if any(s.error for s in run.stats) else 0
    if peak is None:
        run.notes.append("no MFU: " + ("this GPU has no bf16 peak in the hardware database; give --peak-tflops"
                                        if on_gpu else "CPU processes have no peak figure; give --peak-tflops"))
    out = _out_console()
    for line in model_bench.findings(run):
        out.print(f"finding: {line}", highlight=False, soft_wrap=True, style="bold yellow")
    for note in run.notes:
        err.print(f"note: {note}", highlight=False)
    if run.stats:
        model_bench.render_terminal(run, out)
    out.print(f"model: {run.wall_seconds:.1f} s wall, process start-up included", highlight=False)
    doc = _once(lambda: model_bench.document(run, environment, sys.argv))
    write_failed = _write_outputs((
        (json_path, lambda p: report.write_json(p, doc())),
        (report_dir, lambda p: _write_model_report(run, p, environment))), err)
    write_failed |= store.record(doc, err) if run.stats else False
    failed = [s for s in run.stats if s.error]
    if run.stopped:
        return _stopped(run, err)
    if failed:
        fit = [s.ranks[0] for s in run.stats if not s.error]
        hint = (f"; run 'mgpu-bench memory --no-churn --max-batch {spec.name} --seq-len {seq_len}' for the largest "
                "batch that fits" if any("out of memory" in (s.error or "") for s in failed) else "")
        err.print(f"mgpu-bench: {len(failed)} configuration(s) failed: {failed[0].error}{hint}"
                  + (f" ({len(fit)} measured and kept)" if fit else ""), highlight=False, style="bold red")
        return EXIT_FAILED
    return EXIT_FAILED if write_failed else 0


def _write_model_report(run, out_dir, environment) -> None:
    from mgpu_bench.probes.model.report import write_report

    write_report(run, out_dir, environment)


# -- suite -----------------------------------------------------------------------------------

_SUITE_HELP = """The three rounds of a throughput stress test, one report, stored and compared.

\b
Round 1, single-GPU baseline: GEMM per dtype on every GPU (gemm), HBM bandwidth and
  fragmentation (memory), the 350m GPT's training step on one GPU (model).
Round 2, multi-GPU scaling: collective busbw against theory (comm), GPU-to-GPU links (links),
  the model over 1, 2, 4 ... N GPUs with scaling efficiency (model --scaling).
Round 3, limit throughput: the largest batch that fits (memory --max-batch), then a sustained
  GEMM and a sustained training run of --duration each, with clocks, power, temperature and
  throttle reasons sampled over time.

Each probe runs as its own mgpu-bench command in a child process; one that fails is recorded
with its reason and the suite goes on. --quick (a few minutes on 2 GPUs: fewer dtypes, sizes
and steps, --duration 20s) is the monthly patrol; the full suite takes longer. Without GPUs the
probes that run on CPU ranks (comm with gloo, the tiny model) run and the rest are skipped.

The report folder gets report.html (one self-contained page), summary.md, suite.json and the
PNGs. The run is stored in the history database and compared with the suite baseline when one
is set (mgpu-bench baseline set RUN).

\b
Exit codes: 0 all probes ran and nothing regressed against the baseline; 1 a probe failed or a
metric regressed beyond --tolerance and the noise; 2 bad input; 130 Ctrl-C, 143 SIGTERM (what was measured
is written).
"""


@cli.command("suite", help=_SUITE_HELP)
@click.option("--quick", is_flag=True, help="The short patrol: fewer dtypes, sizes and steps.")
@click.option("--rounds", "rounds_text", default="1,2,3", show_default=True, help="Rounds to run, e.g. 1,2.")
@click.option("--duration", "duration_text", default=None,
              help="Round 3's sustained runs, each [default: 20s with --quick, else 5m].")
@click.option("--gpus", default=None, help="N for the first N GPUs, or indices 0,1 [default: all visible].")
@click.option("--tolerance", "tolerance_text", default="5%", show_default=True,
              help="Smallest change that counts against the baseline (noise permitting).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Also write the suite document here (it is always in the report folder).")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Report folder [default: mgpu-bench-suite-DATE-TIME in the current folder].")
@click.option("--progress/--no-progress", default=True, show_default=True, help="A line per probe on stderr.")
@_store_options
def suite_command(quick, rounds_text, duration_text, gpus, tolerance_text, json_path, report_dir, progress,
                  store) -> int:
    from mgpu_bench.probes.comm import measure as comm
    from mgpu_bench.probes.gemm.measure import parse_duration

    from .env import fingerprint
    from .suite import run as suite

    rounds = suite.parse_rounds(rounds_text)
    duration_s = parse_duration(duration_text) if duration_text else (20.0 if quick else 300.0)
    from mgpu_bench.history.cli import parse_tolerance

    tolerance = parse_tolerance(tolerance_text)
    report_dir = report_dir or suite.default_report_dir()
    check_writable(json_path)
    check_report_dir(report_dir)
    ngpu = comm.visible_gpu_count()
    if ngpu:
        chosen = comm.parse_gpus(gpus, ngpu)
    elif gpus is not None:
        raise InputError("--gpus given but no NVIDIA GPU is visible here")
    else:
        chosen = []
    store.check()
    err = _err_console()
    out = _out_console()
    environment = fingerprint()
    bus_ids = {g: str(d.get("pci_bus_id")) for g, d in enumerate(environment.get("gpus", [])) if g in chosen}
    cfg = suite.SuiteConfig(quick=quick, rounds=rounds, duration_s=duration_s, gpus=gpus)
    run = suite.run_suite(cfg, chosen, bus_ids, (lambda t: err.print(f"suite: {t}", highlight=False))
                          if progress else None)
    defer_sigterm()  # measured: a SIGTERM from here on waits for the results to be written
    doc = suite.document(run, environment, sys.argv)
    from .suite import report as suite_report

    found = suite_report.findings(doc)
    doc["findings"] = [f.to_dict() for f in found]
    for f in found:
        out.print(f"{f.severity}: {f.text}", highlight=False, soft_wrap=True)
    for p in run.probes:
        out.print(f"round {p['round']} {p['name']:<16} {p['status']:<11} {p['seconds']:7.1f} s"
                  + (f"  {p['error']}" if p["error"] else ""), highlight=False, soft_wrap=True)
    out.print(f"suite: {run.wall_seconds:.1f} s wall", highlight=False)

    trend = None
    regressed = store_failed = False
    stored = None
    if not store.no_store:
        from mgpu_bench.history.store import History

        try:
            with History.open(store.db) as h:
                stored = h.save(doc)
                err.print(f"stored as {stored} (mgpu-bench history show {stored})", highlight=False)
                regressed = _compare_with_baseline(h, stored, tolerance, out, err)
                trend = suite.history_trend(h, doc)
        except (InputError, OSError) as exc:
            what = "was not stored" if stored is None else f"was stored as {stored}, then"
            err.print(f"mgpu-bench: the suite {what}: {exc}", highlight=False)
            store_failed = True  # a regression watch that cannot store or compare must not pass
    store_failed = store.textfile(doc, stored, err) or store_failed
    written = _write_outputs((
        (report_dir, lambda p: _write_suite_report(doc, p, trend)),
        (json_path, lambda p: suite.write_document(Path(p), doc))), err)
    if not written:
        out.print(f"report: {Path(report_dir) / 'report.html'}", highlight=False)
    if run.interrupted:
        how = "terminated (SIGTERM)" if terminated() else "interrupted"
        err.print(f"mgpu-bench: {how}; the probes measured so far are in the report", highlight=False)
        return EXIT_INTERRUPTED
    return EXIT_FAILED if (run.failed or regressed or written or store_failed) else 0


def _compare_with_baseline(h, stored: str, tolerance: float, out, err) -> bool:
    """The stored suite against the suite baseline, if one is set; True on a regression. A
    baseline with no metric in common is said, not fatal (an interrupted baseline, say)."""
    from mgpu_bench.history.cli import format_change, format_noise, format_value
    from mgpu_bench.history.store import compare_runs

    base = h.baseline("suite")
    if not base or base == stored:
        return False
    try:
        comparison = compare_runs(h, base, stored, tolerance)
    except InputError as exc:
        err.print(f"mgpu-bench: not compared with baseline {base}: {exc}", highlight=False)
        return True
    for line in comparison.fingerprint_differences:
        out.print(f"warning: not the same machine set-up as the baseline: {line}", highlight=False, soft_wrap=True)
    for c in comparison.regressions:
        out.print(f"regression: {c.name}: {format_value(c.base, c.unit)} -> {format_value(c.new, c.unit)} "
                  f"({format_change(c.change, c.absolute)}; threshold {format_noise(c.threshold, c.absolute)})",
                  highlight=False, soft_wrap=True)
    out.print(f"compared with baseline {base}: {len(comparison.regressions)} regression(s)", highlight=False)
    return bool(comparison.regressions)


def _write_suite_report(doc: dict, out_dir: str, trend) -> None:
    from mgpu_bench.suite.report import write_report

    from .suite import run as suite

    write_report(doc, out_dir, history_trend=trend)
    suite.write_document(Path(out_dir) / "suite.json", doc)


def _run_with_progress(fn, cfg, err_console, show: bool):
    if not show:
        return fn(cfg)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from .sizes import format_bytes

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task("comm", total=None)

        def progress(i, total, req):
            bar.update(task, total=total, completed=i,
                       description=f"{req.op} {format_bytes(req.size)} {'in' if req.inplace else 'out'}")

        return fn(cfg, progress)


def _register_history() -> None:
    from mgpu_bench.history.cli import register

    register(cli)


_register_history()


def main() -> None:
    from .errors import raise_on_sigterm

    raise_on_sigterm()  # SIGTERM keeps what was measured, as Ctrl-C does
    cli.main(prog_name="mgpu-bench")


if __name__ == "__main__":
    main()
