"""The plan on the terminal: the figures with their sources, then the step and days per GPU count.
One table model (rows built once, here), printed by rich here and by report.py as HTML/Markdown."""

from __future__ import annotations

from collections.abc import Mapping

from . import text
from .layout import SHARDS


def figure_rows(doc: Mapping) -> tuple[list[str], list[list[str]]]:
    return ["figure", "value", "source"], [[f["name"], text.value(f["value"], f["unit"]), f["source"]]
                                           for f in doc.get("figures") or []]


def curve_rows(doc: Mapping) -> tuple[list[str], list[list[str]]]:
    """Per GPU count: the step and its range, throughput per GPU, efficiency against one GPU, days
    and their range, and whether it was measured (the run) or projected."""
    unit = "tokens/s" if (doc.get("workload") or {}).get("tokens_per_sample") else "samples/s"
    headers = ["GPUs", "step", "range", f"{unit} per GPU", "vs 1 GPU", "days", "range", "from"]
    rows = []
    for p in doc.get("curve") or []:
        rows.append([str(p["gpus"]), text.value(p["step_s"], "s"),
                     text.span(p["low_s"], p["high_s"], p["step_s"], lambda s: text.value(s, "s")),
                     text.rate(p["rate_per_gpu"]), f"{100 * p['efficiency']:.1f}%",
                     text.days(p.get("days")), text.span(p.get("days_low"), p.get("days_high"), p.get("days"),
                                                         text.days),
                     f"measured {p['measured']}" if p.get("measured") else "assumed rate" if p.get("assumed")
                     else "projected"])
    return headers, rows


def goodput_rows(doc: Mapping) -> tuple[list[str], list[list[str]]]:
    """With --noise-scale, per GPU count: the global batch, its statistical efficiency E and E's
    range, the goodput of all the GPUs (throughput x E), the plain days and the days to the same
    training progress (days / E) with their range (estimate/goodput.py)."""
    curve = [p for p in doc.get("curve") or [] if p.get("stat_efficiency") is not None]
    if not curve:
        return [], []
    unit = "tokens/s" if (doc.get("workload") or {}).get("tokens_per_sample") else "samples/s"
    headers = ["GPUs", "global batch", "E", "range", f"goodput {unit}", "days", "same progress", "range"]
    rows = []
    certain = not (doc.get("noise_scale") or {}).get("stderr")
    for p in curve:
        rows.append([str(p["gpus"]), f"{p['global_batch']:,}", f"{p['stat_efficiency']:.3f}",
                     "-" if certain else f"{p['stat_efficiency_low']:.3f} - {p['stat_efficiency_high']:.3f}",
                     text.total_rate(p.get("goodput")), text.days(p.get("days")), text.days(p.get("days_progress")),
                     text.span(p.get("days_progress_low"), p.get("days_progress_high"), p.get("days_progress"),
                               text.days)])
    return headers, rows


GOODPUT_CAPTION = ("goodput per GPU count: E = (B_noise + B_0) / (B_noise + B) of the global batch B (Pollux, Qiao et "
                   "al. OSDI 2021), goodput = all the GPUs' throughput x E, the same progress = days / E")


def title(doc: Mapping) -> str:
    w, cfg, dev = doc.get("workload") or {}, doc.get("config") or {}, doc.get("device") or {}
    budget = doc.get("budget") or {}
    size = f"seq {w['tokens_per_sample']}" if w.get("tokens_per_sample") else ""
    amount = f", {text.count(budget['value'])} {budget['unit']}" if budget.get("value") else ""
    lay = doc.get("layout") or {}
    how = lay.get("text") if lay else str(cfg.get("parallel", "ddp")).upper()
    per = "per GPU" if not lay or lay.get("name") in SHARDS else "micro-batch"
    return (f"plan: {w.get('key')} ({text.value(w.get('params'), 'params')} parameters{', ' + size if size else ''}), "
            f"{how}, batch {doc.get('batch')} {per} on {dev.get('name')}{amount}")


def render_terminal(doc: Mapping, console) -> None:
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    for caption, (headers, rows) in ((title(doc) + ": the figures and where they come from", figure_rows(doc)),
                                     ("step and days per GPU count (range: see --help)", curve_rows(doc)),
                                     (GOODPUT_CAPTION, goodput_rows(doc))):
        if not rows:
            continue
        t = Table(title=caption, title_justify="left", pad_edge=False, box=None, header_style="bold")
        for h in headers:
            t.add_column(h, justify="left" if h in ("figure", "source", "from", "range") else "right")
        for r in rows:
            t.add_row(*r)
        print_table(console, t)
    for m in doc.get("measured_now") or []:
        console.print(f"measured: {m['command']}: {m['status']} in {m['seconds']:.1f} s"
                      + (f", stored as {m['run']}" if m.get("run") else ""), highlight=False, soft_wrap=True)
