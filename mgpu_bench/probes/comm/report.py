"""`mgpu-bench comm --report DIR`: busbw-versus-size plots with the theory line and the
practical ring ceiling (PNG), one self-contained HTML page holding them, and a Markdown summary
for a ticket.

The page loads nothing from anywhere: images are embedded as data URIs, styles are inline, and
every string that came from outside (host names, GPU names, environment values, notes) is
escaped. matplotlib is imported here only, with its non-interactive Agg backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain
from mgpu_bench.output.plotting import png as _png
from mgpu_bench.output.plotting import pyplot as _pyplot
from mgpu_bench.results.probe import OK, PROBLEM, SEVERITIES, WARNING, Finding
from mgpu_bench.results.sizes import format_bytes

from .analyse import gbs, judge, key_figure, no_theory_reason, series, summary, theory_dict, theory_for
from .plan import CommRun
from .render import COLUMNS, TUNING_HEADERS, format_cell, row, tuning_rows


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
                       label=f"ring ceiling ({100 * t['practical'] / t['bandwidth']:.0f}%) {t['practical'] / 1e9:.0f} GB/s")
        ax.set_ylim(bottom=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes, nccl-tests' size column)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(plain(f"{op}: {run.nranks} ranks, {run.backend}"))  # the backend is stored text
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    except BaseException:
        plt.close(fig)
        raise
    return _png(plt, fig)


# What the header shows of the environment (html_page.environment_rows leaves out empty ones).
ENV_KEYS = ("host", "nvidia_driver", "cuda_driver", "nccl", "torch_nccl", "torch", "mgpu_bench")


def _cpu(run: CommRun, environment: dict) -> str | None:
    """The plain sentence for a sweep over CPU processes (gloo); None on GPUs."""
    return html_page.ran_on_cpu(environment, run.nranks, "gloo") if run.backend == "torch-gloo" else None


def status(run: CommRun) -> tuple[str, str]:
    """(severity, one line): complete, or where it stopped; wrong elements make it a problem."""
    world = {(m.spec.op, m.spec.size, m.spec.inplace) for m in run.measurements if m.spec.scope == "world"}
    planned = f" of {len(run.requests)} planned" if run.requests else ""
    ops = list(dict.fromkeys(m.spec.op for m in run.measurements))
    done = (f"{len(world)}{planned} size(s) and placement(s) measured ({len(run.measurements)} measurement(s)"
            f"{': ' + ', '.join(ops) if ops else ''}), {run.total_wrong} wrong element(s), "
            f"{run.wall_seconds:.1f} s wall")
    if run.stopped:
        return PROBLEM, f"stopped early ({run.stopped}): {run.stop_message or 'no reason given'}; {done}"
    return (PROBLEM if run.total_wrong else OK), f"complete: {done}"


def headline_rows(run: CommRun) -> tuple[list[str], list[list[str]]]:
    """Per op (and communicator under a launcher): the peak busbw with its size and placement,
    the theory of its path and the share of it, busbw at the largest size, wrong elements."""
    headers = ["op", "peak busbw", "at size", "placement", "theory", "% of theory", "busbw at largest size",
               "wrong elements"]
    rows = []
    for sr in series(run):
        peak = max(sr.measurements, key=lambda m: m.busbw)
        largest = max(sr.measurements, key=lambda m: (m.spec.bytes, not m.spec.inplace))
        bw = (theory_dict(theory_for(run, peak)) or {}).get("bandwidth")
        rows.append([sr.title, f"{gbs(peak.busbw)} GB/s", format_bytes(peak.spec.bytes), peak.spec.placement,
                     f"{bw / 1e9:.0f} GB/s" if bw else "-", f"{100 * peak.busbw / bw:.0f}%" if bw else "-",
                     f"{gbs(largest.busbw)} GB/s at {format_bytes(largest.spec.bytes)} ({largest.spec.placement})",
                     str(sum(m.total_wrong for m in sr.measurements))])
    return headers, rows


def verdicts(run: CommRun) -> list[Finding]:
    """What the suite says of the sweep (analyse.judge) and the sweep's own findings (warnings)."""
    return [*judge(run), *(Finding(WARNING, f) for f in run.findings)]


def summary_html(run: CommRun) -> str:
    """The top of the page: the key figure, the status, the headline per op with the theory,
    and the findings by severity."""
    e = html_page.esc
    fs = verdicts(run)
    worst = next((s for s in SEVERITIES if any(f.severity == s for f in fs)), "")
    fig, expected = key_figure(run)
    parts = [f"<div class='{f'verdict {worst}'.strip()}'><b>{e(fig)}</b>: {e(expected)}</div>"
             if run.measurements else ""]
    sev, line = status(run)
    parts.append(f"<ul class=findings><li class={sev}><span class=tag>STATUS</span>{e(line)}</li></ul>")
    headers, rows = headline_rows(run)
    if rows:
        parts.append("<h2>summary: peak busbw per op</h2>" + html_page.wide(html_page.table(headers, rows, left=(0, 3, 6))))
    t = _theory(run)
    if t and t.get("summary"):
        parts.append(f"<p><b>theory</b>: {e(t['summary'])}</p>")
    else:
        parts.append(f"<p class=sub>{e(no_theory_reason(run) or '')}.</p>")
    counts = {s: sum(f.severity == s for f in fs) for s in SEVERITIES}
    parts.append(f"<h2>findings: {counts[PROBLEM]} problem(s), {counts[WARNING]} warning(s), {counts[OK]} ok</h2>")
    parts.append(html_page.findings_list(fs) or "<p class=sub>none</p>")
    return "".join(parts)


