"""`mgpu-bench gemm --report DIR`: TFLOP/s per GPU against the datasheet peak, the sustained
runs over time with their clocks and power, the shape search's spread (PNGs), one
self-contained HTML page holding them, and a Markdown summary for a ticket.

Like the comm report, the page loads nothing from anywhere: images are embedded as data URIs, styles
are inline, and every string that came from outside (GPU names, host, environment values,
findings, notes, algorithm names) is escaped. matplotlib is imported lazily, with its
non-interactive Agg backend; outside strings drawn in a plot have their `$` escaped so that
matplotlib does not read them as mathtext.

Data stay in base units (seconds, FLOP/s, Hz, W); TFLOP/s (10^12 FLOP/s), MHz and % are chosen
here, when rendering.
"""

from __future__ import annotations

import base64
import statistics
from collections.abc import Callable
from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain as _mpl
from mgpu_bench.output.plotting import png as _png
from mgpu_bench.output.plotting import pyplot as _pyplot

from .analyse import findings, outliers
from .measure import GemmResult, GemmRun, Shape
from .render import rows, summary_lines

_OUTLIER = "tab:red"
# Bar colours per shape; red is kept for outliers.
_PALETTE = ("tab:blue", "tab:green", "tab:purple", "tab:olive", "tab:cyan", "tab:brown", "tab:pink",
            "tab:gray")
_PNG_KINDS = ("gemm", "sustained", "search")  # file stems: <kind>_<dtype>.png, in page order

# ------------------------------------------------------------------------------------ helpers


def _dtypes(run: GemmRun) -> list[str]:
    """The dtypes with results, in the order the run was asked for."""
    seen = {r.dtype for r in run.results}
    return [d for d in run.config.dtypes if d in seen] + sorted(seen - set(run.config.dtypes))


def _measured(run: GemmRun, dtype: str) -> list[GemmResult]:
    """Full measurements (not the search's coarse pass) of one dtype."""
    return [r for r in run.results if r.dtype == dtype and r.phase != "search"]


def _outlier_gpus(rs: list[GemmResult]) -> set[int]:
    """The GPUs outliers() names among results of one dtype and shape (as findings() does)."""
    ok = [r for r in rs if r.tflops]
    return {o["gpu"] for o in outliers({r.gpu: r.tflops for r in ok},  # type: ignore[misc]
                                            {r.gpu: r.noise for r in ok})}


def _peaks(rs: list[GemmResult]) -> list[tuple[float, str]]:
    """Distinct (FLOP/s, source) datasheet peaks of results (one per GPU model in the node)."""
    return sorted({(r.peak.value, r.peak.source) for r in rs if r.peak and r.peak.value})


def _models(rs: list[GemmResult], limit: int = 90) -> str:
    """The distinct GPU names of results, shortened to `limit` characters for a plot title."""
    text = ", ".join(dict.fromkeys(r.gpu_name for r in rs)) or "no GPU"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _scaled(v: float | None, unit: float, fmt: str) -> str:
    return "-" if v is None else format(v / unit, fmt)


# ------------------------------------------------------------------------------------ plots

