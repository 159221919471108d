"""`mgpu-bench suite`'s report: a Markdown summary for a ticket and one self-contained HTML page over
the three rounds (single-GPU baseline, multi-GPU scaling, limit throughput).

The verdicts come from judge.py; each probe draws its own part of the page through the probe
protocol (probe.images and probe.section); the suite adds its own NVML telemetry beside a probe,
the table of key figures and the history of a few headline metrics.

As in the other reports, nothing on the page is loaded from anywhere: the PNGs are data: URIs,
styles are inline, and every string from outside (host and GPU names, environment values, error
texts, command lines, findings) is escaped, in the HTML with html_page.esc and in Markdown with
html_page.md (control characters shown as escapes, Markdown syntax backslashed).
"""

from __future__ import annotations

import contextlib
import math
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain as _plain
from mgpu_bench.output.plotting import png as _png
from mgpu_bench.output.plotting import pyplot as _pyplot
from mgpu_bench.results.probe import OK, PROBLEM, WARNING

from .judge import ROUND_TITLES, Entry, entries, judge, notes, rows, telemetry_gpus
from .judge import _headline as headline_of

_TABLE_HEADERS = (
    "round",
    "probe",
    "status",
    "wall s",
    "key figure",
    "expected / theory",
)


def _table_cells(row: dict) -> list[str]:
    secs = "-" if row["seconds"] is None else f"{row['seconds']:.1f}"
    return [
        str(row["round"]),
        row["probe"],
        row["status"],
        secs,
        row["figure"],
        row["expected"],
    ]


def _md(text: object) -> str:
    """Outside text for Markdown (html_page.md)."""
    return html_page.md(text)


def _gpu_summary(environment: Mapping) -> str:
    names = Counter(
        str(g.get("name"))
        for g in environment.get("gpus") or []
        if isinstance(g, Mapping) and "name" in g
    )
    return ", ".join(f"{n}x {name}" for name, n in names.items()) or "no GPU"


def machine_line(environment: Mapping) -> str:
    """host; GPU names x count; driver; CUDA; NCCL; torch (plain text, not escaped)."""
    e = environment
    nccl = e.get("nccl") or e.get("torch_nccl")
    return (
        f"host {e.get('host')}; {_gpu_summary(e)}; driver {e.get('nvidia_driver') or '-'}; "
        f"CUDA {e.get('cuda_driver') or '-'} (runtime {e.get('cuda_runtime') or '-'}); NCCL {nccl or '-'}; "
        f"torch {e.get('torch') or '-'}"
    )


def _run_line(doc: Mapping) -> str:
    rounds = ", ".join(str(r) for r in doc.get("rounds") or [])
    dur = doc.get("duration_s")
    return (
        f"created {doc.get('created')}, mgpu-bench {doc.get('tool_version')}, rounds {rounds or '-'}"
        + (f", round 3 duration {dur:g} s" if isinstance(dur, (int, float)) else "")
        + (", quick" if doc.get("quick") else "")
    )


def _command(argv: Sequence) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv) if argv else "-"


def markdown(doc: Mapping) -> str:
    """The ticket-sized summary: the machine, the verdicts (problems first), one table of the
    probes' key figures against their theory, failed probes with their error."""
    env = doc.get("environment") or {}
    found = entries(doc)
    fs = judge(found)
    counts = Counter(f.severity for f in fs)
    lines = [
        f"# mgpu-bench suite: {_md(env.get('host'))}",
        "",
        f"- machine: {_md(machine_line(env))}",
        f"- run: {_md(_run_line(doc))}",
        "",
        f"## Verdicts ({counts[PROBLEM]} problem(s), {counts[WARNING]} warning(s), {counts[OK]} ok)",
        "",
    ]
    lines += [
        f"- **{f.severity.upper()}** {_md(f.text)}"
        if f.severity != OK
        else f"- ok: {_md(f.text)}"
        for f in fs
    ]
    table = rows(found)
    lines += [
        "",
        "## Probes",
        "",
        *html_page.md_table(
            _TABLE_HEADERS,
            [_table_cells(r) for r in table],  # md_table escapes each cell
        ),
    ]
    failed = [r for r in table if r["status"] != "ok"]
    if failed:
        lines += ["", "## Failed or incomplete probes", ""]
        lines += [
            f"- round {r['round']} {_md(r['probe'])} {_md(r['status'])}: {_md(r['error'] or 'no reason given')} "
            f"(command: {_md(_command(r['command']))})"
            for r in failed
        ]
    return "\n".join(lines) + "\n"


