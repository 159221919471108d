"""The text output of NVIDIA's nccl-tests and AMD's rccl-tests, read line by line.

Not NCCL's debug log (nccl_log.py reads that): this is what `all_reduce_perf` and the other
`*_perf` binaries print. Its lines, as their printf formats write them (NVIDIA/nccl-tests
src/util.cu and src/common.cu at 2.19.6; ROCm/rccl-tests src/common.cu, 2024, and src/common.cpp,
2025), any of which older or newer releases may leave out:

    # nccl-tests version 2.19.6 nccl-headers=22803 nccl-library=22803      (nccl-tests >= 2.17)
    # rccl-tests version 2.18.3-HEAD:418cd5f rccl-headers=23004 rccl-library=23004   (rccl-tests, 2026)
    # Collective test starting: all_reduce_perf                          (nccl-tests >= 2.15, rccl 2025)
    # nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20
      agg iters: 1 validation: 1 graph: 0 [unalign: 0]                    (one line; every release)
    rccl-tests: Version develop:5272cd1                                  (rccl-tests until 2025)
    # Using devices
    #  Rank  0 Group  0 Pid   1395 on         vm device  0 [0000:00:06] NVIDIA H200
    #   Rank  0 Pid 590032 on pinoak0003 device  0 [0000:c1:00.0] AMD Instinct MI250X   (rccl 2024)
    #                                                   out-of-place                       in-place
    #       size         count      type   redop    root     time   algbw   busbw  #wrong     time ...
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us) ...
        67108864      16777216     float     sum      -1   248.87  269.65  269.65       0   248.60 ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 311.455
    # Collective test concluded: all_reduce_perf

The table's columns are read from its header line: one group (time or cputime, algbw, busbw,
#wrong, and with -I 1 i_min i_max i_p99 i_cv%) per placement the first header line names
(out-of-place, in-place, or one of them: rccl-tests -O); what follows (-S timestamps, rccl-tests
-M algo/proto/nchannels) is not read. #wrong is "N/A" where the test does not check (sendrecv
in place). Sizes and times are as nccl-tests defines them: size = max(send, receive) bytes of one
rank, count = the element count passed to the collective, time = seconds per iteration averaged
over the ranks (`-a 1`, the default), divided by the graph launches under -G.

A log may hold several runs one after another (concatenated files); each becomes its own
Section. Everything this module cannot place is said in `problems`; nothing is guessed. It is
import-light: no numpy, no backend.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

# Element sizes of nccl-tests' type names (test_typenames in src/common.cu; "char" and "int" are
# the names before NCCL 2; rccl-tests writes fp8_e4m3 where nccl-tests writes f8e4m3).
TYPE_BYTES = {"int8": 1, "char": 1, "uint8": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
              "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1,
              "fp8_e5m2": 1}
# The types mgpu-bench comm measures, by nccl-tests' names (the rest are read, and left out of a run).
DTYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64", "int32": "int32", "int": "int32",
          "int8": "int8", "char": "int8", "f8e4m3": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "f8e5m2": "fp8_e5m2",
          "fp8_e5m2": "fp8_e5m2"}
# The `*_perf` binaries and mgpu-bench's names for their collectives (None: one comm does not measure).
PROGRAMS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
            "broadcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall", "sendrecv": "sendrecv",
            "gather": None, "scatter": None, "alltoallv": None, "hypercube": None, "all_reduce_bias": None}
FIELDS = ("time", "algbw", "busbw", "#wrong")
PER_ITER = ("i_min", "i_max", "i_p99", "i_cv%")

_VERSION = re.compile(r"#\s*(nccl|rccl)-tests version (\S+) (?:nccl|rccl)-headers=(\d+) (?:nccl|rccl)-library=(\d+)")
_RCCL_OLD = re.compile(r"^rccl-tests: Version (\S+)")
_STARTING = re.compile(r"# Collective test starting: (\S+)")
_CONCLUDED = re.compile(r"# Collective test concluded: (\S+)")
_HEADER = re.compile(r"#\s*nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\) "
                     r"warmup iters: (\d+) iters: (\d+) agg iters: (\d+) validation: (\d+) graph: (\d+)"
                     r"(?: unalign: (\d+))?")
_RANK = re.compile(r"#\s+Rank\s+(\d+)(?:\s+Group\s+(\d+))?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                   r"\[([^\]]*)\]\s?(.*?)\s*$")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?")
_ERROR = re.compile(r"(Test (?:NCCL |CUDA |HIP )?failure|Test timeout|# error: )")
_PROGRAM = re.compile(r"\b(" + "|".join(sorted(PROGRAMS, key=len, reverse=True)) + r")_perf(?:_mpi)?\b")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class LogError(ValueError):
    """A text that holds no usable nccl-tests or rccl-tests run (said in one line)."""


@dataclass(frozen=True)
class Figure:
    """A number as the log printed it: its value and half a unit of its last printed digit (the
    rounding it may carry)."""

    value: float
    half: float
    text: str


@dataclass(frozen=True)
class Rank:
    rank: int
    group: int | None
    pid: int
    host: str
    device: int
    bus: str
    name: str


@dataclass(frozen=True)
class Cell:
    """One placement of one row: time (us), algbw and busbw (GB/s) as printed, #wrong (None: N/A)."""

    time: Figure
    algbw: Figure
    busbw: Figure
    wrong: int | None


