"""The launcher's node hierarchy (ranks.scopes), the cross-rank combination and the
straggler report (joined), on plain data."""

from __future__ import annotations

import numpy as np
import pytest

from mgpu_bench.core.ranks import Group, Member, scopes
from mgpu_bench.probes.comm import joined
from mgpu_bench.results.measurement import CommMeasurement, CommSpec


def members(per_node: list[int]) -> list[Member]:
    out, rank = [], 0
    for node, n in enumerate(per_node):
        for local in range(n):
            out.append(Member(rank, f"gpu{node:02d}", node, local, f"cuda:{local}"))
            rank += 1
    return out


def test_one_node_has_no_hierarchy():
    assert scopes(members([8])) == []


def test_two_nodes_of_four_give_two_intra_and_four_inter_communicators():
    groups = scopes(members([4, 4]))
    assert [g for g in groups if g.scope == "intra-node"] == [
        Group("intra-node", "node 0 (gpu00)", (0, 1, 2, 3)), Group("intra-node", "node 1 (gpu01)", (4, 5, 6, 7))]
    assert [g.ranks for g in groups if g.scope == "inter-node"] == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_uneven_nodes_leave_out_communicators_of_one_rank():
    groups = scopes(members([2, 1]))
    assert [(g.scope, g.ranks) for g in groups] == [("intra-node", (0, 1)), ("inter-node", (0, 2))]


def test_combine_keeps_every_rank_and_the_slowest_sets_the_pace():
    per_rank = [{"counts": {"bytes": 1 << 20}, "iters": 40, "batch": 2, "burst": b, "samples": s, "wrong": 0,
                 "estimate": 1e-4} for b, s in ((1e-4, [1e-4] * 20), (1.2e-4, [1.3e-4] * 20))]
    raw = joined.combine(per_rank)
    assert raw["burst_seconds"] == [1e-4, 1.2e-4] and raw["samples"].shape == (2, 20)
    spec = CommSpec("allreduce", "float32", "sum", 1 << 20, 1 << 20, 1 << 18, 2, False, "native",
                    ("cuda:0", "cuda:1"))
    m = CommMeasurement.from_raw(spec, raw, True)
    assert m.time_s == pytest.approx(1.2e-4) and m.median_s == pytest.approx(1.3e-4)


def measurement(op: str, size: int, burst: list[float], scope="world", group="") -> CommMeasurement:
    n = len(burst)
    spec = CommSpec(op, "float32", "sum", size, size, size // 4, n, False, "native",
                    tuple(f"cuda:{i}" for i in range(n)), scope=scope, group=group)
    return CommMeasurement(spec, 20, 1, tuple(burst), np.asarray([[b] * 20 for b in burst]), (0,) * n)


def test_a_slow_node_is_named_and_an_even_cluster_is_not():
    sizes = [1 << 24, 1 << 26, 1 << 28, 1 << 30]
    even = [measurement("allreduce", s, [s / 300e9] * 2, "intra-node", f"node {n}") for s in sizes for n in range(4)]
    assert joined.stragglers(even) == []
    slow = [measurement("allreduce", s, [s / (240e9 if n == 2 else 300e9)] * 2, "intra-node", f"node {n}")
            for s in sizes for n in range(4)]
    (finding,) = joined.stragglers(slow)
    assert finding.startswith("intra-node node 2: busbw 20% below its peers' median in 4 of 4")


def test_the_rank_that_arrives_late_measures_least_and_is_named():
    late = [measurement("allreduce", s, [1e-3, 1e-3, 0.8e-3, 1e-3]) for s in (1 << 20, 1 << 22, 1 << 24)]
    (finding,) = joined.stragglers(late, ["a", "a", "b", "b"])
    assert finding.startswith("rank 2 on b measures 20% less time per call than the slowest rank in 3 of 3")
    assert joined.stragglers([measurement("allreduce", 1 << 20, [1e-3, 0.97e-3, 1e-3, 1e-3])] * 3) == []


def test_mpi_round_robin_placement_is_numbered_by_host():
    from mgpu_bench.core.ranks import nodes_by_host

    # mpirun --map-by node over hosts a, b: rank // ranks-per-node would put a and b in one "node"
    ms = [Member(r, "ab"[r % 2], r // 2, r // 2, f"cuda:{r // 2}") for r in range(4)]
    fixed = nodes_by_host(ms)
    assert [m.node for m in fixed] == [0, 1, 0, 1]
    intra = [g for g in scopes(fixed) if g.scope == "intra-node"]
    assert [g.ranks for g in intra] == [(0, 2), (1, 3)] and intra[0].label == "node 0 (a)"