def plot_telemetry(tel: Mapping, title: str) -> bytes | None:
    """SM clock (MHz), power (W) and temperature (C) over the probe's run per GPU, from the
    NVML samples the suite took beside it, with the max SM clock and the power limit dotted; a
    panel without data is left out; None without any."""
    gpus = telemetry_gpus(tel)
    panels = [
        (key, label, unit, limit)
        for key, label, unit, limit in (
            ("sm_hz", "SM clock (MHz)", 1e6, "sm_max_hz"),
            ("power_w", "power (W)", 1.0, "power_limit_w"),
            ("temp_c", "temperature (C)", 1.0, None),
        )
        if any(
            v is not None
            for g in gpus.values()
            for v in (g.get("series") or {}).get(key) or []
        )
    ]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(panels),
        1,
        sharex=True,
        squeeze=False,
        dpi=110,
        figsize=(9.0, 0.9 + 2.0 * len(panels)),
    )
    for (key, label, unit, limit_key), ax in zip(panels, axes[:, 0]):
        limits = set()
        for i, (k, g) in enumerate(gpus.items()):
            series = g.get("series") or {}
            pts = [
                (t, v / unit)
                for t, v in zip(series.get("t") or [], series.get(key) or [])
                if v is not None
            ]
            if pts:
                ax.plot(
                    [x for x, _ in pts],
                    [y for _, y in pts],
                    "-",
                    color=f"C{i % 10}",
                    linewidth=1,
                    label=f"GPU {_plain(k)}",
                )
            lim = (
                (g.get("static") or g.get("summary") or {}).get(limit_key)
                if limit_key
                else None
            )
            if isinstance(lim, (int, float)) and lim:
                limits.add(lim / unit)
        what = "max SM clock" if limit_key == "sm_max_hz" else "power limit"
        for lim in sorted(limits):
            ax.axhline(
                lim,
                color="black",
                linewidth=1,
                linestyle=":",
                label=f"{what} {lim:.0f}",
            )
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(
            loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False
        )
    axes[-1, 0].set_xlabel("time since the probe started (s)")
    axes[0, 0].set_title(_plain(title), fontsize=10)
    return _png(plt, fig)


