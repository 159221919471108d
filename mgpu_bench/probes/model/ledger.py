"""The step ledger: every second of the timed steps under one cause, the same account for
`mgpu-bench model` and the in-job StepMonitor.

Per timed step i the job's wall W_i (that of the rank whose steps took longest in all: its time is
the job's wall clock; the ranks meet in the gradient collectives, so their steps differ only in
where each one's step boundary falls) is taken apart along a chain; each cause takes its seconds before the next one looks, so that time
is counted once, under the cause that came first:

    straggler      waiting for another rank: the largest lag of a rank behind the fastest at that
                   step (straggler.lags: its longer wall, its longer time outside compute(), its
                   later arrival at the first gradient bucket). A late rank is the cause of the
                   others' wait, not the network.
    stalls         a long step's extra time over the steady-state step (stalls.threshold on the
                   walls less that lag): a checkpoint, an evaluation, a pause of the loop.
    input          the time outside compute() every rank spent (the least over the ranks): waiting
                   for the batch. The GPU idle for want of a batch is the input pipeline's.
    communication  the gradient all-reduce the backward could not hide: the same steps without
                   gradient sync against these (no_sync, the model probe's A/B), the monitor's
                   reference steps, or the last-arriving rank's marks (gradsync) where neither ran.
    host           inside compute() with the GPU idle (the profile's idle time less the input's):
                   kernel launches, synchronisations, Python. Told only where a profile ran on GPUs.
    gpu            the rest: GPU work (compute kernels; on CPU processes, the compute itself).

Each cause's seconds are capped at what is left of the step, so the shares add up to the wall clock
of the steps exactly. Per rank the same step splits into its own input, its wait for the latest
rank, the communication and its own compute. Base units: seconds and fractions.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from . import stalls as stall_rule
from .straggler import lags

CAUSES = ("straggler", "stalls", "input", "communication", "host", "gpu")
RANK_CAUSES = ("input", "waiting", "communication", "compute")
# Healthy limits of each loss, as shares of the time (the seeds: exposed communication under 10%;
# the input pipeline, long steps and an idle GPU alike; a straggler as straggler.STRAGGLER_LIMIT).
LIMITS = {"straggler": 0.05, "stalls": 0.10, "input": 0.10, "communication": 0.10, "host": 0.10}
WORDS = {
    "straggler": "waiting for another rank",
    "stalls": "long steps",
    "input": "the input pipeline",
    "communication": "exposed communication",
    "host": "host-bound (GPU idle inside compute)",
    "gpu": "GPU work",
}
METHODS = {
    "no_sync": "the same steps with and without gradient sync (no_sync())",
    "reference": "reference steps: gradient sync off, the all-reduce run after the backward and timed alone",
    "hook": "DDP's communication hook: the last bucket ready to the last all-reduce done",
    "marks": "marks on the model's tensors: the last gradient to the backward's end, of the last rank to arrive",
    "profile": "NCCL kernels with no compute kernel beside them (profiled steps)",
}


def _outside(rank: dict) -> list[float] | None:
    ph = rank["phases"]
    comp = ph.get("compute") or ([w - d for w, d in zip(ph["step"], ph["data"])] if "data" in ph else None)
    if comp is None:
        return None
    return [max(0.0, w - c) for w, c in zip(ph["step"], comp)]


def build(ranks: Sequence[dict], n: int, *, exposed_s: float | None = None, method: str | None = None,
          idle_s_per_step: float | None = None, cuda: bool = False, groups: Sequence[tuple[int, int]] = ()) -> dict:
    """The ledger of the first n aligned steps of `ranks` (their phases; sync marks where gradsync
    ran). exposed_s: the communication per step measured against a reference (no_sync or the
    monitor's reference steps), else the marks' per step; idle_s_per_step: the profile's GPU idle
    per step (None: no profile); groups: (first, end) step positions of each window (default: one).
    Returns {"seconds": {cause: s}, "shares", "wall_s", "steps", "windows": [{"first", "last",
    "shares"}], "ranks": [{"rank", "shares"}], "method", "told_host"}."""
    walls = [list(r["phases"]["step"][:n]) for r in ranks]
    outs = [_outside(r) for r in ranks]
    outside = None if any(o is None for o in outs) else [o[:n] for o in outs]
    syncs = [r.get("sync") or {} for r in ranks]
    arrival = [list(s.get("arrival") or [])[:n] for s in syncs]
    if len(ranks) < 2 or any(len(a) < n or any(x is None for x in a) for a in arrival):
        arrival = None
    lag = lags(walls, outside, arrival) if len(ranks) > 1 else [[0.0] * n]
    # the job's steps are the longest rank's (its time is the job's wall clock, as the throughput's)
    W = max(walls, key=sum)
    L = [max(lg[i] for lg in lag) for i in range(n)]
    inp = [min(o[i] for o in outside) for i in range(n)] if outside else [0.0] * n
    marks = None
    if exposed_s is None and len(ranks) > 1:
        ex = [list(s.get("exposed") or [])[:n] for s in syncs]
        if all(len(e) == n for e in ex):
            marks = [min((e[i] for e in ex if e[i] is not None), default=None) for i in range(n)]
            method = method or "marks"
    base = [w - x for w, x in zip(W, L)]
    med, least = stall_rule.threshold(base) if n >= 3 else (0.0, float("inf"))
    in_med = statistics.median(inp) if inp else 0.0
    host = max(0.0, idle_s_per_step - in_med) if idle_s_per_step is not None and cuda else 0.0
    per_step: list[dict[str, float]] = []
    for i in range(n):
        stall = base[i] - med if base[i] - med > least else 0.0
        stall_out = min(stall, max(0.0, inp[i] - in_med))
        comm = exposed_s if exposed_s is not None else (marks[i] if marks and marks[i] is not None else 0.0)
        per_step.append(_chain(W[i], (("straggler", L[i]), ("stalls", stall), ("input", inp[i] - stall_out),
                                      ("communication", comm), ("host", host))))
    out = _sum(per_step, 0, n)
    out.update(steps=n, method=method if (exposed_s is not None or marks) else None,
               told_host=idle_s_per_step is not None and cuda, cuda=cuda)
    out["windows"] = [{"first": a, "last": b - 1, "shares": _sum(per_step, a, b)["shares"]}
                      for a, b in (groups or [(0, n)]) if b > a]
    out["ranks"] = []
    comm_i = [row["communication"] for row in per_step]
    for r, rank in enumerate(ranks):
        secs = dict.fromkeys(RANK_CAUSES, 0.0)
        for i in range(n):
            left = walls[r][i]
            o = min(outside[r][i], left) if outside else 0.0
            left -= o
            wait = min(max(0.0, L[i] - lag[r][i]), left)
            left -= wait
            c = min(comm_i[i], left)
            secs["input"] += o
            secs["waiting"] += wait
            secs["communication"] += c
            secs["compute"] += left - c
        total = sum(walls[r])
        out["ranks"].append({"rank": rank.get("rank", r),
                             "shares": {k: v / total if total > 0 else 0.0 for k, v in secs.items()}})
    return out


def _chain(wall: float, claims) -> dict[str, float]:
    """One step's wall split along the chain: each cause takes its seconds from what is left (never
    below 0, never more than is left), in order; GPU work is the rest."""
    row = dict.fromkeys(CAUSES, 0.0)
    left = wall
    for cause, seconds in claims:
        x = min(max(0.0, seconds), max(0.0, left))
        row[cause] = x
        left -= x
    row["gpu"] = max(0.0, left)
    return row


def _sum(rows: list[dict], a: int, b: int) -> dict:
    secs = {c: sum(row[c] for row in rows[a:b]) for c in CAUSES}
    total = sum(secs.values())
    return {"seconds": secs, "wall_s": total, "shares": {c: v / total if total > 0 else 0.0 for c, v in secs.items()}}


def losses(ledger: dict) -> list[tuple[float, str]]:
    """The ledger's losses over their healthy limits, largest first: (share, cause)."""
    shares = ledger.get("shares") or {}
    found = [(shares.get(c) or 0.0, c) for c in LIMITS if (shares.get(c) or 0.0) > LIMITS[c]]
    return sorted(found, key=lambda x: -x[0])


