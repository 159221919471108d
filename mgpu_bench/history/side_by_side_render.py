"""`mgpu-bench side-by-side`: the command, and the renderers of side_by_side's one table model:
terminal, Markdown, CSV, JSON and an HTML page with one grouped bar chart per figure family.

Values are stored in base units and formatted here: GB/s or TB/s, TFLOP/s, us or ms, tokens/s
and samples/s per GPU, GiB, percent; per watt the same per W. A missing figure is "missing".
Every stored string (hosts, GPU names, metric names) passes through safe_text / html_page.esc /
html_page.md before it is shown.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import click

from mgpu_bench.output import html_page
from mgpu_bench.output.console import safe_text
from mgpu_bench.output.tables import format_value

from .side_by_side import Cell, SideBySide, build

MISSING = "missing"


# -- formatting ------------------------------------------------------------------------------------


def value_text(value: float | None, unit: str) -> str:
    """A base-unit value per GPU as a person reads it, with its unit (as history and compare print
    it: output.tables.format_value); a figure the run lacks is "missing"."""
    return MISSING if value is None else format_value(value, unit)


def per_watt_text(value: float | None, unit: str) -> str | None:
    if value is None:
        return None
    if unit == "FLOP/s":
        return f"{value / 1e12:.2f} TFLOP/s per W" if value >= 1e12 else f"{value / 1e9:.1f} GFLOP/s per W"
    if unit == "B/s":
        return f"{value / 1e9:.2f} GB/s per W"
    if unit in ("tokens/s", "samples/s"):
        return f"{value:.2f} {unit} per W"
    return f"{value:.3g} {unit} per W"


def share_text(c: Cell, unit: str) -> str:
    if c.share is None:
        return "theory n/a"
    return f"{100 * c.share:.0f}% of {value_text(c.theory, unit)}"


def cell_lines(c: Cell | None, unit: str, first: bool) -> list[str]:
    """What one cell says: the value per GPU, its share of its machine's theory, the ratio to
    the first column, per watt where power was recorded."""
    if c is None:
        return [MISSING]
    lines = [value_text(c.value, unit) + (f" (median, {c.gpus} GPUs)" if c.gpus > 1 else "")]
    if c.theory is not None or c.theory_text:  # a figure with no theory at all (a latency) says nothing
        lines.append(share_text(c, unit))
    if not first and c.ratio is not None:
        lines.append(f"x{c.ratio:.2f} vs first")
    watt = per_watt_text(c.per_watt, unit)
    if watt:
        lines.append(watt)
    return lines


def families(sbs: SideBySide) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in sbs.rows:
        out.setdefault(r.family, []).append(r)
    return out


# -- terminal --------------------------------------------------------------------------------------


def render_terminal(sbs: SideBySide, console) -> None:
    from rich import box
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    kind = sbs.columns[0].kind
    console.print(safe_text(f"side by side: {len(sbs.columns)} {kind} runs, every figure per GPU against its own "
                            "machine's theory"), soft_wrap=True)
    t = Table(box=None, pad_edge=False, header_style="bold")
    t.add_column("machine", justify="left")
    for c in sbs.columns:
        t.add_column(safe_text(c.run_id), justify="left")
    for fact in sbs.differ:
        t.add_row(fact, *[safe_text(c.facts.get(fact, "-")) for c in sbs.columns])
    if sbs.differ:
        print_table(console, t)
    if sbs.same:
        console.print(safe_text("same on all: " + "; ".join(f"{k} {v}" for k, v in sbs.same.items())),
                      soft_wrap=True)
    for family, rows in families(sbs).items():
        console.print()
        t = Table(title=safe_text(family), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, header_style="bold", show_lines=True)  # a blank line between figures
        t.add_column("figure", justify="left")
        for c in sbs.columns:
            t.add_column(safe_text(c.run_id), justify="right")
        for r in rows:
            t.add_row(safe_text(r.label), *["\n".join(cell_lines(c, r.unit, i == 0)) for i, c in enumerate(r.cells)])
        print_table(console, t)
    console.print()
    theories = _theories(sbs)
    for run_id, texts in theories.items():
        for text in texts:
            console.print(safe_text(f"theory {run_id}: {text}"), soft_wrap=True)
    for note in sbs.notes:
        console.print(safe_text(f"note: {note}"), soft_wrap=True)


def _theories(sbs: SideBySide) -> dict[str, list[str]]:
    """Per run, the distinct theories its cells were set against (said once, below the tables)."""
    out: dict[str, list[str]] = {}
    for i, col in enumerate(sbs.columns):
        texts = list(dict.fromkeys(r.cells[i].theory_text for r in sbs.rows if r.cells[i] is not None
                                   and r.cells[i].theory_text))
        if texts:
            out[col.run_id] = texts
    return out


# -- Markdown, CSV, JSON ---------------------------------------------------------------------------


def markdown(sbs: SideBySide) -> str:
    md = html_page.md
    lines = [f"# mgpu-bench side-by-side: {', '.join(md(c.run_id) for c in sbs.columns)} ({md(sbs.columns[0].kind)})",
             ""]
    if sbs.differ:
        lines += html_page.md_table(["machine", *[c.run_id for c in sbs.columns]],
                                    [[f, *[c.facts.get(f, "-") for c in sbs.columns]] for f in sbs.differ])
        lines.append("")
    if sbs.same:
        lines += ["- same on all: " + "; ".join(f"{md(k)} {md(v)}" for k, v in sbs.same.items()), ""]
    for family, rows in families(sbs).items():
        lines += [f"## {md(family)}", ""]
        lines += html_page.md_table(["figure", *[c.run_id for c in sbs.columns]],
                                    [[r.label, *["; ".join(cell_lines(c, r.unit, i == 0)) for i, c in
                                                 enumerate(r.cells)]] for r in rows])
        lines.append("")
    for run_id, texts in _theories(sbs).items():
        lines += [f"- theory {md(run_id)}: {md(t)}" for t in texts]
    lines += [f"- note: {md(n)}" for n in sbs.notes]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("family", "figure", "key", "unit", "better", "run", "value_per_gpu", "share_of_theory", "theory",
              "theory_source", "ratio_to_first", "power_w", "per_watt", "gpus")


def render_csv(sbs: SideBySide) -> str:
    """One row per figure and run, base units; an empty value where the run lacks the figure."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in sbs.rows:
        for col, c in zip(sbs.columns, r.cells, strict=True):
            cells = ["", "", "", "", "", "", "", ""] if c is None else [
                c.value, _blank(c.share), _blank(c.theory), c.theory_text or "", _blank(c.ratio), _blank(c.power_w),
                _blank(c.per_watt), c.gpus]
            w.writerow([r.family, r.label, r.key, r.unit, r.better, col.run_id, *cells])
    return buf.getvalue()


