"""Every rank's figures in one place, without a collective on the training's path: each rank
puts its latest window summary into the job's store (torch.distributed's, the one the process
group was formed on) at its window edges, and its whole record at finish(); rank 0 reads the
summaries at its own window edges without waiting (a rank that has not got there yet is read
at the next edge) and waits for the records at finish() (up to a timeout, then it reports the
ranks it has). No message pairs with another, so ranks whose step counts drift apart (a step
that raised on one rank) never block each other.

The straggler: in a data-parallel step the ranks meet in the gradient collectives, so their
walls are equal and the slow rank is the one the others wait for. It reaches the collectives
late: its time outside compute() (waiting for data, host work between steps) is longer than
the others', who spend the difference waiting inside compute(). Without a collective in the
step, the slow rank's wall is longer. A rank's lag at a step is the larger of the two excesses
over the fastest rank at that step; in a profiled window on GPUs also the excess of its
compute kernels' time (a slower GPU: the others wait in NCCL). The straggler is the rank with
the largest median lag, named when that is over STRAGGLER_LIMIT of the step and it is the last
rank in LATE_SHARE of the steps.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence

# A rank is named the straggler when it holds the job back by more than 5% of the median step:
# below that the lag is within what the stable window lets step times wander (the model probe's
# STABLE_TOLERANCE, 5%), so it cannot be told from noise; above it every rank of the job loses
# that share of its throughput.
STRAGGLER_LIMIT = 0.05
# ... and when it is the last rank in at least this share of the steps: noise makes each rank the
# last about as often as the others (the comm probe's straggler rule, STRAGGLER_SHARE, likewise).
LATE_SHARE = 0.75


def default_store():
    """The store the default process group was formed on (torch.distributed keeps it in
    distributed_c10d: there is no public accessor), or None."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no group, or a torch without it: the ranks are not gathered
        return None


class Exchange:
    """Keys of one monitor in the job's store: `{prefix}/w/{rank}` (the latest window summary,
    overwritten), `{prefix}/final/{rank}` (the rank's record), `{prefix}/doc` (rank 0's result
    document for the other ranks). Values are JSON."""

    def __init__(self, store, prefix: str, rank: int, world: int) -> None:
        self.store, self.prefix, self.rank, self.world = store, prefix, rank, world

    def _keys(self, kind: str) -> list[str]:
        return [f"{self.prefix}/{kind}/{r}" for r in range(self.world)]

    def put_window(self, summary: dict) -> None:
        self.store.set(f"{self.prefix}/w/{self.rank}", json.dumps(summary))

    def windows(self) -> list[dict] | None:
        """Every rank's latest window summary, or None while some rank has none yet (two round
        trips to the store: one check of all keys, one multi_get)."""
        keys = self._keys("w")
        if not self.store.check(keys):
            return None
        return [json.loads(bytes(v)) for v in self.store.multi_get(keys)]

    def put_final(self, record: dict) -> None:
        self.store.set(f"{self.prefix}/final/{self.rank}", json.dumps(record))

    def finals(self, timeout_s: float, poll_s: float = 0.05) -> list[dict | None]:
        """Every rank's record (rank order), waiting up to timeout_s for those not there yet;
        None for a rank that never put one. The keys are deleted once read."""
        keys = self._keys("final")
        got: list[dict | None] = [None] * self.world
        deadline = time.monotonic() + timeout_s
        while True:
            for r, key in enumerate(keys):
                if got[r] is None and self.store.check([key]):
                    got[r] = json.loads(bytes(self.store.get(key)))
            if all(g is not None for g in got) or time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        for key in keys + self._keys("w"):
            try:
                self.store.delete_key(key)
            except Exception:  # noqa: BLE001 - a store without delete: the keys stay, nothing breaks
                break
        return got

    def put_doc(self, doc: dict) -> None:
        self.store.set(f"{self.prefix}/doc", json.dumps(doc))

    def doc(self, timeout_s: float, poll_s: float = 0.05) -> dict | None:
        """Rank 0's result document, waiting up to timeout_s; None when it never came."""
        key = f"{self.prefix}/doc"
        deadline = time.monotonic() + timeout_s
        while not self.store.check([key]):
            if time.monotonic() > deadline:
                return None
            time.sleep(poll_s)
        return json.loads(bytes(self.store.get(key)))


def lags(walls: Sequence[Sequence[float]], outside: Sequence[Sequence[float]] | None) -> list[list[float]]:
    """Per rank and step, seconds behind the fastest rank: the larger of its wall's excess over
    the shortest wall of that step and (where compute() ran) its time outside compute's excess
    over the shortest of that step. Every rank's lists cover the same steps."""
    ranks, steps = len(walls), len(walls[0]) if walls else 0
    out = [[0.0] * steps for _ in range(ranks)]
    for i in range(steps):
        w0 = min(w[i] for w in walls)
        d0 = min(d[i] for d in outside) if outside else 0.0
        for r in range(ranks):
            lag = walls[r][i] - w0
            if outside:
                lag = max(lag, outside[r][i] - d0)
            out[r][i] = lag
    return out


def straggler(walls: Sequence[Sequence[float]], outside: Sequence[Sequence[float]] | None,
              kernels: Sequence[float | None] = (), step_s: float | None = None) -> dict | None:
    """The slowest rank over the steps given (the stable window, every rank's steps aligned):
    {"rank", "lag_s" (median seconds behind the fastest rank per step), "lag_share" (of the
    median step), "by" ("arrival": its time outside compute(); "wall": its step is longer;
    "kernels": its compute kernels ran longer in the profiled window), "limit", "named",
    "per_rank_lag_s"}. `kernels`: per rank, seconds of compute kernels per profiled step (None
    where not profiled). None for fewer than two ranks or no steps."""
    if len(walls) < 2 or not walls[0]:
        return None
    per_step = lags(walls, outside)
    median_lag = [statistics.median(x) for x in per_step]
    wall_excess = [statistics.median(x) for x in lags(walls, None)]
    step = step_s or statistics.median(max(w[i] for w in walls) for i in range(len(walls[0])))
    by = ["wall" if wall_excess[r] >= median_lag[r] else "arrival" for r in range(len(walls))]
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
    return {"rank": r, "lag_s": median_lag[r], "lag_share": share, "by": by[r], "limit": STRAGGLER_LIMIT,
            "last_share": last, "named": share > STRAGGLER_LIMIT and last >= LATE_SHARE, "per_rank_lag_s": median_lag}


_BY = {"arrival": "it reaches the step's collectives late (its time outside compute(): waiting for data, host work "
                  "between steps, is longer) and the others wait for it inside compute()",
       "wall": "its steps are longer than the others'",
       "kernels": "its compute kernels run longer in the profiled steps (a slower or throttled GPU): the others wait "
                  "for it in NCCL"}


def straggler_text(s: dict, where: str) -> str:
    """The finding's words: the rank, where it runs, its lag, the limit and the likely cause."""
    line = (f"rank {s['rank']}{where} lags the fastest rank by {1e3 * s['lag_s']:.1f} ms per step "
            f"({100 * s['lag_share']:.1f}% of the step")
    if s["named"]:
        return f"straggler: {line}; healthy is under {100 * s['limit']:.0f}%): {_BY[s['by']]}"
    if s["lag_share"] > s["limit"]:
        return (f"no straggler: the slowest rank, {line}), is the last in only {100 * s['last_share']:.0f}% of the "
                f"steps (one is named when it is in {100 * LATE_SHARE:.0f}%): the ranks take turns, noise")
    return f"no straggler: the slowest rank, {line}), is under the {100 * s['limit']:.0f}% that names one"
