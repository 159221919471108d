"""The straggler: the rank the others wait for, in a data-parallel job (the model probe's ranks and
the in-job monitor's alike).

In a data-parallel step the ranks meet in the gradient collectives, so their walls are equal and
the slow rank is the one the others wait for. It reaches the collectives late, in one of two ways:
its time outside compute() (waiting for data, host work between steps) is longer than the others',
who spend the difference waiting inside compute(); or its compute before the collectives is
slower (a slower or throttled GPU, more work on that rank, a host held up inside the forward), so
it reaches the first gradient bucket later after entering compute() (arrival: gradsync's marks,
where the DDP communication hook ran). Without a collective in the step, the slow rank's wall is
longer. A rank's lag at a step is the largest of those excesses over the fastest rank at that step;
in a profiled window on GPUs also the excess of its compute kernels' time (a slower GPU: the others
wait in NCCL). The straggler is the rank with the largest median lag, named when that is over
STRAGGLER_LIMIT of the step and it is the last rank in LATE_SHARE of the steps.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

# A rank is named the straggler when it holds the job back by more than 5% of the median step:
# below that the lag is within what the stable window lets step times wander (the model probe's
# STABLE_TOLERANCE, 5%), so it cannot be told from noise; above it every rank of the job loses
# that share of its throughput.
STRAGGLER_LIMIT = 0.05
# ... and when it is the last rank in at least this share of the steps: noise makes each rank the
# last about as often as the others (the comm probe's straggler rule, STRAGGLER_SHARE, likewise).
LATE_SHARE = 0.75
# A rank late in a subset of steps only (every k-th, or at random): its lag in a step counts when it
# exceeds the steps' median lag by more than STRAGGLER_LIMIT of the step and INTERMITTENT_K robust
# spreads (1.4826 x MAD) of the lags, as stalls.py judges a long step; the rank is named when the
# time its late steps cost (their lag over the median lag) is over STRAGGLER_LIMIT of the time.
INTERMITTENT_K = 5.0


def lags(walls: Sequence[Sequence[float]], outside: Sequence[Sequence[float]] | None,
         arrival: Sequence[Sequence[float | None]] | None = None) -> list[list[float]]:
    """Per rank and step, seconds behind the fastest rank: the largest of its wall's excess over
    the shortest wall of that step, (where compute() ran) its time outside compute's excess over
    the shortest of that step, and (where gradsync marked it) its arrival's excess over the
    earliest of that step. Every rank's lists cover the same steps."""
    ranks, steps = len(walls), len(walls[0]) if walls else 0
    out = [[0.0] * steps for _ in range(ranks)]
    for i in range(steps):
        w0 = min(w[i] for w in walls)
        d0 = min(d[i] for d in outside) if outside else 0.0
        a = [x[i] for x in arrival] if arrival else []
        a0 = min(a) if a and None not in a else None
        for r in range(ranks):
            lag = walls[r][i] - w0
            if outside:
                lag = max(lag, outside[r][i] - d0)
            if a0 is not None:
                lag = max(lag, a[r] - a0)
            out[r][i] = lag
    return out


