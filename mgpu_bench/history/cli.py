"""`mgpu-bench history`, `mgpu-bench baseline` and `mgpu-bench compare`: the stored runs, the
baseline per kind, and the regression check a cron job or CI can gate on.

The main group registers these with `register(cli)`. Bad input raises InputError, which the
main group turns into one line on stderr and exit code 2. Every stored string (host, kind,
command, versions, metric names) passes through safe_text() before it reaches the terminal: a
stored document is outside text, and may hold escape sequences.
"""

from __future__ import annotations

import math
import os
import sys

import click

from mgpu_bench.core.errors import InputError
from mgpu_bench.core.paths import check_distinct, check_writable
from mgpu_bench.output.console import safe_text
from mgpu_bench.output.tables import format_value
from mgpu_bench.results.numbers import AsciiIntRange, ascii_float, foreign_digit

EXIT_REGRESSION = 1
# compare only: the comparison was made and printed, no regression, but --json was not written.
# Not 1 (a regression gate must not fire on a full disk) nor 2 (the input was good).
EXIT_OUTPUT = 3
# compare only: no regression, but a change too close to the noise to call either way (a gate can
# say neither passed nor failed); a regression still exits 1.
EXIT_CANNOT_TELL = 4

# Kinds `history list` leaves out unless asked (--all, --kind): a plan measures nothing, and every
# `mgpu-bench plan` is stored.
FOLDED_KINDS = ("plan",)
_DB_HELP = "History database [default: $MGPU_BENCH_DB, else $XDG_DATA_HOME/mgpu-bench/history.sqlite3]."


def _db_option(f):
    return click.option("--db", "db_path", default=None, metavar="PATH", help=_DB_HELP)(
        f
    )


def _out():
    """stdout at 100 columns when not a terminal; markup and highlighting off: run ids, host
    names and commands are outside text."""
    from rich.console import Console

    from mgpu_bench.output.console import _isatty

    return Console(
        width=100 if not _isatty(sys.stdout) else None,
        soft_wrap=False,
        markup=False,
        highlight=False,
    )


def _open(db_path: str | None, readonly: bool = False, create: bool = True):
    """The history database; `readonly` for the commands that only read (a missing database is
    one line naming its path, and no write lock is taken)."""
    from .store import History

    if create and not readonly:  # refused before anything is made (the XDG folder under HOME=/dev, say)
        History.check(db_path)
    elif not readonly:  # a write to what must be there: a missing database is said as the readers say it
        History.open(db_path, readonly=True).close()
    return History.open(db_path, readonly=readonly, create=create)


def _db(db_path: str | None):
    """The database path a command uses, for the checks of its outputs against it."""
    from .store import default_path

    return db_path or default_path()


def _notes(h) -> None:
    """The rows a listing left out (changed outside mgpu-bench), one note each on stderr."""
    for line in dict.fromkeys(h.skipped):
        click.echo(safe_text(f"note: {line}"), err=True)


# -- rendering --------------------------------------------------------------------------------


def format_change(change: float | None, absolute: bool) -> str:
    """'+3.2%' (relative) or '+1.2 pp' (a fraction's change in percentage points)."""
    if change is None:
        return "-"
    if math.isinf(change):
        return "+inf" if change > 0 else "-inf"
    return f"{100 * change:+.1f} pp" if absolute else f"{100 * change:+.1f}%"


def format_noise(value: float | None, absolute: bool) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f} pp" if absolute else f"{100 * value:.1f}%"


def parse_tolerance(text: str) -> float:
    """'5%' or '0.05' -> 0.05; must be more than 0 and less than 100%."""
    t = str(text).strip()
    number = ascii_float(t.removesuffix("%"))  # ASCII digits only: float() reads '５'
    if number is None:
        digit = foreign_digit(t)
        raise InputError(
            f"--tolerance '{text}' is not a number"
            + (f" (it has the digit {digit!r}, not one of 0-9)" if digit else "")
            + ": write 5% or 0.05"
        )
    value = number / 100 if t.endswith("%") else number
    if not (math.isfinite(value) and 0 < value < 1):
        raise InputError(
            f"--tolerance '{text}' must be more than 0 and less than 100%: write e.g. 5% or 0.05"
        )
    return value


