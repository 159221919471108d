"""`mgpu-bench model --report DIR`: PNGs (step time over the timed steps with the stable window
shaded; the median phase split per configuration; total tokens/s against GPU count with the
ideal line), a self-contained HTML page and a Markdown summary.

As in the other reports, the page loads nothing from anywhere (images are data URIs, every
outside string is escaped by html_page), matplotlib is imported lazily with the Agg backend,
and outside strings drawn in a plot have their `$` escaped so matplotlib does not read them as
mathtext. The run keeps seconds, tokens/s, FLOP/s and bytes; ms, TFLOP/s, % and GiB are chosen
here. Every configuration's table row and plot come from the same rows built once (`_rows`).
"""

from __future__ import annotations

from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain as _plain
from mgpu_bench.output.plotting import png as _png
from mgpu_bench.output.plotting import pyplot as _pyplot

from .analyse import findings
from .figures import PHASES, ModelRun, StepStats, throughput
from .render import flops_text, size_text, tflops

_PHASE_COLOURS = {"data": "tab:orange", "forward": "tab:blue", "backward": "tab:green", "optimizer": "tab:purple"}
_IMAGES = ("ledger", "steps", "phases", "scaling")  # file stems, in page order
_LEDGER_COLOURS = {"gpu": "tab:green", "host": "tab:olive", "communication": "tab:red", "input": "tab:orange",
                   "stalls": "tab:purple", "straggler": "tab:brown"}


def _unit(run: ModelRun) -> str:
    return "GPU" if run.config.device == "cuda" else "process"


def _label(run: ModelRun, s: StepStats) -> str:
    unit = _unit(run) if s.world == 1 else f"{_unit(run)}{'es' if run.config.device != 'cuda' else 's'}"
    return f"{s.world} {unit}, {s.data}"


def step_series(s: StepStats) -> list[float]:
    """Seconds per timed step (warm-up already excluded by the worker), the slowest rank's per
    step, as figures.analyse takes them; [] when no rank recorded steps."""
    good = [r["phases"]["step"] for r in s.ranks if (r.get("phases") or {}).get("step")]
    if not good:
        return []
    n = min(len(g) for g in good)
    return [max(g[i] for g in good) for i in range(n)]


def _title(run: ModelRun, what: str) -> str:
    c = run.config
    gpu = f" on {_plain(run.gpu_name)}" if run.gpu_name else ""
    size = size_text(c)
    return (f"{what}: {_plain(c.model)} ({_plain(c.parallel)}{', ' + size if size else ''}, batch {c.batch_size} x "
            f"{c.grad_accum}){gpu}")


# ------------------------------------------------------------------------------------ plots

def plot_steps(run: ModelRun) -> bytes | None:
    """Step time (ms) over the timed steps for each configuration; its stable window shaded, its
    median dotted, the wall clock's mean step dashed, the long steps (stalls) ringed."""
    series = [(s, xs) for s in run.stats if (xs := step_series(s))]
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (s, xs) in enumerate(series):
        colour = f"C{i % 10}"
        start, end, stable = s.window
        ax.plot(range(len(xs)), [x * 1e3 for x in xs], "-o", markersize=2.5, color=colour,
                label=f"{_plain(_label(run, s))}: window {start}-{max(start, end - 1)}"
                      + ("" if stable else " (not stable)"))
        if end > start:  # window is [start, end) in step indices
            ax.axvspan(start - 0.5, end - 0.5, color=colour, alpha=0.08, linewidth=0)
        if "step_s" in s.derived:
            ax.hlines(s.derived["step_s"] * 1e3, start - 0.5, end - 0.5, colors=colour, linestyles=":")
        if s.derived.get("wall_step_s"):
            ax.hlines(s.derived["wall_step_s"] * 1e3, -0.5, len(xs) - 0.5, colors=colour, linestyles="--",
                      linewidth=0.8)
        marked = _stall_positions(s, len(xs))
        if marked:
            ax.plot(marked, [xs[i] * 1e3 for i in marked], "o", markersize=7, markerfacecolor="none",
                    markeredgecolor="tab:red", label=f"{len(marked)} long step(s)" if i == 0 else None)
    ax.set_xlabel(f"timed step (after {run.config.warmup_steps} warm-up steps)")
    ax.set_ylabel("step time, ms (slowest rank)")
    ax.set_title(_title(run, "step time; shaded: stable window, dotted: its median, dashed: the wall clock's mean, "
                             "ringed: long steps"), fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, alpha=0.3)
    return _png(plt, fig)


