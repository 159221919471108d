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

from . import occupancy
from .children import user_command
from .errors import InputError, defer_sigterm, interruption
from .paths import check_report_dir, check_writable
from .probe import Context, Probe

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended


class Store:
    """Where a finished run goes besides its output files: the history database (unless
    --no-store) and a Prometheus textfile (--prometheus)."""

    def __init__(self, db: str | None, no_store: bool, prometheus: str | None) -> None:
        self.db, self.no_store, self.prometheus = db, no_store, prometheus

    def check(self) -> None:
        """Before any measurement: a database that cannot be used, or a textfile that cannot be
        written, is bad input now, not a lost run later."""
        check_writable(self.prometheus, "--prometheus")
        if not self.no_store:
            from .history import History

            History.check(self.db)  # nothing written yet: a new database is made when the run is stored

    def open(self):
        from .history import History

        return History.open(self.db)

    def check_distinct(self, paths: Mapping, opts: Mapping, stores: bool) -> None:
        """No two outputs the same file, none the history database (paths.check_distinct)."""
        from .paths import check_distinct

        outputs = [("--json", paths.get("json_path")), ("--csv", paths.get("csv_path")),
                   ("--report", paths.get("report_dir")), ("--prometheus", self.prometheus),
                   ("--exclude-file", opts.get("exclude_file"))]  # fleet's list of nodes to drain
        db = None
        if stores and not self.no_store:
            from .history import default_path

            db = self.db or default_path()
        check_distinct(outputs, db, "--db" if self.db else "the history database")


def launcher_rank() -> int:
    """This process's rank under torchrun / srun / mpirun, 0 otherwise (rank 0 alone writes)."""
    from .launch import detect

    le = detect()
    return 0 if le is None else le.rank


def stopped_line(doc: Mapping, err, rank: int = 0, because: list | None = None) -> int:
    """A run that ended early: its one line, and exit code 130 (interrupted) or 1."""
    st = doc.get("status") or {}
    where = f"rank {rank}: " if rank else ""
    text = _because(str(st.get("message") or st.get("stopped")), because or [])
    err.print(f"mgpu-bench: {where}{text}", highlight=False, style="bold red")
    return EXIT_INTERRUPTED if st.get("stopped") == "interrupted" else EXIT_FAILED


def write_outputs(outputs, err) -> list[str]:
    """Writes each (path, writer[, flag]) whose path is set; a path that cannot be written is one
    line on stderr, not a lost run. The flags (or paths) of those that failed; [] when none did."""
    failed = []
    for path, write, *flag in outputs:
        if path:
            try:
                write(path)
            except OSError as exc:
                err.print(f"mgpu-bench: could not write {path}: {_os_reason(exc)}", highlight=False)
                failed.append(flag[0] if flag else str(path))
    return failed


def run(probe: Probe, opts: dict) -> int:
    """The command `mgpu-bench <probe.name>` with its parsed options; its exit code."""
    from .output.console import Progress, err_console, out_console

    paths = {key: opts.pop(key, None) for key in ("json_path", "csv_path", "report_dir")}
    progress = opts.pop("progress", None)
    store = Store(opts.pop("db_path", None), opts.pop("no_store", True), opts.pop("prometheus_path", None))
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

    from .env import fingerprint

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
            history, run_id, comparison = _store(probe, config, doc, store, out, err)
            failed = history is None
        if measured and store.prometheus and not probe.per_node_prometheus:
            failed |= _textfile(store.prometheus, doc, run_id, err)
        written = write_outputs(_writers(probe, doc, paths, history, measured), err)
        failed |= bool(written)
        if measured and probe.stores and not store.no_store and run_id is None:
            _kept_for_later(doc, probe.name, paths["json_path"], "--json" in written, store, err)
    finally:
        if history is not None:
            history.close()

    from .output.console import safe_text  # process, GPU and host names are outside text

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
    regressed = comparison is not None and print_comparison(comparison, out, err)
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
    from . import _native
    from .errors import MgpuError

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
    from .paths import write_json, write_output

    out: list[tuple[str | None, Callable, str]] = [(paths["json_path"], lambda p: write_json(p, doc), "--json")]
    if "csv" in probe.outputs:
        out.append((paths["csv_path"], lambda p: write_output(p, probe.csv(doc)), "--csv"))
    if measured:
        out.append((paths["report_dir"], lambda p: probe.report(doc, p, history), "--report"))
    return out


def _store(probe: Probe, config, doc, store: Store, out, err):
    """Saves the run; for a gating probe, compares it with its kind's baseline. -> (the open
    History, or None when storing failed; the run id; the comparison for print_comparison, or
    None). Nothing goes to `out` (stdout) here: the caller prints once everything is kept. A gating
    run that cannot be compared counts as regressed: a regression watch must not pass by not
    looking."""
    h = run_id = None
    try:
        h = store.open()
        run_id = h.save(doc)
        err.print(f"stored as {run_id} in {h.path} (mgpu-bench history show {run_id})", highlight=False)
        more = [h.save(extra) for extra in probe.records(doc)[1:]]
        if more:
            err.print(f"stored {len(more)} more: {more[0]}-{more[-1]} (one per node, under its own host)",
                      highlight=False)
        comparison = baseline_comparison(h, run_id, probe.tolerance(config)) if probe.gates else None
        return h, run_id, comparison
    except (InputError, OSError) as exc:
        what = "was not stored" if run_id is None else f"was stored as {run_id}, then"
        err.print(f"mgpu-bench: the run {what}: {exc}", highlight=False)
        if h is not None:
            h.close()
        return None, run_id, None