@dataclass(frozen=True)
class Row:
    line: int  # 1-based in the file
    size: int
    count: int
    type: str
    redop: str
    root: int
    cells: dict  # "out" / "in" -> Cell


@dataclass
class Section:
    """One run of one binary: its header, its devices, its table and its footer."""

    first_line: int
    tool: str | None = None  # "nccl-tests" or "rccl-tests", where a version line says so
    version: str | None = None
    headers: int | None = None  # NCCL_VERSION_CODE the test was built with (RCCL's for rccl-tests)
    library: int | None = None  # the library's ncclGetVersion
    program: str | None = None  # all_reduce_perf
    params: dict = field(default_factory=dict)
    ranks: list[Rank] = field(default_factory=list)
    placements: tuple[str, ...] = ()  # "out", "in" in table order
    columns: tuple[str, ...] = ()  # the header line's names
    cputime: bool = False  # -C 1: the time column is the host's CPU time, not the timed iterations'
    rows: list[Row] = field(default_factory=list)
    oob: tuple[int, bool] | None = None
    avg_busbw: Figure | None = None
    avg_check: str | None = None  # "OK" / "FAILED" with NCCL_TESTS_MIN_BW set
    concluded: bool = False
    errors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    last_line: int = 0
    mentions: set = field(default_factory=set)  # *_perf binaries named in its lines (an echoed command)

    @property
    def finished(self) -> bool:
        """The footer is there (the test ran to its end)."""
        return self.avg_busbw is not None

    @property
    def nranks(self) -> int | None:
        return len(self.ranks) or None

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(r.host for r in self.ranks))


def figure(text: str) -> Figure:
    """'248.87' -> 248.87 give or take 0.005; '12402.6' 0.05; '1e+06' (nccl-tests' getFloatStr
    once a number no longer fits its column) 5e5. ValueError for what is no number."""
    if not _NUMBER.fullmatch(text):
        raise ValueError(text)
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    half = 0.5 * 10.0 ** (int(exponent or 0) - decimals)
    return Figure(float(text), half, text)


def version_text(code: int | None) -> str | None:
    """NCCL_VERSION_CODE -> '2.28.3' (X*10000 + Y*100 + Z from 2.9 on, X*1000 + Y*100 + Z before)."""
    if not code:
        return None
    if code >= 10000:
        return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"
    return f"{code // 1000}.{(code % 1000) // 100}.{code % 100}"


def read_log(path) -> str | None:
    """The text of the file at `path` when it is a nccl-tests or rccl-tests log; None when it is
    to be read as a result document (JSON, or a file a document reader refuses in its own words:
    missing, a folder, a FIFO); InputError (exit code 2) for a file that is neither."""
    import os
    import stat

    from .errors import InputError
    from .schema import shown

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{shown(path)} is not text: give a result document written by a command's --json, or "
                         "the text output of nccl-tests or rccl-tests") from None
    if text.lstrip()[:1] in ("{", "["):
        return None
    if looks_like_log(text):
        return text
    raise InputError(f"{shown(path)} is neither a result document (JSON) nor the output of nccl-tests or rccl-tests "
                     "(no '# nThread N nGpus N minBytes ...' line): give a file written by a command's --json, or "
                     "the text all_reduce_perf and the other *_perf binaries print")