def label(ledger: dict, cause: str) -> str:
    """A cause's name as the ledger's reader needs it: the compute share says what it holds."""
    if cause == "gpu":
        if not ledger.get("cuda"):
            return "compute (CPU processes)"
        if not ledger.get("told_host"):
            return "GPU work and host time (no profile tells them apart)"
    return WORDS[cause]


def line(ledger: dict) -> str:
    """One line: the wall clock of the steps and each cause's share, largest first."""
    shares = ledger["shares"]
    parts = [f"{label(ledger, c)} {100 * shares[c]:.1f}%" for c in sorted(CAUSES, key=lambda c: -shares[c])
             if shares[c] >= 0.0005 or c == "gpu"]
    how = f"; communication by {METHODS[ledger['method']]}" if ledger.get("method") in METHODS else ""
    steps = f" (steps {ledger['first']}-{ledger['last']})" if ledger.get("first") is not None else ""
    return (f"step ledger over {ledger['steps']} timed steps{steps}, {ledger['wall_s']:.2f} s: " + ", ".join(parts)
            + how)


def windows_of(index: Sequence[int], windows: Sequence[dict]) -> list[tuple[int, int]]:
    """(first, end) positions in `index` (the aligned steps' numbers) of each monitor window
    ({"first", "last"} step numbers); steps outside every window form none."""
    out = []
    for w in windows:
        pos = [k for k, i in enumerate(index) if w["first"] <= i <= w["last"]]
        if pos:
            out.append((pos[0], pos[-1] + 1))
    return out