def _stall_positions(s: StepStats, n: int) -> list[int]:
    """Positions in the plotted series of the run's long steps (their step numbers mapped through
    the ranks' steps_index where the monitor kept one)."""
    indices = (s.stalls or {}).get("indices") or []
    if not indices:
        return []
    index = next((r.get("steps_index") for r in s.ranks if r.get("steps_index")), None)
    where = {v: k for k, v in enumerate(index)} if index else {k: k for k in range(n)}
    return sorted(where[i] for i in indices if i in where and where[i] < n)


def plot_phases(run: ModelRun) -> bytes | None:
    """A stacked bar per configuration of the median phase times (ms) over the stable window,
    a tick at the median step time, and the exposed communication share above where known."""
    rows = [s for s in run.stats if s.derived and any(f"{p}_s" in s.derived for p in PHASES)]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 3), 4.5))
    xs = list(range(len(rows)))
    bottoms = [0.0] * len(rows)
    for p in PHASES:
        ms = [(s.derived.get(f"{p}_s") or 0.0) * 1e3 for s in rows]
        ax.bar(xs, ms, bottom=bottoms, width=0.6, color=_PHASE_COLOURS[p], label=p)
        bottoms = [b + m for b, m in zip(bottoms, ms, strict=True)]
    for x, s, top in zip(xs, rows, bottoms, strict=True):
        step = s.derived.get("step_s")
        if step is not None:
            ax.hlines(step * 1e3, x - 0.35, x + 0.35, colors="black", linewidth=1.5,
                      label="step (median)" if x == 0 else None)
        exposed = s.derived.get("exposed_comm_share")
        if exposed is not None:
            ax.annotate(f"exposed comm\n{100 * exposed:.1f}%", (x, max(top, (step or 0) * 1e3)),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(xs, [_plain(_label(run, s)).replace(", ", "\n") for s in rows], fontsize=8)
    ax.set_ylabel("ms per step (median over the stable window)")
    ax.set_title(_title(run, "where the step goes"), fontsize=9)
    ax.margins(y=0.15)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    return _png(plt, fig)


def plot_ledger(run: ModelRun) -> bytes | None:
    """The step ledger as stacked bars, one per configuration (and, for a job the monitor measured
    over several windows, one per window beside it): each cause's share of the timed steps' wall
    clock, in the chain's order (ledger.py), the whole bar 100%."""
    from .ledger import CAUSES, label

    bars: list[tuple[str, dict, dict]] = []
    for s in run.stats:
        led = s.ledger
        if not led or not led.get("steps"):
            continue
        bars.append((_plain(_label(run, s)).replace(", ", "\n") + f"\n{led['steps']} steps", led["shares"], led))
        wins = led.get("windows") or []
        if len(wins) > 1:
            bars += [(f"steps\n{w['first']}-{w['last']}", w["shares"], led) for w in wins[-12:]]
    if not bars:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(bars) + 4), 4.5))
    xs = list(range(len(bars)))
    bottoms = [0.0] * len(bars)
    for cause in reversed(CAUSES):  # GPU work at the bottom, the losses above it
        vals = [100 * (shares.get(cause) or 0.0) for _, shares, _ in bars]
        if not any(vals):
            continue
        ax.bar(xs, vals, bottom=bottoms, width=0.6, color=_LEDGER_COLOURS[cause], label=label(bars[0][2], cause))
        for x, v, b in zip(xs, vals, bottoms, strict=True):
            if v >= 6:
                ax.annotate(f"{v:.0f}%", (x, b + v / 2), ha="center", va="center", fontsize=7, color="white")
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax.set_xticks(xs, [name for name, _, _ in bars], fontsize=7)
    ax.set_ylabel("% of the timed steps' wall clock")
    ax.set_ylim(0, 100)
    ax.set_title(_title(run, "step ledger: each second under one cause"), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    return _png(plt, fig)


def _throughput(run: ModelRun) -> dict[int, float]:
    """Total tokens/s (samples/s without tokens) per GPU count, from the configuration
    run.scaling() uses."""
    out = {}
    for n in run.gpu_counts:
        s = run.effective(n)
        if s is not None and throughput(s.derived):
            out[n] = throughput(s.derived)
    return out


def _rate_unit(run: ModelRun) -> str:
    return "tokens/s" if any(s.derived.get("tokens_per_s") for s in run.stats) else "samples/s"


def plot_scaling(run: ModelRun) -> bytes | None:
    """Total tokens/s against GPU count, the ideal line N x T_1, efficiency T_N / (N x T_1) at
    each point; None with fewer than two GPU counts measured."""
    tps = _throughput(run)
    if len(tps) < 2:
        return None
    eff = run.scaling()
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ns = sorted(tps)
    modes = {run.effective(n).data for n in ns}
    ax.plot(ns, [tps[n] for n in ns], "-o", color="tab:blue", label=f"measured ({'/'.join(sorted(modes))} data)")
    if 1 in tps:
        ax.plot(ns, [n * tps[1] for n in ns], ":", color="black", label="ideal: N x T_1")
    for n in ns:
        if n in eff:
            ax.annotate(f"{100 * eff[n]:.1f}%", (n, tps[n]), ha="center", va="top", fontsize=8,
                        xytext=(0, -6), textcoords="offset points")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("GPUs" if run.config.device == "cuda" else "processes")
    ax.set_ylabel(f"{_rate_unit(run)} (total)")
    ax.set_title(_title(run, "scaling (label: efficiency)"), fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, alpha=0.3)
    return _png(plt, fig)


def images(run: ModelRun) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, fn in zip(_IMAGES, (plot_ledger, plot_steps, plot_phases, plot_scaling), strict=True):
        png = fn(run)
        if png:
            out[name] = png
    return out


# ------------------------------------------------------------------------------------ tables

def _fmt(d: dict, key: str, scale: float = 1.0, fmt: str = ".1f") -> str:
    v = d.get(key)
    return "-" if v is None else format(v * scale, fmt)


def _rows(run: ModelRun) -> tuple[list[str], list[list[object]]]:
    """One row per configuration: throughput by the wall clock over every timed step, the stall
    share; the steady-state step and phases as medians over the stable window."""
    u = "GPU" if run.config.device == "cuda" else "proc"
    tokens = _rate_unit(run) == "tokens/s"
    rates = ["tokens/s total", f"tokens/s per {u}"] if tokens else []
    headers = [f"{u}s", "data", "steady step ms", "samples/s total", *rates, "TFLOP/s per GPU", "MFU %",
               "data %", "fwd ms", "bwd ms", "opt ms", "exposed comm %", "long steps % of time", "peak reserved GiB",
               "window steps"]
    rows: list[list[object]] = []
    for s in run.stats:
        d = s.derived
        if not d:
            rows.append([s.world, s.data, f"failed: {s.error or 'no steps measured'}", *["-"] * (len(headers) - 3)])
            continue
        start, end, stable = s.window
        window = f"{start}-{end - 1} of {len(step_series(s))}" + ("" if stable else " (not stable)")
        per = [_fmt(d, "tokens_per_s", 1, ".0f"), _fmt(d, "tokens_per_s_per_gpu", 1, ".0f")] if tokens else []
        rows.append([s.world, s.data, _fmt(d, "step_s", 1e3, ".2f"), _fmt(d, "samples_per_s", 1, ".1f"), *per,
                     tflops(d.get("flops_per_s_per_gpu")),
                     _fmt(d, "mfu", 100), _fmt(d, "data_share", 100), _fmt(d, "forward_s", 1e3, ".2f"),
                     _fmt(d, "backward_s", 1e3, ".2f"), _fmt(d, "optimizer_s", 1e3, ".2f"),
                     _fmt(d, "exposed_comm_share", 100), _fmt(d, "stall_share", 100),
                     _fmt(d, "peak_reserved", 2**-30, ".2f"), window])
    return headers, rows


def _scaling_rows(run: ModelRun) -> tuple[list[str], list[list[object]]]:
    u = "GPU" if run.config.device == "cuda" else "proc"
    tps, eff = _throughput(run), run.scaling()
    headers = [f"{u}s", "data", f"{_rate_unit(run)} total", f"ideal {_rate_unit(run)} (N x T_1)", "efficiency %"]
    if len(tps) < 2:
        return headers, []
    rows = [[n, run.effective(n).data, f"{t:.0f}", f"{n * tps[1]:.0f}" if 1 in tps else "-",
             f"{100 * eff[n]:.1f}" if n in eff else "-"] for n, t in sorted(tps.items())]
    return headers, rows


def _config_rows(run: ModelRun) -> list[list[object]]:
    c = run.config
    peak = run.peak
    w = run.workload or {}
    rows = [["model", c.workload_text], ["parallel", c.parallel], ["sample", size_text(c) or "the module's own"],
            ["batch per rank", f"{c.batch_size} x {c.grad_accum} (micro-batch x accumulation)"],
            ["steps", f"{c.steps} timed after {c.warmup_steps} warm-up"], ["device", c.device],
            ["GPU", run.gpu_name or "-"],
            ["MFU peak", "-" if peak is None or peak.value is None
             else f"{peak.value / 1e12:.1f} TFLOP/s per GPU ({peak.source})"]]
    if w.get("params"):
        rows.append(["parameters", f"{w['params'] / 1e6:.1f} M"])
    if flops_text(run):
        rows.append(["FLOPs", flops_text(run).removeprefix("FLOPs: ")])
    if "loader" in run.data_modes:
        rows.append(["loader", f"{c.num_workers} workers, {c.preprocess_ms} ms preprocessing per sample"])
    return rows


def markdown(run: ModelRun, environment: dict) -> str:
    md = html_page.md
    lines = ["# mgpu-bench model", "", html_page.environment_markdown(environment, cpu=_cpu(run, environment))]
    if run.gpu_name and not html_page.gpu_names(environment):
        lines.append(f"- GPUs: {md(run.gpu_name)}")
    lines += [f"- {md(k)}: {md(v)}" for k, v in _config_rows(run)]
    lines.append("")
    lines += [f"- finding: {md(f.text)}" for f in findings(run)]
    for headers, rows in (_rows(run), _scaling_rows(run)):
        if rows:
            lines += ["", *html_page.md_table(headers, rows)]
    if run.notes:
        lines += [""] + [f"- note: {md(n)}" for n in run.notes]
    if run.stopped:
        lines += ["", f"Stopped early: {md(run.stop_message)}"]
    return "\n".join(lines) + "\n"


def _cpu(run: ModelRun, environment: dict) -> str | None:
    """The plain sentence for a run on CPU processes (gloo); None on GPUs."""
    if run.config.device == "cuda":
        return None
    return html_page.ran_on_cpu(environment, ", ".join(str(n) for n in run.gpu_counts), "gloo")


def page(run: ModelRun, environment: dict, imgs: dict[str, bytes]) -> str:
    """The shared layout (html_page.page): findings by severity first, the environment, then
    the configuration, the tables and the plots."""
    sections = [("configuration", html_page.table(["setting", "value"], _config_rows(run), left=(0, 1)))]
    headers, rows = _rows(run)
    if rows:
        sections.append(("training steps (medians over the stable window)",
                         html_page.wide(html_page.table(headers, rows, left=(1, len(headers) - 1)))))
    headers, rows = _scaling_rows(run)
    if rows:
        sections.append(("scaling", html_page.wide(html_page.table(headers, rows, left=(1,)))))
    titles = {"ledger": "step ledger", "steps": "step time", "phases": "phase split", "scaling": "scaling"}
    for name, png in imgs.items():
        sections.append((titles.get(name, name), html_page.image(name, png)))
    return html_page.page("mgpu-bench model", environment, findings(run), sections, run.notes,
                          run.stop_message if run.stopped else None, cpu=_cpu(run, environment))


def write_report(run: ModelRun, out_dir: str | Path, environment: dict) -> list[Path]:
    """Writes ledger.png, steps.png, phases.png, scaling.png (those that apply), report.html and summary.md
    into out_dir (created; its parent must exist); returns the paths written."""
    imgs = images(run)
    return html_page.write_bundle(out_dir, imgs, page(run, environment, imgs), markdown(run, environment))


def section(run: ModelRun, pngs: dict[str, bytes]) -> str:
    """The run's part of the suite page: its settings, the table per configuration, scaling, plots."""
    parts = [html_page.table(["setting", "value"], _config_rows(run), left=(0, 1))]
    headers, rows = _rows(run)
    if rows:
        parts.append(html_page.table(headers, rows, left=(1, len(headers) - 1)))
    headers, rows = _scaling_rows(run)
    if rows:
        parts.append(html_page.table(headers, rows, left=(1,)))
    parts.append(html_page.images(pngs, ["ledger", "phases", "steps", "scaling"], grid=True))
    return "".join(parts)
