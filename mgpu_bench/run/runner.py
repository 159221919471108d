"""The flow every measuring command shares, for any probe of the registry.

    options -> probe.configure (a frozen config; bad input is exit code 2 before any work)
            -> output paths and the history database checked (rank 0): each writable, none the
               same file as another or as the database
            -> probe.run with progress (faults end it with what was measured kept)
            -> history row (and the baseline comparison for a probe that gates on it); a run the
               database does not take is kept in a file that `history add` stores later
            -> the Prometheus textfile, the result document, CSV and report folder
            -> findings, notes, tables and the comparison on the terminal, last: a reader that
               stops reading stdout (`| head -1`) costs nothing already kept
            -> exit code

Exit codes: 0 success; 1 a measurement failed (wrong elements, an NCCL error or timeout, out of
memory, a failed configuration, a regression against the baseline) or an output (stdout
included, unless its reader closed the pipe) could not be written, after writing what was
gathered; 2 bad input (one line naming the fix; an output path that cannot be written, or names
a directory, FIFO, device or socket, is found before measuring); 130 Ctrl-C, 143 SIGTERM
(scancel, a launcher stopping its job) and 129 SIGHUP (a closed terminal or ssh session), after
writing what was gathered.
`mgpu-bench compare` alone has 3: its --json could not be written after comparing and nothing
regressed (its 1 means a regression, which a cron job gates on; a full disk is not one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from mgpu_bench.core.children import user_command
from mgpu_bench.core.errors import InputError, defer_sigterm, interruption
from mgpu_bench.core.paths import check_report_dir, check_writable
from mgpu_bench.machine import occupancy
from mgpu_bench.results.probe import Context, Probe

from . import keep

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended


def launcher_rank() -> int:
    """This process's rank under torchrun / srun / mpirun, 0 otherwise (rank 0 alone writes)."""
    from mgpu_bench.core.launch import detect

    le = detect()
    return 0 if le is None else le.rank


def stopped_line(doc: Mapping, err, rank: int = 0, because: list | None = None) -> int:
    """A run that ended early: its one line, and exit code 130 (interrupted) or 1."""
    st = doc.get("status") or {}
    where = f"rank {rank}: " if rank else ""
    text = _because(str(st.get("message") or st.get("stopped")), because or [])
    err.print(f"mgpu-bench: {where}{text}", highlight=False, style="bold red")
    return EXIT_INTERRUPTED if st.get("stopped") == "interrupted" else EXIT_FAILED


