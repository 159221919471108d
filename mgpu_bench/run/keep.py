"""What a finished run leaves behind besides the terminal: its history row (and the comparison with its
kind's baseline), the Prometheus textfile, its output files, and, when the history cannot take it, a file
`history add` stores later. The runner and the in-job monitor keep their runs through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mgpu_bench.core.errors import InputError
from mgpu_bench.core.paths import check_writable
from mgpu_bench.results.probe import Probe


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
            from mgpu_bench.history import History

            History.check(self.db)  # nothing written yet: a new database is made when the run is stored

    def open(self):
        from mgpu_bench.history import History

        return History.open(self.db)

    def check_distinct(self, paths: Mapping, opts: Mapping, stores: bool) -> None:
        """No two outputs the same file, none the history database (paths.check_distinct)."""
        from mgpu_bench.core.paths import check_distinct

        outputs = [("--json", paths.get("json_path")), ("--csv", paths.get("csv_path")),
                   ("--report", paths.get("report_dir")), ("--prometheus", self.prometheus),
                   ("--exclude-file", opts.get("exclude_file"))]  # fleet's list of nodes to drain
        db = None
        if stores and not self.no_store:
            from mgpu_bench.history import default_path

            db = self.db or default_path()
        check_distinct(outputs, db, "--db" if self.db else "the history database")


def write_outputs(outputs, err) -> list[str]:
    """Writes each (path, writer[, flag]) whose path is set; a path that cannot be written is one
    line on stderr, not a lost run. The flags (or paths) of those that failed; [] when none did."""
    failed = []
    for path, write, *flag in outputs:
        if path:
            try:
                write(path)
            except OSError as exc:
                err.print(f"mgpu-bench: could not write {path}: {os_reason(exc)}", highlight=False)
                failed.append(flag[0] if flag else str(path))
    return failed


def save(probe: Probe, config, doc, store: Store, out, err):
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


def kept_for_later(doc: Mapping, kind: str, json_path: str | None, json_failed: bool, store: Store, err) -> None:
    """A run the history could not take (locked, full, read-only): its document stays in a file
    (its --json, else one written here), and the line says how to store it later."""
    import datetime as _dt
    import os
    import shlex
    import tempfile

    from mgpu_bench.core.paths import write_json

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


def textfile(path: str, doc: Mapping, run_id: str | None, err) -> bool:
    """The Prometheus textfile; True when it failed."""
    from mgpu_bench.output.prometheus import write_textfile
    from mgpu_bench.results.probe import headline

    try:
        write_textfile(path, headline(doc), run_id, doc.get("environment") or {})
    except OSError as exc:
        err.print(f"mgpu-bench: could not write {path}: {os_reason(exc)}", highlight=False)
        return True
    return False


def os_reason(exc: OSError) -> str:
    """Why a write failed, in words; a full disk or quota named as such, with the fix."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{exc.strerror} (the disk or quota is full: free space there, or give a folder on another disk)"
    return str(exc.strerror or exc)


def baseline_comparison(h, stored: str, tolerance: float):
    """The stored run against its kind's baseline, if one is set: (baseline id, the Comparison or
    the InputError that prevented it), or None without a baseline."""
    from mgpu_bench.history import compare_runs

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
    from mgpu_bench.history.cli_common import format_change, format_noise
    from mgpu_bench.output.console import safe_text  # the baseline is stored text
    from mgpu_bench.output.tables import format_value

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