def markdown(run: CommRun, environment: dict, tuning: dict | None = None) -> str:
    md = html_page.md  # outside text: one line, table pipes escaped
    lines = [f"# mgpu-bench comm: {run.nranks} ranks ({md(run.backend)})", "",
             html_page.environment_markdown(environment, ENV_KEYS, _cpu(run, environment))]
    lines.append(f"- status: {md(status(run)[1])}")
    t = _theory(run)
    if t:
        lines.append(f"- theory: {md(t['summary'])}")
    elif no_theory_reason(run):
        lines.append(f"- {md(no_theory_reason(run))}")
    for f in verdicts(run):
        lines.append(f"- {f.severity}: {md(f.text)}")
    lines += ["", "| op | placement | busbw at largest size | mean busbw >= 64 MiB | % of theory | wrong |",
              "|---|---|---|---|---|---|"]
    for s in summary(run):
        mean = f"{gbs(s['mean_busbw_large'])} GB/s" if s["mean_busbw_large"] is not None else "n/a"
        st = theory_dict((run.scope_theory or {}).get(s["scope"], run.theory)
                                if s["scope"] != "world" else run.theory)
        pct = f"{100 * s['busbw_at_largest'] / st['bandwidth']:.0f}%" if st and st.get("bandwidth") else "n/a"
        what = s["op"] if s["scope"] == "world" else f"{s['op']} {s['scope']} {md(s['group'])}"
        lines.append(f"| {what} | {s['placement']} | {gbs(s['busbw_at_largest'])} GB/s at "
                     f"{format_bytes(s['largest_bytes'])} | {mean} | {pct} | {s['wrong']} |")
    if tuning:
        rows, paste = tuning_rows(tuning)
        lines += ["", "## NCCL settings (comm --tune)", "", *html_page.md_table(TUNING_HEADERS, rows), "", "```",
                  *paste, "```"]
    return "\n".join(lines) + "\n"


def _series_table(run: CommRun, sr) -> str:
    e = html_page.esc
    out = ["<table><tr>" + "".join(f"<th>{e(c.title)}<br>{e(c.unit)}</th>" for c in COLUMNS) + "</tr>"]
    for m in sr.measurements:
        r = row(m, theory_for(run, m))
        out.append("<tr>" + "".join(f"<td>{e(format_cell(c, r[c.key]))}</td>" for c in COLUMNS) + "</tr>")
    out.append("</table>")
    return html_page.wide("".join(out))


def page(run: CommRun, environment: dict, images: dict[str, bytes], tuning: dict | None = None) -> str:
    """The summary first (summary_html), the environment, then per op its plot and tables, and
    for `comm --tune` the settings per size band with the lines to paste."""
    e = html_page.esc
    all_series = series(run)
    sections = []
    for key, png in images.items():
        op = key.removeprefix("busbw_")
        parts = [html_page.image(f"busbw of {op}", png)]
        for sr in (x for x in all_series if x.op == op):
            parts.append(("" if sr.scope == "world" else f"<h3>{e(sr.title)}</h3>") + _series_table(run, sr))
        sections.append((op, "".join(parts)))
    if tuning:
        rows, paste = tuning_rows(tuning)
        sections.append(("NCCL settings (comm --tune)", html_page.wide(html_page.table(TUNING_HEADERS, rows, left=(0, 1, 4, 9)))
                         + "<pre>" + e("\n".join(paste)) + "</pre>"))
    return html_page.page(f"mgpu-bench comm: {run.nranks} ranks ({run.backend})", environment, [], sections,
                          run.notes, summary=summary_html(run), keys=ENV_KEYS,
                          cpu=_cpu(run, environment))


def write_report(run: CommRun, out_dir: str | Path, environment: dict, doc: Mapping | None = None) -> list[Path]:
    """Writes busbw_<op>.png per op, report.html and summary.md into out_dir (created if its
    parent exists); returns the paths. `doc`: the result document, whose tuning a `comm --tune`
    run's page shows."""
    tuning = (doc or {}).get("tuning")
    pngs = images(run)
    return html_page.write_bundle(out_dir, pngs, page(run, environment, pngs, tuning),
                                  markdown(run, environment, tuning))


def images(run: CommRun) -> dict[str, bytes]:
    """busbw_<op> per op, in run order."""
    return {f"busbw_{op}": plot_op(run, op) for op in dict.fromkeys(m.spec.op for m in run.measurements)}


def section(run: CommRun, pngs: dict[str, bytes]) -> str:
    """The sweep's part of the suite page: ranks, theory, transports, plots, summary per op."""
    e = html_page.esc
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
        mean = "-" if s["mean_busbw_large"] is None else gbs(s["mean_busbw_large"])
        rows.append([s["op"], s["placement"], format_bytes(s["largest_bytes"]), gbs(s["busbw_at_largest"]),
                     mean, pct, s["wrong"]])
    if rows:
        parts.append(html_page.table(["op", "placement", "largest size", "busbw GB/s", "mean busbw >= 64 MiB GB/s",
                                      "% of theory", "wrong"], rows, left=(0, 1)))
    return "".join(parts)