def straggler(walls: Sequence[Sequence[float]], outside: Sequence[Sequence[float]] | None,
              kernels: Sequence[float | None] = (), step_s: float | None = None,
              arrival: Sequence[Sequence[float | None]] | None = None,
              index: Sequence[int] | None = None) -> dict | None:
    """The slowest rank over the steps given (the stable window, every rank's steps aligned):
    {"rank", "lag_s" (median seconds behind the fastest rank per step), "lag_share" (of the
    median step), "by" ("arrival": its time outside compute(); "compute": it reaches the
    gradient collectives later after entering compute(); "wall": its step is longer; "kernels":
    its compute kernels ran longer in the profiled window), "limit", "named", "per_rank_lag_s",
    "outside_lag_s" and "compute_lag_s" (the straggler's median excess outside compute() and in
    its compute before the collectives; None where not measured)}. `kernels`: per rank, seconds
    of compute kernels per profiled step (None where not profiled); `arrival`: per rank and step,
    seconds from compute() start to its first gradient bucket (gradsync); index: the steps' numbers.
    "intermittent" holds the rank late in a subset of the steps, by more than the steps' usual lag
    (intermittent()); where no rank lags in most steps and it is named, it is the straggler, "by"
    "intermittent"; where one does, both are said (straggler_text, cause_text). None for fewer
    than two ranks or no steps."""
    if len(walls) < 2 or not walls[0]:
        return None
    if arrival is not None and any(x is None for a in arrival for x in a):
        arrival = None  # a step some rank did not mark: the arrival is not told for the window
    per_step = lags(walls, outside, arrival)
    median_lag = [statistics.median(x) for x in per_step]
    wall_excess = [statistics.median(x) for x in lags(walls, None)]
    out_excess = [statistics.median(x) for x in lags([[0.0] * len(w) for w in walls], outside)] if outside else None
    in_excess = ([statistics.median(x) for x in lags([[0.0] * len(w) for w in walls], None, arrival)]
                 if arrival else None)
    step = step_s or statistics.median(max(w[i] for w in walls) for i in range(len(walls[0])))
    by = []
    for r in range(len(walls)):
        parts = {"wall": wall_excess[r], "arrival": out_excess[r] if out_excess else -1.0,
                 "compute": in_excess[r] if in_excess else -1.0}
        by.append(max(parts, key=lambda k: (parts[k], k == "wall")))
    known = [k for k in kernels if k is not None]
    if len(known) == len(walls):
        k0 = min(known)
        for r, k in enumerate(known):
            if k - k0 > median_lag[r]:
                median_lag[r], by[r] = k - k0, "kernels"
    r = max(range(len(walls)), key=lambda i: median_lag[i])
    share = median_lag[r] / step if step > 0 else 0.0
    steps = len(walls[0])
    last = sum(1 for i in range(steps) if max(range(len(walls)), key=lambda q: per_step[q][i]) == r) / steps
    if by[r] == "kernels":
        last = 1.0  # one figure per rank over the profiled window
    named = share > STRAGGLER_LIMIT and last >= LATE_SHARE
    out = {"rank": r, "lag_s": median_lag[r], "lag_share": share, "by": by[r], "limit": STRAGGLER_LIMIT,
           "last_share": last, "named": named, "per_rank_lag_s": median_lag,
           "outside_lag_s": out_excess[r] if out_excess else None,
           "compute_lag_s": in_excess[r] if in_excess else None}
    # Late steps on top of the steps' usual lag: alone (the rank keeps pace otherwise) or beside a rank
    # behind in every step (a loaded host can hold one rank back throughout): both are said then.
    found = intermittent(per_step, [max(w[i] for w in walls) for i in range(steps)], step, index)
    if found is not None:
        out["intermittent"] = found
        if found["named"] and not named:
            out.update(rank=found["rank"], named=True, by="intermittent")
    return out


def intermittent(per_step: Sequence[Sequence[float]], walls: Sequence[float], step_s: float,
                 index: Sequence[int] | None = None) -> dict | None:
    """A rank late in a subset of the steps: per step the latest rank's lag (per_step: lags()),
    the steps where one rank is late by more than the median lag plus the larger of
    STRAGGLER_LIMIT of the step and INTERMITTENT_K robust spreads; the rank whose late steps cost
    most: {"rank", "steps" (how many), "of", "indices" (their step numbers), "every" (mean steps
    between them), "period" (when at least LATE_SHARE of them fall every p-th step), "lag_s" (its
    median lag in them), "cost_s", "cost_share" (their lag over the median lag / the steps' wall
    clock), "named" (cost_share over STRAGGLER_LIMIT)}; None when no step is late."""
    from collections import Counter

    ranks, n = len(per_step), len(per_step[0]) if per_step else 0
    if ranks < 2 or n < 5:
        return None
    top = [max(range(ranks), key=lambda q: per_step[q][i]) for i in range(n)]
    lag = [per_step[top[i]][i] for i in range(n)]
    med = statistics.median(lag)
    spread = 1.4826 * statistics.median(abs(x - med) for x in lag)
    bar = med + max(STRAGGLER_LIMIT * step_s, INTERMITTENT_K * spread)
    late: dict[int, list[int]] = {}
    for i in range(n):
        if lag[i] > bar:
            late.setdefault(top[i], []).append(i)
    if not late:
        return None
    total = sum(walls)
    cost = {r: sum(lag[i] - med for i in steps) for r, steps in late.items()}
    r = max(cost, key=lambda q: cost[q])
    steps = late[r]
    idx = [int(index[i]) if index is not None else i for i in steps]
    out = {"rank": r, "steps": len(steps), "of": n, "indices": idx[:200], "every": None, "period": None,
           "lag_s": statistics.median(lag[i] for i in steps), "cost_s": cost[r],
           "cost_share": cost[r] / total if total > 0 else 0.0}
    if len(idx) >= 2:
        out["every"] = (idx[-1] - idx[0]) / (len(idx) - 1)
    # the period from the large ones (at least half the largest lag: a save every 5th step beside a
    # busy host's stray late steps, as stalls.py finds a stall's period)
    top_lag = max(lag[i] for i in steps)
    big = [j for j, i in zip(idx, steps) if lag[i] >= 0.5 * top_lag]
    if len(big) >= 3:
        gap = Counter(b - a for a, b in itertools.pairwise(big)).most_common(1)[0][0]
        residue, on = Counter(i % gap for i in big).most_common(1)[0] if gap > 1 else (0, 0)
        if gap > 1 and on >= LATE_SHARE * len(big):
            out["period"], out["on_period"] = gap, sum(1 for i in idx if i % gap == residue)
    out["named"] = out["cost_share"] > STRAGGLER_LIMIT
    return out


