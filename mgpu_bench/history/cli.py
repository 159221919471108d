"""`mgpu-bench history`: the stored runs (add, list, prune, show, trend); and register(), which puts
every history command on the main group: these, `baseline` and `compare` (cli_compare.py) and
`side-by-side` (side_by_side_render.py).

Bad input raises InputError, which the main group turns into one line on stderr and exit code 2.
Every stored string (host, kind, command, versions, metric names) passes through safe_text()
before it reaches the terminal: a stored document is outside text, and may hold escape sequences.
"""

from __future__ import annotations

import math
import os

import click

from mgpu_bench.core.errors import InputError
from mgpu_bench.core.paths import check_distinct, check_writable
from mgpu_bench.output.console import safe_text
from mgpu_bench.output.tables import format_value
from mgpu_bench.results.numbers import AsciiIntRange, ascii_float

from .cli_common import HelpGroup, _db, _db_option, _open, _out, format_change, format_noise
from .cli_compare import baseline_group, compare_command

# Kinds `history list` leaves out unless asked (--all, --kind): a plan measures nothing, and every
# `mgpu-bench plan` is stored.
FOLDED_KINDS = ("plan",)


def _notes(h) -> None:
    """The rows a listing left out (changed outside mgpu-bench), one note each on stderr."""
    for line in dict.fromkeys(h.skipped):
        click.echo(safe_text(f"note: {line}"), err=True)


def _short_command(command: str | None) -> str:
    """The stored command line with the program's folder dropped (shown on one line)."""
    if not command:
        return "-"
    program, _, rest = command.partition(" ")
    return " ".join(x for x in (os.path.basename(program), rest) if x)


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

    from .records import prepare

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


def register(main: click.Group) -> None:
    """Adds `history`, `baseline`, `compare` and `side-by-side` to the main command group (idempotent)."""
    from .side_by_side_render import side_by_side_command

    for command in (history_group, baseline_group, compare_command, side_by_side_command):
        main.add_command(command)