def run(probe: Probe, opts: dict) -> int:
    """The command `mgpu-bench <probe.name>` with its parsed options; its exit code."""
    from mgpu_bench.output.console import Progress, err_console, out_console

    paths = {key: opts.pop(key, None) for key in ("json_path", "csv_path", "report_dir")}
    progress = opts.pop("progress", None)
    store = keep.Store(opts.pop("db_path", None), opts.pop("no_store", True), opts.pop("prometheus_path", None))
    rank = launcher_rank()
    if rank == 0:  # rank 0 alone writes and stores; other nodes may lack its folders
        check_writable(paths["json_path"], "--json")
        check_writable(paths["csv_path"], "--csv")
        check_report_dir(paths["report_dir"])
    config = probe.configure(opts)
    if rank == 0:
        if not paths["report_dir"]:
            paths["report_dir"] = probe.default_report_dir(config)
            check_report_dir(paths["report_dir"])
        store.check_distinct(paths, opts, probe.stores)
        if probe.stores:
            store.check()
    code = probe.delegate(config)
    if code is not None:
        return code

    from mgpu_bench.machine.env import fingerprint

    out, err = out_console(), err_console()
    show = progress if progress is not None else probe.progress_default
    if show is None:  # a terminal gets the probe's display; a log file or pipe plain lines
        show = True
    style = probe.progress if err.is_terminal or probe.progress == "lines" else "plain"
    environment = fingerprint()  # before the run: a device fault must not cost the results
    watch = occupancy.Watch(_bus_ids(probe.gpus(config))) if rank == 0 else None
    try:
        with Progress(err, probe.name, style, bool(show) and rank == 0) as bar:
            bar.estimate(probe.estimate(config))
            doc = probe.run(config, Context(environment, user_command(), rank, bar, watch,
                                            store.prometheus if probe.per_node_prometheus else None, store.open))
    except KeyboardInterrupt as exc:  # a probe that keeps nothing partial
        err.print(f"mgpu-bench: {interruption(exc)}", highlight=False)
        return EXIT_INTERRUPTED
    defer_sigterm()  # measured: a SIGTERM from here on waits for the results to be written
    status = doc.get("status") or {}
    if rank != 0:  # under a launcher, rank 0 alone prints and writes
        if status.get("stopped"):
            return stopped_line(doc, err, rank)
        return EXIT_FAILED if probe.failure(doc) else 0

    if watch is not None and "occupancy" not in doc:
        doc["occupancy"] = watch.to_dict()
    shared = occupancy.from_document(doc)
    measured = probe.measured(doc)
    # Kept first, printed last: the history row, the textfile and the files are written before a
    # line goes to stdout, whose reader may stop reading (`| head -1`) or never could (/dev/full).
    failed, history, run_id, comparison = False, None, None, None
    try:
        if measured and probe.stores and not store.no_store:
            history, run_id, comparison = keep.save(probe, config, doc, store, out, err)
            failed = history is None
        if measured and store.prometheus and not probe.per_node_prometheus:
            failed |= keep.textfile(store.prometheus, doc, run_id, err)
        written = keep.write_outputs(_writers(probe, doc, paths, history, measured), err)
        failed |= bool(written)
        if measured and probe.stores and not store.no_store and run_id is None:
            keep.kept_for_later(doc, probe.name, paths["json_path"], "--json" in written, store, err)
    finally:
        if history is not None:
            history.close()

    from mgpu_bench.output.console import safe_text  # process, GPU and host names are outside text

    before = (doc.get("occupancy") or {}).get("before")
    for line in occupancy.findings_text(occupancy.competing(shared), before):
        out.print(safe_text(f"finding: {line}", lines=True), highlight=False, soft_wrap=True, style="bold red")  # colours the rest
    for line in occupancy.findings_text([p for p in shared if p.busy is False], before):
        out.print(safe_text(f"note: {line}", lines=True), highlight=False, soft_wrap=True)  # memory held, nothing run: not a cause
    for f in probe.findings(doc):
        out.print(safe_text(f"{probe.finding_label(f)}: {f.text}", lines=True), highlight=False, soft_wrap=True,
                  style=None if f.severity == "ok" else "bold yellow")
    for note in dict.fromkeys(probe.notes(doc)):
        err.print(safe_text(f"note: {note}", lines=True), highlight=False)
    probe.render(doc, out)
    regressed = comparison is not None and keep.print_comparison(comparison, out, err)
    if measured and paths["report_dir"] and not failed and Path(paths["report_dir"], "report.html").exists():
        out.print(f"report: {Path(paths['report_dir']) / 'report.html'}", highlight=False)

    if status.get("stopped"):
        return stopped_line(doc, err, because=shared)
    line = probe.failure(doc)
    if line:
        err.print(f"mgpu-bench: {_because(line, shared)}", highlight=False, style="bold red")
        return EXIT_FAILED
    return EXIT_FAILED if (failed or regressed) else 0


def _bus_ids(gpus: tuple[int, ...]) -> dict[int, str]:
    """CUDA index -> PCI bus id of the probe's GPUs ({} on CPU ranks or without a driver)."""
    if not gpus:
        return {}
    from mgpu_bench import _native
    from mgpu_bench.core.errors import MgpuError

    try:
        return {g: str(_native.device_info(g)["pci_bus_id"]) for g in gpus}
    except MgpuError:
        return {}


def _because(line: str, shared: list) -> str:
    """An out-of-memory line with the other processes that hold memory on the GPUs named."""
    if not shared or "out of memory" not in line:
        return line
    return f"{line}; other processes hold memory on the GPU: {', '.join(p.describe() for p in shared)}"


def _writers(probe: Probe, doc: Mapping, paths: dict, history, measured: bool) -> list[tuple[str | None, Callable]]:
    from mgpu_bench.core.paths import write_json, write_output

    out: list[tuple[str | None, Callable, str]] = [(paths["json_path"], lambda p: write_json(p, doc), "--json")]
    if "csv" in probe.outputs:
        out.append((paths["csv_path"], lambda p: write_output(p, probe.csv(doc)), "--csv"))
    if measured:
        out.append((paths["report_dir"], lambda p: probe.report(doc, p, history), "--report"))
    return out


RUN_ID = r"(?:r?\d+|latest)"  # how `history show` names a stored run (r12), or 12, or latest