def _short_command(command: str | None) -> str:
    """The stored command line with the program's folder dropped (shown on one line)."""
    if not command:
        return "-"
    program, _, rest = command.partition(" ")
    return " ".join(x for x in (os.path.basename(program), rest) if x)


# -- history ----------------------------------------------------------------------------------


class HelpGroup(click.Group):
    """A command group that, given no command, prints its help as --help prints it (stdout, its
    own lines) and exits 2, click's code for a missing command; click would put the help in a
    usage error, which the main group prints as one line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(2)
        return super().parse_args(ctx, args)


@click.group("history", cls=HelpGroup)
def history_group() -> None:
    """Stored runs: every result stored with its machine fingerprint, never overwritten.

    \b
    mgpu-bench history add result.json   store a result document (from any --json)
    mgpu-bench history add nccl.log      store a nccl-tests / rccl-tests log as a comm run
    mgpu-bench history list              the last runs, newest first
    mgpu-bench history show r12          one run's headline metrics
    mgpu-bench history trend NAME        one metric over the runs, oldest first
    mgpu-bench history prune --keep 1000 thin the history by age and count (baselines kept)
    """


@history_group.command("add")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--join", is_flag=True,
              help="Store the nccl-tests / rccl-tests logs given as one comm run (one machine's logs, a file per "
                   "collective); without it each run of each log is a run of its own.")
@click.option("--op", "op_name", default=None, metavar="OP",
              help="The collective of a log that does not name it (nccl-tests before 2.15 print no program name, "
                   "and allgather and alltoall tables look alike): allreduce, allgather, reducescatter, broadcast, "
                   "reduce, alltoall or sendrecv.")
@_db_option
def history_add(files, join, op_name, db_path) -> int:
    """Stores result documents (a command's --json) and the text output of NVIDIA's nccl-tests
    or AMD's rccl-tests (all_reduce_perf and the other *_perf binaries) as new runs. A log's run
    is a comm run with nccl-tests' size semantics, so its busbw per size compares with `mgpu-bench
    comm` at the same sizes; what the log could not tell (driver, topology) is said in its
    fingerprint, a log cut short or with wrong elements is stored with that said, and a log with
    no usable row is refused (exit code 2). The log's own collective and ranks count: --op naming
    another than the log's is refused. Every file is read and checked before any is stored, and
    all are stored in one transaction: every run of every file, or none. A run's time is the one
    its log states (nccl-tests -S 1), else the time of the import (said in its source)."""
    from mgpu_bench.results import probe as registry
    from mgpu_bench.results.nccl_tests import read_log
    from mgpu_bench.results.probe import load_document
    from mgpu_bench.results.schema import shown

    from .store import prepare

    docs, logs = [], []  # docs: (place among the files, file, document), stored in the files' order
    for i, f in enumerate(files):
        text = read_log(f)
        if text is None:
            docs.append((i, f, load_document(f)))  # every file read and checked against its schema before any is stored
        else:
            logs.append((f, i, text))
    if (join or op_name) and not logs:
        raise InputError("--join and --op are for nccl-tests and rccl-tests logs: the files given are result documents")
    if logs:
        op = None
        if op_name is not None:
            from mgpu_bench.results.ops import OP_ORDER

            op = op_name.strip().lower().replace("_", "").replace("-", "")
            if op not in OP_ORDER:
                raise InputError(f"--op {safe_text(op_name)!s}: choose from {', '.join(OP_ORDER)}")
        build = registry.get("comm").role("imported", "documents")
        for doc, held in build([(shown(os.path.basename(f)), text) for f, _, text in logs], op=op, join=join):
            docs.append((logs[held[0]][1], ", ".join(logs[k][0] for k in held), doc))
    docs.sort(key=lambda d: d[0])
    prepared = [prepare(doc) for _, _, doc in docs]  # every document checked and read before the database opens
    lines = []
    with _open(db_path) as h:
        run_ids = h.save_all(prepared)  # one transaction: all of them or none
    for (_, f, doc), run_id, p in zip(docs, run_ids, prepared, strict=True):
        source = doc.get("source") if isinstance(doc.get("source"), dict) else None
        what = ""
        if source:
            ranks = len(doc.get("devices") or [])
            what = f" ({source.get('tool')}{' ' + source['version'] if source.get('version') else ''}, " \
                   f"{ranks} rank(s))"
        lines.append(f"stored {run_id}: {p.kind}, {len(p.metrics)} headline metric(s), from {f}{what}")
        if source:
            lines += [f"  warning: {x}" for x in doc.get("findings") or []]
            lines += [f"  note: {x}" for x in doc.get("notes") or []]
            if source.get("created_from"):
                lines.append(f"  note: created {doc.get('created')}: {source['created_from']}")
    out = _out()
    for line in lines:
        out.print(safe_text(line), soft_wrap=True)
    return 0


@history_group.command("list")
@click.option(
    "--limit",
    default=20,
    show_default=True,
    type=AsciiIntRange(1, 100_000),
    help="Runs to show.",
)
@click.option(
    "--kind",
    default=None,
    help="Only runs of this kind (a command's name: comm, gemm, memory, model, links, fleet, sdc, overlap, suite).",
)
@click.option("--all", "show_all", is_flag=True,
              help="List every run, plans included (without it `plan` runs, which measure nothing, are left out and "
                   "counted in one line; --kind plan lists them alone).")
@_db_option
def history_list(limit, kind, show_all, db_path) -> int:
    """The last measured runs, newest first; * marks the baseline of its kind; status says how
    each ended (complete, interrupted by Ctrl-C, terminated by SIGTERM, stopped by a fault, or a
    suite's failed probes), what was measured before kept in every case. `plan` runs (every
    `mgpu-bench plan` is stored) are left out unless --all or --kind plan, and their count said."""
    from rich.table import Table

    from mgpu_bench.output.tables import print_table
    from mgpu_bench.results import probe as registry

    if kind is not None and kind not in registry.names():
        raise InputError(f"--kind {safe_text(kind)!s}: not a kind of run; choose from {', '.join(registry.names())}")
    folded = () if show_all or kind is not None else FOLDED_KINDS
    out = _out()
    with _open(db_path, readonly=True) as h:
        runs = h.list(limit, kind, exclude=folded)
        hidden = {k: h.count(k) for k in folded}
        path = h.path
        status = {run_id: _status_text(st) for run_id, st in h.statuses([r.run_id for r in runs]).items()}
        _notes(h)
    hidden = {k: n for k, n in hidden.items() if n}
    fold_line = "; ".join(f"{n:,} {k} run(s) not listed: --kind {k} lists them, --all lists every run"
                          for k, n in hidden.items())
    if not runs:
        out.print(safe_text(f"no {kind + ' ' if kind else 'measured ' if hidden else ''}runs stored in {path}"))
        if fold_line:
            out.print(fold_line, soft_wrap=True)
        return 0
    t = Table(box=None, pad_edge=False, header_style="bold")
    for name, just in (
        ("run", "right"),
        ("created UTC", "left"),
        ("kind", "left"),
        ("host", "left"),
        ("metrics", "right"),
        ("status", "left"),
        ("command", "left"),
    ):
        t.add_column(name, justify=just)  # type: ignore[arg-type]
    for r in runs:  # long hosts and commands wrap in their columns (print_table), never cut
        t.add_row(
            ("*" if r.baseline else "") + r.run_id,
            safe_text(r.created.replace("T", " ")[:16]),
            safe_text(r.kind),
            safe_text(r.host or "-"),
            str(r.metric_count),
            safe_text(status[r.run_id]),
            safe_text(_short_command(r.command)),
            style="yellow" if status[r.run_id] != "complete" else None,
        )
    print_table(out, t)
    if fold_line:
        out.print(fold_line, soft_wrap=True)
    return 0


def _status_text(st: dict | None) -> str:
    """How a stored run ended, from its document's status block: complete; interrupted (Ctrl-C),
    terminated (SIGTERM) or stopped: its reason (a timeout, out of memory, an NCCL error) with
    what it measured kept; for a suite, the probes that failed; unreadable (None: a document
    changed outside mgpu-bench)."""
    if st is None:
        return "unreadable"
    stopped, message = st.get("stopped"), str(st.get("message") or "")
    if stopped == "interrupted":
        return "terminated" if "SIGTERM" in message or "SIGHUP" in message else "interrupted"
    if stopped:
        return f"stopped: {str(stopped).replace('_', ' ')}"
    failed = st.get("failed") or []
    if failed:
        return f"failed: {len(failed) if isinstance(failed, list) else 1} probe(s)"
    return "complete"


_AGE_UNITS = {"h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_age(text: str) -> float:
    """'90d', '12w', '1y', '36h' -> seconds; InputError naming the form. An age beyond any date
    (99999999999999d) is infinite: nothing was created that long ago."""
    t = str(text).strip().lower()
    number = ascii_float(t[:-1]) if t and t[-1] in _AGE_UNITS else None
    if number is None or math.isnan(number) or number <= 0:
        raise InputError(f"--older-than '{text}' is not an age: write e.g. 90d, 12w, 1y or 36h (hours, days, weeks, "
                         "years of 365 days)")
    return number * _AGE_UNITS[t[-1]]


def age_cutoff(seconds: float) -> str:
    """The UTC time `seconds` ago (ISO 8601); the first instant of year 1 where that is before it
    (no run is older, and datetime goes no further back)."""
    import datetime as _dt

    now = _dt.datetime.now(_dt.UTC)
    earliest = _dt.datetime(1, 1, 1, tzinfo=_dt.UTC)
    if not math.isfinite(seconds) or seconds >= (now - earliest).total_seconds():
        return earliest.isoformat(timespec="seconds")
    return (now - _dt.timedelta(seconds=seconds)).isoformat(timespec="seconds")


def _mb(n: int) -> str:
    """Bytes in MB: two decimals under 10 MB (a small history's change shows), one above."""
    return f"{n / 1e6:.2f} MB" if n < 10e6 else f"{n / 1e6:.1f} MB"


@history_group.command("prune")
@click.option("--older-than", "age_text", default=None, metavar="AGE",
              help="Remove runs created more than AGE ago (90d, 12w, 1y, 36h).")
@click.option("--keep", default=None, type=AsciiIntRange(0, 10_000_000), metavar="N",
              help="Keep the newest N runs (N at least 1) of each kind and host, remove the rest. 0 is refused: "
                   "`check --keep 0` keeps every check, so here it would read as the opposite of what it removes.")
@click.option("--kind", default=None, help="Only runs of this kind (check, comm, ...).")
@click.option("--host", default=None, help="Only runs of this host.")
@click.option("--drop-samples", is_flag=True,
              help="Keep the chosen runs and their headline metrics; drop their raw samples (per-iteration values "
                   "in the metrics and the document) instead.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; change nothing.")
@_db_option
def history_prune(age_text, keep, kind, host, drop_samples, dry_run, db_path) -> int:
    """Thins the history by age and count, per kind and host. Baselines and the runs they
    reference (a baseline check's reference runs, a plan's sources) always stay. Without
    --drop-samples the chosen runs are removed and the file is compacted (VACUUM); a check
    stores with its own limit already (`check --keep`, the newest 1000 per node). The sizes said
    are the bytes on disk, the write-ahead log and its index included, the second after the
    compaction and a checkpoint."""
    from mgpu_bench.results import probe as registry

    from .store import files_size

    if age_text is None and keep is None:
        raise InputError("say what to prune: --older-than AGE (e.g. 90d), --keep N (the newest N runs of each kind "
                         "and host), or both")
    if keep == 0:
        raise InputError("--keep 0 would remove every run but the baselines (in `check --keep` 0 means keep all): give "
                         "--keep 1 or more to keep the newest N of each kind and host, or leave --keep out")
    if kind is not None and kind not in registry.names():
        raise InputError(f"--kind {safe_text(kind)!s}: not a kind of run; choose from {', '.join(registry.names())}")
    cutoff = age_cutoff(parse_age(age_text)) if age_text is not None else None
    out = _out()
    before = files_size(os.path.expanduser(_db(db_path)))  # as it lies on disk, before this command opens it
    with _open(db_path, create=False) as h:
        done = h.prune(cutoff, keep, kind, host, drop_samples, dry_run)
        if not dry_run and (done.removed or done.thinned):
            h.vacuum()
        elif not dry_run:
            h.checkpoint()
        path = h.path
    after = files_size(path)  # closed: the last connection's -wal and -shm are gone, or counted
    n = sum(done.groups.values())
    groups = ", ".join(f"{k} on {hst or '-'}: {c:,}" for (k, hst), c in sorted(done.groups.items(),
                                                                                key=lambda kv: (-kv[1], kv[0][0])))
    verb = ("would thin" if drop_samples else "would remove") if dry_run else ("thinned" if drop_samples else "removed")
    line = f"{verb} {n:,} of {done.considered:,} run(s) considered" + (f" ({groups})" if groups else "")
    if done.kept_protected:
        line += f"; {done.kept_protected:,} kept as baselines or runs a baseline references"
    out.print(safe_text(line), soft_wrap=True)
    out.print(safe_text(f"{path}: {_mb(before)}" + ("" if dry_run else f" -> {_mb(after)}")), soft_wrap=True)
    return 0


@history_group.command("show")
@click.argument("run")
@click.option(
    "--prometheus",
    "prom_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also write the metrics for node_exporter's textfile collector (a .prom file).",
)
@_db_option
def history_show(run, prom_path, db_path) -> int:
    """One run's headline metrics (RUN: r12 as `history list` prints it, 12, or latest)."""
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    from .compare import noise

    check_writable(prom_path, "--prometheus")
    check_distinct([("--prometheus", prom_path)], _db(db_path))
    out = _out()
    with _open(db_path, readonly=True) as h:
        rec = h.get(run)
        metrics = h.metrics(rec.run_id)
        is_baseline = h.baseline_of(rec) == rec.run_id
    fp = rec.fingerprint
    if prom_path:  # written first, printed after: a reader that stops reading stdout costs no file
        from mgpu_bench.output.prometheus import write_textfile

        try:
            write_textfile(prom_path, metrics, rec.run_id, fp)
        except OSError as exc:
            click.echo(
                safe_text(f"mgpu-bench: could not write {prom_path}: {exc.strerror or exc}"),
                err=True,
            )
            return 1
    source = rec.document.get("source") if isinstance(rec.document.get("source"), dict) else {}
    out.print(safe_text(
        f"run {rec.run_id}: {rec.kind}{' (baseline)' if is_baseline else ''}, created {rec.created}"
        + (f" ({source['created_from']})" if isinstance(source.get("created_from"), str) else "")
        + f", host {rec.host or '-'}"
    ), soft_wrap=True)
    if rec.command:
        out.print(safe_text(f"command: {rec.command}"), soft_wrap=True)
    out.print(safe_text(software_line(rec)), soft_wrap=True)
    if not metrics:
        out.print("no headline metrics in this run")
    else:
        t = Table(box=None, pad_edge=False, header_style="bold")
        t.add_column("metric", overflow="fold")
        t.add_column("value", justify="right", no_wrap=True)
        t.add_column("noise", justify="right", no_wrap=True)
        t.add_column("samples", justify="right")
        for m in metrics:
            absolute = m.unit == "fraction"
            t.add_row(
                safe_text(m.name),
                safe_text(format_value(m.value, m.unit)),
                format_noise(noise(m.samples, absolute), absolute),
                str(len(m.samples)),
            )
        print_table(out, t)
        out.print(
            "noise: 1.4826 x MAD / median of the samples (fractions: in points); - under 5 samples"
        )
    if prom_path:
        out.print(safe_text(f"wrote {prom_path}"))
    return 0


# Kinds whose measurements call no NCCL (a GEMM, a copy between GPUs): their runs' NCCL is not said.
_NO_NCCL = ("gemm", "links")


def software_line(rec) -> str:
    """The software a stored run used, from its fingerprint: driver, CUDA, NCCL and torch for a
    run on GPUs (NCCL where its kind calls it); torch alone, with the backend, for a run of CPU
    processes (a gloo comm run, a model run on the CPU, a run whose machine showed no GPU), whose
    machine's CUDA and NCCL it never loaded into its work."""
    fp, doc = rec.fingerprint, rec.document
    backend = str(doc.get("backend") or "") if rec.kind == "comm" else ""
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    gpus = fp.get("gpus") if isinstance(fp.get("gpus"), list) else []
    cpu = "gloo" in backend or config.get("device") == "cpu" or not gpus and not doc.get("source")
    torch = fp.get("torch") or "-"
    if cpu:
        over = f" ({backend})" if backend else ""
        return f"torch {torch}{over}: CPU processes, no GPU driver, CUDA or NCCL used"
    parts = [f"driver {fp.get('nvidia_driver') or '-'}", f"CUDA {fp.get('cuda_runtime') or '-'}"]
    if rec.kind not in _NO_NCCL:
        parts.append(f"NCCL {fp.get('nccl') or '-'}")
    return ", ".join([*parts, f"torch {torch}"])


@history_group.command("trend")
@click.argument("metric")
@click.option(
    "--limit",
    default=20,
    show_default=True,
    type=AsciiIntRange(1, 100_000),
    help="Latest runs to show.",
)
@click.option("--host", default=None, help="Only the runs of this host (a fleet pass stores one per node).")
@_db_option
def history_trend(metric, limit, host, db_path) -> int:
    """One metric over the runs that have it, oldest first, with the change against the first
    (METRIC: a dotted name as `history show` prints it)."""
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    out = _out()
    with _open(db_path, readonly=True) as h:
        points = h.trend(metric, limit, host)
        if not points and h.skipped:  # stored, but every row of it was changed outside mgpu-bench
            raise InputError(h.skipped[0].removeprefix("left out: "))
        _notes(h)
        if not points:
            raise InputError(_no_trend(h, metric, host))
    first = points[0]
    absolute = first.unit == "fraction"
    out.print(safe_text(f"{metric} ({first.better} is better), oldest first"), soft_wrap=True)
    t = Table(box=None, pad_edge=False, header_style="bold")
    for name, just in (
        ("run", "right"),
        ("created UTC", "left"),
        ("host", "left"),
        ("value", "right"),
        ("vs first", "right"),
    ):
        t.add_column(name, justify=just)  # type: ignore[arg-type]
    for p in points:
        if absolute:
            change: float | None = p.value - first.value
        else:
            change = (p.value - first.value) / abs(first.value) if first.value else None
        t.add_row(
            p.run_id,
            safe_text(p.created.replace("T", " ")[:16]),
            safe_text(p.host or "-"),
            safe_text(format_value(p.value, p.unit)),
            format_change(change, absolute),
        )
    print_table(out, t)
    return 0


def _closest(names_like, metric: str) -> list[str]:
    """The stored names closest to `metric` (those sharing the longest start), up to 3."""
    parts = metric.split(".")
    for k in range(len(parts) - 1, 0, -1):
        hint = [n for n in names_like(".".join(parts[:k]) + ".") if n != metric]
        if hint:
            return hint[:3]
    return []


def _no_trend(h, metric: str, host: str | None) -> str:
    """Why `history trend` found no point: the metric is stored nowhere (the names closest to it),
    or nowhere for that host (what that host does have, and which hosts have the metric)."""
    if host is None:
        hint = _closest(lambda like: h.metric_names(like, 4), metric)
        return f"no stored run has the metric '{metric}'" + (
            f": did you mean {', '.join(hint)}?" if hint else ": see `mgpu-bench history show RUN`")
    others = h.hosts_of(metric)
    elsewhere = f"; runs of {', '.join(others[:5])} have it" if others else "; no run of any host has it"
    theirs = h.host_metric_names(host, None, 1)
    if not theirs:
        return f"no stored run is of host '{host}'{elsewhere}"
    hint = _closest(lambda like: h.host_metric_names(host, like, 4), metric) or h.host_metric_names(host, None, 3)
    return f"host '{host}' has no stored run with the metric '{metric}'{elsewhere}; its metrics include {', '.join(hint)}"


# -- baseline ---------------------------------------------------------------------------------


@click.group("baseline", cls=HelpGroup)
def baseline_group() -> None:
    """The run each kind is compared with by default (`mgpu-bench compare`)."""


@baseline_group.command("set")
@click.argument("run")
@_db_option
def baseline_set(run, db_path) -> int:
    """Makes RUN (r12, 12 or latest) the baseline of its kind, replacing the previous one."""
    with _open(db_path, create=False) as h:
        run_id = h.resolve(run)
        kind = h.set_baseline(run_id)
    _out().print(safe_text(f"{run_id} is now the baseline for {kind} runs"))
    return 0


@baseline_group.command("show")
@click.option("--kind", default=None, help="Only this kind's baseline.")
@_db_option
def baseline_show(kind, db_path) -> int:
    """The baseline run of each kind (exit code 2 when --kind has none)."""
    out = _out()
    with _open(db_path, readonly=True) as h:
        if kind is not None:
            run_id = h.baseline(kind)
            if run_id is None:
                raise InputError(
                    f"no baseline for {kind} runs: set one with `mgpu-bench baseline set RUN`"
                )
            items = {kind: run_id}
        else:
            items = h.baselines()
        if not items:
            out.print(safe_text(
                f"no baselines set in {h.path}: set one with `mgpu-bench baseline set RUN`"
            ))
            return 0
        for k, run_id in items.items():
            rec = h.get(run_id)
            out.print(safe_text(f"{k}: {run_id} (created {rec.created}, host {rec.host or '-'})"))
    return 0


# -- compare ----------------------------------------------------------------------------------

_COMPARE_HELP = """Compares a stored run with a baseline, metric by metric.

\b
RUN and --baseline: r12 (as `history list` prints it), 12, or latest. Without --baseline,
the baseline set for RUN's kind (`mgpu-bench baseline set`).
Per metric: change = (new - base) / base; fractions (MFU, shares) change in percentage
points. Noise of a run = 1.4826 x MAD / median of the metric's own samples (iterations,
steps, bursts), none with fewer than 5. Up to --tolerance a change is "unchanged". Beyond it
a metric is a regression when it is worse by more than max(--tolerance, 3 x the larger noise
of the two runs) (ratios as |ln(new / base)|, so a 10x drop counts as far as a 10x gain), an
improvement when better by as much, "within noise" when inside one noise, and "cannot tell"
in between: larger than the runs' spread, too small against it to call. On a host too noisy
to compare (a CPU run started on a busy host, or figures spreading over 10% within a run)
each metric's noise is at least that run's typical spread (said). Differences of host, GPUs,
driver, CUDA, NCCL, torch, NCCL_*/CUDA_* variables or topology between the two runs are
printed first as a warning.

\b
Exit codes: 0 no regression and nothing undecided; 1 at least one regression, or runs that
cannot be compared (gate cron jobs and CI on it); 2 bad input (unknown run, no baseline, bad
--tolerance, an unusable database, a --json path that cannot be written: checked before
comparing); 3 compared without a regression, but --json could not be written afterwards (a
full disk must not read as a regression; a regression still exits 1, with the write failure
said); 4 cannot tell: no regression, but a change too close to the noise to call either way
(run both again on a quieter host, or with more steps or iterations).
"""


@click.command("compare", help=_COMPARE_HELP)
@click.argument("run")
@click.option(
    "--baseline",
    "base",
    default=None,
    metavar="RUN",
    help="The run to compare with [default: RUN's kind's baseline].",
)
@click.option(
    "--tolerance",
    "tolerance_text",
    default="5%",
    show_default=True,
    help="Changes up to this are unchanged: 5% or 0.05 (more than 0, less than 100%).",
)
@click.option(
    "--json",
    "json_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the comparison (base units, every metric) as JSON.",
)
@_db_option
def compare_command(run, base, tolerance_text, json_path, db_path) -> int:
    from rich.table import Table

    from mgpu_bench.output.console import stdout_failure
    from mgpu_bench.output.tables import print_table

    from .compare import NOISE_K, STATUSES, compare_runs

    tolerance = parse_tolerance(tolerance_text)
    check_writable(json_path, "--json")
    check_distinct([("--json", json_path)], _db(db_path))
    with _open(db_path, readonly=True) as h:
        new = h.get(run)
        if base is None:
            base = h.baseline_of(new)
            if base is None:
                raise InputError(
                    f"no baseline for {new.kind} runs: set one with `mgpu-bench baseline set RUN`, "
                    "or give --baseline RUN"
                )
        result = compare_runs(h, base, new.run_id, tolerance)
    code = EXIT_REGRESSION if result.failed else EXIT_CANNOT_TELL if result.cannot_tell else 0
    if json_path:  # written first, printed after: a reader that stops reading stdout costs no file
        from mgpu_bench.core.paths import write_json

        try:
            write_json(json_path, result.to_dict())
        except OSError as exc:
            code = EXIT_REGRESSION if result.failed else EXIT_OUTPUT
            click.echo(
                safe_text(f"mgpu-bench: compared, but could not write {json_path}: {exc.strerror or exc} "
                          f"(exit code {code}: {'a regression' if result.failed else 'the file is missing'})"),
                err=True,
            )
    out = _out()
    for line in result.not_comparable:
        out.print(safe_text(f"not comparable: {line}"), style="bold red", soft_wrap=True)
    for line in result.fingerprint_differences:
        out.print(
            safe_text(f"warning: {result.base} and {result.new} ran on different setups: {line}"),
            style="bold yellow",
            soft_wrap=True,
        )
    for line in result.warnings:
        out.print(safe_text(f"warning: {line}"), style="bold yellow", soft_wrap=True)
    out.print(
        f"{result.new} against {result.base}: a regression is worse by more than "
        f"max({100 * tolerance:g}%, {NOISE_K:g} x noise)",
        soft_wrap=True,
    )
    t = Table(box=None, pad_edge=False, header_style="bold")
    t.add_column("metric", overflow="fold")
    for name in ("base", "new", "change", "noise"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("status", no_wrap=True)
    styles = {"regression": "bold red", "improvement": "green", "missing": "yellow", "cannot tell": "yellow"}
    for c in result.changes:
        t.add_row(
            safe_text(c.name),
            safe_text(format_value(c.base, c.unit)),
            safe_text(format_value(c.new, c.unit)),
            format_change(c.change, c.absolute),
            format_noise(_spread(c), c.absolute),
            c.status,
            style=styles.get(c.status),
        )
    print_table(out, t)
    counts = {s: sum(1 for c in result.changes if c.status == s) for s in STATUSES}
    for c in result.regressions:  # one line each, for grep and mail
        out.print(safe_text(
            f"regression: {c.name} {format_value(c.base, c.unit)} -> {format_value(c.new, c.unit)} "
            f"({format_change(c.change, c.absolute)}, threshold {format_noise(c.threshold, c.absolute)})"),
            soft_wrap=True,
        )
    for c in result.undecided:
        out.print(safe_text(
            f"cannot tell: {c.name} {format_value(c.base, c.unit)} -> {format_value(c.new, c.unit)} "
            f"({format_change(c.change, c.absolute)}: beyond the noise {format_noise(_spread(c), c.absolute)}, under "
            f"the threshold {format_noise(c.threshold, c.absolute)})"),
            soft_wrap=True,
        )
    out.print(", ".join(f"{n} {s}{'s' if n != 1 and s in ('regression', 'improvement') else ''}"
                        for s, n in counts.items()))
    if result.cannot_tell:
        out.print(f"cannot tell (exit code {EXIT_CANNOT_TELL}): {len(result.undecided)} change(s) too close to the "
                  "noise to call; run both again on a quieter host, or longer", soft_wrap=True)
    out.print(f"{result.compared} metric(s) compared, those both runs have; {counts['missing']} only in {result.base}, "
              f"{counts['added']} only in {result.new}", soft_wrap=True)
    if code in (0, EXIT_CANNOT_TELL) and stdout_failure() is not None and not isinstance(stdout_failure(), BrokenPipeError):
        return EXIT_OUTPUT  # compared, no regression, the comparison not printed: never the regression code
    return code


def _spread(c) -> float | None:
    """The noise a change was judged against: the larger of the runs', or a noisy host's floor."""
    known = [x for x in (c.noise_base, c.noise_new, c.floor) if x is not None]
    return max(known) if known else None


def register(main: click.Group) -> None:
    """Adds `history`, `baseline`, `compare` and `side-by-side` to the main command group (idempotent)."""
    from .side_by_side_render import side_by_side_command

    for command in (history_group, baseline_group, compare_command, side_by_side_command):
        main.add_command(command)

