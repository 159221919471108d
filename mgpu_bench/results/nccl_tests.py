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

A log is outside text, read in time linear in its length: every pattern is matched on one line of
at most MAX_LINE characters, anchored where the tool prints at the line's start, with no two
repetitions that can take the same characters; numbers are split out of a row, never searched for.
What nccl-tests cannot print is refused (LogError, before anything is built from it) or, for a row,
left out and said: counts beyond a C int, sizes beyond MAX_BYTES, a host name longer than Linux
allows, a figure that is not a finite number, a time that is not above 0, more runs, rows or
device lines than MAX_RUNS, MAX_ROWS and MAX_RANKS.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .schema import MAX_BYTES, MAX_GPU_INDEX, MAX_RANKS

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

# Bounds on what a log can hold, each from what the tests print (NVIDIA/nccl-tests src/util.cu):
MAX_LOG_BYTES = 64 << 20  # a file: a log of thousands of ranks with NCCL_DEBUG=INFO lines stays under it
MAX_LINE = 4096  # characters: a process's device lines fill a 2048-byte buffer, a row with -I 1 -S 1 ~300
MAX_FIELD = 32  # characters of one figure: getFloatStr writes 6 or 7, "%6g" the #wrong count
MAX_RUNS = 1000  # runs (header lines) in one file
MAX_ROWS = 100_000  # rows of one run (-N cycles of a 40-size sweep: thousands)
MAX_HOST = 64  # characters of a host name (Linux HOST_NAME_MAX; nccl-tests cuts the name at its first '.')
MAX_BUS = 127  # characters of a PCI bus id (rankInfo_t.device_hex[128])
MAX_NAME = 255  # characters of a GPU name (cudaDeviceProp.name[256])
MAX_PROBLEMS = 20  # problem lines kept per run; the rest counted
# A row's figures: its time at least the last digit "%7.2f" prints, at most 11 days; its bandwidths at
# most 10 PB/s (a thousand times any link): beyond them a figure is a damaged one.
MIN_TIME_US, MAX_TIME_US, MAX_GBS = 0.01, 1e12, 1e7
C_INT = (1 << 31) - 1  # nThread, nGpus, iters, ranks, devices: printed with %d
C_LONG = (1 << 63) - 1  # minBytes, maxBytes, step: %ld

_A = re.ASCII  # \d and \s are ASCII: int() would read other scripts' digits
_VERSION = re.compile(r"#\s*(nccl|rccl)-tests version (\S{1,200}) (?:nccl|rccl)-headers=(\d{1,9}) "
                      r"(?:nccl|rccl)-library=(\d{1,9})", _A)
_RCCL_OLD = re.compile(r"rccl-tests: Version (\S{1,200})", _A)
_STARTING = re.compile(r"# Collective test starting: (\S{1,100})", _A)
_CONCLUDED = re.compile(r"# Collective test concluded: (\S{1,100})", _A)
_HEADER = re.compile(r"#\s*nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\) "
                     r"warmup iters: (\d+) iters: (\d+) agg iters: (\d+) validation: (\d+) graph: (\d+)"
                     r"(?: unalign: (\d+))?", _A)