_BY = {"arrival": "it reaches the step's collectives late (its time outside compute(): waiting for data, host work "
                  "between steps, is longer) and the others wait for it inside compute()",
       "compute": "its compute before the gradient all-reduce is slower: it reaches the first gradient bucket later "
                  "after entering compute() (a slower or throttled GPU, more work on that rank, a host held up in its "
                  "forward) and the others wait for it inside compute()",
       "wall": "its steps are longer than the others'",
       "kernels": "its compute kernels run longer in the profiled steps (a slower or throttled GPU): the others wait "
                  "for it in NCCL"}


def _nth(k: int) -> str:
    from .stalls import _nth as nth

    return nth(k)


def intermittent_text(x: dict, where: str) -> str:
    """A rank late in some steps: how often, by how much, what it costs."""
    how = (f"every {_nth(x['period'])} step" if x.get("period") else
           f"irregular, about one in {x['every']:.0f}" if x.get("every") else "once")
    if x.get("period") and x.get("on_period") is not None and x["on_period"] < x["steps"]:
        how += f"; {x['steps'] - x['on_period']} of them off it"
    return (f"rank {x['rank']}{where} is late in {x['steps']} of {x['of']} steps ({how}), "
            f"{1e3 * x['lag_s']:.1f} ms behind the fastest rank each time: the others' wait costs "
            f"{100 * x['cost_share']:.1f}% of the time")


def cause_text(s: dict) -> str:
    """A named straggler in the verdict's words: who, by how much, why (its place is the finding's)."""
    x = s.get("intermittent")
    if s.get("by") == "intermittent" and x:
        return intermittent_text(x, "")
    return f"rank {s['rank']} lags the fastest rank by {1e3 * s['lag_s']:.1f} ms per step: {_BY[s['by']]}" + _also(s, "")


def _also(s: dict, where: str) -> str:
    """A named intermittent straggler beside a rank behind in every step: the second cause's words."""
    x = s.get("intermittent")
    if not (x and x.get("named") and s.get("by") != "intermittent"):
        return ""
    return f"; on top of that, {intermittent_text(x, where if x['rank'] == s['rank'] else '')}"


def straggler_text(s: dict, where: str) -> str:
    """The finding's words: the rank, where it runs, its lag, the limit and the likely cause."""
    x = s.get("intermittent")
    if s["named"] and s.get("by") == "intermittent" and x:
        return (f"straggler, intermittent: {intermittent_text(x, where)} (healthy is under "
                f"{100 * s['limit']:.0f}%); in its other steps it keeps pace")
    line = (f"rank {s['rank']}{where} lags the fastest rank by {1e3 * s['lag_s']:.1f} ms per step "
            f"({100 * s['lag_share']:.1f}% of the step")
    if s["named"]:
        split = ""
        if s.get("compute_lag_s") is not None and s.get("outside_lag_s") is not None:
            split = (f" (in compute before the collectives {1e3 * s['compute_lag_s']:.1f} ms, outside compute() "
                     f"{1e3 * s['outside_lag_s']:.1f} ms)")
        return f"straggler: {line}; healthy is under {100 * s['limit']:.0f}%): {_BY[s['by']]}{split}{_also(s, where)}"
    if x:  # late steps whose cost stays under the limit
        return (f"no straggler: {intermittent_text(x, where)}, under the {100 * s['limit']:.0f}% that names one")
    if s["lag_share"] > s["limit"]:
        return (f"no straggler: the slowest rank, {line}), is the last in only {100 * s['last_share']:.0f}% of the "
                f"steps (one is named when it is in {100 * LATE_SHARE:.0f}%) and no rank is late in a subset of "
                "them: the ranks take turns, noise")
    return f"no straggler: the slowest rank, {line}), is under the {100 * s['limit']:.0f}% that names one"