def _blank(x) -> object:
    return "" if x is None else x


# -- HTML ------------------------------------------------------------------------------------------


def chart(sbs: SideBySide, family: str, rows: list) -> bytes:
    """One grouped bar chart: a group per figure of the family, a bar per run (value per GPU in
    the family's display unit), each bar labelled with its share of its machine's theory; a run
    that lacks the figure gets no bar and the word missing."""
    from mgpu_bench.output.plotting import plain, png, pyplot

    plt = pyplot()
    unit = rows[0].unit
    scale, shown = _scale(unit, rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows) * len(sbs.columns) / 2 + 2), 4.0))
    try:
        n = len(sbs.columns)
        width = 0.8 / n
        top = max((c.value / scale for r in rows for c in r.cells if c is not None), default=1.0) or 1.0
        for i, col in enumerate(sbs.columns):
            xs = [k + (i - (n - 1) / 2) * width for k in range(len(rows))]
            values = [r.cells[i].value / scale if r.cells[i] is not None else 0.0 for r in rows]
            bars = ax.bar(xs, values, width, label=plain(col.label))
            for bar, r in zip(bars, rows, strict=True):
                c = r.cells[i]
                text = MISSING if c is None else (f"{100 * c.share:.0f}%" if c.share is not None else "")
                ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height() if c is not None else 0.0),
                            xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7,
                            rotation=90 if c is None else 0)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([plain(r.label) for r in rows], rotation=30 if len(rows) > 4 else 0, ha="right"
                           if len(rows) > 4 else "center", fontsize=8)
        ax.set_ylim(0, top * 1.18)
        ax.set_ylabel(plain(f"{shown} per GPU"))
        ax.set_title(plain(family) + "\n(bar label: share of that machine's theory)", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    except BaseException:
        plt.close(fig)
        raise
    return png(plt, fig)


def _scale(unit: str, rows: list) -> tuple[float, str]:
    """(divisor, display unit) for a chart's axis."""
    biggest = max((abs(c.value) for r in rows for c in r.cells if c is not None), default=0.0)
    if unit == "B/s":
        return (1e12, "TB/s") if biggest >= 1e12 else (1e9, "GB/s")
    if unit == "FLOP/s":
        return (1e12, "TFLOP/s") if biggest >= 1e11 else (1e9, "GFLOP/s")
    if unit == "s":
        return (1e-3, "ms") if biggest >= 1e-3 else (1e-6, "us")
    if unit == "fraction":
        return 0.01, "%"
    if unit == "B":
        return 2**30, "GiB"
    return 1.0, unit


def page(sbs: SideBySide, pngs: dict[str, bytes]) -> str:
    e = html_page.esc
    facts = html_page.table(["machine", *[c.run_id for c in sbs.columns]],
                            [[f, *[c.facts.get(f, "-") for c in sbs.columns]] for f in sbs.differ], left=range(
                                len(sbs.columns) + 1))
    same = (f"<p>same on all: {e('; '.join(f'{k} {v}' for k, v in sbs.same.items()))}</p>" if sbs.same else "")
    sections = []
    for k, (family, rows) in enumerate(families(sbs).items()):
        table = html_page.table(["figure", *[c.run_id for c in sbs.columns]],
                                [[r.label, *["; ".join(cell_lines(c, r.unit, i == 0)) for i, c in enumerate(r.cells)]]
                                 for r in rows], left=(0,))
        sections.append((family, html_page.image(family, pngs[f"family_{k}"]) + html_page.wide(table)))
    notes = [f"theory {run_id}: {t}" for run_id, texts in _theories(sbs).items() for t in texts] + sbs.notes
    title = f"mgpu-bench side-by-side: {', '.join(c.run_id for c in sbs.columns)} ({sbs.columns[0].kind})"
    return html_page.page(title, {}, [], sections, notes, summary=html_page.wide(facts) + same)


def write_report(sbs: SideBySide, out_dir: str) -> list[Path]:
    pngs = {f"family_{k}": chart(sbs, family, rows) for k, (family, rows) in enumerate(families(sbs).items())}
    return html_page.write_bundle(out_dir, pngs, page(sbs, pngs), markdown(sbs))


# -- the command -----------------------------------------------------------------------------------

HELP = """Sets two or more stored runs of one kind (suites, or runs of one probe) from different
machines side by side: per figure its value per GPU, its share of that machine's own theory
(its link theory, the datasheet peak or HBM bandwidth of its GPU), the ratio to the first run,
per watt where NVML power was recorded, and the model step of the same workload. The machine
facts that differ (GPU, count, driver, NCCL, CUDA, topology, network) head the table. A figure
a run lacks is shown as missing. A nccl-tests or rccl-tests log stored with `mgpu-bench
history add LOG` is a comm run like any other.

\b
RUN: r12 (as `history list` prints it), 12, or latest. Not a regression gate: `compare` is.
Exit codes: 0 shown; 1 a --json/--csv/--report output could not be written after being
checked (what was printed stands); 2 bad input (unknown run, runs of different kinds, fewer
than two runs, an output path that cannot be written)."""


@click.command("side-by-side", help=HELP)
@click.argument("runs", nargs=-1, required=True)
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Write the table as JSON (base units, shares as fractions, missing figures as null).")
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False),
              help="Write one row per figure and run (base units).")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write report.html (a grouped bar chart per figure family), summary.md and the PNGs here.")
