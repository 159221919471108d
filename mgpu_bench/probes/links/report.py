"""`mgpu-bench links --report DIR`: GPU x GPU heatmaps of copy bandwidth (PNG); the suite section."""

from __future__ import annotations

import statistics

from mgpu_bench.output import html_page
from mgpu_bench.results.sizes import format_gbs

from .result import ENGINES, LinksRun


def heatmap_png(run: LinksRun, engine: str, bidirectional: bool) -> bytes | None:
    """A GPU x GPU heatmap (rows source, columns destination) of GB/s per direction."""
    copies = run.copies(engine, bidirectional)
    if not copies:
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    g = run.gpus
    grid = np.full((len(g), len(g)), np.nan)
    for (a, b), m in copies.items():
        grid[g.index(a), g.index(b)] = m.bandwidth / 1e9
    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * len(g), 1.0 + 0.6 * len(g)), dpi=110)
    try:
        im = ax.imshow(grid, cmap="viridis")
        ax.set_xticks(range(len(g)), [f"GPU {x}" for x in g], rotation=45)
        ax.set_yticks(range(len(g)), [f"GPU {x}" for x in g])
        ax.set_xlabel("destination")
        ax.set_ylabel("source")
        mid = (np.nanmin(grid) + np.nanmax(grid)) / 2
        for i in range(len(g)):
            for j in range(len(g)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7,
                            color="k" if grid[i, j] > mid else "w")
        what = "both directions at once" if bidirectional else "one direction"
        ax.set_title(f"{'copy engine' if engine == 'ce' else 'SM kernel'}, {what}, GB/s", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def write_report(run: LinksRun, out_dir) -> list:
    """links_<engine>_<uni|bi>.png heatmaps into out_dir (created if its parent exists)."""
    from pathlib import Path

    from mgpu_bench.core.paths import write_output
    from mgpu_bench.results.schema import file_stem

    out = Path(out_dir)
    out.mkdir(exist_ok=True)
    written = []
    for name, png in images(run).items():
        p = out / f"{file_stem(name)}.png"
        write_output(p, png)
        written.append(p)
    return written


def images(run: LinksRun) -> dict[str, bytes]:
    """links_<engine>_<uni|bi> heatmaps where those copies ran."""
    out = {}
    for engine in ENGINES:
        for bidir in (False, True):
            png = heatmap_png(run, engine, bidir)
            if png:
                out[f"links_{engine}_{'bi' if bidir else 'uni'}"] = png
    return out


def section(run: LinksRun, pngs: dict[str, bytes], hops: dict | None = None) -> str:
    """The run's part of the suite page: the link theory (the run's hops unless given), heatmaps,
    latency, host copies."""
    hops = run.hops if hops is None else hops
    parts = []
    details = sorted({h.detail for h in hops.values()})
    if details:
        bws = sorted({h.bandwidth for h in hops.values() if h.bandwidth})
        parts.append(f"<p>link theory: {html_page.esc('; '.join(details))}"
                     + (f", {bws[0] / 1e9:.0f} GB/s per direction" if len(bws) == 1 else "") + "</p>")
    parts.append(html_page.images(pngs, grid=True))
    lat = run.latencies()
    if lat:
        us = sorted(m.median_s * 1e6 for m in lat.values())
        parts.append(f"<p>dependent 4-byte read of a peer's memory: median {statistics.median(us):.2f} us "
                     f"(range {us[0]:.2f}-{us[-1]:.2f}) over {len(us)} pairs</p>")
    h2d, d2h = run.host("h2d"), run.host("d2h")
    if h2d or d2h:
        parts.append(html_page.table(["GPU", "host -> GPU GB/s", "GPU -> host GB/s"],
                                     [[g, format_gbs(h2d[g].bandwidth) if g in h2d else "-",
                                       format_gbs(d2h[g].bandwidth) if g in d2h else "-"] for g in run.gpus]))
    return "".join(parts)
