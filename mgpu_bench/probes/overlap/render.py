"""overlap on the terminal and as CSV: one table model (rows built once, here), two renderers.

The run keeps seconds, bytes/s and FLOP/s; GB/s, TFLOP/s, ms, MHz and % are chosen here."""

from __future__ import annotations

import io

from .analyse import (
    PHASE_TITLES,
    PHASES,
    Analysis,
    OverlapRun,
    Slowdown,
    analyse,
    phase_telemetry,
    side_samples,
    window,
)


def _scale(run: OverlapRun, kind: str) -> tuple[float, str]:
    """(divisor, unit) for a rate: busbw in GB/s; a GEMM in TFLOP/s on GPUs, GFLOP/s on CPU."""
    if kind == "comm":
        return 1e9, "GB/s"
    return (1e12, "TFLOP/s") if run.on_gpu else (1e9, "GFLOP/s")


def _fig(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _slow(s: Slowdown | None) -> tuple[str, str]:
    if s is None:
        return "-", "-"
    return f"{100 * s.value:+.1f}%", "-" if s.noise is None else f"±{100 * s.noise:.1f}%"


def rows(run: OverlapRun, a: Analysis | None = None) -> tuple[list[str], list[list[str]]]:
    """The main table: per side, its rate and time per iteration alone and together, the
    slowdown and its noise, and the theory where there is one (the GEMM if NCCL's SMs were
    simply taken from it)."""
    a = a or analyse(run)
    c = run.config
    headers = ["side", "figure", "alone", "together", "slowdown", "noise", "theory"]
    out: list[list[str]] = []
    if a.comm_alone and a.comm_together:
        div, unit = _scale(run, "comm")
        name = f"allreduce {c.size_text} fp32" if run.world >= 2 else f"stand-in ({c.size_text} x 1)"
        what = f"busbw {unit}" if run.world >= 2 else f"buffer {unit}"
        out.append([name, what, _fig(a.comm_alone.rate / div), _fig(a.comm_together.rate / div),
                    *_slow(a.comm_slowdown), "-"])
        out.append(["", "ms per call", _fig(a.comm_alone.seconds * 1e3, 3), _fig(a.comm_together.seconds * 1e3, 3),
                    "", "", ""])
    if a.gemm_alone and a.gemm_together:
        div, unit = _scale(run, "gemm")
        theory = "-"
        if a.channels and a.sm_count and run.world >= 2:
            theory = (f"{a.gemm_alone.rate * (1 - a.channels / a.sm_count) / div:.1f} if NCCL's {a.channels} of "
                      f"{a.sm_count} SMs were taken from it")
        out.append([f"GEMM {c.gemm_dtype} {c.shape}", f"{unit} per {run.unit}", _fig(a.gemm_alone.rate / div),
                    _fig(a.gemm_together.rate / div), *_slow(a.gemm_slowdown), theory])
        out.append(["", "ms per GEMM", _fig(a.gemm_alone.seconds * 1e3, 3), _fig(a.gemm_together.seconds * 1e3, 3),
                    "", "", ""])
    return headers, out


def rank_rows(run: OverlapRun) -> tuple[list[str], list[list[str]]]:
    """Per rank: the GEMM alone and together, and per phase its GPU's median SM clock (MHz) and
    mean power (W) from NVML ('-' on CPU processes or without NVML)."""
    div, unit = _scale(run, "gemm")
    clocked = bool(phase_telemetry(run, "together") or phase_telemetry(run, "gemm_alone"))
    headers = ["rank", "device", f"GEMM alone {unit}", f"together {unit}"] + \
        ([f"{PHASE_TITLES[p]}: MHz / W" for p in PHASES] if clocked else [])
    out = []
    for r in run.ranks:
        rates = []
        for phase in ("gemm_alone", "together"):
            s = side_samples(r, phase, "gemm")
            rates.append(_fig(run.config.flops / (sum(s) / len(s)) / div) if s else "-")
        clocks = []
        for p in PHASES if clocked else ():
            t = (r.get("telemetry") or {}).get(p) or {}
            mhz = t.get("sm_hz_median")
            clocks.append(f"{_fig(mhz / 1e6 if mhz else None, 0)} / {_fig(t.get('power_w_mean'), 0)}")
        out.append([str(r.get("rank")), f"{r.get('device')}" + (f" {r['gpu_name']}" if r.get("gpu_name") else ""),
                    *rates, *clocks])
    return headers, out


def lines(run: OverlapRun, a: Analysis | None = None) -> list[str]:
    """The lines below the tables: the window the together figures come from, NCCL's channels,
    the telemetry caveat."""
    a = a or analyse(run)
    out = []
    if run.ranks:
        r0 = run.ranks[0]
        w = window((r0.get("phases") or {}).get("together") or {})
        if w is not None:
            p = r0["phases"]["together"]
            out.append(f"together (rank 0): both ran {w.end_s - w.start_s:.2f} s of {w.span_s:.2f} s ({w.share:.0%}); "
                       f"counted {len(w.comm)} of {len(p['comm']['seconds'])} {'allreduces' if run.world > 1 else 'calls'}"
                       f" and {len(w.gemm)} of {len(p['gemm']['seconds'])} GEMMs, those that ended inside that window"
                       + _hidden(a.hidden))
    if a.channels is not None:
        nvls = [(r.get("nccl") or {}).get("nvls_channels") for r in run.ranks]
        extra = f", {max(n for n in nvls if n is not None)} NVLS channels" if any(nvls) else ""
        out.append(f"NCCL: {a.channels} collective channels{extra} (NCCL's INFO log at set-up), one CTA each"
                   + (f": {a.channels} of {a.sm_count} SMs while an allreduce runs" if a.sm_count else ""))
    envs = {k: v for r in run.ranks for k, v in (r.get("nccl_env") or {}).items()}
    if envs:
        out.append("set in the environment: " + " ".join(f"{k}={v}" for k, v in sorted(envs.items())))
    if phase_telemetry(run, "together"):
        out.append("clocks and power: NVML every 0.1 s on each rank's GPU; its power reading is a 1 s average, so it "
                   "lags a phase's start")
    return out


def _hidden(hidden: float | None) -> str:
    if hidden is None:
        return ""
    if hidden < 0:
        return "; running both at once took longer than one after the other"
    return f"; running both at once hid {hidden:.0%} of the shorter stream"


def render_terminal(run: OverlapRun, console) -> None:
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    a = analyse(run)
    c = run.config
    comm = "NCCL allreduce" if run.world >= 2 and run.on_gpu else "gloo allreduce" if run.world >= 2 else \
        "elementwise stand-in (one rank)"
    headers, body = rows(run, a)
    t = Table(title=f"Compute and communication together: {run.ranks_text}, {comm} of {c.size_text} "
                    f"and a {c.gemm_dtype} {c.shape} GEMM, {c.duration_s:g} s per phase; slowdown = time per "
                    "iteration together / alone - 1",
              title_justify="left", pad_edge=False, box=None, header_style="bold")
    for h in headers:
        t.add_column(h, justify="left" if h in ("side", "figure", "theory") else "right")
    for row in body:
        t.add_row(*row)
    print_table(console, t)
    if run.on_gpu or len(run.ranks) > 1:
        headers, body = rank_rows(run)
        t = Table(title="Per rank: the GEMM" + (", and the GPU's median SM clock and mean power in each phase"
                                                if len(headers) > 4 else ""),
                  title_justify="left", pad_edge=False, box=None, header_style="bold")
        for h in headers:
            t.add_column(h, justify="left" if h == "device" else "right")
        for row in body:
            t.add_row(*row)
        print_table(console, t)
    for line in lines(run, a):
        console.print(line, highlight=False, soft_wrap=True)


def render_csv(run: OverlapRun) -> str:
    """One row per rank, phase and side: iterations counted, mean seconds per iteration, its rate
    and the rate's unit (base units: B/s for the allreduce's busbw, FLOP/s)."""
    import csv

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["rank", "device", "phase", "side", "op", "iterations", "mean_s", "rate", "rate_unit"])
    n = run.world
    for r in run.ranks:
        for phase in PHASES:
            for side in ("comm", "gemm"):
                s = side_samples(r, phase, side)
                if not s:
                    continue
                mean = sum(s) / len(s)
                if side == "comm":
                    nbytes = run.config.count * 4
                    rate, unit = (nbytes * 2 * (n - 1) / n / mean, "B/s busbw") if n >= 2 else (nbytes / mean, "B/s")
                    op = r.get("comm_op") or "allreduce"
                else:
                    rate, unit, op = run.config.flops / mean, "FLOP/s", f"gemm {run.config.gemm_dtype} {run.config.shape}"
                w.writerow([r.get("rank"), r.get("device"), phase, side, op, len(s), f"{mean:.9g}", f"{rate:.6g}",
                            unit])
    return buf.getvalue()

