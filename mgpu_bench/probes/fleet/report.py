"""`mgpu-bench fleet --report DIR`: the ranked node table, the suspects, the link pass as a node x
node heatmap of pair busbw (PNG), one self-contained HTML page and a Markdown summary."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain, png, pyplot

from .analyse import UNITS, fmt, node_table
from .analyse import pct as _pct


def plot_pairs(doc: Mapping) -> bytes | None:
    """Node x node: the pair allreduce busbw of every pairing measured (blank where none)."""
    pairs = [p for p in doc.get("pairings") or [] if (p.get("allreduce") or {}).get("busbw")]
    nodes = [n for n in doc.get("nodes") or [] if n.get("answered", True)]
    if not pairs or len(nodes) < 2:
        return None
    import numpy as np

    plt = pyplot()
    n = len(nodes)
    grid = np.full((n, n), np.nan)
    at = {x["index"]: i for i, x in enumerate(nodes)}  # node index -> its row: only the nodes that answered
    unit, scale = UNITS["allreduce"]
    if max(p["allreduce"]["busbw"] for p in pairs) < scale:  # CPU processes: MB/s, as the tables (analyse.fmt)
        unit, scale = unit.replace("GB", "MB"), scale / 1e3
    for p in pairs:
        if p["a"] in at and p["b"] in at:  # a node lost after its first pairings has no row
            grid[at[p["a"]], at[p["b"]]] = grid[at[p["b"]], at[p["a"]]] = p["allreduce"]["busbw"] / scale
    fig, ax = plt.subplots(figsize=(1.5 + 0.35 * n, 1.2 + 0.3 * n), dpi=100)
    im = ax.imshow(grid, cmap="viridis")
    labels = [plain(x["node"]) for x in nodes]
    ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(n), labels, fontsize=7)
    ax.set_title(f"pair allreduce busbw ({unit}) of the link pass", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return png(plt, fig)


def images(doc: Mapping) -> dict[str, bytes]:
    out = {}
    p = plot_pairs(doc)
    if p:
        out["pairs"] = p
    return out


def _table(doc: Mapping) -> tuple[list[str], list[list[object]]]:
    rows = node_table(doc, doc.get("verdicts") or {"suspects": [], "stats": {"gpu": {}}})
    return (["node", "model", "of median", "deciding figure", "verdict"],
            [[r["node"], r["model"] or "-", _pct(r["ratio"]), r["deciding"], r["verdict"]] for r in rows])


def markdown(doc: Mapping) -> str:
    md = html_page.md
    env = doc.get("environment") or {}
    v = doc.get("verdicts") or {}
    names = {n["index"]: n["node"] for n in doc.get("nodes") or []}
    lines = [f"# mgpu-bench fleet: {len(doc.get('nodes') or [])} nodes", "",
             f"- from {md(env.get('host'))}; NCCL {md(env.get('nccl'))}; torch {md(env.get('torch'))}",
             f"- to drain: {md(', '.join(names[i] for i in v.get('drain') or []) or 'none')}", ""]
    lines += [f"- **{s['severity'].upper()}** {md(s['text'])}" for s in v.get("suspects") or []]
    headers, rows = _table(doc)
    lines += ["", *html_page.md_table(headers, rows)]
    w = v.get("world") or {}
    if w.get("busbw"):
        lines += ["", f"world allreduce {fmt('world', w['busbw'])}, two nodes {fmt('world', w.get('reference'))}"]
    return "\n".join(lines) + "\n"


def page(doc: Mapping, pngs: dict[str, bytes]) -> str:
    v = doc.get("verdicts") or {}
    headers, rows = _table(doc)
    sections = [("nodes, worst first", html_page.table(headers, rows, left=(0, 1, 3, 4)))]
    if pngs:
        sections.append(("link pass", html_page.images(pngs)))
    return html_page.page(f"mgpu-bench fleet: {len(doc.get('nodes') or [])} nodes", doc.get("environment") or {},
                          [s["text"] for s in v.get("suspects") or []], sections, doc.get("notes") or [],
                          (doc.get("status") or {}).get("message"))


def write_report(doc: Mapping, out_dir: str | Path) -> list[Path]:
    pngs = images(doc)
    return html_page.write_bundle(out_dir, pngs, page(doc, pngs), markdown(doc))


def section(doc: Mapping, pngs: dict[str, bytes]) -> str:
    headers, rows = _table(doc)
    return html_page.table(headers, rows, left=(0, 1, 3, 4)) + html_page.images(pngs)
