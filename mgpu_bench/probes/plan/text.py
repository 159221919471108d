"""Figures in words: base units in the document, units chosen here (GiB, ms, GB/s, days)."""

from __future__ import annotations

import math

GIB = float(1 << 30)


def value(v, unit: str) -> str:
    """A figure with its unit, readable: bytes as GiB, seconds as ms below 10 s, B/s as GB/s."""
    if v is None:
        return "-"
    if unit == "B":
        if v >= 1024 * GIB:
            return f"{v / (1024 * GIB):.2f} TiB"
        return f"{v / GIB:.2f} GiB" if v >= 0.01 * GIB else f"{v / (1 << 20):.2f} MiB"
    if unit == "s":
        return f"{1e3 * v:.1f} ms" if v < 10 else f"{v:.1f} s" if v < 1e5 else f"{v:.3g} s"
    if unit == "B/s":
        return f"{v / 1e9:.1f} GB/s"
    if unit == "params":
        return f"{v / 1e12:.3g}T" if v >= 1e12 else f"{v / 1e9:.3g}B" if v >= 1e9 else f"{v / 1e6:.4g}M"
    if unit == "FLOP":
        return f"{v / 1e15:.4g} PFLOP" if v >= 1e15 else f"{v / 1e12:.4g} TFLOP" if v >= 1e11 else f"{v / 1e9:.4g} GFLOP"
    if unit == "FLOP/s":
        return f"{v / 1e12:.4g} TFLOP/s"
    if unit == "fraction":
        return f"{100 * v:.1f}%"
    if unit == "x":
        return f"{v:.3f}x"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.4g} {unit}"
    return f"{int(v):,} {unit}"


def count(n: float) -> str:
    """A budget: 3e11 -> '300B'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.4g}{suffix}"
    return f"{n:g}"


LONG_DAYS = 1e5  # days (274 years): beyond, three significant digits in powers of ten, never a row of digits


def days(d: float | None) -> str:
    if d is None or not math.isfinite(d):
        return "-"
    if d < 1 / 24:  # under an hour: minutes, under a minute: seconds
        return f"{1440 * d:.1f} min" if d >= 1 / 1440 else f"{86400 * d:.1f} s"
    if d < 1:
        return f"{24 * d:.1f} h"
    return f"{d:.1f} days" if d < 1000 else f"{d:,.0f} days" if d < LONG_DAYS else f"{d:.3g} days"


def rate(r: float) -> str:
    return f"{r / 1e3:.1f}k" if r >= 1e4 else f"{r:.1f}"


def samples(n: float) -> str:
    """A batch or noise scale in samples: 1,000, 48.6."""
    return f"{n:,.0f}" if n >= 100 else f"{n:.3g}"


def total_rate(r: float | None) -> str:
    """A whole job's samples or tokens per second: 8.51M, 182.2k."""
    if r is None:
        return "-"
    return f"{r / 1e9:.2f}G" if r >= 1e9 else f"{r / 1e6:.2f}M" if r >= 1e6 else rate(r)


def span(lo, hi, like, fmt) -> str:
    """'lo - hi' in the unit `fmt` chose for `like` (the central figure beside it)."""
    if lo is None or hi is None:
        return "-"
    unit = fmt(like).split(" ", 1)[1] if " " in fmt(like) else ""
    scale = {"ms": 1e3, "h": 24.0, "min": 1440.0}.get(unit, 86400.0 if unit == "s" and fmt is days else 1.0)

    def number(x: float) -> str:
        return f"{x:.1f}" if abs(x) < LONG_DAYS else f"{x:.3g}"

    return f"{number(lo * scale)} - {number(hi * scale)}"
