"""One rank of a launcher's job (torchrun, srun, mpirun) sweeping collectives, whatever the backend.

Every rank runs the same requests; for each, the world communicator is measured, then on more
than one node the intra-node and inter-node communicators (launch.scopes). After each
measurement the ranks exchange their raw seconds (an all-gather on the job's control group), so
every rank knows at once whether any rank failed and all stop together; rank 0 combines the
ranks of each communicator into the raw dict a single-process session returns (per-rank burst
means and samples; measurement.CommMeasurement takes the slowest rank per iteration) and hands it
on. The backends differ only in `measure`: the native CommSession, or torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mgpu_bench.errors import MgpuError, portable
from mgpu_bench.launch import Group, Member
from mgpu_bench.measurement import CommMeasurement, CommRequest

SCOPES = ("world", "intra-node", "inter-node")

# measure(request, group or None for the world, this rank's place in it, its size) -> this
# rank's {"counts", "iters", "batch", "burst", "samples", "wrong", "estimate"}.
MeasureFn = Callable[[CommRequest, Group | None, int, int], dict]
# emit(request index, scope, group or None, raw dict for CommMeasurement.from_raw)
EmitFn = Callable[[int, str, Group | None, dict], None]


class RankFailure(MgpuError):
    """Another rank's measurement failed; carries that rank's own exception."""

    def __init__(self, rank: int, error: BaseException) -> None:
        super().__init__(f"rank {rank}: {error}")
        self.rank, self.error = rank, error


def sweep(requests: Sequence[CommRequest], me: Member, members: Sequence[Member], groups: Sequence[Group],
          measure: MeasureFn, all_gather: Callable[[object], list], emit: EmitFn) -> None:
    """Runs every request on every scope in order. A failure on any rank raises on every rank:
    the failing rank's own exception there, RankFailure (naming it) on the others; Ctrl-C is
    not caught."""
    mine = {g.scope: g for g in groups if me.rank in g.ranks}
    scopes = ["world"] + [s for s in SCOPES[1:] if any(g.scope == s for g in groups)]
    for index, req in enumerate(requests):
        for scope in scopes:
            group = None if scope == "world" else mine.get(scope)
            result: tuple = ("idle", None)
            if scope == "world" or group is not None:
                place, size = (me.rank, len(members)) if group is None else (group.ranks.index(me.rank),
                                                                            len(group.ranks))
                try:
                    result = ("ok", measure(req, group, place, size))
                except (KeyboardInterrupt, SystemExit):
                    raise
                except Exception as exc:  # noqa: BLE001 - shared with the other ranks, then raised
                    result = ("error", portable(exc))
                    own = exc
            gathered = all_gather(result)
            failed = [(r, res[1]) for r, res in enumerate(gathered) if res[0] == "error"]
            if failed:
                if result[0] == "error":
                    raise own
                raise RankFailure(*failed[0])
            if me.rank != 0:
                continue
            if scope == "world":
                emit(index, scope, None, combine([g[1] for g in gathered]))
            else:
                for g in (g for g in groups if g.scope == scope):
                    emit(index, scope, g, combine([gathered[r][1] for r in g.ranks]))


def combine(per_rank: list[dict]) -> dict:
    """The ranks of one communicator (in its rank order) as one raw dict."""
    first = per_rank[0]
    n = min(len(r["samples"]) for r in per_rank)  # equal: iters and batch are agreed in a communicator
    return {
        "counts": dict(first["counts"]),
        "iters": int(first["iters"]),
        "batch": int(first["batch"]),
        "burst_seconds": [float(r["burst"]) for r in per_rank],
        "samples": np.asarray([list(r["samples"])[:n] for r in per_rank], dtype=float).reshape(len(per_rank), n),
        "wrong": [int(r["wrong"]) for r in per_rank],
        "warmup_seconds_per_iter": float(first["estimate"]),
    }


# -- the straggler report ------------------------------------------------------------------------

# A communicator (node or rail) is named when its busbw is this far below the median of its
# peers in the same scope, op and size, in at least STRAGGLER_SHARE of the sizes measured.
GROUP_GAP = 0.10
# In a synchronising collective the rank that starts late waits least, so it measures the
# shortest time; it is named when it measures this much less than the slowest rank...
RANK_GAP = 0.10
# ... in at least this share of the measurements (and at least MIN_MEASUREMENTS of them).
STRAGGLER_SHARE = 0.75
MIN_MEASUREMENTS = 3


def stragglers(measurements: Sequence[CommMeasurement], hosts: Sequence[str] | None = None) -> list[str]:
    """Findings naming the slow node or rail (communicators of one scope compared with each other)
    and the rank that arrives late (per-rank times within the world communicator)."""
    out = []
    by_key: dict[tuple, list[CommMeasurement]] = {}
    for m in measurements:
        if m.spec.scope != "world":
            by_key.setdefault((m.spec.scope, m.spec.op, m.spec.inplace, m.spec.bytes), []).append(m)
    slow: dict[tuple[str, str], list[float]] = {}  # (scope, group) -> gaps where it stood out
    seen: dict[str, int] = {}
    for (scope, *_), ms in by_key.items():
        if len(ms) < 2:
            continue
        seen[scope] = seen.get(scope, 0) + 1
        median = float(np.median([m.busbw for m in ms]))
        for m in ms:
            gap = 1 - m.busbw / median if median > 0 else 0.0
            if gap > GROUP_GAP:
                slow.setdefault((scope, m.spec.group), []).append(gap)
    for (scope, group), gaps in sorted(slow.items()):
        total = seen[scope]
        if total >= MIN_MEASUREMENTS and len(gaps) >= STRAGGLER_SHARE * total:
            what = "NVLink/PCIe inside that node" if scope == "intra-node" else "the NIC of that local rank"
            out.append(f"{scope} {group}: busbw {100 * float(np.median(gaps)):.0f}% below its peers' median in "
                       f"{len(gaps)} of {total} measurements: check {what}")
    world = [m for m in measurements if m.spec.scope == "world" and len(m.burst_seconds) > 1]
    if len(world) >= MIN_MEASUREMENTS:
        late: dict[int, list[float]] = {}
        for m in world:
            b = np.asarray(m.burst_seconds)
            r = int(b.argmin())
            gap = 1 - float(b[r] / b.max())
            if gap > RANK_GAP:
                late.setdefault(r, []).append(gap)
        for r, gaps in sorted(late.items()):
            if len(gaps) >= STRAGGLER_SHARE * len(world):
                where = f" on {hosts[r]}" if hosts and r < len(hosts) else ""
                out.append(f"rank {r}{where} measures {100 * float(np.median(gaps)):.0f}% less time per call than "
                           f"the slowest rank in {len(gaps)} of {len(world)} measurements: it reaches each "
                           "collective late and the others wait for it (a busy host CPU, a slower GPU or "
                           "its PCIe/NIC path)")
    return out