# The name is the rest of the line (stripped in code: a lazy group before \s*$ is quadratic).
_RANK = re.compile(r"#\s+Rank\s+(\d+)(?:\s+Group\s+(\d+))?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                   r"\[([^\]]*)\](.*)", _A)
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d{1,19})\s*(OK|FAILED)?", _A)
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?", _A)
_ERROR = re.compile(r"(Test (?:NCCL |CUDA |HIP )?failure|Test timeout|# error: )", _A)
_PROGRAM = re.compile(r"\b(" + "|".join(sorted(PROGRAMS, key=len, reverse=True)) + r")_perf(?:_mpi)?\b", _A)
_TABLE = re.compile(r"#\s+size\s+count\s+type\s+redop", _A)
# One way only to read each character: digits, an optional point with digits, an optional exponent.
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,4})?", _A)
# -S 1: a row ends with the time it was printed, strftime "%Y-%m-%d %H:%M:%S" in the host's local time.
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", _A)
_CLOCK = re.compile(r"\d{2}:\d{2}:\d{2}", _A)


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
    stamp: str | None = None  # -S 1: "2026-03-01T12:00:00", the host's local time as printed (no zone)


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
    unsaid: int = 0  # problem and error lines beyond MAX_PROBLEMS, counted only
    rank_ids: set = field(default_factory=set)  # the rank numbers of `ranks`

    @property
    def finished(self) -> bool:
        """The footer is there (the test ran to its end)."""
        return self.avg_busbw is not None

    @property
    def nranks(self) -> int | None:
        """The ranks the log's device lines show (one line per rank); None where it has none."""
        return len(self.ranks) or None

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(r.host for r in self.ranks))

    @property
    def started(self) -> str | None:
        """The time its first row was printed (-S 1), as the log states it: local time, no zone."""
        return next((r.stamp for r in self.rows if r.stamp), None)

    @property
    def local_gpus(self) -> int:
        """GPUs per process by its header (nThread x nGpus)."""
        return self.params.get("nthread", 1) * self.params.get("ngpus", 1)

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
        else:
            self.unsaid += 1

    def error(self, text: str) -> None:
        if len(self.errors) < MAX_PROBLEMS:
            self.errors.append(text)
        else:
            self.unsaid += 1


