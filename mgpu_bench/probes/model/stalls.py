"""Long steps in a run of training steps: found, placed and described.

A stall is a step longer than the steady-state step (the median) by more than STALL_MIN_SHARE of
it and by more than STALL_NOISE_K robust spreads of the steps (so that the jitter of a healthy
loop is never one): a checkpoint saved every 10th step, an evaluation, a logging flush, garbage
collection, a slow batch. Each one is placed where its extra time went:

    outside  outside compute(): waiting for the batch, host work between the steps
    host     inside compute() with the GPU idle: it had caught up with the host (the host was held
             up: a synchronisation, garbage collection, a checkpoint written from the loop)
    gpu      inside compute() with the GPU busy: the host was ahead of it by about the extra
             time (more GPU work in that step, a slower GPU)
    compute  inside compute() where no GPU timeline tells the two apart (CPU processes)

The GPU's side comes from its queue: at each mark the monitor records a CUDA event and the host
clock; the event's time on the GPU minus the host's, less the least such difference seen in the
window, is how far the GPU was behind the host there (0: it had caught up and was waiting). A
stall whose compute() ends with the GPU less than half its extra time behind the host had the
GPU waiting for the host.

The description says how many, how long, how often (periodic with its period, or irregular),
the share of the measured time they cost (their extra time over the steady-state step / the
elapsed time) and where they fall. Base units: seconds.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Sequence

# A step is long when it exceeds the median step by more than a quarter of it: a GC pause or a
# slow batch of a few percent is the noise a stable window allows (STABLE_TOLERANCE, 5%), while a
# checkpoint or an evaluation costs a step's worth or more ...
STALL_MIN_SHARE = 0.25
# ... and by more than 5 robust spreads (1.4826 x MAD) of the steps, so a jittery loop (CPU
# processes sharing cores) is not read as stalling: under a normal model 5 sigma is one step in
# 3.5 million.
STALL_NOISE_K = 5.0
# Stalls are periodic when at least this share of the large ones (and 3 at least) fall every p-th
# step, p the most common gap between them: a save every 10th step stays periodic beside stray
# long steps of other causes (told apart: "6 of them, 2 other"). Large: at least LARGE_SHARE of
# the longest one's extra time (a checkpoint's 0.5 s, not a scheduler's 15 ms hiccup on a busy host).
PERIODIC_SHARE = 0.75
LARGE_SHARE = 0.5
# At most this many stalls are kept by step index per rank and run (their count and time are
# always whole).
KEPT_EVENTS = 2000
WHERE = ("outside", "host", "gpu", "compute")
WHERE_WORDS = {
    "outside": "outside compute(): waiting for the batch or host work between the steps",
    "host": "inside compute() with the GPU idle: the host held it up (a synchronisation, garbage collection, a "
            "checkpoint written from the loop)",
    "gpu": "inside compute() with the GPU busy: more GPU work in those steps, or a slower GPU",
    "compute": "inside compute()",
}


def _mad(xs: Sequence[float], med: float) -> float:
    return 1.4826 * statistics.median(abs(x - med) for x in xs) if xs else 0.0


def threshold(walls: Sequence[float]) -> tuple[float, float]:
    """(the steady-state step: the median, the least excess over it that makes a stall)."""
    med = statistics.median(walls)
    return med, max(STALL_MIN_SHARE * med, STALL_NOISE_K * _mad(walls, med))


def events(walls: Sequence[float], outside: Sequence[float] | None, inside: Sequence[float] | None,
           queue: Sequence[float | None] | None = None, index: Sequence[int] | None = None,
           ref: tuple[float, float] | None = None) -> list[list]:
    """The stalls of one rank's steps: [step index, excess seconds over the median, where].
    outside / inside: each step's time outside and inside compute() (None: not told apart, every
    stall "compute"); queue: how far the GPU was behind the host at each step's compute end (None
    per step or for all: no GPU timeline); index: the steps' numbers (default 0, 1, ...); ref: the
    (median, least excess) to judge against (default: these steps' own)."""
    n = len(walls)
    if n < 3:
        return []
    med, least = ref or threshold(walls)
    out_med = statistics.median(outside) if outside else 0.0
    in_med = statistics.median(inside) if inside else 0.0
    found = []
    for i, w in enumerate(walls):
        excess = w - med
        if excess <= least:
            continue
        where = "compute"
        if outside is not None and inside is not None:
            if outside[i] - out_med >= inside[i] - in_med:
                where = "outside"
            elif queue is not None and queue[i] is not None:
                where = "gpu" if queue[i] >= 0.5 * excess else "host"
        found.append([index[i] if index is not None else i, excess, where])
    return found


def tally(whole: dict | None, found: Sequence[Sequence]) -> dict:
    """Running sums of stalls for a run that keeps only KEPT_EVENTS of them one by one: count,
    excess_s, max_excess_s, and per place its count and seconds."""
    whole = whole or {"count": 0, "excess_s": 0.0, "max_excess_s": 0.0, "where": dict.fromkeys(WHERE, 0),
                      "where_s": dict.fromkeys(WHERE, 0.0)}
    for e in found:
        x = float(e[1])
        whole["count"] += 1
        whole["excess_s"] += x
        whole["max_excess_s"] = max(whole["max_excess_s"], x)
        whole["where"][e[2]] = whole["where"].get(e[2], 0) + 1
        whole["where_s"][e[2]] = whole["where_s"].get(e[2], 0.0) + x
    return whole


def describe(found: Sequence[Sequence], steps: int, elapsed_s: float, step_s: float, whole: dict | None = None) -> dict:
    """What the stalls of a run of `steps` measured steps, `elapsed_s` seconds in all, cost
    against the steady-state step `step_s`: {count, steps, excess_s (their extra time in all),
    share (of elapsed_s), median_excess_s, max_excess_s, period (steps between them when
    periodic, else None), on_period (how many of them fall on it), every (mean steps between
    them), where (count per place), main (the place of the most extra time), indices (their step
    numbers, the first KEPT_EVENTS)}. `whole`:
    tally()'s sums of every stall where `found` holds only the first of them."""
    found = sorted(found, key=lambda e: e[0])
    sums = whole if whole is not None and whole.get("count", 0) > len(found) else tally(None, found)
    out: dict = {"count": len(found), "steps": steps, "step_s": step_s, "excess_s": 0.0, "share": 0.0,
                 "median_excess_s": None, "max_excess_s": None, "period": None, "on_period": None, "every": None,
                 "where": dict.fromkeys(WHERE, 0), "main": None, "indices": [int(e[0]) for e in found[:KEPT_EVENTS]]}
    if not found:
        return out
    out["count"], out["excess_s"], out["max_excess_s"] = sums["count"], sums["excess_s"], sums["max_excess_s"]
    out["share"] = out["excess_s"] / elapsed_s if elapsed_s > 0 else 0.0
    out["median_excess_s"] = statistics.median(float(e[1]) for e in found)
    out["where"] = dict(sums["where"])
    out["main"] = max((k for k in sums["where_s"] if sums["where"].get(k)), key=lambda k: sums["where_s"][k])
    idx = [int(e[0]) for e in found]
    if len(idx) >= 2:
        out["every"] = (idx[-1] - idx[0]) / (len(idx) - 1)
    top = max(float(e[1]) for e in found)
    large = [e for e in found if float(e[1]) >= LARGE_SHARE * top]
    big = [int(e[0]) for e in large]
    if len(big) >= 3:
        gap = Counter(b - a for a, b in itertools.pairwise(big)).most_common(1)[0][0]
        if gap > 1:
            residue, best = Counter(i % gap for i in big).most_common(1)[0]  # on one residue: every gap-th step
            if best >= PERIODIC_SHARE * len(big):
                on = [float(e[1]) for e in large if int(e[0]) % gap == residue]
                rest = [float(e[1]) for e in found if not (int(e[0]) % gap == residue and float(e[1]) >= LARGE_SHARE * top)]
                out.update(period=gap, on_period=best, period_excess_s=statistics.median(on),
                           other_excess_s=statistics.median(rest) if rest else None)
    return out


def text(s: dict) -> str | None:
    """The stalls in words, or None when there are none: "6 long steps of 60 (every 10th step,
    0.50 s longer each), outside compute(): ..." (their cost is the caller's)."""
    if not s or not s.get("count"):
        return None
    n = s["count"]
    if s.get("period"):
        on = s.get("on_period") or n
        head = f"{on} long step{'s' if on != 1 else ''} of {s['steps']} every {_nth(s['period'])} step " \
               f"({_seconds(s.get('period_excess_s') or s['median_excess_s'])} longer each)"
        if n > on:
            head += f" and {n - on} other{'s' if n - on != 1 else ''} ({_seconds(s.get('other_excess_s') or 0.0)} each)"
    else:
        every = s.get("every")
        how = ("once" if not every else "one after another" if every < 1.5 else
               f"irregular, about one every {every:.0f} steps")
        most = s["max_excess_s"]
        head = (f"{n} long step{'s' if n != 1 else ''} of {s['steps']} ({how}, {_seconds(s['median_excess_s'])} longer "
                "each" + (f", at most {_seconds(most)}" if n > 1 and most > 1.5 * s["median_excess_s"] else "") + ")")
    return f"{head}, {_where_text(s)}"


def _seconds(x: float) -> str:
    return f"{x:.2f} s" if x >= 0.1 else f"{1e3 * x:.1f} ms"


def cost_text(s: dict) -> str | None:
    """text() with the share of the time the stalls cost."""
    line = text(s)
    return None if line is None else f"{line}; they cost {100 * s['share']:.1f}% of the time"


def _where_text(s: dict) -> str:
    counts = {k: v for k, v in (s.get("where") or {}).items() if v}
    main = s.get("main") or next(iter(counts), "compute")
    line = WHERE_WORDS.get(main, main)
    if s.get("rank") is not None:
        line += f" (rank {s['rank']})"
    others = [f"{v} {k}" for k, v in counts.items() if k != main]
    return line + (f"; also {', '.join(others)}" if others else "")


_SUFFIX = {1: "st", 2: "nd", 3: "rd"}


def _nth(k: int) -> str:
    """10 -> '10th', 2 -> '2nd', 21 -> '21st', 12 -> '12th'."""
    return f"{k}{'th' if 10 <= k % 100 <= 20 else _SUFFIX.get(k % 10, 'th')}"


def queue_depths(gpu_s: Sequence[float], host_s: Sequence[float]) -> list[float]:
    """How far the GPU was behind the host at each mark: (GPU time - host time) less the least
    such difference (both clocks' times relative to any one origin each, seconds)."""
    diffs = [g - h for g, h in zip(gpu_s, host_s)]
    if not diffs:
        return []
    low = min(diffs)
    return [d - low for d in diffs]
