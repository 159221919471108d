"""`mgpu-bench overlap --report DIR`: PNGs (each side's rate alone and together, with its noise;
rank 0's together phase iteration by iteration against the alone means, the window shaded; the
GPUs' SM clock and power through the phases), a self-contained HTML page and a Markdown summary,
and the suite's section. As in the other reports: matplotlib imported lazily (Agg), outside
strings escaped, the table rows the same ones the terminal prints (render.rows)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain, png, pyplot

from .analyse import PHASE_TITLES, PHASES, OverlapRun, analyse, findings, side_samples, window
from .render import lines, rank_rows, rows

_IMAGES = ("rates", "timeline", "clocks")


def plot_rates(run: OverlapRun) -> bytes | None:
    """Two panels: the allreduce's busbw and the GEMM's rate, alone and together, with 3x the
    noise of each mean as error bars."""
    a = analyse(run)
    panels = []
    if a.comm_alone and a.comm_together:
        panels.append(("allreduce busbw, GB/s" if run.world >= 2 else "stand-in, buffer GB/s", 1e9,
                       a.comm_alone, a.comm_together, a.comm_slowdown))
    if a.gemm_alone and a.gemm_together:
        unit, div = ("TFLOP/s", 1e12) if run.on_gpu else ("GFLOP/s", 1e9)
        panels.append((f"GEMM {run.config.gemm_dtype} {run.config.shape}, {unit} per {run.unit}", div,
                       a.gemm_alone, a.gemm_together, a.gemm_slowdown))
    if not panels:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (title, div, alone, together, slow) in zip(axes[0], panels, strict=True):
        values = [alone.rate / div, together.rate / div]
        errs = [3 * (s.se or 0.0) * v for s, v in zip((alone, together), values, strict=True)]
        ax.bar(["alone", "together"], values, yerr=errs, capsize=4, color=["tab:blue", "tab:orange"])
        for i, v in enumerate(values):  # inside the bar's foot: clear of the error bar
            ax.annotate(f"{v:.3g}", (i, 0), ha="center", va="bottom", fontsize=8, color="white", xytext=(0, 3),
                        textcoords="offset points")
        ax.set_title(plain(title) + (f"\nslowdown {100 * slow.value:+.1f}% time" if slow else ""), fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{run.ranks_text}: alone and together (bars: 3x the noise of the mean)", fontsize=9)
    fig.tight_layout()
    return png(plt, fig)


def plot_timeline(run: OverlapRun) -> bytes | None:
    """Rank 0's together phase: each iteration's time over its alone mean, against when it ended;
    the window where both ran shaded."""
    if not run.ranks:
        return None
    r = run.ranks[0]
    p = (r.get("phases") or {}).get("together") or {}
    w = window(p)
    if w is None:
        return None
    import numpy as np

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = {"comm": "allreduce" if run.world >= 2 else "stand-in", "gemm": "GEMM"}
    for side, colour, phase in (("comm", "tab:blue", "comm_alone"), ("gemm", "tab:orange", "gemm_alone")):
        alone = side_samples(r, phase, side)
        secs = np.asarray(p[side]["seconds"], dtype=float)
        if not alone or not secs.size:
            continue
        t = float(p[side].get("start_s") or 0.0) + np.cumsum(secs)
        ax.plot(t, secs / float(np.mean(alone)), ".", markersize=2, color=colour,
                label=f"{names[side]}: mean {float(np.mean(secs[t <= w.end_s + 1e-12])) / float(np.mean(alone)):.2f}x "
                      "inside the window")
    ax.axvspan(w.start_s, w.end_s, color="grey", alpha=0.12, linewidth=0, label="both running")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("seconds since the phase started")
    ax.set_ylabel("time per iteration / alone mean")
    ax.set_title(f"together, rank 0 ({plain(r.get('device'))}): each iteration against its alone mean", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(True, alpha=0.3)
    return png(plt, fig)


def plot_clocks(run: OverlapRun) -> bytes | None:
    """Every GPU's SM clock and power through the three phases (NVML), the phases shaded."""
    series = [(r, s) for r in run.ranks if (s := r.get("telemetry_series")) and s.get("t")]
    if not series:
        return None
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for i, (r, s) in enumerate(series):
        colour = f"C{i % 10}"
        mhz = [x / 1e6 if x is not None else float("nan") for x in s["sm_hz"]]
        watts = [x if x is not None else float("nan") for x in s["power_w"]]
        top.plot(s["t"], mhz, "-", color=colour, linewidth=1, label=plain(f"rank {r.get('rank')} {r.get('device')}"))
        bottom.plot(s["t"], watts, "-", color=colour, linewidth=1)
    for j, phase in enumerate(PHASES):
        bounds = (series[0][1].get("phases") or {}).get(phase)
        if bounds:
            for ax in (top, bottom):
                ax.axvspan(bounds[0], bounds[1], color=f"C{j + 5}", alpha=0.08, linewidth=0)
            top.annotate(PHASE_TITLES[phase], ((bounds[0] + bounds[1]) / 2, 1.0), xycoords=("data", "axes fraction"),
                         ha="center", va="bottom", fontsize=7)
    top.set_ylabel("SM clock, MHz")
    bottom.set_ylabel("power, W (1 s average)")
    bottom.set_xlabel("seconds since the first phase started")
    top.legend(fontsize=7, loc="lower left")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    return png(plt, fig)


