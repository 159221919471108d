"""Logs of nccl-tests and rccl-tests written with their own printf formats, for the tests of the
import (mgpu_bench/results/nccl_tests.py, probes/comm/imported.py).

Every line below is the format string of the source that prints it, given to Python's `%`
operator, which formats %12li, %6.2f, %g, %*s and %*.2f as C's printf does:

- nccl-tests 2.19.6 (NVIDIA/nccl-tests a0b82b2): src/util.cu writeDeviceReport (version, program,
  header, device lines), writeResultHeader (the table's header, with -I the per-iteration one),
  writeBenchmarkLinePreamble / writeBenchmarkLineBody / getFloatStr / writePerIterReport (rows),
  writeResultFooter, finalizeFooter and writeErrors (the closing lines);
- nccl-tests before 2.15 (d313d20, 2022): the same rows; a header without unalign and without the
  version and program lines, devices as "[0x%02x]";
- rccl-tests 2024 (ROCm/rccl-tests ae3e635, src/common.cu) and 2025 (src/common.cpp): rows
  "  %7s  %6.2f  %6.2f  %5g" with the time as %7.0f / %7.1f / %7.2f, devices "#   Rank %2d Pid %6d
  on %10s device %2d [%s] %s" (2024) or as nccl-tests (2025), "rccl-tests: Version %s", the
  "Errors with asterisks" line, and on gfx942 a note printed without its newline before the
  "Collective test starting" line.

The figures are made the way the tests make them: a time per iteration, algbw = size / time,
busbw = algbw x the collective's bus factor (the per-collective files' GetBw).
"""

# ruff: noqa: UP031 - the point of this module: the sources' printf formats, given to Python's % as they are
from __future__ import annotations

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0}
TYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "uint8": 1, "int32": 4, "int64": 8}


def get_float_str(value: float, width: int) -> str:
    """nccl-tests src/util.cu getFloatStr."""
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        text = fmt % (width, value)
        if len(text) <= width:
            return text
    return ("%*.1e" if width >= 7 else "%*.0e") % (width, value)


def count_of(coll: str, size: int, typename: str, n: int) -> int:
    """The count column: the per-collective GetCollByteCount's paramcount (size / type bytes,
    over the ranks for allgather, reducescatter and alltoall)."""
    elements = size // TYPE_BYTES[typename]
    return elements // n if coll in ("all_gather", "reduce_scatter", "alltoall") else elements


def figures(coll: str, size: int, n: int, seconds: float) -> tuple[float, float, float]:
    """(time in us, algbw GB/s, busbw GB/s) as the tests compute them (GetBw)."""
    algbw = size / 1e9 / seconds
    return seconds * 1e6, algbw, algbw * FACTORS[coll](n)


def speed(size: int, peak_gbs: float = 300.0, latency_us: float = 20.0) -> float:
    """A plausible time per iteration: latency plus size at a peak rate."""
    return latency_us * 1e-6 + size / (peak_gbs * 1e9)


# -- nccl-tests 2.19.6 ----------------------------------------------------------------------------------

def nccl_header(program: str, nthread: int, ngpus: int, min_bytes: int, max_bytes: int, factor: int = 2,
                iters: int = 20, graph: int = 0, check: int = 1, version: bool = True) -> list[str]:
    lines = []
    if version:
        lines.append("# nccl-tests version %s nccl-headers=%d nccl-library=%d" % ("2.19.6", 22803, 22803))
        lines.append("# Collective test starting: %s" % program)
        lines.append("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: "
                     "%d validation: %d graph: %d unalign: %d" % (nthread, ngpus, min_bytes, max_bytes, factor, "factor",
                                                                5, iters, 1, check, graph, 0))
    else:  # before 2.15: no version or program line, no unalign
        lines.append("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: "
                     "%d validation: %d graph: %d" % (nthread, ngpus, min_bytes, max_bytes, factor, "factor", 5, iters, 1,
                                                      check, graph))
    lines.append("#")
    return lines


def nccl_devices(ranks: list[tuple[int, int, int, str, int, str]], old: bool = False) -> list[str]:
    """ranks: (rank, group, pid, host, device, name)."""
    out = ["# Using devices"]
    for rank, group, pid, host, device, name in ranks:
        if old:
            out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s" % (rank, group, pid, host, device,
                                                                                   7 + device, name))
        else:
            out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s" % (
                rank, group, pid, host, device, 0, 6 + device, 0, name))
    return out


def nccl_table_header(per_iter: bool = False, cputime: bool = False) -> list[str]:
    t = "cputime" if cputime else "time"
    out = ["#"]
    if per_iter:
        out.append("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                "
                   "in-place (+ per-iteration)" % ("", "", "", "", ""))
        out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  "
                   "%7s  %7s %*s" % ("size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", "i_min",
                                     "i_max", "i_p99", "i_cv%", t, "algbw", "busbw", "#wrong", "i_min", "i_max",
                                     "i_p99", "i_cv%", 0, ""))
        out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  "
                   "%7s  %7s %*s" % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)",
                                     "(us)", "(%)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", 0, ""))
    else:
        out.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
                   % ("", "", "", "", ""))
        out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s" % (
            "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong",
            0, ""))
        out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s" % (
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", 0, ""))
    return out