def plot_history(trend: Mapping[str, Sequence[tuple[str, float, str]]]) -> bytes | None:
    """One panel per metric: its value over the runs' creation times, the newest point marked.
    `trend`: metric name -> [(created ISO time, value, unit)]; None when no point can be read."""
    import datetime as _dt

    series = []
    for name, points in trend.items():
        pts = []
        for p in points or []:
            try:
                when = _dt.datetime.fromisoformat(str(p[0]))
                value = float(p[1])
            except (TypeError, ValueError, IndexError):
                continue
            if not math.isnan(value):
                pts.append((when, value, str(p[2]) if len(p) > 2 else ""))
        if pts:
            series.append(
                (
                    name,
                    sorted(
                        pts,
                        key=lambda x: (
                            x[0].timestamp() if x[0].tzinfo else x[0].toordinal()
                        ),
                    ),
                )
            )
    if not series:
        return None
    plt = _pyplot()
    cols = 1 if len(series) == 1 else 2
    rows = (len(series) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, squeeze=False, figsize=(5.2 * cols, 2.6 * rows), dpi=100
    )
    for ax, (name, pts) in zip(axes.flat, series):
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, "-o", markersize=3, linewidth=1, color="tab:blue")
        ax.plot(xs[-1:], ys[-1:], "o", markersize=6, color="tab:red", label="this run")
        ax.set_title(_plain(name), fontsize=9)
        ax.set_ylabel(_plain(pts[-1][2]), fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.tick_params(axis="x", labelsize=7, rotation=30)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return _png(plt, fig)


def images(doc: Mapping, history_trend: Mapping | None = None) -> dict[str, bytes]:
    """Every PNG of the page keyed by file stem: <NN>_<probe>_<plot> per probe in run order (the
    modules' own plots), and history when a trend is given. A probe whose plots fail is left
    without them (its section says so)."""
    return _images(entries(doc), history_trend)


def _images(found: list[Entry], history_trend: Mapping | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for e in found:
        pngs: dict[str, bytes] = {}
        # A plot that fails on an odd document leaves its section without it, the rest drawn.
        with contextlib.suppress(Exception):
            if e.readable:
                pngs.update(e.probe.images(e.doc))
        with contextlib.suppress(Exception):
            title = f"{e.where}: clocks, power and temperature sampled by the suite"
            png = plot_telemetry(e.telemetry, title) if e.telemetry else None
            if png:
                pngs["telemetry"] = png
        out.update({f"{e.slug}_{k}": v for k, v in pngs.items()})
    if history_trend:
        png = plot_history(history_trend)
        if png:
            out["history"] = png
    return out


_STYLE = html_page.STYLE + (
    "h2{border-bottom:2px solid #444;padding-bottom:2px;margin-top:1.6em}h3{margin-bottom:.3em}"
    ".machine{font-size:1.05em}.sub{color:#555}ul.findings{list-style:none;padding:0}"
    "ul.findings li{margin:4px 0;padding:4px 8px}.problem{background:#fdecea;border-left:6px solid #c62828}"
    ".warning{background:#fff8e1;border-left:6px solid #f9a825}.ok{background:#edf7ed;border-left:6px solid #2e7d32}"
    ".tag{font-weight:bold;font-family:monospace;display:inline-block;min-width:6.5em}"
    ".verdict{font-size:1.15em;padding:8px 10px;margin:8px 0}.grid{display:flex;flex-wrap:wrap;gap:12px}"
    ".probes th{text-align:left}.grid p{margin:0}.st-ok{color:#2e7d32}.st-bad{color:#c62828}.err{color:#b00;font-family:monospace;white-space:pre-wrap}td{vertical-align:top}"
)


def _own(imgs: Mapping[str, bytes], e: Entry) -> dict[str, bytes]:
    """The entry's images keyed as its probe drew them (without the entry's prefix)."""
    prefix = f"{e.slug}_"
    return {k[len(prefix):]: v for k, v in imgs.items() if k.startswith(prefix)}


def _probe_html(p: Entry, row: dict, imgs) -> str:
    e = html_page.esc
    secs = "" if p.seconds is None else f", {p.seconds:.1f} s"
    head = (
        f"<h3>{e(p.title or p.name)} <span class=sub>({e(p.name)}: "
        f"<span class={'st-ok' if p.status == 'ok' else 'st-bad'}>{e(p.status)}</span>{e(secs)})</span></h3>"
        f"<p class=sub>command: <span class=mono>{e(_command(p.command))}</span></p>"
    )
    if p.error:
        head += f"<p class=err>{e(p.error)}</p>"
    if row["figure"] != "-":
        head += (
            f"<p><b>{e(row['figure'])}</b>"
            + (f" (expected: {e(row['expected'])})" if row["expected"] != "-" else "")
            + "</p>"
        )
    tel = _telemetry_html(p, imgs)
    if not p.readable:
        unreadable = (
            f"<p class=err>result document not readable: {e(p.load_error)}</p>"
            if p.load_error
            else ""
        )
        return head + unreadable + tel
    try:
        body = p.probe.section(p.doc, _own(imgs, p))
    except Exception as exc:  # noqa: BLE001 - the rest of the page still renders
        body = f"<p class=err>this section could not be drawn: {e(type(exc).__name__)}: {e(str(exc))}</p>"
    said = notes(p)
    return head + body + tel + (f"<p class=sub>notes:</p>{html_page.ul(said)}" if said else "")


def _telemetry_html(p: Entry, imgs) -> str:
    """The suite's own NVML samples beside the probe: the plot and one row per GPU."""
    if not p.telemetry:
        return ""
    e = html_page.esc
    every = p.telemetry.get("interval_s")
    every_text = f" every {every:g} s" if isinstance(every, (int, float)) else ""
    parts = [
        f"<p><b>telemetry sampled by the suite</b>{every_text}: clocks, power, temperature "
        + "and clock-event (throttle) reasons while the probe ran</p>"
    ]
    if p.telemetry.get("error"):
        parts.append(f"<p class=err>no telemetry: {e(str(p.telemetry['error']))}</p>")
    parts.append(html_page.images(_own(imgs, p), ["telemetry"]))
    rows = []
    for k, g in telemetry_gpus(p.telemetry).items():
        t = g.get("summary") or {}

        def f(key, scale=1.0, t=t):
            v = t.get(key)
            return f"{v * scale:.0f}" if isinstance(v, (int, float)) else "-"

        rows.append(
            [
                k,
                t.get("samples", "-"),
                f("sm_hz_median", 1e-6),
                f("sm_hz_min", 1e-6),
                f("sm_max_hz", 1e-6),
                f("power_w_mean"),
                f("power_w_max"),
                f("power_limit_w"),
                f("temp_c_max"),
                ", ".join(t.get("reasons") or []) or "-",
            ]
        )
    if rows:
        headers = [
            "GPU",
            "samples",
            "SM MHz median",
            "SM MHz min",
            "SM MHz max clock",
            "W mean",
            "W max",
            "W limit",
            "C max",
            "clock-event reasons seen",
        ]
        parts.append(html_page.table(headers, rows, left=(9,)))
    return "".join(parts)


def _environment_html(env: Mapping) -> str:
    e = html_page.esc
    keys = (*html_page.ENV_KEYS, "platform", "python")
    rows = [[k, env.get(k)] for k in keys if k in env]
    parts = [html_page.table(["key", "value"], rows, left=(0, 1))]
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, Mapping)]
    if gpus:
        parts.append(
            html_page.table(
                [
                    "index",
                    "name",
                    "memory GiB",
                    "compute capability",
                    "SMs",
                    "PCI bus id",
                    "UUID",
                ],
                [
                    [
                        g.get("index"),
                        g.get("name"),
                        "-"
                        if g.get("total_memory") is None
                        else f"{g['total_memory'] / 2**30:.1f}",
                        g.get("compute_capability", "-"),
                        g.get("multiprocessors", "-"),
                        g.get("pci_bus_id", "-"),
                        g.get("uuid", g.get("error", "-")),
                    ]
                    for g in gpus
                ],
                left=(1, 5, 6),
            )
        )
    variables = env.get("env") or {}
    if variables:
        parts.append(
            html_page.table(
                ["variable", "value"],
                [[k, v] for k, v in variables.items()],
                left=(0, 1),
            )
        )
    libs = env.get("libraries") or {}
    if isinstance(libs, Mapping) and libs:
        parts.append(
            html_page.table(
                ["library", "file loaded"],
                [[k, v] for k, v in libs.items()],
                left=(0, 1),
            )
        )
    return "".join(parts) or f"<p>{e('no environment recorded')}</p>"


