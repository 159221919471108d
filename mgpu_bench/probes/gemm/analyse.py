"""What a GEMM run means: the slow GPU named with its likely cause, wrong results, a sustained
run that lost throughput, throttling; the suite's verdicts and key figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from mgpu_bench.results.probe import OK, PROBLEM, WARNING, Finding

from .measure import GemmResult, GemmRun, Shape

OUTLIER_FLOOR = 0.02  # a GPU is named only when it is this far below the median, or 3x noise


def outliers(values: Mapping[int, float], noise: Mapping[int, float | None]) -> list[dict]:
    """GPUs below the node's median by more than max(2%, 3x their noise): [{gpu, value,
    median, deficit, threshold}]. Needs two GPUs or more."""
    if len(values) < 2:
        return []
    med = statistics.median(values.values())
    if med <= 0:
        return []
    known = [n for n in noise.values() if n is not None]
    pooled = statistics.median(known) if known else None
    out = []
    for gpu, v in sorted(values.items()):
        n = noise.get(gpu)
        n = max(n, pooled) if n is not None and pooled is not None else (n if n is not None else pooled)
        threshold = max(OUTLIER_FLOOR, 3 * n) if n is not None else OUTLIER_FLOOR
        deficit = 1.0 - v / med
        if deficit > threshold:
            out.append({"gpu": gpu, "value": v, "median": med, "deficit": deficit, "threshold": threshold})
    return out


def sustained_drop(series: Sequence[tuple[float, float]], flops: int) -> dict | None:
    """TFLOP/s over the first and the last 10% of a sustained run (at least 3 bursts each) and
    the relative drop; None for a series too short to say."""
    n = len(series)
    tail = max(3, n // 10)
    if n < 2 * tail:
        return None
    first = statistics.median(flops / s for _, s in series[:tail])
    last = statistics.median(flops / s for _, s in series[-tail:])
    return {"first": first, "last": last, "drop": 1.0 - last / first, "bursts": tail}


def findings(run: GemmRun, shared: Sequence = ()) -> list[Finding]:
    """What a person can act on: wrong results and a slow GPU with its likely cause (problems):
    another process on it (occupancy.GpuProcess in `shared`) before anything the clocks say; a
    sustained run that lost throughput and throttling seen while measuring (warnings)."""
    from mgpu_bench.machine import occupancy, telemetry

    lines: list[Finding] = []
    for r in run.results:
        if r.best is None and r.candidates and not r.wrong:
            errors = sorted({c.error for c in r.candidates if c.error})
            lines.append(Finding(PROBLEM, f"GPU {r.gpu} {r.dtype} {r.shape}: none of the {len(r.candidates)} algorithms cuBLASLt "
                         f"proposed ran ({'; '.join(errors) or 'no timings'})"))
        for c in r.wrong:
            lines.append(Finding(PROBLEM, f"GPU {r.gpu} {r.dtype} {r.shape}: algorithm {c.name()} gave wrong results "
                         f"(normalised error {c.max_error:.2e} > tolerance {r.tolerance:.0e}): a faulty GPU "
                         "or library; this algorithm is not counted"))
    for (dtype, shape), rs in _groups(run).items():
        by_gpu = {r.gpu: r for r in rs}
        for o in outliers({r.gpu: r.tflops for r in rs}, {r.gpu: r.noise for r in rs}):  # type: ignore[misc]
            r = by_gpu[o["gpu"]]
            cause = occupancy.cause(r.gpu, list(shared))
            if cause is None and r.telemetry:
                peers = [p.telemetry for p in rs if p.gpu != r.gpu and p.telemetry]
                cause = telemetry.explain(r.telemetry, peers)
            lines.append(Finding(PROBLEM, f"GPU {r.gpu} {dtype} {shape}: {o['value']:.1f} TFLOP/s, {100 * o['deficit']:.1f}% below "
                         f"the node's median {o['median']:.1f} (threshold {100 * o['threshold']:.1f}%)"
                         + (f"; {cause}" if cause else "; no clock or power cause seen: check the card")))
    for r in run.results:
        if r.series:
            d = sustained_drop(r.series, r.shape.flops)
            if d and d["drop"] > max(0.03, 3 * (r.noise or 0)):
                tel = (r.series_telemetry or {}).get("summary") or {}
                why = ", ".join(tel.get("limiting") or []) or "no throttle reason reported"
                lines.append(Finding(WARNING, f"GPU {r.gpu} {r.dtype} sustained: {d['first'] / 1e12:.1f} -> {d['last'] / 1e12:.1f} "
                             f"TFLOP/s ({100 * d['drop']:.1f}% lower) over {r.series[-1][0]:.0f} s; {why}"))
    seen: set[tuple[int, str]] = set()
    for r in run.results:  # the power cap at the default limit is normal under GEMM: not a finding
        for tel in (r.telemetry, (r.series_telemetry or {}).get("summary")):
            for concern in telemetry.concerns(tel or {}):
                if (r.gpu, concern) not in seen:
                    seen.add((r.gpu, concern))
                    lines.append(Finding(WARNING, f"GPU {r.gpu}: {concern} while measuring ({r.dtype} {r.shape})"))
    return lines


def judge(run: GemmRun) -> list[Finding]:
    """The suite's ok lines: per dtype and shape, the GPUs within noise of their median, against
    the dense peak."""
    out = []
    for (dtype, shape), rs in _groups(run).items():
        slow = outliers({r.gpu: r.tflops for r in rs}, {r.gpu: r.noise for r in rs})
        if len(rs) < 2 or slow or any(r.wrong for r in rs):
            continue
        med = statistics.median(r.tflops for r in rs)
        peaks = sorted({r.peak.value for r in rs if r.peak and r.peak.value})
        of = f" ({100 * med * 1e12 / peaks[0]:.0f}% of the {peaks[0] / 1e12:g} TFLOP/s dense peak)" \
            if len(peaks) == 1 else ""
        out.append(Finding(OK, f"{dtype} {shape}: the {len(rs)} GPUs are within max(2%, 3x noise) of their median "
                               f"{med:.1f} TFLOP/s{of}"))
    return out


def _groups(run: GemmRun) -> dict[tuple[str, Shape], list[GemmResult]]:
    """The measured (not search) results with a figure, by dtype and shape."""
    groups: dict[tuple[str, Shape], list[GemmResult]] = {}
    for r in run.results:
        if r.phase != "search" and r.tflops:
            groups.setdefault((r.dtype, r.shape), []).append(r)
    return groups


def key_figure(run: GemmRun) -> tuple[str, str]:
    """The sustained runs' medians with clocks, power and temperature, else each shape's median,
    against the dense peak."""
    figs, exps = [], []
    sustained = [r for r in run.results if r.series]
    if sustained:
        for dtype in dict.fromkeys(r.dtype for r in sustained):
            rs = [r for r in sustained if r.dtype == dtype]
            per = {
                r.gpu: statistics.median(
                    r.shape.flops / s / 1e12 for _, s in r.series if s
                )
                for r in rs
            }
            tel = [(r.series_telemetry or {}).get("summary") or {} for r in rs]
            clocks = [t["sm_hz_median"] for t in tel if t.get("sm_hz_median")]
            power = [t["power_w_max"] for t in tel if t.get("power_w_max") is not None]
            temp = [t["temp_c_max"] for t in tel if t.get("temp_c_max") is not None]
            reasons = sorted({x for t in tel for x in t.get("limiting") or []})
            low = min(per, key=per.__getitem__)
            med = statistics.median(per.values())
            text = (
                f"{dtype} sustained {max(r.series[-1][0] for r in rs):.0f} s: median {med:.1f} TFLOP/s over "
                f"{len(per)} GPU(s)"
                + (f" (lowest GPU {low}: {per[low]:.1f})" if len(per) > 1 else "")
            )
            if clocks:
                text += f"; SM clock median {statistics.median(clocks) / 1e6:.0f} MHz"
            if power:
                text += f", power up to {max(power):.0f} W"
            if temp:
                text += f", up to {max(temp):.0f} C"
            if reasons:
                text += f"; {', '.join(reasons)}"
            figs.append(text)
            peaks = sorted({r.peak.value for r in rs if r.peak and r.peak.value})
            if len(peaks) == 1:
                exps.append(
                    f"{peaks[0] / 1e12:g} TFLOP/s dense peak ({100 * med * 1e12 / peaks[0]:.0f}%)"
                )
        return "; ".join(figs), "; ".join(exps) or "-"
    for (dtype, shape), rs in _groups(run).items():
        per = {r.gpu: r.tflops for r in rs}
        med = statistics.median(per.values())
        low = min(per, key=per.__getitem__)
        figs.append(
            f"{dtype} {shape}: median {med:.1f} TFLOP/s over {len(per)} GPU(s)"
            + (f" (lowest GPU {low}: {per[low]:.1f})" if len(per) > 1 else "")
        )
        peaks = sorted({r.peak.value for r in rs if r.peak and r.peak.value})
        if len(peaks) == 1:
            exps.append(
                f"{peaks[0] / 1e12:g} TFLOP/s dense peak ({100 * med * 1e12 / peaks[0]:.0f}%)"
            )
    if not figs and any(r.best is None for r in run.results):
        figs.append(f"no valid result ({len(findings(run))} finding(s))")
    return "; ".join(figs) or "-", "; ".join(exps) or "-"
