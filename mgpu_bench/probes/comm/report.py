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
from mgpu_bench.probes.comm import render as report
from mgpu_bench.sizes import format_bytes

from .measure import CommRun


def _theory(run: CommRun) -> dict | None:
    return report.theory_dict(run.theory)


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
    for s in report.summary(run):
        mean = f"{s['mean_busbw_large'] / 1e9:.1f} GB/s" if s["mean_busbw_large"] is not None else "n/a"
        st = report.theory_dict((run.scope_theory or {}).get(s["scope"], run.theory)
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
    cols = report.COLUMNS
    all_series = report.series(run)
    for op, png in images.items():
        body.append(f"<h2>{e(op)}</h2>")
        body.append(f"<img alt='busbw of {e(op)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
        for sr in (x for x in all_series if x.op == op):
            if sr.scope != "world":
                body.append(f"<h3>{e(sr.title)}</h3>")
            body.append("<table><tr>" + "".join(f"<th>{e(c.title)}<br>{e(c.unit)}</th>" for c in cols) + "</tr>")
            for m in sr.measurements:
                r = report.row(m, report.theory_for(run, m))
                body.append("<tr>" + "".join(f"<td>{e(report.format_cell(c, r[c.key]))}</td>" for c in cols)
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
    out = Path(out_dir)
    out.mkdir(exist_ok=True)
    images = {op: plot_op(run, op) for op in dict.fromkeys(m.spec.op for m in run.measurements)}
    written = []
    for op, png in images.items():
        p = out / f"busbw_{op}.png"
        p.write_bytes(png)
        written.append(p)
    (out / "report.html").write_text(page(run, environment, images))
    (out / "summary.md").write_text(markdown(run, environment))
    return written + [out / "report.html", out / "summary.md"]


def run_from_document(doc: dict) -> CommRun:
    """A CommRun rebuilt from a stored result document (theory kept as its dict)."""
    from mgpu_bench.measurement import CommMeasurement

    run = CommRun(backend=doc["backend"], devices=list(doc["devices"]), requests=[],
                  measurements=[CommMeasurement.from_dict(d) for d in doc["measurements"] if d.get("kind") == "comm"],
                  notes=list(doc.get("notes", [])), stopped=doc["status"]["stopped"],
                  stop_message=doc["status"]["message"], wall_seconds=doc.get("wall_seconds", 0.0))
    run.theory = doc.get("theory")
    run.scope_theory = doc.get("scope_theory")
    run.findings = list(doc.get("findings") or [])
    run.transports = doc.get("transports")
    return run