def _kept_for_later(doc: Mapping, kind: str, json_path: str | None, json_failed: bool, store: Store, err) -> None:
    """A run the history could not take (locked, full, read-only): its document stays in a file
    (its --json, else one written here), and the line says how to store it later."""
    import datetime as _dt
    import os
    import shlex
    import tempfile

    from .paths import write_json

    kept = json_path if json_path and not json_failed else None
    if kept is None:
        name = f"mgpu-bench-{kind}-{_dt.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.json"
        for folder in (".", tempfile.gettempdir()):
            try:
                kept = str(write_json(Path(folder).absolute() / name, doc))
                break
            except (OSError, InputError):
                continue
    if kept is None:
        err.print("mgpu-bench: and its document could not be kept in a file either", highlight=False)
        return
    db = f" --db {shlex.quote(str(store.db))}" if store.db else ""
    err.print(f"mgpu-bench: its document is in {kept}: `mgpu-bench history add {shlex.quote(kept)}{db}` stores it "
              "later", highlight=False)


def _textfile(path: str, doc: Mapping, run_id: str | None, err) -> bool:
    """The Prometheus textfile; True when it failed."""
    from .output.prometheus import write_textfile
    from .probe import headline

    try:
        write_textfile(path, headline(doc), run_id, doc.get("environment") or {})
    except OSError as exc:
        err.print(f"mgpu-bench: could not write {path}: {_os_reason(exc)}", highlight=False)
        return True
    return False


def _os_reason(exc: OSError) -> str:
    """Why a write failed, in words; a full disk or quota named as such, with the fix."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{exc.strerror} (the disk or quota is full: free space there, or give a folder on another disk)"
    return str(exc.strerror or exc)


def baseline_comparison(h, stored: str, tolerance: float):
    """The stored run against its kind's baseline, if one is set: (baseline id, the Comparison or
    the InputError that prevented it), or None without a baseline."""
    from .history import compare_runs

    base = h.baseline_of(h.get(stored))
    if not base or base == stored:
        return None
    try:
        return base, compare_runs(h, base, stored, tolerance)
    except InputError as exc:
        return base, exc


def print_comparison(found, out, err) -> bool:
    """Prints baseline_comparison()'s answer; True on a regression. A baseline with no metric in
    common is said, and counts as a failure to compare."""
    from .history.cli import format_change, format_noise, format_value
    from .output.console import safe_text  # the baseline is stored text

    base, comparison = found
    if isinstance(comparison, InputError):
        err.print(safe_text(f"mgpu-bench: not compared with baseline {base}: {comparison}"), highlight=False)
        return True
    for line in comparison.not_comparable:
        out.print(safe_text(f"not comparable with baseline {base}: {line}"), highlight=False, soft_wrap=True)
    for line in comparison.fingerprint_differences:
        out.print(safe_text(f"warning: not the same machine set-up as the baseline: {line}"), highlight=False,
                  soft_wrap=True)
    for line in comparison.warnings:
        out.print(safe_text(f"warning: {line}"), highlight=False, soft_wrap=True)
    for c in comparison.regressions:
        out.print(safe_text(f"regression: {c.name}: {format_value(c.base, c.unit)} -> {format_value(c.new, c.unit)} "
                            f"({format_change(c.change, c.absolute)}; threshold "
                            f"{format_noise(c.threshold, c.absolute)})"), highlight=False, soft_wrap=True)
    undecided = f", {len(comparison.undecided)} too close to the noise to call" if comparison.undecided else ""
    out.print(f"compared with baseline {base}: {len(comparison.regressions)} regression(s){undecided}", highlight=False)
    return comparison.failed


RUN_ID = r"(?:r?\d+|latest)"  # how `history show` names a stored run (r12), or 12, or latest


def render_again(result: str, out_dir: str | None, db: str | None = None) -> int:
    """`mgpu-bench report RESULT [--out DIR]`: the report of a result document, from a file or a
    stored run (r12, 12, latest), drawn by the probe of its kind."""
    import json
    import os
    import re
    import stat

    from . import probe as registry
    from .document import RESULT_SCHEMA, document_kind

    history = None
    if not os.path.exists(result) and re.fullmatch(RUN_ID, result.strip(), re.IGNORECASE):  # False on any OSError
        from .history import History

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
    from .paths import check_distinct

    # the report never replaces the database it reads from, nor the result file it draws
    check_distinct([("--out", out_dir)], history.path if history is not None else None,
                   keep=[] if history is not None else [("the result", result)])
    if isinstance(doc, dict) and doc.get("schema") == "mgpu-bench/topo":
        raise InputError(f"{where} is a `mgpu-bench topo` snapshot (the node as data, not a measurement): it has "
                         "no report; `mgpu-bench topo` shows it, and a command's --json gives a result to report")
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        raise InputError(f"{where} is not an mgpu-bench result: give a file written by --json")
    result = where
    from .probe import validate

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
        from .output.console import err_console

        err_console().print(f"mgpu-bench: could not write the report into {out_dir}: {_os_reason(exc)}",
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
    from . import topo as topology
    from .output.console import err_console, out_console
    from .output.tables import print_table
    from .paths import check_distinct, write_json

    check_writable(json_path, "--json")
    check_distinct([("--json", json_path)])  # never over a history database
    snapshot = topology.collect()
    failed = write_outputs([(json_path, lambda p: write_json(p, snapshot))], err_console())  # kept first, printed last
    topology.render(snapshot, out_console(), print_table=print_table)
    return EXIT_FAILED if failed else 0
