"""The order of the fleet pass: rounds of disjoint node pairs, and the splits that isolate a slow
world collective. Pure functions of the node count and a seed, so every rank computes the same
plan, and benchmarks/fleet_sim.py can drive them with modelled measurements.

Why this schedule. A node is judged by its pairings: slow with every partner is the node (or its
host side: PCIe, CPU, all its NICs); slow with one partner while both are fine elsewhere is the
path between them. So each node needs several distinct partners, all nodes measured at once:

- Every round is a perfect matching (every node in exactly one pair; with an odd count one node
  rests, a different one each round), so a round costs one pair measurement's time whatever
  the fleet's size: the pairs run concurrently on disjoint nodes.
- The rounds are those of the circle method (a one-factorization of the complete graph) over a
  seeded random order of the nodes: no pair meets twice, and a node's partners are spread over
  the fleet rather than its rank neighbours.
- R rounds give each node R partners. A bad node is slow in all R of its pairings; each of its
  partners is slow in one. The decision (analyse.py) names a node slow in more than half of its
  pairings and explains its partners' single slow pairing by it. With k bad nodes among N, a good
  node meets two or more of them in R random rounds with probability about C(R,2) (k/N)^2, and
  even then the explaining-away names only the bad ones. A false suspect needs a good node to
  measure slow by chance in more than half of its R pairings: with a per-pairing false rate p
  (beyond 3 robust sigmas, p ~ 0.003) that is about C(R, R/2+1) p^(R/2+1), under 1e-6 for R >= 4.
- So R need not grow with the fleet for one bad node; it grows as ceil(log2 N) (capped at N-1,
  at least 4) so that several bad nodes, and a bad node's rails, are each seen in enough pairings
  while the pass stays short: 10 rounds at 1024 nodes, 14 at 16384.

The world collective is measured once; when it is slow and no node or rail explains it, the
world is split into halves, each half measured concurrently, the slow half split again: about
log2 N levels to the slowest group (isolate()).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence


def default_rounds(nodes: int) -> int:
    """max(4, ceil(log2 N)) rounds, at most N - 1 (every other node once)."""
    if nodes < 2:
        return 0
    return min(nodes - 1, max(4, math.ceil(math.log2(nodes))))


def pairing_rounds(nodes: int, rounds: int, seed: int = 0) -> list[list[tuple[int, int]]]:
    """`rounds` rounds of disjoint pairs of node indices 0..nodes-1 (each pair as (low, high));
    a node without a partner in a round rests (odd counts)."""
    order = list(range(nodes))
    random.Random(seed).shuffle(order)
    slots: list[int | None] = [*order, None] if nodes % 2 else order
    n = len(slots)
    out = []
    for r in range(min(rounds, n - 1)):
        rest = slots[1:]
        turned = rest[r % (n - 1):] + rest[:r % (n - 1)]  # rotate every slot but the first
        line = [slots[0], *turned]
        pairs = []
        for i in range(n // 2):
            a, b = line[i], line[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        out.append(sorted(pairs))
    return out


def halves(group: Sequence[int]) -> list[list[int]]:
    """A group of nodes split in two, in order (the first half the larger by one at most)."""
    mid = (len(group) + 1) // 2
    return [list(group[:mid]), list(group[mid:])]


def isolate(nodes: Sequence[int], measure: Callable[[list[list[int]]], list[float]], reference: float,
            slow: Callable[[float, float], bool], smallest: int = 2) -> dict:
    """Binary isolation of a slow collective: measure the halves of every slow group at once
    (measure(groups) -> one figure per group), keep the slow ones, stop at `smallest` nodes.
    -> {"levels": [[(group, figure, slow)], ...], "found": the smallest slow groups, "between":
    slow groups whose halves were both fine (the fault lies on the path between the halves)}."""
    levels: list[list[tuple[list[int], float, bool]]] = []
    found: list[list[int]] = []
    between: list[list[int]] = []
    current = [list(nodes)]
    while current:
        groups = [h for g in current for h in halves(g) if len(h) >= smallest]
        if not groups:
            found += current
            break
        figures = measure(groups)
        level = [(g, f, slow(f, reference)) for g, f in zip(groups, figures, strict=True)]
        levels.append(level)
        nxt = []
        for parent in current:
            kids = [x for x in level if set(x[0]) <= set(parent)]
            bad = [x[0] for x in kids if x[2]]
            if not bad:
                between.append(parent)
            for g in bad:
                (nxt if len(g) > smallest else found).append(g)
        current = nxt
    return {"levels": levels, "found": found, "between": between}
