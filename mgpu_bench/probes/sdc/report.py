"""`mgpu-bench sdc --report DIR`: the GEMM and HBM-check throughput per GPU over the repetitions
(a burn-in shows a GPU slowing as it heats), a self-contained HTML page with the verdict per GPU,
every located difference and the pinned algorithm, and a Markdown summary for a ticket.

Data stay in base units (FLOP/s, bytes/s, bytes); TFLOP/s, GB/s and GiB are chosen here.
"""

from __future__ import annotations

from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain as _mpl
from mgpu_bench.output.plotting import png as _png
from mgpu_bench.output.plotting import pyplot as _pyplot

from .analyse import judge
from .render import algo_text, rows
from .result import SdcRun, shape_text

HEADERS = ["GPU", "model", "verdict", "GEMMs", "GEMM hash", "TFLOP/s", "HBM GiB", "HBM GB/s", "HBM wrong words",
           "allreduce wrong elements", "wrong checks"]


def _fmt(v: float | None, scale: float, fmt: str) -> str:
    return "-" if v is None else format(v / scale, fmt)


def gpu_rows(run: SdcRun) -> list[list[object]]:
    return [[r["gpu"], r["gpu_name"] or "-", ", ".join(r["issues"].split(";")) if r["issues"] else "ok", r["gemms"],
             r["gemm_hash"] or "-", _fmt(r["gemm_flops_per_s"], 1e12, ".1f"), _fmt(r["hbm_bytes"], 2**30, ".2f"),
             _fmt(r["hbm_bytes_per_s"], 1e9, ".0f"), r["hbm_wrong_words"],
             r["collective_wrong_elements"] if r["collectives"] else "-", f"{r['wrong_checks']} of {r['checks']}"]
            for r in rows(run)]


def difference_rows(run: SdcRun) -> list[list[object]]:
    """Every located difference: GPU, work, repetition, where, the two values, against what."""
    out: list[list[object]] = []
    for d in run.peer_differences:
        f = d.get("first") or {}
        out.append([d["gpu"], d.get("work", "gemm"), 1, f.get("where", "-"), f.get("got") or "-", f.get("want") or "-",
                    f.get("against", f"GPU {d['against']}")])
    for c in run.checks:
        if c.wrong and c.first:
            f = c.first
            out.append([c.gpu, c.work, c.repetition, f.get("where", "-"), f.get("got") or "-", f.get("want") or "-",
                        f.get("against", "-")])
    return out


def plot_throughput(run: SdcRun) -> bytes | None:
    """PNG: per GPU, GEMM TFLOP/s and HBM-check GB/s (written plus read) per repetition; None
    with fewer than two repetitions."""
    if run.repetitions < 2:
        return None
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9.0, 5.6), dpi=110, sharex=True)
    flops = run.config.gemm_flops
    for i, d in enumerate(run.devices):
        g, colour = d["index"], f"C{i % 10}"
        gemm = [(c.repetition, c.count * flops / c.seconds / 1e12) for c in run.checks_of(g, "gemm") if c.seconds > 0]
        hbm = [(c.repetition, 2 * c.bytes / c.seconds / 1e9) for c in run.checks_of(g, "hbm") if c.seconds > 0]
        if gemm:
            top.plot(*zip(*gemm, strict=True), "-o", color=colour, markersize=2, linewidth=1, label=f"GPU {g}")
        if hbm:
            bottom.plot(*zip(*hbm, strict=True), "-o", color=colour, markersize=2, linewidth=1, label=f"GPU {g}")
    top.set_ylabel("GEMM TFLOP/s")
    top.set_title(_mpl(f"{run.config.dtype} GEMM {shape_text(run.config.shape)} and HBM check per repetition"),
                  fontsize=10)
    bottom.set_ylabel("HBM check GB/s\n(written + read)")
    bottom.set_xlabel("repetition")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _png(plt, fig)


def images(run: SdcRun) -> dict[str, bytes]:
    png = plot_throughput(run)
    return {"throughput": png} if png else {}


def _tables(run: SdcRun) -> list[tuple[str, str]]:
    out = [("GPUs", html_page.wide(html_page.table(HEADERS, gpu_rows(run), left=(1, 2, 4))))]
    diffs = difference_rows(run)
    if diffs:
        out.append(("first differing elements", html_page.table(
            ["GPU", "work", "repetition", "where", "here", "there", "against"], diffs, left=(1, 3, 4, 5, 6))))
    if run.algo:
        text = f"chosen on GPU {run.algo.get('chosen_on')}: {algo_text(run.algo)}"
        out.append(("pinned cuBLASLt algorithm", f"<p class=mono>{html_page.esc(text)}</p>"))
    return out


def page(run: SdcRun, environment: dict, imgs: dict[str, bytes]) -> str:
    sections = [(name, html_page.image(name, png)) for name, png in imgs.items()] + _tables(run)
    return html_page.page("mgpu-bench sdc", environment, judge(run), sections, run.notes,
                          run.stop_message if run.stopped else None)


def markdown(run: SdcRun, environment: dict) -> str:
    md = html_page.md
    lines = ["# mgpu-bench sdc", "", html_page.environment_markdown(environment), ""]
    lines += [f"- {f.severity}: {md(f.text)}" for f in judge(run)]
    lines += ["", *html_page.md_table(HEADERS, gpu_rows(run))]
    diffs = difference_rows(run)
    if diffs:
        lines += ["", *html_page.md_table(["GPU", "work", "repetition", "where", "here", "there", "against"], diffs)]
    if run.algo:
        text = f"Pinned cuBLASLt algorithm (chosen on GPU {run.algo.get('chosen_on')}): {algo_text(run.algo)}"
        lines += ["", md(text)]
    if run.stopped:
        lines += ["", f"Stopped early: {md(run.stop_message)}"]
    return "\n".join(lines) + "\n"


def write_report(run: SdcRun, out_dir: str | Path, environment: dict) -> list[Path]:
    imgs = images(run)
    return html_page.write_bundle(out_dir, imgs, page(run, environment, imgs), markdown(run, environment))


def section(run: SdcRun, pngs: dict[str, bytes]) -> str:
    """The run's part of the suite page: the plot, the GPU table, the located differences."""
    parts = [html_page.images(pngs)]
    parts += [f"<p><b>{name}</b></p>{content}" for name, content in _tables(run)]
    return "".join(parts)