def plot_tflops(run: GemmRun, dtype: str) -> bytes:
    """PNG of TFLOP/s per GPU for `dtype` (bars grouped by shape when several were measured),
    with the datasheet dense peak, the node's median per shape (dashed) and the outliers that
    outliers() names in red. A GPU without a valid result is marked 'no valid result'."""
    plt = _pyplot()
    rs = _measured(run, dtype)
    shapes = list(dict.fromkeys(r.shape for r in rs))
    gpus = sorted({r.gpu for r in rs})
    slot = {g: i for i, g in enumerate(gpus)}
    nbars = max(1, len(gpus) * len(shapes))
    fig, ax = plt.subplots(figsize=(min(16.0, max(7.5, 2.0 + 0.45 * nbars)), 5.2), dpi=110)
    width = 0.8 / max(1, len(shapes))
    top = 0.0
    any_slow = False
    for j, shape in enumerate(shapes):
        group = [r for r in rs if r.shape == shape]
        slow = _outlier_gpus(group)
        colour = _PALETTE[j % len(_PALETTE)]
        offset = (j - (len(shapes) - 1) / 2) * width
        ok = [r for r in group if r.tflops]
        for r in group:
            if not r.tflops:
                ax.text(slot[r.gpu] + offset, 0, "no valid\nresult", ha="center", va="bottom", fontsize=7,
                        rotation=90 if len(shapes) > 1 else 0)
        if not ok:
            continue
        xs = [slot[r.gpu] + offset for r in ok]
        ys = [r.tflops or 0.0 for r in ok]
        bars = ax.bar(xs, ys, width * 0.92, color=[_OUTLIER if r.gpu in slow else colour for r in ok],
                      label=str(shape) if len(shapes) > 1 else None)
        any_slow = any_slow or bool(slow)
        for bar, r in zip(bars, ok):
            if r.gpu in slow and len(shapes) > 1:
                bar.set_hatch("//")  # its shape's colour is gone: the position and hatch say which
        if nbars <= 32:
            ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
        med = statistics.median(ys)
        ax.axhline(med, color="dimgray" if len(shapes) == 1 else colour, linewidth=1, linestyle="--",
                   label=f"node median{f' {shape}' if len(shapes) > 1 else ''}: {med:.1f} TFLOP/s")
        top = max(top, *ys)
    for value, source in _peaks(rs):
        ax.axhline(value / 1e12, color="black", linewidth=1.2,
                   label=_mpl(f"{value / 1e12:g} TFLOP/s dense peak ({source})"))
        top = max(top, value / 1e12)
    ax.set_xticks(range(len(gpus)), [f"GPU {g}" for g in gpus])
    ax.set_xlim(-0.6, len(gpus) - 0.4)
    ax.set_ylim(0, (top or 1.0) * 1.15)
    ax.set_xlabel("GPU (index)")
    ax.set_ylabel("TFLOP/s (10^12 FLOP/s, 2MNK / median time)")
    shape_text = f" {shapes[0]}" if len(shapes) == 1 else ""
    ax.set_title(_mpl(f"{dtype} GEMM{shape_text}, best cuBLASLt algorithm per GPU\n{_models(rs)}"),
                 fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if any_slow:
        from matplotlib.patches import Patch

        handles.append(Patch(color=_OUTLIER, label="outlier: below the node median by > max(2%, 3x noise)"))
        labels.append(handles[-1].get_label())
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7,
              frameon=False)
    return _png(plt, fig)


def plot_sustained(run: GemmRun, dtype: str) -> bytes | None:
    """PNG of the sustained runs of `dtype`: TFLOP/s over time per GPU, then the SM clock (MHz)
    and the power (W) over time from the telemetry sampled beside them (a panel without data is
    left out), with the max SM clock and the power limit where known. None without a series."""
    rs = [r for r in run.results if r.dtype == dtype and r.series]
    if not rs:
        return None
    plt = _pyplot()
    tel = [(r, r.series_telemetry or {}) for r in rs]
    panels: list[tuple[str, str, float, str, str]] = [("tflops", "TFLOP/s", 1.0, "", "")]
    for key, label, unit, limit_key, limit_label in (
            ("sm_hz", "SM clock (MHz)", 1e6, "sm_max_hz", "max SM clock"),
            ("power_w", "power (W)", 1.0, "power_limit_w", "power limit")):
        if any(v is not None for _, t in tel for v in t.get(key) or []):
            panels.append((key, label, unit, limit_key, limit_label))
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False, dpi=110,
                             figsize=(9.0, 1.2 + 2.4 * len(panels)))
    twice = len({r.gpu for r in rs}) < len(rs)  # a GPU sustained more than one shape: say which
    colours = {id(r): f"C{i % 10}" for i, r in enumerate(rs)}
    for (key, label, unit, limit_key, limit_label), ax in zip(panels, axes[:, 0]):
        limits: set[float] = set()
        for r, t in tel:
            name = f"GPU {r.gpu}" + (f" {r.shape}" if twice else "")
            if key == "tflops":
                pts = [(x, r.shape.flops / s / 1e12) for x, s in r.series or [] if s and s > 0]
            else:
                pts = [(x, v / unit) for x, v in zip(t.get("t") or [], t.get(key) or []) if v is not None]
                lim = (t.get("summary") or {}).get(limit_key)
                if lim:
                    limits.add(lim / unit)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", marker="." if len(pts) <= 60 else None,
                        color=colours[id(r)], linewidth=1, markersize=3, label=name)
        for lim in sorted(limits):
            ax.axhline(lim, color="black", linewidth=1, linestyle=":",
                       label=f"{limit_label} {lim:.0f} {'MHz' if unit == 1e6 else 'W'}")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        if key == "tflops":
            ax.set_ylim(0, ax.get_ylim()[1] * 1.1)  # room above a flat series
    axes[-1, 0].set_xlabel("time since the sustained run started (s)")
    shapes = ", ".join(str(s) for s in dict.fromkeys(r.shape for r in rs))
    axes[0, 0].set_title(_mpl(f"{dtype} sustained GEMM {shapes}\n{_models(rs)}"), fontsize=10)
    return _png(plt, fig)