def figure(text: str) -> Figure:
    """'248.87' -> 248.87 give or take 0.005; '12402.6' 0.05; '1e+06' (nccl-tests' getFloatStr
    once a number no longer fits its column) 5e5. ValueError for what is no finite number, or is
    longer than any figure the tests print (MAX_FIELD characters)."""
    if len(text) > MAX_FIELD or not _NUMBER.fullmatch(text):
        raise ValueError(text)
    value = float(text)
    mantissa, _, exponent = text.lower().partition("e")
    power = int(exponent or 0) - len(mantissa.partition(".")[2])
    if not math.isfinite(value) or power > 300:  # 1e400 is inf; 0e999's rounding would be
        raise ValueError(text)
    return Figure(value, 0.5 * 10.0 ** power, text)


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
    missing, a folder, a FIFO); InputError (exit code 2) for a file that is neither, or one larger
    than MAX_LOG_BYTES (refused before it is read)."""
    import os
    import stat

    from mgpu_bench.core.errors import InputError

    from .schema import shown

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > MAX_LOG_BYTES:
            with open(path, "rb") as fh:
                start = fh.read(1).lstrip()
            if start not in (b"{", b"["):
                raise InputError(f"{shown(path)} is {st.st_size / 1e6:,.0f} MB, more than a nccl-tests or rccl-tests "
                                 f"log holds (at most {MAX_LOG_BYTES >> 20} MiB are read): keep the test's own lines, "
                                 "e.g. grep -v 'NCCL INFO'")
            return None
        with open(path, "rb") as fh:
            data = fh.read(MAX_LOG_BYTES + 1)
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
    return any(len(line) <= MAX_LINE and (_HEADER.search(line) or _TABLE.match(line.lstrip()))
               for line in text.splitlines())


def parse(text: str) -> list[Section]:
    """The runs of a log, in order. LogError when none has a header line (a foreign text), or
    when the log says what nccl-tests cannot print (a count, size or name beyond its bounds)."""
    lines = text.splitlines()
    sections: list[Section] = []
    pending: dict = {}  # version and program lines seen before the header they belong to
    current: Section | None = None
    for i, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE:  # no pattern reads it: the tests print no such line
            if current is not None and raw.lstrip()[:1] in ("#", *"0123456789"):
                current.problem(f"line {i}: {len(raw):,} characters, more than any line nccl-tests prints: not read "
                                "(left out)")
            continue
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
            if len(sections) >= MAX_RUNS:
                raise LogError(f"line {i}: more than {MAX_RUNS} runs in one file: give each run's output apart")
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


# The header's numbers: (name, least, most); nccl-tests prints the counts with %d, the sizes with %ld.
_PARAMS = (("nthread", 1, C_INT), ("ngpus", 1, C_INT), ("min_bytes", 0, C_LONG), ("max_bytes", 0, C_LONG),
           ("step", 0, C_LONG), ("step_kind", None, None), ("warmup", 0, C_INT), ("iters", 0, C_INT),
           ("agg_iters", 0, C_INT), ("validation", 0, C_INT), ("graph", 0, C_INT), ("unalign", 0, C_INT))
_SHOWN = {"nthread": "nThread", "ngpus": "nGpus", "min_bytes": "minBytes", "max_bytes": "maxBytes", "step": "step",
          "warmup": "warmup iters", "iters": "iters", "agg_iters": "agg iters", "validation": "validation",
          "graph": "graph", "unalign": "unalign"}


def _section(m: re.Match, pending: dict, i: int) -> Section:
    s = Section(first_line=pending.get("at", i), tool=pending.get("tool"), version=pending.get("version"),
                headers=pending.get("headers"), library=pending.get("library"), program=pending.get("program"),
                mentions=set(pending.get("mentions", ())))
    for (key, least, most), value in zip(_PARAMS, m.groups(), strict=True):
        if value is None:
            continue
        if key == "step_kind":
            s.params[key] = value
            continue
        number = int(value) if len(value) <= 19 else None  # a line holds at most MAX_LINE digits: bounded either way
        if number is None or not least <= number <= most:
            shown = value if len(value) <= 24 else f"{value[:12]}...({len(value)} digits)"
            raise LogError(f"line {i}: the header says {_SHOWN[key]} {shown}, which nccl-tests cannot print (from "
                           f"{least} to {most:,}): an edited or damaged log")
        s.params[key] = number
    return s


def _ascii_int(text: str | None, least: int, most: int) -> int | None:
    """A whole number written in ASCII digits (with a sign) within [least, most]; None otherwise."""
    if text is None:
        return None
    body = text[1:] if text[:1] in "+-" else text
    if not (0 < len(body) <= 19 and body.isascii() and body.isdigit()):
        return None
    n = int(text)
    return n if least <= n <= most else None


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
        _rank(s, m, i)
        return
    if stripped.startswith("#"):
        _comment(s, stripped, i)
        return
    if _ERROR.search(stripped):
        s.error(f"line {i}: {stripped[:300]}")
        return
    tokens = stripped.split()
    if not (tokens[0].isascii() and tokens[0].isdigit()):
        return  # NCCL INFO lines, launcher messages, a shell prompt: not the test's
    if not s.columns:
        s.problem(f"line {i}: a row before the table's header line: left out")
        return
    row = _row(s, tokens, i)
    if row is not None:
        if len(s.rows) >= MAX_ROWS:
            raise LogError(f"line {i}: more than {MAX_ROWS:,} rows in the run at line {s.first_line}: give the runs "
                           "of one file apart, or fewer cycles (-N)")
        s.rows.append(row)


def _rank(s: Section, m: re.Match, i: int) -> None:
    """A device line: one rank, its process, host, GPU index, PCI bus and GPU name."""
    rank, group, pid, host, device, bus, name = m.groups()
    name = name.strip()
    numbers = (_ascii_int(rank, 0, C_INT), None if group is None else _ascii_int(group, -1, C_INT),
               _ascii_int(pid, 0, C_INT), _ascii_int(device, 0, MAX_GPU_INDEX))
    bad = ("rank" if numbers[0] is None else "group" if group is not None and numbers[1] is None else
           "pid" if numbers[2] is None else f"device (at most {MAX_GPU_INDEX})" if numbers[3] is None else
           f"host name ({len(host)} characters; at most {MAX_HOST})" if len(host) > MAX_HOST else
           f"PCI bus ({len(bus)} characters; at most {MAX_BUS})" if len(bus) > MAX_BUS else
           f"GPU name ({len(name)} characters; at most {MAX_NAME})" if len(name) > MAX_NAME else None)
    if bad:
        raise LogError(f"line {i}: a device line whose {bad} is not one nccl-tests prints: an edited or damaged log")
    if s.rows:
        s.problem(f"line {i}: a device line inside the table (the output of another run mixed in)")
        return
    if numbers[0] in s.rank_ids:
        s.problem(f"line {i}: a second device line for rank {numbers[0]} (lines of another run mixed in): not read "
                  "(left out)")
        return
    if len(s.ranks) >= MAX_RANKS:
        raise LogError(f"line {i}: more than {MAX_RANKS:,} device lines in the run at line {s.first_line}")
    s.ranks.append(Rank(numbers[0], numbers[1], numbers[2], host, numbers[3], bus, name))
    s.rank_ids.add(numbers[0])


def _comment(s: Section, text: str, i: int) -> None:
    body = text.lstrip("#").split()
    if body[:2] == ["size", "count"]:
        if s.rows:
            s.problem(f"line {i}: a second table header inside the table (another run's output mixed in)")
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
            s.problem(f"line {i}: the average bus bandwidth line holds no finite number ({m.group(1)[:40]!r})")
        s.avg_check = m.group(2)
        return
    m = _CONCLUDED.match(text)
    if m:
        s.concluded = True
        s.program = s.program or m.group(1)
        return
    if _ERROR.search(text):
        s.error(f"line {i}: {text[:300]}")


def _wrong(text: str) -> int | None:
    """The #wrong column: "N/A" (not checked) -> None; a count as "%6g" prints it ("0", "1e+06")."""
    if text == "N/A":
        return None
    value = figure(text).value
    if not (0 <= value < 2 ** 63) or value != int(value):
        raise ValueError(text)
    return int(value)


