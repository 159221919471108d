"""`mgpu-bench comm --report DIR`: busbw-versus-size plots with the theory line and the
practical ring ceiling (PNG), one self-contained HTML page holding them, and a Markdown summary
for a ticket.

The page loads nothing from anywhere: images are embedded as data URIs, styles are inline, and
every string that came from outside (host names, GPU names, environment values, notes) is
escaped. matplotlib is imported here only, with its non-interactive Agg backend.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import png as _png
from mgpu_bench.output.plotting import pyplot as _pyplot
from mgpu_bench.sizes import format_bytes, format_gbs

from .analyse import series, summary, theory_dict, theory_for
from .plan import CommRun
from .render import COLUMNS, format_cell, row


def _theory(run: CommRun) -> dict | None:
    return theory_dict(run.theory)


def plot_op(run: CommRun, op: str) -> bytes:
    """PNG of busbw (GB/s) against size (log2 axis) for `op`, one line per placement, with
    the theory and the practical ring ceiling as horizontal lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    try:
        for inplace, style in ((False, "o-"), (True, "s--")):
            ms = sorted((m for m in run.measurements if m.spec.op == op and m.spec.inplace == inplace
                         and m.spec.scope == "world"), key=lambda m: m.spec.bytes)
            if ms:
                ax.plot([m.spec.bytes for m in ms], [m.busbw / 1e9 for m in ms], style,
                        label="in-place" if inplace else "out-of-place", markersize=4)
        for scope, style in (("intra-node", "^-"), ("inter-node", "v-")):
            slowest: dict[int, float] = {}  # bytes -> the slowest communicator's busbw, out-of-place
            groups = set()
            for m in run.measurements:
                if m.spec.op == op and m.spec.scope == scope and not m.spec.inplace:
                    groups.add(m.spec.group)
                    slowest[m.spec.bytes] = min(slowest.get(m.spec.bytes, float("inf")), m.busbw)
            if slowest:
                xs = sorted(slowest)
                ax.plot(xs, [slowest[x] / 1e9 for x in xs], style, markersize=4,
                        label=f"{scope} (slowest of {len(groups)})")
        t = _theory(run)
        if t and t.get("bandwidth"):
            ax.axhline(t["bandwidth"] / 1e9, color="tab:red", linewidth=1,
                       label=f"theory {t['bandwidth'] / 1e9:.0f} GB/s")
            ax.axhline(t["practical"] / 1e9, color="tab:red", linewidth=1, linestyle=":",
                       label=f"ring ceiling (80%) {t['practical'] / 1e9:.0f} GB/s")
        ax.set_ylim(bottom=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes, nccl-tests' size column)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{op}: {run.nranks} ranks, {run.backend}")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    except BaseException:
        plt.close(fig)
        raise
    return _png(plt, fig)


def markdown(run: CommRun, environment: dict) -> str:
    md = html_page.md  # outside text: one line, table pipes escaped
    gpus = ", ".join(md(g.get("name", "?")) for g in environment.get("gpus", []) if "name" in g) or "no GPU"
    facts = (f"- host: {md(environment.get('host'))}; GPUs: {gpus}; driver {md(environment.get('nvidia_driver'))}; "
             f"NCCL {md(environment.get('nccl'))}; torch {md(environment.get('torch'))}")
    lines = [f"# mgpu-bench comm: {run.nranks} ranks ({md(run.backend)})", "", facts]
    t = _theory(run)
    if t:
        lines.append(f"- theory: {md(t['summary'])}")
    for f in run.findings:
        lines.append(f"- finding: {md(f)}")
    lines += ["", "| op | placement | busbw at largest size | mean busbw >= 64 MiB | % of theory | wrong |",
              "|---|---|---|---|---|---|"]
    for s in summary(run):
        mean = f"{s['mean_busbw_large'] / 1e9:.1f} GB/s" if s["mean_busbw_large"] is not None else "n/a"
        st = theory_dict((run.scope_theory or {}).get(s["scope"], run.theory)
                                if s["scope"] != "world" else run.theory)
        pct = f"{100 * s['busbw_at_largest'] / st['bandwidth']:.0f}%" if st and st.get("bandwidth") else "n/a"
        what = s["op"] if s["scope"] == "world" else f"{s['op']} {s['scope']} {md(s['group'])}"
        lines.append(f"| {what} | {s['placement']} | {s['busbw_at_largest'] / 1e9:.1f} GB/s at "
                     f"{format_bytes(s['largest_bytes'])} | {mean} | {pct} | {s['wrong']} |")
    if run.stopped:
        lines += ["", f"Stopped early: {md(run.stop_message)}"]
    return "\n".join(lines) + "\n"


def page(run: CommRun, environment: dict, images: dict[str, bytes]) -> str:
    e = html.escape
    gpus = environment.get("gpus", [])
    head = [f"<h1>mgpu-bench comm: {run.nranks} ranks ({e(run.backend)})</h1>",
            "<table class=kv>"]
    for key in ("host", "nvidia_driver", "cuda_driver", "nccl", "torch", "mgpu_bench"):
        head.append(f"<tr><th>{e(key)}</th><td>{e(str(environment.get(key)))}</td></tr>")
    head.append(f"<tr><th>GPUs</th><td>{e(', '.join(str(g.get('name')) for g in gpus))}</td></tr>")
    env = environment.get("env", {})
    head.append(f"<tr><th>environment</th><td>{e(' '.join(f'{k}={v}' for k, v in env.items()))}</td></tr>")
    head.append("</table>")
    t = _theory(run)
    if t:
        head.append(f"<p><b>theory</b>: {e(t['summary'])}</p>")
    for f in run.findings:
        head.append(f"<p class=finding>finding: {e(f)}</p>")
    if run.stopped:
        head.append(f"<p class=finding>{e(run.stop_message or '')}</p>")
    body = []
    cols = COLUMNS
    all_series = series(run)
    for key, png in images.items():
        op = key.removeprefix("busbw_")
        body.append(f"<h2>{e(op)}</h2>")
        body.append(f"<img alt='busbw of {e(op)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
        for sr in (x for x in all_series if x.op == op):
            if sr.scope != "world":
                body.append(f"<h3>{e(sr.title)}</h3>")
            body.append("<table><tr>" + "".join(f"<th>{e(c.title)}<br>{e(c.unit)}</th>" for c in cols) + "</tr>")
            for m in sr.measurements:
                r = row(m, theory_for(run, m))
                body.append("<tr>" + "".join(f"<td>{e(format_cell(c, r[c.key]))}</td>" for c in cols)
                            + "</tr>")
            body.append("</table>")
    notes = "".join(f"<li>{e(n)}</li>" for n in run.notes)
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             ".kv td,.kv th{text-align:left}.finding{color:#a40}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>mgpu-bench comm</title>"
            f"<style>{style}</style></head><body>{''.join(head)}{''.join(body)}"
            f"{'<h2>notes</h2><ul>' + notes + '</ul>' if notes else ''}</body></html>")


def write_report(run: CommRun, out_dir: str | Path, environment: dict) -> list[Path]:
    """Writes busbw_<op>.png per op, report.html and summary.md into out_dir (created if its
    parent exists); returns the paths."""
    pngs = images(run)
    return html_page.write_bundle(out_dir, pngs, page(run, environment, pngs), markdown(run, environment))


def images(run: CommRun) -> dict[str, bytes]:
    """busbw_<op> per op, in run order."""
    return {f"busbw_{op}": plot_op(run, op) for op in dict.fromkeys(m.spec.op for m in run.measurements)}


def section(run: CommRun, pngs: dict[str, bytes]) -> str:
    """The sweep's part of the suite page: ranks, theory, transports, plots, summary per op."""
    e = html.escape
    t = theory_dict(run.theory) or {}
    theory = t.get("summary") or "none (no GPU topology)"
    parts = [f"<p>{run.nranks} ranks, backend {e(run.backend)}; theory: {e(theory)}</p>"]
    if run.transports:
        words = "; ".join(f"{pair} " + ", ".join(f"{k} x{v}" for k, v in c.items())
                          for pair, c in run.transports.items())
        parts.append(f"<p>NCCL transports (ranks, channels): {e(words)}</p>")
    parts.append(html_page.images(pngs, grid=True))
    rows = []
    for s in summary(run) if run.measurements else []:
        pct = f"{100 * s['busbw_at_largest'] / t['bandwidth']:.0f}" if t.get("bandwidth") else "-"
        mean = "-" if s["mean_busbw_large"] is None else format_gbs(s["mean_busbw_large"])
        rows.append([s["op"], s["placement"], format_bytes(s["largest_bytes"]), format_gbs(s["busbw_at_largest"]),
                     mean, pct, s["wrong"]])
    if rows:
        parts.append(html_page.table(["op", "placement", "largest size", "busbw GB/s", "mean busbw >= 64 MiB GB/s",
                                      "% of theory", "wrong"], rows, left=(0, 1)))
    return "".join(parts)