def looks_like_log(text: str) -> bool:
    """The text has the header line every nccl-tests and rccl-tests release prints, or a table."""
    return bool(_HEADER.search(text)) or bool(re.search(r"^#\s+size\s+count\s+type\s+redop", text, re.MULTILINE))


def parse(text: str) -> list[Section]:
    """The runs of a log, in order. LogError when none has a header line (a foreign text)."""
    lines = text.splitlines()
    sections: list[Section] = []
    pending: dict = {}  # version and program lines seen before the header they belong to
    current: Section | None = None
    for i, raw in enumerate(lines, start=1):
        line = raw.rstrip()
        mention = _PROGRAM.search(line)  # a command line echoed into the log names the binary
        if mention and not _CONCLUDED.search(line):
            (current.mentions if current is not None and not current.finished else
             pending.setdefault("mentions", set())).add(mention.group(1))
        m = _VERSION.search(line)
        if m:
            pending.update(tool=f"{m.group(1)}-tests", version=m.group(2), headers=int(m.group(3)),
                           library=int(m.group(4)), at=pending.get("at", i))
            continue
        m = _STARTING.search(line)  # rccl-tests on gfx942 prints a note without a newline before it
        if m:
            pending.update(program=m.group(1), at=pending.get("at", i))
            continue
        m = _HEADER.search(line)
        if m:
            if current is not None:
                current.last_line = i - 1
                _close(current, overlapped=not current.rows and not current.finished and not current.errors)
            current = _section(m, pending, i)
            sections.append(current)
            pending = {}
            continue
        if current is None:
            continue
        _line(current, line, i)
    if current is not None:
        current.last_line = len(lines)
        _close(current, overlapped=False)
    if not sections:
        raise LogError("not a nccl-tests or rccl-tests log: it has no '# nThread N nGpus N minBytes ...' header "
                       "line (give the text output of all_reduce_perf and the other *_perf binaries)")
    for s in sections:
        if not s.program and len(s.mentions) == 1:
            s.program = f"{next(iter(s.mentions))}_perf"
    return sections


def _section(m: re.Match, pending: dict, i: int) -> Section:
    s = Section(first_line=pending.get("at", i), tool=pending.get("tool"), version=pending.get("version"),
                headers=pending.get("headers"), library=pending.get("library"), program=pending.get("program"),
                mentions=set(pending.get("mentions", ())))
    keys = ("nthread", "ngpus", "min_bytes", "max_bytes", "step", "step_kind", "warmup", "iters", "agg_iters",
            "validation", "graph", "unalign")
    s.params = {k: (v if k == "step_kind" else int(v)) for k, v in zip(keys, m.groups(), strict=True) if v is not None}
    return s


def _line(s: Section, line: str, i: int) -> None:
    """One line inside a section: a rank, the table's header, a row, the footer, an error."""
    stripped = line.strip()
    if not stripped:
        return
    m = _RCCL_OLD.match(stripped)
    if m:
        s.tool, s.version = s.tool or "rccl-tests", s.version or m.group(1)
        return
    m = _RANK.match(stripped)
    if m:
        if s.rows:
            s.problems.append(f"line {i}: a device line inside the table (the output of another run mixed in)")
            return
        rank, group, pid, host, device, bus, name = m.groups()
        s.ranks.append(Rank(int(rank), int(group) if group else None, int(pid), host, int(device), bus, name))
        return
    if stripped.startswith("#"):
        _comment(s, stripped, i)
        return
    if _ERROR.search(stripped):
        s.errors.append(f"line {i}: {stripped[:300]}")
        return
    tokens = stripped.split()
    if not tokens[0].isdigit():
        return  # NCCL INFO lines, launcher messages, a shell prompt: not the test's
    if not s.columns:
        s.problems.append(f"line {i}: a row before the table's header line: left out")
        return
    row = _row(s, tokens, i)
    if row is not None:
        s.rows.append(row)