def nccl_row(size: int, count: int, typename: str, opname: str, root: int, cells, per_iter: bool = False) -> str:
    """cells: (time_us, algbw, busbw, wrong or None for N/A) per placement."""
    line = "%12li  %12li  %8s  %6s  %6s" % (size, count, typename, opname, "%6i" % root)
    for t, a, b, wrong in cells:
        ts, as_, bs = get_float_str(t, 7), get_float_str(a, 6), get_float_str(b, 6)
        if wrong is None:
            line += "  %7s  %6s  %6s    N/A" % (ts, as_, bs)
        else:
            line += "  %7s  %6s  %6s  %6g" % (ts, as_, bs, wrong)
        if per_iter:
            line += "  %7s  %7s  %7s  %7s" % (get_float_str(t * 0.98, 7), get_float_str(t * 1.05, 7),
                                               get_float_str(t * 1.04, 7), get_float_str(1.5, 7))
    return line


def nccl_footer(program: str, errors: int, avg: float, error: str = "", version: bool = True) -> list[str]:
    """writeResultFooter, finalizeFooter, writeErrors (before 2.15: no "concluded" line, and the
    footer's labels written out as "# Out of bounds values : %d %s")."""
    if not version:
        return ["# Out of bounds values : %d %s" % (errors, "FAILED" if errors else "OK"),
                "# Avg bus bandwidth    : %g %s" % (avg, ""), "#", ""]
    return ["# %-20s : %d %s" % ("Out of bounds values", errors, "FAILED" if errors else "OK"),
            "# %-20s : %g %s" % ("Avg bus bandwidth", avg, ""),
            "#",
            "# Collective test concluded: %s" % program,
            "#",
            "# error: %s" % error if error else ""]


def nccl_log(coll: str, ranks, sizes, typename: str = "float", opname: str = "sum", root: int = -1,
             wrong=lambda size, inplace: 0, per_iter: bool = False, graph: int = 0, version: bool = True,
             old_devices: bool = False, nthread: int | None = None, ngpus: int = 1, cputime: bool = False,
             types=None) -> str:
    """A whole nccl-tests log of `coll` over `ranks`; `types` (name, redop) pairs for -d all."""
    n = len(ranks)
    program = f"{coll}_perf"
    lines = nccl_header(program, nthread or n, ngpus, sizes[0], sizes[-1], graph=graph, version=version)
    lines += nccl_devices(ranks, old=old_devices)
    lines += nccl_table_header(per_iter, cputime)
    bus = []
    for tname, op in types or [(typename, opname)]:
        for size in sizes:
            cells = []
            for inplace in (False, True):
                t, a, b = figures(coll, size, n, speed(size) * (1.01 if inplace else 1.0))
                if cputime:
                    t *= 1.3  # the host's clock: the bandwidths still come from the timed iterations
                cells.append((t, a, b, wrong(size, inplace)))
                bus.append(b)
            lines.append(nccl_row(size, count_of(coll, size, tname, n), tname, op, root, cells, per_iter))
    errors = sum(1 for size in sizes for inplace in (False, True) if wrong(size, inplace))
    lines += nccl_footer(program, errors, sum(bus) / len(bus), version=version)
    return "\n".join(lines) + "\n"


def h200_ranks(n: int, host: str = "node1", pid: int = 4242, first_rank: int = 0) -> list:
    return [(first_rank + i, 0, pid, host, i, "NVIDIA H200") for i in range(n)]


# -- rccl-tests -------------------------------------------------------------------------------------------

def rccl_time(t: float) -> str:
    return "%7.0f" % t if t >= 10000.0 else "%7.1f" % t if t >= 100.0 else "%7.2f" % t


def rccl_log(coll: str, n: int, sizes, name: str = "AMD Instinct MI300X", host: str = "mi300x-01",
             new: bool = False, peak_gbs: float = 190.0) -> str:
    """rccl-tests 2024 (src/common.cu) or, with `new`, 2025 (src/common.cpp), one process driving
    `n` GPUs (-g n)."""
    program = f"{coll}_perf"
    lines = []
    head = ("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: %d "
            "validation: %d graph: %d" % (1, n, sizes[0], sizes[-1], 2, "factor", 5, 20, 1, 1, 0))
    if new:
        # run(): PRINT("On gfx942 architecture, using FNUZ FP8 types") has no newline
        lines.append("On gfx942 architecture, using FNUZ FP8 types" + "# Collective test starting: %s" % program)
    lines += [head, "#", "rccl-tests: Version %s" % "develop:5272cd1", "# Using devices"]
    for i in range(n):
        if new:
            lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s" % (
                i, 0, 2517106, host, i, 0, 5 + 0x20 * i, 0, name))
        else:
            lines.append("#   Rank %2d Pid %6d on %10s device %2d [%s] %s" % (i, 2517106, host, i,
                                                                           "0000:%02x:00.0" % (5 + 0x20 * i), name))
    lines.append("#")
    lines.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
                 % ("", "", "", "", ""))
    lines.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s" % (
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
        "#wrong"))
    lines.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s" % (
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""))
    bus = []
    for size in sizes:
        line = "%12li  %12li  %8s  %6s  %6s" % (size, count_of(coll, size, "float", n), "float",
                                                "none" if coll == "all_gather" else "sum", "%6i" % -1)
        for inplace in (False, True):
            t, a, b = figures(coll, size, n, speed(size, peak_gbs) * (1.01 if inplace else 1.0))
            line += "  %7s  %6.2f  %6.2f  %5g" % (rccl_time(t), a, b, 0)
            bus.append(b)
        lines.append(line)
    lines += ["# Errors with asterisks indicate errors that have exceeded the maximum threshold.",
              "# Out of bounds values : %d %s" % (0, "OK"),
              "# Avg bus bandwidth    : %g %s" % (sum(bus) / len(bus), ""), "#"]
    if new:
        lines.append("# Collective test concluded: %s" % program)
    lines.append("")  # PRINT("%s\n", ncclGetLastError(NULL)): empty
    return "\n".join(lines) + "\n"
