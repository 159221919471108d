"""nccl-tests and rccl-tests logs as comm runs: what `mgpu-bench history add LOG` stores.

Each run of a log (mgpu_bench.results.nccl_tests reads the text) becomes a comm result document like
the probe's own: one measurement per row and placement, with the same size semantics (nccl-tests'
size column is the comm probe's size), so its busbw per size has the same metric name as a
`mgpu-bench comm` run's and the two compare 1:1. The document says where it came from
("source") and what the log could not tell ("not_in_log" in its environment).

The log prints each figure rounded: time to its column's decimals, algbw and busbw to two
(nccl-tests' getFloatStr, rccl-tests' %6.2f). The seconds stored are the one time every printed
figure of the row agrees with (inside each figure's rounding, algbw = size / time, busbw = algbw
x the op's bus factor), so that the document's derived time, algbw and busbw print as the log
printed them. A row whose figures admit no such time (another rank count or formula, an edited
log) keeps the printed time and is said.

A log with a problem is stored with it said (findings: wrong elements, a failed check, a run cut
short, lines of another run); one with nothing usable is an InputError (exit code 2) and nothing
is stored. The log's own facts win over options: a run's collective is the program it names (or
the one its table fits), and `--op` naming another is an InputError; its rank count is the ranks
its device lines show, never more (a header's nThread x nGpus only where the log has none, and
then at most MAX_UNLISTED). Every document of the logs given is built and checked before any is
stored, and `history add` stores them in one transaction: a file is stored whole or not at all.

A run's time ("created") is the time the log states, where it states one (nccl-tests -S 1 prints
the local time after each row; the first row's is taken, its zone unknown), else the time of the
import, said in the source; never the file's modification time, which a copy resets.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mgpu_bench.core.errors import InputError
from mgpu_bench.machine.theory import platform_theory
from mgpu_bench.results import nccl_tests
from mgpu_bench.results.document import Document
from mgpu_bench.results.measurement import CommMeasurement, CommSpec
from mgpu_bench.results.ops import OP_ORDER, REDOPS, busbw_factor

from .document import result_document
from .plan import CommRun

# What a log cannot tell, said in the run's fingerprint (the header and compare read them).
NOT_IN_LOG = ("nvidia_driver", "cuda_runtime", "cuda_driver", "torch", "topology", "network", "env")
# GPUs one process drives by its header alone, where the log shows no device lines: the most GPUs
# one node holds (16: HGX-2, DGX-2); beyond it the log must show its ranks.
MAX_UNLISTED = 16
# Ranks x figures of one run: each figure lists its devices (4 Mi names: about 50 MB of JSON).
MAX_DEVICE_NAMES = 1 << 22
MAX_ITERS = 1 << 40  # iters x agg iters x graph launches, as the comm document declares them
SAID = 5  # rows (wrong elements, types left out) named one by one; the rest counted
CREATED_FROM_LOG = ("the log's own time: its first row's timestamp (nccl-tests -S 1), the test host's local time "
                    "read as UTC (the log names no time zone)")
CREATED_AT_IMPORT = ("the time of the import: the log states no time of its own (nccl-tests prints one per row only "
                     "with -S 1)")
TIME_NOTE = ("time: the log's per-iteration time, averaged over the ranks as nccl-tests does by default (-a 1; the "
             "log does not say which -a it ran with), where mgpu-bench comm takes the slowest rank's")


@dataclass
class Piece:
    """One usable run of one file, read into measurements."""

    file: str
    section: nccl_tests.Section
    op: str
    op_from: str
    nranks: int
    measurements: list[CommMeasurement]
    findings: list[str]
    notes: list[str]
    created: str | None  # the log's own time (naive ISO 8601, local to its host) or None
    wrong: int = 0  # wrong elements its rows report (the #wrong columns)
    index: int = 0  # the log's place among those given


def documents(logs: Sequence[tuple[str, str]], op: str | None = None,
              join: bool = False) -> list[tuple[Document, list[int]]]:
    """The comm documents of (file name, text) logs, each with the indices of the logs it holds:
    one per run, or with `join` one for them all (one machine's logs, a file per collective).
    `op` names the collective of a log that does not; a log that names (or whose table fits)
    another is an InputError. InputError, naming the file, where a log holds nothing to store or
    says what nccl-tests cannot print."""
    if op is not None and op not in OP_ORDER:
        raise InputError(f"--op {op!r}: choose from {', '.join(OP_ORDER)}")
    pieces: list[Piece] = []
    for index, (name, text) in enumerate(logs):
        try:
            sections = nccl_tests.parse(text)
        except nccl_tests.LogError as exc:
            raise InputError(f"{name}: {exc}") from None
        _refuse_interleaved(name, sections)
        kept, refused = [], []
        for s in sections:
            piece = _piece(name, s, op)
            if isinstance(piece, str):
                refused.append(piece)
                continue
            piece.index = index
            kept.append(piece)
        if not kept:
            raise InputError(f"{name}: {refused[-1]}")
        for piece in kept:  # a run of the same file with nothing to store (a failed first attempt): said
            piece.findings += [f"{name}: {why} (left out)" for why in refused]
        pieces += kept
    if join and len(pieces) > 1:
        return [(_document(pieces), sorted({p.index for p in pieces}))]
    return [(_document([p]), [p.index]) for p in pieces]


def _refuse_interleaved(name: str, sections: list[nccl_tests.Section]) -> None:
    mixed = [s for s in sections if any(p.startswith("mixed:") for p in s.problems)]
    if not mixed:
        return
    lines = ", ".join(str(s.first_line) for s in sections)
    alone = all(len(s.ranks) == 1 and s.ranks[0].rank == 0 for s in sections)
    why = (": every process ran the test alone as rank 0 of a 1-rank run (nccl-tests built without MPI=1 and "
           "started by mpirun or srun); rebuild it with `make MPI=1`" if alone else
           ": give one run's output per file")
    raise InputError(f"{name}: the output of {len(sections)} runs is interleaved (headers at lines {lines}, each "
                     f"before the rows of the one before){why}")


def _piece(name: str, s: nccl_tests.Section, op: str | None) -> Piece | str:
    """The section read into measurements, or why it has nothing to store. InputError where it
    claims what its own lines do not show, or contradicts --op."""
    if not s.rows:
        if s.errors:
            return f"the run failed before its first result ({s.errors[0]})"
        return (f"no result rows in the run at line {s.first_line} (the log ends at line {s.last_line}, before its "
                "table)" if not s.finished else f"the run at line {s.first_line} printed no result rows")
    findings, notes = [], []
    nranks = _ranks(name, s, findings, notes)
    own, why = nccl_tests.op_of(s, nranks)
    if op is None:
        if own is None:
            return f"{why}: give --op (one of {', '.join(OP_ORDER)})"
        op = own
        if not s.program:
            notes.append(f"collective: {why}")
    else:
        _agrees(name, s, op, nranks)
        if own is None:
            why = f"given with --op ({why})"
    iters = s.params.get("iters", 0) * max(s.params.get("agg_iters", 1), 1) * max(s.params.get("graph", 0), 1)
    if iters > MAX_ITERS:
        raise InputError(f"{name}: the run at line {s.first_line} claims {iters:,} timed iterations (iters x agg iters "
                         f"x graph launches; at most {MAX_ITERS:,}): an edited or damaged log")
    groups: dict[tuple, list[tuple]] = {}
    skipped: dict[str, int] = {}
    mismatched, wrong_rows = [], []
    for r in s.rows:
        dtype = nccl_tests.DTYPES.get(r.type)
        redop = None if r.redop == "none" else r.redop
        if dtype is None or (redop is not None and redop not in REDOPS):
            what = f"type {r.type}" if dtype is None else f"redop {r.redop}"
            skipped[what] = skipped.get(what, 0) + 1
            continue
        for place, cell in r.cells.items():
            seconds, agrees = fit_seconds(cell, r.size, busbw_factor(op, nranks), s.cputime)
            if not agrees:
                mismatched.append(r.line)
            key = (dtype, redop, r.size, r.count, place == "in", max(r.root, 0))
            groups.setdefault(key, []).append((seconds, cell.wrong, r.line))
            if cell.wrong:
                wrong_rows.append((r.line, place, cell.wrong))
    for what, n in list(skipped.items())[:SAID]:
        notes.append(f"{n} row(s) of {what} left out: not a type and redop mgpu-bench comm measures")
    if not groups:
        return "no row of a type and redop mgpu-bench comm measures (" + ", ".join(list(skipped)[:SAID]) + ")"
    if len(groups) * nranks > MAX_DEVICE_NAMES:
        raise InputError(f"{name}: the run at line {s.first_line} has {len(groups):,} figures over {nranks:,} ranks, "
                         f"more than one document holds (each figure names its devices; at most {MAX_DEVICE_NAMES:,} "
                         "names): give its sizes in several logs")
    for line, place, n in wrong_rows[:SAID]:
        findings.append(f"{name} line {line}: {n} wrong element(s) {'in' if place == 'in' else 'out-of'}-place: the "
                        "data did not arrive intact")
    if len(wrong_rows) > SAID:
        findings.append(f"{name}: {len(wrong_rows) - SAID:,} more figure(s) with wrong elements (lines "
                        f"{_lines([w[0] for w in wrong_rows[SAID:]])})")
    if mismatched:
        findings.append(f"{name}: {len(mismatched)} figure(s) (lines {_lines(mismatched)}) whose algbw and busbw do not "
                        f"fit the time with {op}'s bus factor over {nranks} ranks: printed time kept (another rank "
                        "count, or an edited log)")
    findings += [f"{name} {p}" for p in s.problems] + [f"{name} {e}" for e in s.errors]
    findings += _footer(name, s)
    repeats = max(len(v) for v in groups.values())
    if repeats > 1:
        notes.append(f"{repeats} rows per size (the log repeats its table: -N cycles or joined logs): the median "
                     "time is the figure, each row a sample")
    if s.cputime:
        notes.append("the log's time column is CPU time (-C 1); the seconds stored follow its algbw and busbw")
    return Piece(name, s, op, why, nranks, _measurements(s, op, nranks, groups), findings, notes, s.started,
                 sum(w[2] for w in wrong_rows))


def _ranks(name: str, s: nccl_tests.Section, findings: list[str], notes: list[str]) -> int:
    """The run's rank count: the ranks its device lines show; without any, its header's nThread x
    nGpus (one process) up to MAX_UNLISTED, an InputError beyond."""
    local = s.local_gpus
    if s.nranks is None:
        if local > MAX_UNLISTED:
            raise InputError(f"{name}: the run at line {s.first_line} claims nThread {s.params.get('nthread')} x nGpus "
                             f"{s.params.get('ngpus')} = {local:,} GPUs in one process, and the log has no device "
                             "lines ('#  Rank  0 Group  0 Pid ...') to show them: give the log with its '# Using "
                             "devices' lines")
        notes.append(f"the log has no device lines: {local} rank(s) from its nThread x nGpus (one process)")
        return local
    if s.nranks < local:
        findings.append(f"{name}: the run at line {s.first_line} claims {local} GPU(s) per process (nThread x nGpus), "
                        f"its device lines show {s.nranks}: {s.nranks} rank(s) taken (lines missing, or a process's "
                        "list cut at 2048 bytes)")
    return s.nranks


def _agrees(name: str, s: nccl_tests.Section, op: str, nranks: int) -> None:
    """--op against the log's own collective: the program it names, else what its table fits."""
    if s.program:
        own, _ = nccl_tests.program_op(s.program)
        if own != op:
            raise InputError(f"{name}: --op {op}, but the run at line {s.first_line} is the log of {s.program}"
                             + (f" ({own})" if own else "") + ": the log's own collective counts; leave --op out")
        return
    fits = nccl_tests.table_fits(s, nranks)
    if fits is not None and op not in fits:
        raise InputError(f"{name}: --op {op}, but the table of the run at line {s.first_line} fits "
                         + (" or ".join(fits) if fits else "no collective mgpu-bench comm measures")
                         + f" (its sizes, counts, root and busbw/algbw over {nranks} rank(s)): leave --op out, or give "
                         f"the log of {op}")


def fit_seconds(cell: nccl_tests.Cell, size: int, factor: float, cputime: bool = False) -> tuple[float, bool]:
    """(seconds, True) for the time that every printed figure of `cell` rounds to: time within
    its rounding, algbw = size / time and busbw = algbw x factor within theirs; (the printed time,
    False) when no time fits them all. With a CPU time column (-C 1) the bandwidths alone decide."""
    lo, hi = (cell.time.value - cell.time.half) * 1e-6, (cell.time.value + cell.time.half) * 1e-6
    if cputime:
        lo, hi = 0.0, float("inf")
    for bw, half, f in ((cell.algbw.value, cell.algbw.half, 1.0), (cell.busbw.value, cell.busbw.half, factor)):
        if f <= 0:
            continue  # one rank: busbw is 0 whatever the time
        top, bottom = (bw + half) / f * 1e9, (bw - half) / f * 1e9  # bytes/s
        lo = max(lo, size / top)
        if bottom > 0:
            hi = min(hi, size / bottom)
    if lo <= hi and 0 < hi < float("inf"):
        return (lo + hi) / 2, True
    return cell.time.value * 1e-6, False


def _measurements(s: nccl_tests.Section, op: str, nranks: int, groups: dict) -> list[CommMeasurement]:
    devices = _devices(s, nranks)
    graph = s.params.get("graph", 0)
    iters = s.params.get("iters", 0) * max(s.params.get("agg_iters", 1), 1) * max(graph, 1)
    out = []
    for (dtype, redop, size, count, inplace, root), rows in groups.items():
        seconds = [t for t, _, _ in rows]
        wrong = [w for _, w, _ in rows]
        spec = CommSpec(op=op, dtype=dtype, redop=redop, size=size, bytes=size, count=count, nranks=nranks,
                        inplace=inplace, backend=s.tool or "nccl-tests", devices=tuple(devices), graph=graph > 0,
                        root=root)
        out.append(CommMeasurement(spec, iters=iters, batch=max(s.params.get("iters", 1), 1),
                                   burst_seconds=(statistics.median(seconds),), samples=np.asarray([seconds]),
                                   wrong=None if any(w is None for w in wrong) else (sum(wrong),)))
    return out


def _devices(s: nccl_tests.Section, nranks: int) -> list[str]:
    ranks = sorted(s.ranks, key=lambda r: r.rank)
    if not ranks:
        return [f"cuda:{i}" for i in range(nranks)]
    several = len(s.hosts) > 1
    return [f"{r.host}:cuda:{r.device}" if several else f"cuda:{r.device}" for r in ranks]


def _footer(name: str, s: nccl_tests.Section) -> list[str]:
    """What the run's closing lines say against it: a failed check, an average that the rows do
    not give (rows missing, or another run's mixed in)."""
    out = []
    if s.oob is not None and not s.oob[1]:
        out.append(f"{name}: the log's own check failed: 'Out of bounds values : {s.oob[0]} FAILED'")
    if s.avg_check == "FAILED":
        out.append(f"{name}: the log's bandwidth check failed: average bus bandwidth {s.avg_busbw.text} GB/s is below "
                   "90% of its NCCL_TESTS_MIN_BW")
    figures = [c.busbw for r in s.rows for c in r.cells.values()]
    if s.avg_busbw is not None and figures and not any("left out" in p for p in s.problems):
        mean = sum(f.value for f in figures) / len(figures)
        if abs(mean - s.avg_busbw.value) > max(f.half for f in figures) + s.avg_busbw.half + 1e-9:
            out.append(f"{name}: mixed or incomplete: its average bus bandwidth line says {s.avg_busbw.text} GB/s, its "
                       f"{len(figures)} busbw figures average {mean:.3f} (rows missing, or another run's mixed in)")
    return out


def _lines(lines: list[int]) -> str:
    return ", ".join(map(str, lines[:5])) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")


def _document(pieces: list[Piece]) -> Document:
    """One comm document of one or more pieces (joined: one machine's runs)."""
    first = pieces[0]
    ranks = [(r.rank, r.host, r.device, r.name) for r in first.section.ranks]
    for p in pieces[1:]:
        if [(r.rank, r.host, r.device, r.name) for r in p.section.ranks] != ranks or p.nranks != first.nranks:
            raise InputError(f"--join: {first.file} and {p.file} ran on different ranks or devices: store them apart")
        if (p.section.tool, p.section.library) != (first.section.tool, first.section.library):
            raise InputError(f"--join: {first.file} and {p.file} come from different tools or library versions: store "
                             "them apart")
    s = first.section
    merged: dict[tuple, CommMeasurement] = {}
    for p in pieces:
        for m in p.measurements:
            key = (m.spec.op, m.spec.dtype, m.spec.redop, m.spec.size, m.spec.inplace, m.spec.root)
            merged[key] = m if key not in merged else _cycles(merged[key], m)
    names = list(dict.fromkeys(r.name for r in s.ranks if r.name))
    theory = platform_theory(names[0] if len(names) == 1 else None, first.nranks, max(len(s.hosts), 1))
    if len(names) > 1:
        theory = platform_theory(None, first.nranks)
    tool = s.tool or "nccl-tests"
    errors = [e for p in pieces for e in p.section.errors]
    truncated = [p for p in pieces if not p.section.finished]
    stopped, message = None, None
    if errors:
        stopped = "timeout" if "timeout" in errors[0].lower() else "nccl_error"
        message = errors[0]
    elif truncated:
        stopped, message = "truncated", f"{truncated[0].file}: the log ends before the run's closing lines"
    run = CommRun(backend=tool, devices=list(next(iter(merged.values())).spec.devices), requests=[],
                  measurements=list(merged.values()),
                  notes=list(dict.fromkeys([TIME_NOTE, *(n for p in pieces for n in p.notes)])),
                  stopped=stopped, stop_message=message)
    run.theory = theory
    run.findings = list(dict.fromkeys(f for p in pieces for f in p.findings))
    environment = _environment(s, tool)
    command = f"{' '.join(dict.fromkeys(p.section.program or p.op for p in pieces))} ({_tool_text(s)} log " \
              f"{', '.join(dict.fromkeys(p.file for p in pieces))})"
    doc = result_document(run, environment, command)
    stated = [p.created for p in pieces if p.created]
    if stated:  # else the envelope's: now, the time of the import
        doc["created"] = f"{min(stated)}+00:00"
    doc["source"] = {
        "tool": tool, "version": s.version, "library": nccl_tests.version_text(s.library),
        "headers": nccl_tests.version_text(s.headers),
        "created_from": CREATED_FROM_LOG if stated else CREATED_AT_IMPORT,
        "logs": [{"file": p.file, "lines": [p.section.first_line, p.section.last_line], "program": p.section.program,
                  "op": p.op, "op_from": p.op_from, "ranks": p.nranks, "params": p.section.params,
                  "average_busbw": None if p.section.avg_busbw is None else p.section.avg_busbw.value * 1e9,
                  "out_of_bounds": None if p.section.oob is None else {"count": p.section.oob[0], "ok": p.section.oob[1]},
                  "wrong_elements": p.wrong, "started": p.created, "finished": p.section.finished} for p in pieces],
    }
    return Document.of(doc, run)


def _cycles(a: CommMeasurement, b: CommMeasurement) -> CommMeasurement:
    """The same figure twice (a table repeated in joined logs): both rows as samples."""
    seconds = [*a.samples[0].tolist(), *b.samples[0].tolist()]
    wrong = None if a.wrong is None or b.wrong is None else (a.total_wrong + b.total_wrong,)
    return CommMeasurement(a.spec, a.iters, a.batch, (statistics.median(seconds),), np.asarray([seconds]), wrong)


def _tool_text(s: nccl_tests.Section) -> str:
    return f"{s.tool or 'nccl-tests'}{' ' + s.version if s.version else ''}"


def _environment(s: nccl_tests.Section, tool: str) -> dict:
    """The fingerprint a log gives: hosts, GPUs (name, device index, PCI bus as printed), the
    library version; and what it does not."""
    library = nccl_tests.version_text(s.library)
    ranks = sorted(s.ranks, key=lambda r: r.rank)
    return {
        "host": ",".join(s.hosts)[:1024] or None,
        "gpus": [{"index": r.device, "name": r.name or None, "pci_bus_id": r.bus or None, "uuid": None,
                  "rank": r.rank, "host": r.host} for r in ranks],
        "nccl": None if library is None else f"{library}{' (RCCL)' if tool == 'rccl-tests' else ''}",
        "env": None,
        "source": f"{_tool_text(s)} log",
        "not_in_log": list(NOT_IN_LOG),
    }