def _comment(s: Section, text: str, i: int) -> None:
    body = text.lstrip("#").split()
    if body[:2] == ["size", "count"]:
        if s.rows:
            s.problems.append(f"line {i}: a second table header inside the table (another run's output mixed in)")
            return
        s.columns = tuple(body)
        s.cputime = "cputime" in body[:6]
        return
    if "out-of-place" in body or "in-place" in body:
        s.placements = tuple(p for w in body for p in (("out",) if w == "out-of-place" else ("in",) if
                                                        w == "in-place" else ()))
        return
    m = _OOB.match(text)
    if m:
        s.oob = (int(m.group(1)), m.group(2) != "FAILED")
        return
    m = _AVG.match(text)
    if m:
        try:
            s.avg_busbw = figure(m.group(1))
        except ValueError:
            s.problems.append(f"line {i}: the average bus bandwidth line holds no number ({m.group(1)!r})")
        s.avg_check = m.group(2)
        return
    m = _CONCLUDED.match(text)
    if m:
        s.concluded = True
        s.program = s.program or m.group(1)
        return
    if _ERROR.search(text):
        s.errors.append(f"line {i}: {text[:300]}")


def _row(s: Section, tokens: Sequence[str], i: int) -> Row | None:
    """A table row read by the header's columns; None (said in problems) when it does not fit."""
    cols = s.columns
    placements = s.placements or (("out", "in") if cols.count("busbw") == 2 else ("out",))
    if cols.count("busbw") != len(placements):
        s.problems.append(f"line {i}: the table header names {cols.count('busbw')} busbw column(s) for "
                          f"{len(placements)} placement(s): rows left out")
        return None
    group = len(FIELDS) + (len(PER_ITER) if "i_min" in cols else 0)
    need = 5 + group * len(placements)
    if len(tokens) < need:
        s.problems.append(f"line {i}: a row of {len(tokens)} fields where the header has {need} (cut short): left out")
        return None
    try:
        size, count, root = int(tokens[0]), int(tokens[1]), int(tokens[4])
        cells = {}
        for k, place in enumerate(placements):
            at = 5 + k * group
            t, a, b, w = tokens[at:at + 4]
            cells[place] = Cell(figure(t), figure(a), figure(b), None if w == "N/A" else int(float(w)))
    except ValueError:
        s.problems.append(f"line {i}: a row whose fields are not numbers where the header has numbers: left out")
        return None
    return Row(i, size, count, tokens[2], tokens[3], root, cells)


def _close(s: Section, overlapped: bool) -> None:
    """What a section that has ended says about itself: cut short, interleaved with another."""
    if overlapped:
        s.problems.append("mixed: another run's header line follows this one's before any row of it (several "
                          "processes writing into one file at once)")
    elif s.rows and not s.finished:
        s.problems.append(f"truncated: the log ends at line {s.last_line} without the run's closing lines (no "
                          "'# Avg bus bandwidth' line): the rows before are kept")


def op_of(s: Section) -> tuple[str | None, str]:
    """(mgpu-bench's op name or None, why): from the program the log names, else from the table
    where the size, count, root, redop and busbw/algbw columns single one collective out (the
    per-collective files' GetCollByteCount and GetBw); None with the candidates said otherwise."""
    if s.program:
        base = re.sub(r"(_perf)?(_mpi)?$", "", s.program)
        if base in PROGRAMS:
            op = PROGRAMS[base]
            if op is None:
                return None, f"{s.program} measures {base.replace('_', '')}, a collective mgpu-bench comm does not"
            return op, f"the log names {s.program}"
        return None, f"{s.program} is not a nccl-tests or rccl-tests collective"
    n = s.nranks or s.params.get("nthread", 1) * s.params.get("ngpus", 1)
    rows = [r for r in s.rows if r.cells and r.type in TYPE_BYTES and r.count]
    if not rows:
        return None, "the log names no collective and has no row to tell it from"
    r = rows[-1]
    per_rank = r.count * TYPE_BYTES[r.type] == r.size
    cell = next(iter(r.cells.values()))
    ratio = cell.busbw.value / cell.algbw.value if cell.algbw.value else None
    candidates: list[str] = []
    if r.root >= 0:
        candidates = ["broadcast"] if r.redop == "none" and per_rank else ["reduce"] if per_rank else []
    elif r.redop == "none":
        candidates = ["allgather", "alltoall"]
    elif per_rank:
        candidates = [op for op, f in (("allreduce", 2 * (n - 1) / n), ("sendrecv", 1.0))
                      if ratio is None or abs(ratio - f) <= 0.02 * f + 0.01]
    else:
        candidates = ["reducescatter"]
    if len(candidates) == 1:
        return candidates[0], f"the log names no program; its table fits {candidates[0]} alone"
    if not candidates:
        return None, "the log names no program and its table fits no collective mgpu-bench comm measures"
    return None, f"the log names no program and its table fits {' and '.join(candidates)} alike"
