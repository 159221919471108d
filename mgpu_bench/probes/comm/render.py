"""comm on the terminal and in CSV: one table model, several renderers.

Rows are built once (`row`); the terminal (rich), CSV, Markdown and HTML renderers only format.
Stored figures are base units; display units are chosen here: us for time, GB/s (10^9 bytes/s,
as nccl-tests prints) for bandwidth.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from mgpu_bench.results.measurement import CommMeasurement
from mgpu_bench.results.sizes import format_bytes

from .analyse import gbs, no_theory_reason, pct_theory, plural, series, summary, theory_dict, theory_for
from .plan import CommRun


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    unit: str
    fmt: str  # format spec for numbers


COLUMNS = (
    Column("size", "size", "B", ""),
    Column("count", "count", "elts", "d"),
    Column("dtype", "type", "", ""),
    Column("redop", "redop", "", ""),
    Column("placement", "place", "", ""),
    Column("time_us", "time", "us", ".1f"),
    Column("algbw", "algbw", "GB/s", "gbs"),
    Column("busbw", "busbw", "GB/s", "gbs"),
    Column("theory", "busbw", "%theo", ".0f"),
    Column("median_us", "median", "us", ".1f"),
    Column("p99_us", "p99", "us", ".1f"),
    Column("cov", "CoV", "%", ".1f"),
    Column("wrong", "#wrong", "", "d"),
)


def row(m: CommMeasurement, theory=None) -> dict:
    """Display values of one measurement, in the COLUMNS' units."""
    cov = m.cov
    return {
        "op": m.spec.op,
        "size": m.spec.bytes,
        "count": m.spec.count,
        "dtype": m.spec.dtype,
        "redop": m.spec.redop or "-",
        "placement": "in" if m.spec.inplace else "out",
        "time_us": m.time_s * 1e6,
        "algbw": m.algbw,  # bytes/s: format_cell writes GB/s (analyse.gbs)
        "busbw": m.busbw,
        "theory": pct_theory(m, theory),
        "median_us": m.median_s * 1e6,
        "p99_us": m.p99_s * 1e6,
        "cov": None if cov is None else cov * 100,
        "wrong": None if m.wrong is None else m.total_wrong,
    }


def format_cell(col: Column, value) -> str:
    """One value as a renderer shows it, in its column's unit."""
    if value is None:
        return "n/a"
    if col.key == "size":
        return format_bytes(value)
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if col.fmt == "gbs":
        return gbs(value)
    return format(value, col.fmt) if col.fmt else str(value)


def summary_lines(run: CommRun) -> list[str]:
    lines = []
    for s in summary(run):
        mean = (f"mean {gbs(s['mean_busbw_large'])} GB/s over {plural(s['large_sizes'], 'size')} >= 64 MiB"
                if s["mean_busbw_large"] is not None else "no size >= 64 MiB measured")
        where = "" if s["scope"] == "world" else f" [{s['scope']} {s['group']}]"
        lines.append(
            f"{s['op']}{where} {s['placement']}: busbw {gbs(s['busbw_at_largest'])} GB/s at "
            f"{format_bytes(s['largest_bytes'])}; {mean}; {s['wrong']} wrong"
        )
    return lines


def render_terminal(run: CommRun, console) -> None:
    """Rich tables, one per op, readable at 100 columns."""
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    for sr in series(run):
        ms = sr.measurements
        devices = ms[0].spec.devices
        title = f"{sr.title}  ({len(devices)} ranks, {run.backend}, {', '.join(dict.fromkeys(devices))})"
        table = Table(title=title, title_justify="left", pad_edge=False, box=None, header_style="bold")
        for col in COLUMNS:
            head = f"{col.title}\n{col.unit}" if col.unit and col.key != "size" else col.title
            table.add_column(head, justify="left" if col.key in ("dtype", "redop", "placement") else "right")
        for m in ms:
            r = row(m, theory_for(run, m))
            style = "red" if r["wrong"] else None
            table.add_row(*[format_cell(c, r[c.key]) for c in COLUMNS], style=style)
        print_table(console, table)
        console.print()
    t = theory_dict(run.theory)
    if no_theory_reason(run) and run.measurements:
        console.print(no_theory_reason(run), highlight=False, soft_wrap=True)
    if t is not None:
        practical = (f"; NCCL rings reach about {t['practical'] / 1e9:.0f} GB/s "
                     f"({100 * t['practical'] / t['bandwidth']:.0f}%)" if t.get("practical") and t.get("bandwidth") else "")
        console.print(f"theory: {t['summary']}{practical}", highlight=False, soft_wrap=True)
    for scope, st in (run.scope_theory or {}).items():
        st = theory_dict(st)
        if scope != "world" and st:
            console.print(f"theory {scope}: {st['summary']}", highlight=False, soft_wrap=True)
    if run.algorithms:
        for op in dict.fromkeys(m.spec.op for m in run.measurements):
            spans = _algorithm_spans(run, op)
            if spans:
                console.print(f"{op}: NCCL's tuning model picks {spans} (its cost model, not a trace)",
                              highlight=False, soft_wrap=True)
    if run.transports:
        parts = [f"{pair} " + ", ".join(f"{k} x{v}" for k, v in c.items()) for pair, c in run.transports.items()]
        console.print(f"NCCL transports (ranks, channels): {'; '.join(parts)}", highlight=False, soft_wrap=True)


