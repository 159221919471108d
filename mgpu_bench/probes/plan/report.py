"""`mgpu-bench plan --report DIR`: the projected scaling curve beside the measured points (PNG),
a self-contained HTML page and a Markdown summary, and a section for a suite-style page. As in the
other reports: matplotlib imported lazily (Agg), outside strings escaped, the table rows the same
ones the terminal prints (render.figure_rows, render.curve_rows)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain, png, pyplot

from .analyse import findings
from .render import GOODPUT_CAPTION, curve_rows, figure_rows, goodput_rows, title

_IMAGES = ("scaling",)


def plot_scaling(doc: Mapping) -> bytes | None:
    """Throughput per GPU against the GPU count (log x): the projection with its range shaded, the
    measured configurations as points, and the ideal (the one-GPU figure held) dotted."""
    curve = doc.get("curve") or []
    if not curve:
        return None
    unit = "tokens/s" if (doc.get("workload") or {}).get("tokens_per_sample") else "samples/s"
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    n = [p["gpus"] for p in curve]
    ax.plot(n, [p["rate_per_gpu"] for p in curve], "-", color="tab:blue", label="projected (central)")
    # each point's samples or tokens per GPU per step (a fixed global batch gives each GPU count its own)
    ax.fill_between(n, [p["rate_per_gpu"] * p["step_s"] / p["high_s"] for p in curve],
                    [p["rate_per_gpu"] * p["step_s"] / max(p["low_s"], 1e-12) for p in curve],
                    color="tab:blue", alpha=0.15, linewidth=0, label="range")
    measured = [p for p in doc.get("measured_points") or []] + [p for p in curve if p["gpus"] == 1 and p["measured"]]
    if measured:
        ax.plot([p["gpus"] for p in measured], [p["rate_per_gpu"] for p in measured], "o", color="tab:orange",
                label="measured (" + ", ".join(sorted({plain(p["measured"]) for p in measured if p["measured"]})) + ")")
    if all(p.get("stat_efficiency") is not None for p in curve):  # --noise-scale: what each GPU's rate is worth
        ax.plot(n, [p["rate_per_gpu"] * p["stat_efficiency"] for p in curve], "--", color="tab:green",
                label="goodput per GPU (x statistical efficiency, Pollux)")
    ax.axhline(curve[0]["rate_per_gpu"] / max(curve[0]["efficiency"], 1e-12), color="grey", linestyle=":",
               linewidth=1, label="one GPU's rate (ideal scaling)")
    gpn = (doc.get("device") or {}).get("gpus_per_node")
    if gpn and n[-1] > gpn:
        ax.axvline(gpn, color="grey", linewidth=0.8, linestyle="--")
        ax.annotate(" one node", (gpn, 0.02), xycoords=("data", "axes fraction"), fontsize=7, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [str(x) for x in n], fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.set_ylabel(f"{unit} per GPU")
    ax.set_ylim(bottom=0)
    ax.set_title(plain(title(doc)), fontsize=8)
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(True, alpha=0.3)
    return png(plt, fig)


def images(doc: Mapping) -> dict[str, bytes]:
    img = plot_scaling(doc)
    return {"scaling": img} if img else {}


def _missing(doc: Mapping) -> list[str]:
    return [f"{m['what']}: " + (f"`{m['command']}`" if m.get("command") else m.get("why") or "")
            for m in doc.get("missing") or []]


def _tables(doc: Mapping) -> str:
    out = ""
    for headers, rows in (figure_rows(doc), curve_rows(doc)):
        if rows:
            out += html_page.wide(html_page.table(headers, rows, left=(0, 2) if headers[0] == "figure" else (7,)))
    headers, rows = goodput_rows(doc)
    if rows:
        out += f"<h3>{html_page.esc(GOODPUT_CAPTION)}</h3>" + html_page.wide(html_page.table(headers, rows))
    if doc.get("missing"):
        out += "<h3>missing</h3>" + html_page.ul(_missing(doc))
    return out


def markdown(doc: Mapping, environment: Mapping) -> str:
    md = html_page.md
    lines = [f"# {md(title(doc))}", "", html_page.environment_markdown(environment), ""]
    lines += [f"- **{f.severity.upper()}** {md(f.text)}" for f in findings(doc)]
    for headers, rows in (figure_rows(doc), curve_rows(doc)):
        if rows:
            lines += ["", *html_page.md_table(headers, rows)]
    headers, rows = goodput_rows(doc)
    if rows:
        lines += ["", md(GOODPUT_CAPTION) + ":", "", *html_page.md_table(headers, rows)]
    if doc.get("notes"):
        lines += ["", "Notes:", *(f"- {md(n)}" for n in doc["notes"])]
    return "\n".join(lines) + "\n"


def page(doc: Mapping, pngs: Mapping[str, bytes], environment: Mapping) -> str:
    sections = [("figures and the curve", _tables(doc))]
    if pngs:
        sections.append(("scaling", html_page.images(pngs, _IMAGES)))
    stopped = (doc.get("status") or {}).get("message")
    return html_page.page(title(doc), dict(environment), findings(doc), sections, doc.get("notes") or [], stopped)


def write_report(doc: Mapping, out_dir: str | Path, environment: Mapping) -> list[Path]:
    pngs = images(doc)
    return html_page.write_bundle(out_dir, pngs, page(doc, pngs, environment), markdown(doc, environment))


def section(doc: Mapping, pngs: Mapping[str, bytes]) -> str:
    return _tables(doc) + html_page.images(pngs, _IMAGES)