def render_again(result: str, out_dir: str | None, db: str | None = None) -> int:
    """`mgpu-bench report RESULT [--out DIR]`: the report of a result document, from a file or a
    stored run (r12, 12, latest), drawn by the probe of its kind."""
    import json
    import os
    import re
    import stat

    from mgpu_bench.results import probe as registry
    from mgpu_bench.results.document import RESULT_SCHEMA, document_kind

    history = None
    if not os.path.exists(result) and re.fullmatch(RUN_ID, result.strip(), re.IGNORECASE):  # False on any OSError
        from mgpu_bench.history import History

        history = History.open(db, readonly=True)  # a read: nothing created, no write lock
        try:
            rec = history.get(result.strip().lower())  # InputError naming the known runs when unknown
        except BaseException:
            history.close()
            raise
        doc, where = rec.document, f"stored run {rec.run_id}"
        out_dir = out_dir or f"{rec.run_id}-report"
    else:
        where = result
        if Path(result).name:  # "", "." and "/" have no name to put -report after: they fail as files below
            out_dir = out_dir or str(Path(result).with_name(Path(result).stem + "-report"))
        try:
            mode = os.stat(result).st_mode
        except OSError:
            mode = None  # read below, which names why
        if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            raise InputError(f"{result} is not a regular file (a FIFO or a device would be read without end): give a "
                             "result file written by a command's --json")
        try:
            doc = json.loads(Path(result).read_text())
        except IsADirectoryError:
            raise InputError(f"{result} is a folder: give a result file written by a command's --json, or a "
                             "stored run id such as r12 (mgpu-bench history list shows them)") from None
        except OSError as exc:
            raise InputError(f"cannot read {result}: {exc.strerror or exc}; give a result file written by a "
                             "command's --json, or a stored run id such as r12 (mgpu-bench history list shows "
                             "them)") from None
        except (ValueError, RecursionError):
            raise InputError(f"{result} is not JSON: give a file written by a command's --json") from None
    check_report_dir(out_dir, "--out")
    from mgpu_bench.core.paths import check_distinct

    # the report never replaces the database it reads from, nor the result file it draws
    check_distinct([("--out", out_dir)], history.path if history is not None else None,
                   keep=[] if history is not None else [("the result", result)])
    if isinstance(doc, dict) and doc.get("schema") == "mgpu-bench/topo":
        raise InputError(f"{where} is a `mgpu-bench topo` snapshot (the node as data, not a measurement): it has "
                         "no report; `mgpu-bench topo` shows it, and a command's --json gives a result to report")
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        raise InputError(f"{where} is not an mgpu-bench result: give a file written by --json")
    result = where
    from mgpu_bench.results.probe import validate

    validate(doc, where)  # the kind's declared shape, field by field, before anything is drawn
    probe = registry.for_document(doc)
    if probe is None:
        kinds = ", ".join(registry.names())
        raise InputError(f"{result} is a {document_kind(doc) or 'result'} document of no known kind: give a file "
                         f"written by {kinds}")
    if not isinstance(doc.get(probe.payload), list):
        raise InputError(f"{result} is a {probe.name} document without its {probe.payload}: give a file written by "
                         f"mgpu-bench {probe.name} --json")
    try:
        paths = probe.report(doc, out_dir, history)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{result} is a {probe.name} document that cannot be read back ({type(exc).__name__}: "
                         f"{exc}): give a file written by mgpu-bench {probe.name} --json") from None
    except OSError as exc:  # a full disk, a quota, the folder removed meanwhile: checked writable, then not
        from mgpu_bench.output.console import err_console

        err_console().print(f"mgpu-bench: could not write the report into {out_dir}: {keep.os_reason(exc)}",
                            highlight=False)
        return EXIT_FAILED
    finally:
        if history is not None:
            history.close()
    for p in paths:
        print(p)
    return 0


def topo(json_path: str | None) -> int:
    """`mgpu-bench topo`: the node as data, rendered, and written as JSON when asked."""
    from mgpu_bench.core.paths import check_distinct, write_json
    from mgpu_bench.machine import topo as topology
    from mgpu_bench.machine import topo_view
    from mgpu_bench.output.console import err_console, out_console
    from mgpu_bench.output.tables import print_table

    check_writable(json_path, "--json")
    check_distinct([("--json", json_path)])  # never over a history database
    snapshot = topology.collect()
    failed = keep.write_outputs([(json_path, lambda p: write_json(p, snapshot))], err_console())  # kept first, printed last
    topo_view.render(snapshot, out_console(), print_table=print_table)
    return EXIT_FAILED if failed else 0