def page(
    doc: Mapping,
    history_trend: Mapping | None = None,
    *,
    pngs: Mapping[str, bytes] | None = None,
) -> str:
    """The HTML page: the verdicts on top (problems first, marked), the probes' table, a section
    per round with each probe's own plots and tables, failed probes with their error, the
    history trend (when given: metric name -> [(created ISO time, value, unit)]) and the
    environment. `pngs`: what images() returned, so that write_report draws once."""
    e = html_page.esc
    found = entries(doc)
    imgs = _images(found, history_trend) if pngs is None else pngs
    env = doc.get("environment") or {}
    fs = judge(found)
    counts = Counter(f.severity for f in fs)
    body = [
        f"<h1>mgpu-bench suite: {e(str(env.get('host')))}</h1>",
        f"<p class=machine>{e(machine_line(env))}</p>",
        f"<p class=sub>{e(_run_line(doc))}; command: "
        + f"<span class=mono>{e(_command(doc.get('command') or []))}</span></p>",
    ]
    head, _line = headline_of(found)
    if head is not None:
        body.append(f"<div class='verdict {head.severity}'><b>{e(head.text)}</b></div>")
    body.append(
        f"<h2>verdicts: {counts[PROBLEM]} problem(s), {counts[WARNING]} warning(s), {counts[OK]} ok</h2>"
    )
    body.append(
        "<ul class=findings>"
        + "".join(  # the headline stands above, not again here
            f"<li class={f.severity}><span class=tag>{f.severity.upper()}</span>{e(f.text)}</li>"
            for f in fs
            if f != head
        )
        + "</ul>"
    )
    table = rows(found)
    body.append(
        "<h2>probes</h2><div class=probes>"
        + html_page.table(
            _TABLE_HEADERS, [_table_cells(r) for r in table], left=(1, 2, 4, 5)
        )
        + "</div>"
    )
    for rnd in sorted({p.round for p in found}):
        body.append(f"<h2>round {rnd}: {e(ROUND_TITLES.get(rnd, 'other probes'))}</h2>")
        body += [
            _probe_html(p, row, imgs) for p, row in zip(found, table) if p.round == rnd
        ]
    failed = [r for r in table if r["status"] != "ok"]
    if failed:
        body.append(
            "<h2>failed or incomplete probes</h2>"
            + html_page.table(
                ["round", "probe", "status", "error", "command"],
                [
                    [
                        r["round"],
                        r["probe"],
                        r["status"],
                        r["error"] or "no reason given",
                        _command(r["command"]),
                    ]
                    for r in failed
                ],
                left=(1, 2, 3, 4),
            )
        )
    if "history" in imgs:
        body.append("<h2>history</h2>" + html_page.image("history", imgs["history"]))
    body.append("<h2>environment</h2>" + _environment_html(env))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>mgpu-bench suite</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>"
    )


def write_report(
    doc: Mapping, out_dir: str | Path, history_trend: Mapping | None = None
) -> list[Path]:
    """Writes every PNG (<NN>_<probe>_<plot>.png, history.png), report.html (the images
    embedded: the file works alone) and summary.md into out_dir (created; its parent must exist,
    FileNotFoundError otherwise); returns the paths, in that order."""
    imgs = images(doc, history_trend)
    return html_page.write_bundle(out_dir, imgs, page(doc, history_trend, pngs=imgs), markdown(doc))