def _algorithm_spans(run: CommRun, op: str) -> str:
    """'Ring/LL 1 MiB-4 MiB, Ring/Simple 8 MiB-1 GiB' over the measured sizes of `op`."""
    sizes = sorted({m.spec.bytes for m in run.measurements if m.spec.op == op})
    spans: list[list] = []
    for b in sizes:
        algo = (run.algorithms or {}).get(f"{op}@{b}")
        if algo is None:
            continue
        if spans and spans[-1][0] == algo:
            spans[-1][2] = b
        else:
            spans.append([algo, b, b])
    return ", ".join(f"{a} {format_bytes(lo)}" + (f"-{format_bytes(hi)}" if hi != lo else "") for a, lo, hi in spans)


def render_csv(run: CommRun) -> str:
    """One row per measurement, base units (bytes, seconds, bytes/s)."""
    buf = io.StringIO()
    fields = ["op", "scope", "group", "bytes", "requested_bytes", "count", "dtype", "redop", "placement", "nranks", "backend",
              "iters", "time_s", "algbw_Bps", "busbw_Bps", "theory_Bps", "pct_theory", "median_s", "p99_s", "cov", "nsamples", "wrong"]
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    for m in run.measurements:
        theory_bw = (theory_dict(theory_for(run, m)) or {}).get("bandwidth")
        w.writerow({
            "op": m.spec.op, "scope": m.spec.scope, "group": m.spec.group, "bytes": m.spec.bytes, "requested_bytes": m.spec.size, "count": m.spec.count,
            "dtype": m.spec.dtype, "redop": m.spec.redop or "", "placement": m.spec.placement,
            "nranks": m.spec.nranks, "backend": m.spec.backend, "iters": m.iters,
            "time_s": f"{m.time_s:.9g}", "algbw_Bps": f"{m.algbw:.6g}", "busbw_Bps": f"{m.busbw:.6g}",
            "theory_Bps": "" if theory_bw is None else f"{theory_bw:.6g}",
            "pct_theory": "" if theory_bw is None else f"{100 * m.busbw / theory_bw:.4g}",
            "median_s": f"{m.median_s:.9g}", "p99_s": f"{m.p99_s:.9g}",
            "cov": "" if m.cov is None else f"{m.cov:.4g}", "nsamples": m.nsamples,
            "wrong": "" if m.wrong is None else m.total_wrong,
        })
    return buf.getvalue()