def reference_exposed(good: list[dict]) -> dict | None:
    """From the in-job monitor's reference steps (monitor/reference.py): per reference step the
    job's wall (the longest rank's) and that wall less the all-reduce run after its backward (the
    least over the ranks: the last to arrive waits the least, its time is the all-reduce alone);
    {"step_s": the median step without communication, "steps", "wall_s": their walls in all}.
    None without at least REFERENCE_MIN of them on every rank."""
    refs = [r.get("reference") for r in good]
    if not all(refs):
        return None
    common = set.intersection(*(set(x["steps"]) for x in refs))
    rows, walls = [], []
    for i in sorted(common):
        at = [x["steps"].index(i) for x in refs]
        wall = max(x["wall_s"][k] for x, k in zip(refs, at))
        comm = min(x["comm_s"][k] for x, k in zip(refs, at))
        rows.append(max(0.0, wall - comm))
        walls.append(wall)
    if len(rows) < REFERENCE_MIN:
        return None
    return {"step_s": statistics.median(rows), "steps": len(rows), "wall_s": sum(walls)}


# Reference steps the monitor's exposed communication needs at least (fewer: the marks' figure).
REFERENCE_MIN = 3


def of_run(cuda: bool, st, good: list[dict], n: int) -> dict | None:
    """build() over every aligned timed step of a configuration (figures.StepStats `st` of `good`
    ranks), with the exposed communication measured against a reference where one ran (no_sync or
    the monitor's reference steps; else the marks' per step), the profile's GPU idle, and the
    monitor's windows."""
    d = st.derived
    exposed_s = None
    if st.comm_method in ("no_sync", "reference") and d.get("exposed_comm_share") is not None:
        exposed_s = d["exposed_comm_share"] * d["step_s"]
    prof = good[0].get("profile")
    idle = prof["idle_s"] / prof["steps"] if prof and prof.get("steps") and prof.get("window_s") else None
    index = good[0].get("steps_index")
    groups, names = (), None
    windows = good[0].get("windows")
    if index and windows:
        groups = windows_of(index[:n], windows)
    if index:
        names = list(index[:n])
    try:
        out = build(good, n, exposed_s=exposed_s, method=st.comm_method, idle_s_per_step=idle,
                           cuda=cuda, groups=groups)
    except (KeyError, TypeError, ValueError, IndexError):  # a rank without phases per step: no ledger
        return None
    if names:
        for w in out["windows"]:
            w["first"], w["last"] = names[w["first"]], names[w["last"]]
        out["first"], out["last"] = names[0], names[-1]
    return out