def _row(s: Section, tokens: Sequence[str], i: int) -> Row | None:
    """A table row read by the header's columns; None (said in problems) when it does not fit."""
    cols = s.columns
    placements = s.placements or (("out", "in") if cols.count("busbw") == 2 else ("out",))
    if cols.count("busbw") != len(placements):
        s.problem(f"line {i}: the table header names {cols.count('busbw')} busbw column(s) for "
                  f"{len(placements)} placement(s): rows left out")
        return None
    group = len(FIELDS) + (len(PER_ITER) if "i_min" in cols else 0)
    need = 5 + group * len(placements)
    if len(tokens) < need:
        s.problem(f"line {i}: a row of {len(tokens)} fields where the header has {need} (cut short): left out")
        return None
    size, count, root = _ascii_int(tokens[0], 0, MAX_BYTES), _ascii_int(tokens[1], 0, MAX_BYTES), \
        _ascii_int(tokens[4], -1, MAX_RANKS)
    if size is None or count is None or root is None:
        s.problem(f"line {i}: a row whose size, count or root is not a whole number nccl-tests prints there (sizes "
                  f"up to {MAX_BYTES:,} B, roots from -1): left out")
        return None
    if len(tokens[2]) > MAX_FIELD or len(tokens[3]) > MAX_FIELD:
        s.problem(f"line {i}: a row whose type or redop is longer than any nccl-tests prints: left out")
        return None
    cells = {}
    try:
        for k, place in enumerate(placements):
            at = 5 + k * group
            t, a, b, w = tokens[at:at + 4]
            cell = Cell(figure(t), figure(a), figure(b), _wrong(w))
            if not (MIN_TIME_US <= cell.time.value <= MAX_TIME_US and 0 <= cell.algbw.value <= MAX_GBS
                    and 0 <= cell.busbw.value <= MAX_GBS):
                raise ValueError(t)
            cells[place] = cell
    except ValueError:
        s.problem(f"line {i}: a row whose figures are not what nccl-tests prints there (a time from {MIN_TIME_US} "
                  f"to {MAX_TIME_US:.0e} us, bandwidths from 0 to {MAX_GBS:.0e} GB/s, a whole #wrong count): left out")
        return None
    stamp = None
    if "timestamp" in cols and len(tokens) >= need + 2 and _DATE.fullmatch(tokens[-2]) and _CLOCK.fullmatch(tokens[-1]):
        import datetime as _dt

        try:
            stamp = _dt.datetime.fromisoformat(f"{tokens[-2]}T{tokens[-1]}").isoformat(timespec="seconds")
        except ValueError:
            stamp = None  # a month 13: no time said
    return Row(i, size, count, tokens[2], tokens[3], root, cells, stamp)


