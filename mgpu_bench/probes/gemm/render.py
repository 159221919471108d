"""gemm on the terminal and in CSV: one row model (`rows`, base units), two renderers."""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence

from .measure import GemmResult, GemmRun, Shape

CSV_FIELDS = ("gpu", "gpu_name", "dtype", "phase", "m", "n", "k", "layout", "flops", "best", "best_seconds",
              "flops_per_s", "peak_flops_per_s", "pct_peak", "noise", "max_error", "sm_hz_median",
              "power_w_max", "temp_c_max", "limiting")


def rows(run: GemmRun, phases: Sequence[str] = ("shape", "search-best")) -> list[dict]:
    """One row per result (base units), shared by the terminal table and the CSV."""
    out = []
    for r in run.results:
        if r.phase not in phases:
            continue
        b = r.best
        t = r.telemetry or {}
        out.append({
            "gpu": r.gpu, "gpu_name": r.gpu_name, "dtype": r.dtype, "phase": r.phase, "m": r.shape.m,
            "n": r.shape.n, "k": r.shape.k, "layout": r.layout, "flops": r.shape.flops,
            "best": b.name() if b else None, "best_seconds": b.median_s if b else None,
            "flops_per_s": r.flops_per_s, "peak_flops_per_s": r.peak.value if r.peak else None,
            "pct_peak": r.pct_peak, "noise": r.noise,
            "max_error": b.max_error if b else None, "sm_hz_median": t.get("sm_hz_median"),
            "power_w_max": t.get("power_w_max"), "temp_c_max": t.get("temp_c_max"),
            "limiting": ";".join(t.get("limiting") or []),
        })
    return out


def render_csv(run: GemmRun) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows(run):
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_terminal(run: GemmRun, console) -> None:
    """One table (100 columns) per run, then the best algorithm of every row, then the summary."""
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    t = Table(title="GEMM (cuBLASLt): TFLOP/s = 2*M*N*K / median seconds per GEMM of the best candidate; "
                    f"{run.config.init} inputs",
              title_justify="left", pad_edge=False, box=None, header_style="bold")
    for name, just in (("GPU", "right"), ("dtype", "left"), ("M x N x K  layout", "left"), ("TFLOP/s", "right"),
                       ("% peak", "right"), ("best", "right"), ("noise\n%", "right"), ("SM\nMHz", "right"),
                       ("power\nW max", "right"), ("temp\nC max", "right"), ("clock limits", "left")):
        t.add_column(name, justify=just, overflow="fold")  # type: ignore[arg-type]
    table_rows = rows(run)
    for row in table_rows:
        t.add_row(str(row["gpu"]), row["dtype"], f"{row['m']}x{row['n']}x{row['k']}  {row['layout']}",
                  _num(row["flops_per_s"] and row["flops_per_s"] / 1e12, ".1f"), _num(row["pct_peak"], ".1f"),
                  (row["best"] or "-").split(" ", 1)[0], _num(row["noise"] and 100 * row["noise"], ".2f"),
                  _num(row["sm_hz_median"] and row["sm_hz_median"] / 1e6, ".0f"), _num(row["power_w_max"], ".0f"),
                  _num(row["temp_c_max"], ".0f"), row["limiting"].replace(";", ", ") or "-")
    print_table(console, t)
    for row in table_rows:
        if row["best"]:
            console.print(f"  best for GPU {row['gpu']} {row['dtype']} {row['m']}x{row['n']}x{row['k']}: "
                          f"{row['best']}", highlight=False, soft_wrap=True)
    for line in summary_lines(run):
        console.print(line, highlight=False, soft_wrap=True)


def summary_lines(run: GemmRun) -> list[str]:
    """Per dtype and shape, the node's figures in one line each (for grep); the search and the
    sustained runs summarised."""
    lines = []
    groups: dict[tuple[str, Shape], list[GemmResult]] = {}
    for r in run.results:
        if r.phase != "search" and r.tflops:
            groups.setdefault((r.dtype, r.shape), []).append(r)
    for (dtype, shape), rs in groups.items():
        vals = [r.tflops for r in rs if r.tflops]
        pcts = [r.pct_peak for r in rs if r.pct_peak is not None]
        peaks = {(r.peak.value, r.peak.source) for r in rs if r.peak and r.peak.value}
        first = [r.shape.flops / r.heuristic_first.median_s / 1e12 for r in rs
                 if r.heuristic_first and r.heuristic_first.median_s]
        lines.append(f"gemm {dtype} {shape}: {len(vals)} GPU(s), median {statistics.median(vals):.1f} TFLOP/s "
                     f"(min {min(vals):.1f}, max {max(vals):.1f})"
                     + (f", median {statistics.median(pcts):.1f}% of the dense peak ("
                        + "; ".join(f"{v / 1e12:g} TFLOP/s, {src}" for v, src in sorted(peaks)) + ")"
                        if pcts else ", no peak figure for this GPU")
                     + (f"; the heuristic's first choice alone: {statistics.median(first):.1f}" if first else ""))
    coarse = run.measured("search")
    if coarse:
        by_dtype: dict[str, list[GemmResult]] = {}
        for r in coarse:
            by_dtype.setdefault(r.dtype, []).append(r)
        for dtype, rs in by_dtype.items():
            shapes = {r.shape for r in rs}
            secs = sum(r.seconds_wall for r in rs) / max(1, len({r.gpu for r in rs}))
            lines.append(f"search {dtype}: {len(shapes)} shapes, about {secs:.1f} s of measuring per GPU; "
                         "the best shapes were measured again in full (rows above)")
    for r in run.results:
        if r.series:
            tps = [r.shape.flops / s / 1e12 for _, s in r.series]
            tel = (r.series_telemetry or {}).get("summary") or {}
            extra = ""
            if tel.get("sm_hz_median"):
                extra = (f"; SM clock median {tel['sm_hz_median'] / 1e6:.0f} MHz (min {tel['sm_hz_min'] / 1e6:.0f}), "
                         f"power max {_num(tel.get('power_w_max'), '.0f')} W of {_num(tel.get('power_limit_w'), '.0f')} W, "
                         f"temperature max {_num(tel.get('temp_c_max'), '.0f')} C")
            lines.append(f"sustained GPU {r.gpu} {r.dtype} {r.shape}: {r.series[-1][0]:.1f} s, {len(tps)} bursts, "
                         f"median {statistics.median(tps):.1f} TFLOP/s (min {min(tps):.1f}, max {max(tps):.1f}){extra}")
    return lines
