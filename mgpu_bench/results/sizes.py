"""Byte sizes as users write them: ``8``, ``1K``, ``64M``, ``1G`` (binary: K = 1024)."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from mgpu_bench.core.errors import InputError

MAX_SIZE = 1 << 50  # 1 PiB: anything larger is a typo, not a buffer
MAX_SIZES = 1000  # points in one sweep

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# ASCII digits only (re.ASCII): Python's \d and Decimal() read '１' as 1.
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE | re.ASCII)


def show_number(x: float) -> str:
    """A number as the user gave it: 2 (not 2.0), 1.0000001 (not 1), 1e+308 (the shortest text
    that reads back as the same float)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return repr(x) if isinstance(x, float) else str(x)


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864. K/M/G/T are powers of 1024; ``KiB``/``KB`` spell the same."""
    if text.strip().startswith("-") and _SIZE.match(text.strip()[1:]):
        raise InputError(f"size '{text.strip()}' is negative: a size is a byte count above 0, like 8, 1K or 64M")
    m = _SIZE.match(text)
    if not m:
        if not text.strip():
            raise InputError("a size is missing: write a byte count like 8, 1K, 64M or 1G")
        raise InputError(f"cannot read size '{text}': write a byte count like 8, 1K, 64M or 1G")
    value = Decimal(m.group(1)) * _UNITS[m.group(2).upper()]  # exact, unlike float
    if value != int(value):
        raise InputError(f"size '{text}' is not a whole number of bytes")
    if value > MAX_SIZE:
        raise InputError(f"size '{text}' is above 1 PiB: check the unit")
    return int(value)


def parse_sizes(spec: str, factor: float | None = None, step: str | None = None) -> list[int]:
    """A range ``"1M-1G"`` (multiplied by ``factor``, default 2, or increased by ``step``
    bytes) or a list ``"8,1K,64M"``. Sizes are returned in the given (list) or increasing
    (range) order; a range includes its end when the progression lands on it."""
    spec = spec.strip()
    if factor is not None and step is not None:
        raise InputError("give either --factor or --step, not both")
    if factor is not None and not (factor > 1 and math.isfinite(factor)):
        raise InputError(f"--factor must be a finite number greater than 1 (got {show_number(factor)})")
    if spec.startswith("-"):
        raise InputError(f"--sizes '{spec}' starts with a negative size: sizes are byte counts above 0; a range is "
                         "written low-high, like 1K-1M")
    if "-" in spec and "," not in spec:
        lo_text, _, hi_text = spec.partition("-")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo <= 0:
            raise InputError(f"the range '{spec}' must start above 0 bytes")
        if hi < lo:
            raise InputError(f"the range '{spec}' ends below its start: write it as {hi_text}-{lo_text}")
        sizes = []
        if step is not None:
            if step.strip().startswith("-"):
                raise InputError(f"--step '{step.strip()}' is negative: give a positive byte count such as 1M")
            inc = parse_size(step)
            if inc <= 0:
                raise InputError(f"--step must be a positive byte count (got '{step}')")
            if (hi - lo) // inc + 1 > MAX_SIZES:
                raise InputError(f"--step {step} over {spec} gives more than {MAX_SIZES} sizes: use a larger step")
            size = lo
            while size <= hi:
                sizes.append(size)
                size += inc
        else:
            f = 2.0 if factor is None else factor
            size = lo
            while size <= hi:
                sizes.append(size)
                if len(sizes) > MAX_SIZES:
                    raise InputError(f"--factor {show_number(f)} over {spec} gives more than {MAX_SIZES} sizes: use a "
                                     "larger factor")
                grown = size * f  # a float; beyond any size for a huge factor (1e308 x 1 MiB is inf)
                if not math.isfinite(grown) or grown >= hi + 1:  # int(grown) would pass the end
                    break
                size = max(size + 1, int(grown))  # whole bytes, always increasing
        return sizes
    if step is not None or factor is not None:
        raise InputError("--factor and --step apply to a range like 1M-1G, not to a list")
    parts = spec.split(",")
    if not spec or all(not p.strip() for p in parts):
        raise InputError("--sizes is empty: give a range like 1M-1G or a list like 8,1K,64M")
    if any(not p.strip() for p in parts):
        raise InputError(f"--sizes '{spec}' has an empty entry between its commas: write a list like 8,1K,64M")
    sizes = [parse_size(part) for part in parts]
    if any(s <= 0 for s in sizes):
        raise InputError("sizes must be above 0 bytes")
    if len(sizes) > MAX_SIZES:
        raise InputError(f"more than {MAX_SIZES} sizes in --sizes")
    return sizes


def format_bytes(n: float) -> str:
    """Binary units where exact, as nccl-tests users read them: 1048576 -> '1 MiB',
    1536 -> '1.50 KiB'; a size that no unit writes exactly in two decimals stays in bytes
    (67108860 -> '67108860 B'), so that a rounded size never looks like a round one."""
    n = int(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            if n % scale == 0:
                return f"{n // scale} {unit}"
            if (n * 100) % scale == 0:
                return f"{n / scale:.2f} {unit}"
            break
    return f"{n} B"


def format_gib(n: float) -> str:
    """An amount of memory, approximately: 24107499520 -> '22.45 GiB'."""
    return f"{n / (1 << 30):.2f} GiB"


def format_gbs(bytes_per_s: float) -> str:
    """bytes/s as GB/s (10^9), without the unit: one decimal from 10 GB/s up, two below."""
    v = bytes_per_s / 1e9
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def parse_duration(text: str) -> float:
    """'60s', '2m', '90' (seconds), '1h' -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h)?\s*", text.lower())
    if not m:
        raise InputError(f"--duration '{text}' is not a duration: write e.g. 60s, 5m or 1h")
    value = float(m.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, None: 1}[m.group(2)]
    if not (0 < value <= 7 * 24 * 3600):
        raise InputError(f"--duration '{text}' must be more than 0 and at most a week")
    return value