def _close(s: Section, overlapped: bool) -> None:
    """What a section that has ended says about itself: cut short, interleaved with another."""
    if overlapped:
        s.problems.append("mixed: another run's header line follows this one's before any row of it (several "
                          "processes writing into one file at once)")
    elif s.rows and not s.finished:
        s.problems.append(f"truncated: the log ends at line {s.last_line} without the run's closing lines (no "
                          "'# Avg bus bandwidth' line): the rows before are kept")
    if s.unsaid:
        s.problems.append(f"and {s.unsaid:,} more line(s) of problems or errors like those above (left out)")


def op_of(s: Section, nranks: int | None = None) -> tuple[str | None, str]:
    """(mgpu-bench's op name or None, why): from the program the log names, else from the table
    where the size, count, root, redop and busbw/algbw columns single one collective out (the
    per-collective files' GetCollByteCount and GetBw); None with the candidates said otherwise.
    `nranks`: the run's rank count (default: its device lines, else its header's GPUs)."""
    if s.program:
        return program_op(s.program)
    candidates = table_fits(s, nranks)
    if candidates is None:
        return None, "the log names no collective and has no row to tell it from"
    if len(candidates) == 1:
        return candidates[0], f"the log names no program; its table fits {candidates[0]} alone"
    if not candidates:
        return None, "the log names no program and its table fits no collective mgpu-bench comm measures"
    return None, f"the log names no program and its table fits {' and '.join(candidates)} alike"


def program_op(program: str) -> tuple[str | None, str]:
    """(mgpu-bench's op or None, why) of a binary's name ('all_reduce_perf', 'gather_perf_mpi')."""
    base = program.removesuffix("_mpi").removesuffix("_perf")
    if base in PROGRAMS:
        op = PROGRAMS[base]
        if op is None:
            return None, f"{program} measures {base.replace('_', '')}, a collective mgpu-bench comm does not"
        return op, f"the log names {program}"
    return None, f"{program} is not a nccl-tests or rccl-tests collective"


def table_fits(s: Section, nranks: int | None = None) -> list[str] | None:
    """The collectives the last row's size, count, root, redop and busbw/algbw ratio fit (GetCollByteCount
    and GetBw of each collective's file); None where the run has no row to tell them by."""
    n = nranks or s.nranks or s.local_gpus
    rows = [r for r in s.rows if r.cells and r.type in TYPE_BYTES and r.count]
    if not rows:
        return None
    r = rows[-1]
    per_rank = r.count * TYPE_BYTES[r.type] == r.size
    cell = next(iter(r.cells.values()))
    ratio = cell.busbw.value / cell.algbw.value if cell.algbw.value else None
    if r.root >= 0:
        return ["broadcast"] if r.redop == "none" and per_rank else ["reduce"] if per_rank else []
    if r.redop == "none":
        return ["allgather", "alltoall"]
    if per_rank:
        return [op for op, f in (("allreduce", 2 * (n - 1) / n), ("sendrecv", 1.0))
                if ratio is None or abs(ratio - f) <= 0.02 * f + 0.01]
    return ["reducescatter"]
