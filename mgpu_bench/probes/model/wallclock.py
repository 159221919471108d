"""A run's figures from its ranks' steps, as the wall clock sees them: each rank's totals over every
timed step, its long steps (stalls.py) and the job's, the gradient all-reduce's figures from
DDP's communication hook (gradsync.py), and the straggler over the stable window (straggler.py).
figures.analyse() puts them into a configuration's StepStats."""

from __future__ import annotations

import statistics

from . import stalls as stall_rule


def rank_totals(rank: dict, samples_per_step: int, tokens_per_sample: int | None) -> dict:
    """A rank's whole measured run: {steps, samples, tokens, elapsed_s, compute_s}. The in-job
    monitor gives its own (its windows' sums: steps it no longer keeps per step count too); the
    model probe's ranks keep every step, at `samples_per_step` samples each."""
    if rank.get("totals"):
        return rank["totals"]
    ph = rank["phases"]
    walls = ph["step"]
    comp = ph.get("compute") or ([w - d for w, d in zip(walls, ph["data"])] if "data" in ph else walls)
    n = len(walls)
    return {"steps": n, "samples": samples_per_step * n,
            "tokens": samples_per_step * n * tokens_per_sample if tokens_per_sample else None,
            "elapsed_s": sum(walls), "compute_s": sum(comp)}


def _rank_stalls(rank: dict, totals: dict, step_s: float) -> dict:
    """stalls.describe of one rank: the monitor's events found at its window edges, else found in
    the rank's steps (outside compute: the step less its compute phase)."""
    found = rank.get("stall_events")
    if found is None:
        ph = rank["phases"]
        comp = ph.get("compute") or ([w - d for w, d in zip(ph["step"], ph["data"])] if "data" in ph else None)
        outside = [w - c for w, c in zip(ph["step"], comp)] if comp is not None else None
        found = stall_rule.events(ph["step"], outside, comp, rank.get("queue"), rank.get("steps_index"))
    return stall_rule.describe(found, int(totals["steps"]), float(totals["elapsed_s"]), step_s, rank.get("stall_sums"))


def job_stalls(good: list[dict], totals: list[dict], step_s: float) -> dict:
    """The stalls of the rank whose stalls say most: the one with stalls outside compute() (the
    others wait for it inside compute() in the same steps), else the one with the most extra time."""
    found = [_rank_stalls(r, t, step_s) for r, t in zip(good, totals)]
    i = max(range(len(found)), key=lambda k: (found[k]["main"] == "outside", found[k]["excess_s"], -k))
    out = found[i]
    if len(good) > 1 and out["main"] == "outside":
        out["rank"] = good[i].get("rank", i)
    return out


def sync_figures(good: list[dict], start: int, end: int, step_s: float, world: int) -> dict:
    """From the gradient marks (gradsync: the marks on the model's tensors, or the communication
    hook's) over the stable window: per step the exposed communication of the rank that waited
    least (the last to arrive: its wait is the communication alone) and, where the hook timed it
    (in these steps, or in a short pass after them: "sync_hooked"), that rank's all-reduce time
    and bytes; their medians, the share of the steady-state step and the bus bandwidth: bytes x
    2(n-1)/n / the all-reduce time (the ring all-reduce's factor, as nccl-tests' busbw)."""
    syncs = [r.get("sync") for r in good]
    if world < 2 or not all(syncs):
        return {}
    exposed, busy, nbytes = [], [], []
    for i in range(start, end):
        row = [(sy["exposed"][i], sy["busy"][i], sy["bytes"][i]) for sy in syncs
               if i < len(sy.get("exposed") or []) and sy["exposed"][i] is not None]
        if len(row) == len(syncs):
            e, b, n = min(row, key=lambda x: x[0])
            exposed.append(e)
            if b is not None and n is not None:
                busy.append(b)
                nbytes.append(n)
    hooked = [r.get("sync_hooked") for r in good]
    if not busy and all(hooked):  # the marks timed the steps; a short pass in the hook timed the all-reduce itself
        for i in range(min(len(h["exposed"]) for h in hooked)):
            row = [(h["exposed"][i], h["busy"][i], h["bytes"][i]) for h in hooked]
            if all(x[1] is not None for x in row):
                _, b, n = min(row, key=lambda x: x[0])
                busy.append(b)
                nbytes.append(n)
    if not exposed:
        return {}
    out = {"hook_exposed_s": statistics.median(exposed)}
    out["hook_exposed_share"] = min(1.0, out["hook_exposed_s"] / step_s)
    if busy:
        out["sync_busy_s"], out["sync_bytes"] = statistics.median(busy), statistics.median(nbytes)
        if out["sync_busy_s"] > 0:
            out["sync_algbw"] = out["sync_bytes"] / out["sync_busy_s"]
            out["sync_busbw"] = out["sync_algbw"] * 2 * (world - 1) / world
    return out


def straggler_of(good: list[dict], start: int, end: int, step_s: float) -> dict | None:
    """straggler.straggler over the steps start:end, with the ranks' arrival where gradsync marked
    it; the rank's own number in "rank"."""
    from .straggler import straggler

    def col(r, key):
        ph = r["phases"]
        if key == "outside":
            comp = ph.get("compute") or ([w - x for w, x in zip(ph["step"], ph["data"])] if "data" in ph else None)
            return [w - c for w, c in zip(ph["step"], comp)][start:end] if comp is not None else None
        return ph["step"][start:end]

    outside = [col(r, "outside") for r in good]
    arrival = [(r.get("sync") or {}).get("arrival") for r in good]
    index = good[0].get("steps_index")
    s = straggler([col(r, "step") for r in good], None if any(o is None for o in outside) else outside,
                  [_kernel_s(r.get("profile")) for r in good], step_s,
                  [a[start:end] for a in arrival] if all(arrival) else None,
                  index[start:end] if index and len(index) >= end else list(range(start, end)))
    if s is not None:
        s["rank"] = good[s["rank"]].get("rank", s["rank"])
        if s.get("intermittent"):
            s["intermittent"]["rank"] = good[s["intermittent"]["rank"]].get("rank", s["intermittent"]["rank"])
    return s


def _kernel_s(profile: dict | None) -> float | None:
    """Seconds per profiled step with a compute kernel running (busy, less NCCL alone)."""
    if not profile or not profile.get("window_s") or not profile.get("steps"):
        return None
    return (profile["busy_s"] - profile["nccl_exposed_s"]) / profile["steps"]