@click.option("--db", "db_path", default=None, metavar="PATH",
              help="History database [default: $MGPU_BENCH_DB, else $XDG_DATA_HOME/mgpu-bench/history.sqlite3].")
def side_by_side_command(runs, json_path, csv_path, report_dir, db_path) -> int:
    from rich.console import Console

    from mgpu_bench.core.paths import check_distinct, check_report_dir, check_writable, write_json, write_output
    from mgpu_bench.output.console import _isatty

    from .store import History, default_path

    check_writable(json_path, "--json")
    check_writable(csv_path, "--csv")
    check_report_dir(report_dir, "--report")
    check_distinct([("--json", json_path), ("--csv", csv_path), ("--report", report_dir)], db_path or default_path())
    with History.open(db_path, readonly=True) as h:
        sbs = build(h, list(runs))
    code = 0
    writers = [(json_path, lambda p: write_json(p, sbs.to_dict())), (csv_path, lambda p: write_output(p, render_csv(sbs))),
               (report_dir, lambda p: write_report(sbs, p))]
    for path, write in writers:  # written first, printed after: a reader that stops reading costs no file
        if path:
            try:
                write(path)
            except OSError as exc:
                click.echo(safe_text(f"mgpu-bench: could not write {path}: {exc.strerror or exc}"), err=True)
                code = 1
    out = Console(width=100 if not _isatty(sys.stdout) else None, soft_wrap=False, markup=False, highlight=False)
    render_terminal(sbs, out)
    for path in (json_path, csv_path, report_dir):
        if path:
            out.print(safe_text(f"wrote {path}"), soft_wrap=True)
    return code

