"""`mgpu-bench memory --report DIR`: PNGs (free memory against the largest block per allocator
and pattern; HBM bandwidth against the datasheet; reserved against allocated over the PyTorch
workload), a self-contained HTML page and a Markdown summary."""

from __future__ import annotations

from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain
from mgpu_bench.output.plotting import png as _png
from mgpu_bench.output.plotting import pyplot as _pyplot

from .analyse import findings, sample_size
from .measure import HBM_LABELS, MemoryRun


def plot_churn(run: MemoryRun, gpu: int) -> bytes | None:
    rs = [r for r in run.churn if r.gpu == gpu]
    if not rs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rs) + 2), 4.2))
    xs = range(len(rs))
    ax.bar([x - 0.2 for x in xs], [r.free / 2**30 for r in rs], width=0.4, label="free after the pattern")
    ax.bar([x + 0.2 for x in xs], [r.largest / 2**30 for r in rs], width=0.4, label="largest block allocated")
    for x, r in zip(xs, rs, strict=True):
        if r.fragmentation is not None:
            ax.annotate(f"{100 * r.fragmentation:.0f}%", (x + 0.2, r.largest / 2**30), ha="center", va="bottom",
                        fontsize=7)
    ax.set_xticks(list(xs), [plain(f"{r.allocator}\n{r.pattern}") for r in rs], fontsize=7)
    ax.set_ylabel("GiB")
    ax.set_title(f"GPU {gpu}: free memory against the largest allocatable block (label: fragmentation)",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return _png(plt, fig)


def plot_hbm(run: MemoryRun) -> bytes | None:
    if not run.hbm:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [plain(f"GPU {h.gpu}\n{h.kind}") for h in run.hbm]
    ax.bar(range(len(run.hbm)), [h.bandwidth / 1e12 for h in run.hbm], color="tab:blue")
    for peak in sorted({h.peak for h in run.hbm if h.peak}):
        ax.axhline(peak / 1e12, color="black", linestyle=":", label=f"datasheet {peak / 1e12:.2f} TB/s")
    ax.set_xticks(range(len(run.hbm)), labels, fontsize=7)
    ax.set_ylabel("TB/s (bytes read + written)")
    ax.set_title("HBM bandwidth", fontsize=9)
    if any(h.peak for h in run.hbm):
        ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return _png(plt, fig)


def plot_torch(run: MemoryRun) -> bytes | None:
    series = {s: (d.get("step_reserved_bytes"), d.get("step_allocated_bytes")) for s, d in run.torch.items()
              if d.get("step_reserved_bytes")}
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (setting, (reserved, allocated)) in enumerate(series.items()):
        colour = f"C{i}"
        xs = list(range(1, len(reserved) + 1))
        ax.plot(xs, [(v or 0) / 2**30 for v in reserved], "-", color=colour, label=f"{setting}: reserved")
        ax.plot(xs, [(v or 0) / 2**30 for v in allocated or []], "--", color=colour,
                label=f"{setting}: allocated")
    ax.set_xlabel("training step (sequence length varies per step)")
    ax.set_ylabel("GiB")
    ax.set_title("PyTorch caching allocator: reserved against allocated after each step", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, alpha=0.3)
    return _png(plt, fig)


def images(run: MemoryRun) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for gpu in dict.fromkeys(r.gpu for r in run.churn):
        png = plot_churn(run, gpu)
        if png:
            out[f"churn_gpu{gpu}"] = png
    for name, fn in (("hbm", plot_hbm), ("torch_allocator", plot_torch)):
        png = fn(run)
        if png:
            out[name] = png
    return out


# The tables of the memory report (headers, rows), shared with the suite report.
def churn_rows(run: MemoryRun) -> tuple[list[str], list[list[object]]]:
    headers = ["GPU", "allocator", "pattern", "free GiB", "largest GiB", "fragmentation %", "search s"]
    rows = [[r.gpu, r.allocator, r.pattern, f"{r.free / 2**30:.2f}", f"{r.largest / 2**30:.2f}",
             "-" if r.fragmentation is None else f"{100 * r.fragmentation:.1f}", f"{r.raw['search_seconds']:.2f}"]
            for r in run.churn]
    return headers, rows


def hbm_rows(run: MemoryRun) -> tuple[list[str], list[list[object]]]:
    headers = ["GPU", "kernel", "TB/s", "% of datasheet"]
    rows = [[h.gpu, HBM_LABELS[h.kind], f"{h.bandwidth / 1e12:.2f}",
             "-" if h.pct_peak is None else f"{h.pct_peak:.1f}"] for h in run.hbm]
    return headers, rows


def markdown(run: MemoryRun, environment: dict) -> str:
    md = html_page.md
    gpus = ", ".join(md(g.get("name")) for g in environment.get("gpus", []) if isinstance(g, dict))
    driver = (f"- driver: {md(environment.get('nvidia_driver'))}, CUDA {md(environment.get('cuda_driver'))}, "
              f"torch {md(environment.get('torch'))}")
    lines = ["# mgpu-bench memory", "", f"- host: {md(environment.get('host'))}", driver, f"- GPUs: {gpus}", ""]
    lines += [f"- finding: {md(f.text)}" for f in findings(run)]
    for headers, rows in (churn_rows(run), hbm_rows(run)):
        if rows:
            lines += ["", *html_page.md_table(headers, rows)]
    for mb in run.max_batch:
        if not mb.get("error"):
            lines.append(f"\n- max batch {md(mb['model'])} {sample_size(mb)}, checkpointing "
                         f"{'on' if mb['checkpointing'] else 'off'}: {mb.get('max_batch')}")
    if run.stopped:
        lines += ["", f"Stopped early: {md(run.stop_message)}"]
    return "\n".join(lines) + "\n"


def page(run: MemoryRun, environment: dict, imgs: dict[str, bytes]) -> str:
    sections = []
    for name, png in imgs.items():
        sections.append((name.replace("_", " "), html_page.image(name, png)))
    headers, rows = churn_rows(run)
    if rows:
        sections.append(("allocation churn", html_page.table(headers, rows, left=(1, 2))))
    headers, rows = hbm_rows(run)
    if rows:
        sections.append(("HBM bandwidth", html_page.table(headers, rows, left=(1,))))
    return html_page.page("mgpu-bench memory", environment, [f.text for f in findings(run)], sections, run.notes,
                          run.stop_message if run.stopped else None)


def write_report(run: MemoryRun, out_dir: str | Path, environment: dict) -> list[Path]:
    imgs = images(run)
    return html_page.write_bundle(out_dir, imgs, page(run, environment, imgs), markdown(run, environment))


def section(run: MemoryRun, pngs: dict[str, bytes]) -> str:
    """The run's part of the suite page: plots, churn and HBM tables, the max-batch searches."""
    parts = [html_page.images(pngs, grid=True)]
    for (headers, rows), left in ((churn_rows(run), (1, 2)), (hbm_rows(run), (1,))):
        if rows:
            parts.append(html_page.table(headers, rows, left=left))
    if run.max_batch:
        parts.append(html_page.table(
            ["model", "sample", "activation checkpointing", "largest batch per GPU", "first OOM batch", "trials",
             "s", "error"],
            [[m.get("model"), sample_size(m) or "-", "on" if m.get("checkpointing") else "off",
              "-" if m.get("max_batch") is None else m.get("max_batch"),
              "-" if m.get("first_oom_batch") is None else m.get("first_oom_batch"), len(m.get("trials") or []),
              f"{m.get('seconds') or 0:.1f}", m.get("error") or "-"] for m in run.max_batch],
            left=(0, 2, 7)))
    return "".join(parts)