def images(run: OverlapRun) -> dict[str, bytes]:
    out = {}
    for name, fn in zip(_IMAGES, (plot_rates, plot_timeline, plot_clocks), strict=True):
        img = fn(run)
        if img:
            out[name] = img
    return out


def _title(run: OverlapRun) -> str:
    return f"mgpu-bench overlap: {run.ranks_text}, compute and communication together"


def _cpu(run: OverlapRun, environment: Mapping) -> str | None:
    return None if run.on_gpu else html_page.ran_on_cpu(environment, len(run.ranks) or None)


def markdown(run: OverlapRun, environment: Mapping) -> str:
    md = html_page.md
    lines_ = [f"# {_title(run)}", "", html_page.environment_markdown(environment, cpu=_cpu(run, environment)), ""]
    lines_ += [f"- **{f.severity.upper()}** {md(f.text)}" for f in findings(run)]
    headers, body = rows(run)
    lines_ += ["", *html_page.md_table(headers, body)]
    if run.on_gpu or len(run.ranks) > 1:
        headers, body = rank_rows(run)
        lines_ += ["", *html_page.md_table(headers, body)]
    lines_ += ["", *(f"- {md(x)}" for x in lines(run))]
    if run.notes:
        lines_ += ["", "Notes:", *(f"- {md(n)}" for n in run.notes)]
    return "\n".join(lines_) + "\n"


def _tables(run: OverlapRun) -> str:
    headers, body = rows(run)
    out = html_page.wide(html_page.table(headers, body, left=(0, 1, 6)))
    if run.on_gpu or len(run.ranks) > 1:
        headers, body = rank_rows(run)
        out += html_page.wide(html_page.table(headers, body, left=(1,)))
    return out + html_page.ul(lines(run))


def page(run: OverlapRun, pngs: Mapping[str, bytes], environment: Mapping) -> str:
    sections = [("alone and together", _tables(run))]
    if pngs:
        sections.append(("plots", html_page.images(pngs, _IMAGES)))
    return html_page.page(_title(run), dict(environment), findings(run), sections, run.notes, run.stop_message,
                          cpu=_cpu(run, environment))


def write_report(run: OverlapRun, out_dir: str | Path, environment: Mapping) -> list[Path]:
    pngs = images(run)
    return html_page.write_bundle(out_dir, pngs, page(run, pngs, environment), markdown(run, environment))


def section(run: OverlapRun, pngs: Mapping[str, bytes]) -> str:
    return _tables(run) + html_page.images(pngs, _IMAGES)