def render_tuning(tuning: dict, console, run: CommRun) -> None:
    """`comm --tune` on the terminal: per collective the best setting per size band against
    the default (figures at the band's deciding size), every setting's busbw per size, then the
    lines to paste (or that the defaults stand) and the NVLS state."""
    from rich.table import Table

    from mgpu_bench.output.tables import print_table
    from mgpu_bench.results.sizes import format_gbs

    from .tune.rule import Tuning, exclusion
    from .tune.trials import DEFAULT

    tu = Tuning.from_dict(tuning)
    choices = tu.choices()
    advice = tu.advice()
    devices = ", ".join(dict.fromkeys(run.devices))
    for op in tu.ops:
        table = Table(title=f"{op}: the best NCCL setting per size band  ({run.nranks} ranks, {devices})",
                      title_justify="left", pad_edge=False, box=None, header_style="bold")
        for head in ("band", "at", "default\nGB/s", "best setting", "busbw\nGB/s", "gain\n%", "noise\n%",
                     "recom-\nmended"):
            table.add_column(head, justify="right" if "\n" in head or head == "at" else "left")
        mine = [c for c in choices if c.op == op]
        for c in mine:
            a = c.at
            table.add_row(f"{c.band.name} {c.band.label}", format_bytes(a.size) if a else "-",
                          format_gbs(a.default_busbw) if a else "-", c.setting or "-",
                          format_gbs(a.busbw) if a else "-", f"{100 * a.gain:+.1f}" if a else "-",
                          f"{100 * a.noise:.1f}" if a and a.noise is not None else "n/a",
                          "yes" if c.recommended else "no", style="green" if c.recommended else None)
        print_table(console, table)
        for c in mine:  # the reasons, one line each (for grep)
            costs = f"; elsewhere {', '.join(c.costs)}" if c.costs else ""
            console.print(f"{op} {c.band.name} {c.band.label}: {'yes' if c.recommended else 'no'}, {c.reason}{costs}",
                          highlight=False, soft_wrap=True)
        console.print()
        sizes = [s for b in tu.bands for s in b.sizes]
        table = Table(title=f"{op}: every setting, busbw GB/s per size (each in a fresh process)",
                      title_justify="left", pad_edge=False, box=None, header_style="bold")
        table.add_column("setting")
        for s in sizes:
            table.add_column(format_bytes(s), justify="right", no_wrap=True)
        table.add_column("status")
        for t in tu.trials:
            if op not in t.candidate.ops:
                continue
            ms = [t.at(op, s) for s in sizes]
            cells = [format_gbs(m.busbw) if m is not None else "-" for m in ms]
            why = exclusion(t, tu.nvls)
            label = t.candidate.label + (" (again)" if t.candidate.group == DEFAULT and t.run > 1 else "")
            table.add_row(label, *cells, why or "ok", style="red" if t.wrong else None)
        print_table(console, table)
        console.print()
    console.print(f"NVLS: {tu.nvls.why}", highlight=False, soft_wrap=True)
    for note in tu.notes + list(advice.notes):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    if advice.lines:
        console.print("NCCL settings to use here, with their gain over the default at the band's deciding size "
                      "(paste the export lines into the job's environment):", highlight=False, soft_wrap=True)
        for given in advice.given:
            console.print(f"  {given}", highlight=False, soft_wrap=True)
        for line in advice.lines:
            console.print(line, highlight=False, soft_wrap=True)
    else:
        console.print("no NCCL setting beat the default by more than max(2%, 3 x noise) at every size of a band "
                      "without losing elsewhere: keep the defaults", highlight=False, soft_wrap=True)
    pasted = {line.split("=", 1)[0] for line in advice.lines}
    for lines, where, costs in advice.only_for:
        clash = sorted(pasted & {line.split("=", 1)[0] for line in lines})
        instead = f", in place of the {' and '.join(c.removeprefix('export ') for c in clash)} line above" \
            if clash else ""
        console.print(f"only where the job's messages are all within {where}; elsewhere {', '.join(costs)}{instead}:",
                      highlight=False, soft_wrap=True)
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True)
    console.print(f"{len(tu.trials)} NCCL setting run(s) in {run.wall_seconds:.1f} s wall, each in a fresh process "
                  "(start-up included)", highlight=False)


TUNING_HEADERS = ("op", "band", "at", "default GB/s", "best setting", "busbw GB/s", "gain %", "noise %",
                  "recommended", "why")


def tuning_rows(tuning: dict) -> tuple[list[list[str]], list[str]]:
    """`comm --tune` as rows (TUNING_HEADERS, one per collective and size band, figures at the
    band's deciding size) and the lines to paste (or the sentence that the defaults stand), for
    the report page and summary.md; the terminal draws the same choices (render_tuning)."""
    from mgpu_bench.results.sizes import format_gbs

    from .tune.rule import Tuning

    tu = Tuning.from_dict(tuning)
    rows = []
    for c in tu.choices():
        a = c.at
        rows.append([c.op, f"{c.band.name} {c.band.label}", format_bytes(a.size) if a else "-",
                     format_gbs(a.default_busbw) if a else "-", c.setting or "-", format_gbs(a.busbw) if a else "-",
                     f"{100 * a.gain:+.1f}" if a else "-", f"{100 * a.noise:.1f}" if a and a.noise is not None else "n/a",
                     "yes" if c.recommended else "no", c.reason])
    advice = tu.advice()
    keep = ("no NCCL setting beat the default by more than max(2%, 3 x noise) at every size of a band without "
            "losing elsewhere: keep the defaults")
    lines = list(advice.lines) or [keep]
    for only, where, costs in advice.only_for:
        lines += [f"only where the job's messages are all within {where} (elsewhere {', '.join(costs)}):", *only]
    return rows, lines


def tuning_csv(tuning: dict) -> str:
    """Every setting's measurements, one row each: the setting's environment, then the figures in
    base units (bytes, seconds, bytes/s) as render_csv writes them."""
    from .tune.rule import Tuning

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["setting", "run", "op", "bytes", "busbw_Bps", "time_s", "cov", "nsamples", "wrong", "status"])
    tu = Tuning.from_dict(tuning)
    for t in tu.trials:
        for m in t.measurements:
            w.writerow([t.candidate.label, t.run, m.spec.op, m.spec.bytes, f"{m.busbw:.6g}", f"{m.time_s:.9g}",
                        "" if m.cov is None else f"{m.cov:.4g}", m.nsamples, m.total_wrong,
                        t.error or t.stopped or "ok"])
    return buf.getvalue()