def _search_scores(run: GemmRun, dtype: str) -> dict[Shape, list[float]]:
    """Each coarse shape's TFLOP/s on every GPU that gave a figure."""
    out: dict[Shape, list[float]] = {}
    for r in run.results:
        if r.dtype == dtype and r.phase == "search" and r.tflops:
            out.setdefault(r.shape, []).append(r.tflops)
    return out


def plot_search(run: GemmRun, dtype: str) -> bytes | None:
    """PNG of the search's coarse pass for `dtype`: each shape's median TFLOP/s over the GPUs,
    ranked best first (with the range over GPUs) and against its work 2MNK; the shapes measured
    again in full are marked. None when no search ran (or none of its shapes gave a figure)."""
    scores = _search_scores(run, dtype)
    if not scores:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    med = {s: statistics.median(v) for s, v in scores.items()}
    ranked = sorted(med, key=med.__getitem__, reverse=True)
    refined = [s for s in dict.fromkeys(r.shape for r in run.results if r.dtype == dtype
                                        and r.phase == "search-best") if s in med]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 5.0), dpi=110)
    marker = "o" if len(ranked) <= 200 else None
    xs = list(range(1, len(ranked) + 1))
    left.plot(xs, [med[s] for s in ranked], "-", marker=marker, markersize=3, linewidth=1,
              label="median over GPUs")
    if any(len(scores[s]) > 1 for s in ranked):
        left.fill_between(xs, [min(scores[s]) for s in ranked], [max(scores[s]) for s in ranked], alpha=0.25,
                          label="range over GPUs")
    right.scatter([s.flops / 1e9 for s in ranked], [med[s] for s in ranked], s=12, label="coarse shapes")
    if refined:
        rank = {s: i + 1 for i, s in enumerate(ranked)}
        left.plot([rank[s] for s in refined], [med[s] for s in refined], "o", color=_OUTLIER, markersize=6,
                  fillstyle="none", label="measured again in full")
        right.scatter([s.flops / 1e9 for s in refined], [med[s] for s in refined], s=40, facecolors="none",
                      edgecolors=_OUTLIER, label="measured again in full")
        for s in refined[:8]:
            left.annotate(str(s), (rank[s], med[s]), textcoords="offset points", xytext=(6, -3), fontsize=7)
    for value, source in _peaks([r for r in run.results if r.dtype == dtype]):
        for ax in (left, right):
            ax.axhline(value / 1e12, color="black", linewidth=1.2,
                       label=_mpl(f"{value / 1e12:g} TFLOP/s dense peak ({source})"))
    left.set_xlabel("shape, ranked (best first)")
    right.set_xlabel("work per GEMM (GFLOP = 2MNK / 10^9, log scale)")
    right.set_xscale("log")
    for ax in (left, right):
        ax.set_ylabel("TFLOP/s (median over GPUs)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7, frameon=False)
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(_mpl(f"{dtype} shape search, coarse pass: {len(ranked)} shapes, best {ranked[0]} "
                      f"at {med[ranked[0]]:.1f} TFLOP/s"), fontsize=10)
    return _png(plt, fig)


# ------------------------------------------------------------------------------------ tables

# One table model for Markdown and HTML: (header with its unit, right-aligned, cell text from a
# render.rows() row). The headers are the terminal table's (render.render_terminal).
COLUMNS: tuple[tuple[str, bool, Callable[[dict], str]], ...] = (
    ("GPU", True, lambda r: str(r["gpu"])),
    ("dtype", False, lambda r: r["dtype"]),
    ("M x N x K", False, lambda r: f"{r['m']}x{r['n']}x{r['k']}"),
    ("layout", False, lambda r: r["layout"]),
    ("TFLOP/s", True, lambda r: _scaled(r["flops_per_s"], 1e12, ".1f")),
    ("% peak", True, lambda r: _scaled(r["pct_peak"], 1, ".1f")),
    ("peak TFLOP/s", True, lambda r: _scaled(r["peak_flops_per_s"], 1e12, "g")),
    ("best algorithm", False, lambda r: r["best"] or "none valid"),
    ("noise %", True, lambda r: _scaled(r["noise"], 0.01, ".2f")),
    ("SM MHz", True, lambda r: _scaled(r["sm_hz_median"], 1e6, ".0f")),
    ("W max", True, lambda r: _scaled(r["power_w_max"], 1, ".0f")),
    ("C max", True, lambda r: _scaled(r["temp_c_max"], 1, ".0f")),
    ("clock limits", False, lambda r: r["limiting"] or "-"),
)


def _gpu_names(run: GemmRun, environment: dict) -> str:
    names = [str(g.get("name")) for g in environment.get("gpus") or [] if "name" in g]
    if not names:
        names = [str(d.get("name")) for d in run.devices if "name" in d]
    return ", ".join(names) or "no GPU"


def _notes(run: GemmRun) -> list[str]:
    notes = list(dict.fromkeys(run.notes))
    if run.telemetry_error and not any(run.telemetry_error in n for n in notes):
        notes.append(f"no clock/power telemetry: {run.telemetry_error}")
    return notes


def _title(run: GemmRun) -> str:
    return (f"mgpu-bench gemm: {len(run.devices)} GPU(s), "
            f"{', '.join(_dtypes(run) or list(run.config.dtypes))}")


def _wall(run: GemmRun) -> str:
    return (f"{len(run.results)} measurement(s) in {run.wall_seconds:.2f} s wall, probe set-up and "
            "algorithm selection included.")


_md = html_page.md  # an outside string on one Markdown line, its controls and syntax escaped
_md_cell = html_page.md


def markdown(run: GemmRun, environment: dict) -> str:
    """The summary for a ticket: environment, findings, the table of render.rows() (units in the
    headers), gemm.summary_lines(), notes and the stop message."""
    e = {k: _md(environment.get(k)) for k in ("host", "nvidia_driver", "cuda_driver", "cuda_runtime",
                                                  "cublaslt", "torch")}
    env_line = (f"- host: {e['host']}; GPUs: {_md(_gpu_names(run, environment))}; "
                f"driver {e['nvidia_driver']}; CUDA {e['cuda_driver']} (runtime {e['cuda_runtime']}); "
                f"cuBLASLt {e['cublaslt']}; torch {e['torch']}")
    lines = [f"# {_title(run)}", "", env_line]
    for f in findings(run):
        lines.append(f"- finding: {_md(f.text)}")
    table = rows(run)
    if table:
        lines += ["", "| " + " | ".join(title for title, _, _ in COLUMNS) + " |",
                  "|" + "|".join("---:" if right else "---" for _, right, _ in COLUMNS) + "|"]
        lines += ["| " + " | ".join(_md_cell(cell(row)) for _, _, cell in COLUMNS) + " |" for row in table]
    summary = summary_lines(run)
    if summary:
        lines += [""] + [f"- {_md(s)}" for s in summary]
    lines += ["", _wall(run)]
    notes = _notes(run)
    if notes:
        lines += ["", "Notes:"] + [f"- {_md(n)}" for n in notes]
    if run.stopped:
        lines += ["", f"Stopped early ({_md(run.stopped)}): {_md(run.stop_message or '')}"]
    return "\n".join(lines) + "\n"


def page(run: GemmRun, environment: dict, images: dict[str, bytes]) -> str:
    """The HTML page: environment, findings, per dtype its images and table rows, the summary
    lines and notes. `images` is keyed by file stem ('gemm_bf16', 'sustained_bf16',
    'search_bf16'); other keys are shown after the dtypes."""
    e = html_page.esc
    env_ = environment
    head = [f"<h1>{e(_title(run))}</h1>", "<table class=kv>"]
    for key in ("host", "nvidia_driver", "cuda_driver", "cuda_runtime", "cublaslt", "torch", "mgpu_bench"):
        head.append(f"<tr><th>{e(key)}</th><td>{e(str(env_.get(key)))}</td></tr>")
    head.append(f"<tr><th>GPUs</th><td>{e(_gpu_names(run, env_))}</td></tr>")
    variables = " ".join(f"{k}={v}" for k, v in (env_.get("env") or {}).items())
    head.append(f"<tr><th>environment</th><td>{e(variables)}</td></tr>")
    head.append("</table>")
    for f in findings(run):
        head.append(f"<p class=finding>finding: {e(f.text)}</p>")
    if run.stopped:
        head.append(f"<p class=finding>stopped early ({e(run.stopped)}): {e(run.stop_message or '')}</p>")

    def img(key: str) -> str:
        data = base64.b64encode(images[key]).decode()
        return f"<p><img alt='{e(key)}' src='data:image/png;base64,{data}'></p>"

    body = []
    shown: set[str] = set()
    table = rows(run)
    header = "<tr>" + "".join(f"<th>{e(title)}</th>" for title, _, _ in COLUMNS) + "</tr>"
    for dtype in _dtypes(run):
        body.append(f"<h2>{e(dtype)}</h2>")
        for kind in _PNG_KINDS:
            key = f"{kind}_{dtype}"
            if key in images:
                body.append(img(key))
                shown.add(key)
        mine = [row for row in table if row["dtype"] == dtype]
        if mine:
            body.append("<table>" + header + "".join(
                "<tr>" + "".join(f"<td{'' if right else ' class=l'}>{e(cell(row))}</td>"
                                 for _, right, cell in COLUMNS) + "</tr>" for row in mine)
                + "</table>")
    for key in images:
        if key not in shown:
            body.append(f"<h2>{e(key)}</h2>{img(key)}")
    summary = "".join(f"<li>{e(s)}</li>" for s in summary_lines(run))
    if summary:
        body.append(f"<h2>summary</h2><ul class=mono>{summary}</ul>")
    body.append(f"<p>{e(_wall(run))}</p>")
    notes = "".join(f"<li>{e(n)}</li>" for n in _notes(run))
    style = ("body{font-family:sans-serif;max-width:72em;margin:2em auto}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             ".kv td,.kv th,td.l{text-align:left}.finding{color:#a40}.mono{font-family:monospace}"
             "img{max-width:100%}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>mgpu-bench gemm</title>"
            f"<style>{style}</style></head><body>{''.join(head)}{''.join(body)}"
            f"{'<h2>notes</h2><ul>' + notes + '</ul>' if notes else ''}</body></html>")


def report_images(run: GemmRun) -> dict[str, bytes]:
    """Every PNG of the run keyed by file stem: gemm_<dtype> for dtypes with full measurements,
    sustained_<dtype> and search_<dtype> where those ran."""
    out: dict[str, bytes] = {}
    for dtype in _dtypes(run):
        if _measured(run, dtype):
            out[f"gemm_{dtype}"] = plot_tflops(run, dtype)
        for kind, plot in (("sustained", plot_sustained), ("search", plot_search)):
            png = plot(run, dtype)
            if png is not None:
                out[f"{kind}_{dtype}"] = png
    return out


def write_report(run: GemmRun, out_dir: str | Path, environment: dict) -> list[Path]:
    """Writes gemm_<dtype>.png, sustained_<dtype>.png and search_<dtype>.png where present,
    report.html and summary.md into out_dir (created if its parent exists; FileNotFoundError
    otherwise); returns the paths."""
    pngs = report_images(run)
    return html_page.write_bundle(out_dir, pngs, page(run, environment, pngs), markdown(run, environment))


def plot_temperature(run: GemmRun, dtype: str) -> bytes | None:
    """GPU temperature (C) over the sustained runs of `dtype`, from the telemetry sampled beside
    them (plot_sustained draws TFLOP/s, SM clock and power); None without any."""
    rs = [r for r in run.results if r.dtype == dtype and r.series and (r.series_telemetry or {}).get("temp_c")]
    if not rs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.0, 2.6), dpi=110)
    for i, r in enumerate(rs):
        t = r.series_telemetry
        pts = [(x, v) for x, v in zip(t.get("t") or [], t.get("temp_c") or []) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=f"C{i % 10}", linewidth=1,
                    label=f"GPU {r.gpu}")
    ax.set_xlabel("time since the sustained run started (s)")
    ax.set_ylabel("temperature (C)")
    ax.set_title(_mpl(f"{dtype} sustained GEMM: GPU temperature"), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _png(plt, fig)


def images(run: GemmRun) -> dict[str, bytes]:
    """The suite page's PNGs: the report's and, for the sustained runs, the GPU temperature over
    time."""
    out = report_images(run)
    for dtype in dict.fromkeys(r.dtype for r in run.results if r.series):
        png = plot_temperature(run, dtype)
        if png:
            out[f"temperature_{dtype}"] = png
    return out


def section(run: GemmRun, pngs: dict[str, bytes]) -> str:
    """The run's part of the suite page: plots, the table per GPU and dtype, the sustained runs
    with their clocks, power and temperature, the summary lines."""
    keys = [f"{kind}_{d}" for d in dict.fromkeys(r.dtype for r in run.results)
            for kind in ("gemm", "sustained", "temperature", "search")]
    parts = [html_page.images(pngs, keys)]
    table_rows = rows(run)
    if table_rows:
        parts.append(html_page.table([t for t, _, _ in COLUMNS], [[cell(r) for _, _, cell in COLUMNS]
                                                                  for r in table_rows],
                                     left=[i for i, (_, right, _) in enumerate(COLUMNS) if not right]))
    sustained = [r for r in run.results if r.series]
    if sustained:
        srows = []
        for r in sustained:
            t = (r.series_telemetry or {}).get("summary") or {}
            tps = [r.shape.flops / s / 1e12 for _, s in r.series if s]

            def f(key, scale=1.0, fmt=".0f", t=t):
                v = t.get(key)
                return "-" if v is None else format(v * scale, fmt)

            srows.append([r.gpu, r.dtype, str(r.shape), f"{r.series[-1][0]:.0f}", f"{statistics.median(tps):.1f}",
                          f"{min(tps):.1f}", f("sm_hz_median", 1e-6), f("sm_hz_min", 1e-6), f("power_w_mean"),
                          f("power_w_max"), f("power_limit_w"), f("temp_c_max"),
                          ", ".join(t.get("limiting") or []) or "-"])
        parts.append("<p><b>sustained runs</b>: clocks, power, temperature and throttle reasons sampled beside "
                     "them</p>")
        parts.append(html_page.table(["GPU", "dtype", "M x N x K", "s", "TFLOP/s median", "TFLOP/s min",
                                      "SM MHz median", "SM MHz min", "W mean", "W max", "W limit", "C max",
                                      "throttle reasons"], srows, left=(1, 2, 12)))
    parts.append(html_page.ul(summary_lines(run), "mono"))
    return "".join(parts)
