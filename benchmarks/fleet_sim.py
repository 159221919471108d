"""The fleet pass's schedule and decision logic at scale, driven by modelled measurements.

    python3 benchmarks/fleet_sim.py [--trials 100] [--sizes 16,64,256,1024,4096,16384] [--noise 0.03]

Each node has RAILS NICs of RATE bytes/s; a pairing's sendrecv on rail r runs at the slower of
the two ends (times a link factor) with lognormal noise of --noise (relative); the pair's
allreduce at the slower of the two nodes' slowest rails. Faults, planted at random per trial: a
bad node (every rail at half rate), a bad rail (one NIC of a node at half rate), or a bad link
(two random nodes at half rate between them). The world allreduce is a ring over the nodes in
index order, as slow as its slowest hop; isolation splits it as schedule.isolate does.

Printed per size and fault: the link-pass rounds, the share of trials that named exactly the
planted parts (found), trials that named a part that was not planted (false), and the modelled
wall time of the pass at that size from --round-s (one round's time measured on real ranks) and
--node-s (the node pass)."""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mgpu_bench.probes.fleet import analyse, schedule

RAILS = 8
RATE = 48e9  # NDR 400 Gb/s per rail, about 48 GB/s reached


def simulate(n: int, fault: str, count: int, noise: float, seed: int, rounds_: int = 0) -> dict:
    rng = random.Random(f"faults {seed}")  # independent of the schedule's seed (it shuffles with the same number)
    npr = np.random.default_rng(seed)
    rail_rate = np.full((n, RAILS), RATE)
    bad_links: set[frozenset] = set()
    planted: set[tuple] = set()
    picked = rng.sample(range(n), min(n, 2 * count))
    for i in range(count):
        node = picked[i]
        if fault == "node":
            rail_rate[node, :] *= 0.5
            planted.add(("node", node))
        elif fault == "rail":
            r = rng.randrange(RAILS)
            rail_rate[node, r] *= 0.5
            planted.add(("rail", node, r))
        else:
            other = picked[count + i]
            bad_links.add(frozenset((node, other)))
            planted.add(("link", *sorted((node, other))))

    def factor(a: int, b: int) -> float:
        return 0.5 if frozenset((a, b)) in bad_links else 1.0

    rounds = schedule.pairing_rounds(n, rounds_ or schedule.default_rounds(n), seed)
    pairings = []
    for k, pairs in enumerate(rounds):
        for a, b in pairs:
            f = factor(a, b)
            base = np.minimum(rail_rate[a], rail_rate[b]) * f
            rails = base * np.exp(npr.normal(0, noise, RAILS))
            allreduce = base.min() * 0.92 * math.exp(npr.normal(0, noise))
            pairings.append({"round": k, "a": a, "b": b, "rails": {str(r): {"busbw": float(v)} for r, v in
                                                                     enumerate(rails)},
                             "allreduce": {"busbw": allreduce}})

    def ring(group: list[int]) -> float:
        hops = [min(rail_rate[a].min(), rail_rate[b].min()) * factor(a, b)
                for a, b in zip(group, group[1:] + group[:1], strict=True)]
        return min(hops) * 0.92 * math.exp(npr.normal(0, noise))

    world = {"busbw": ring(list(range(n)))}
    nodes = [{"index": i, "node": f"n{i:05d}", "model": "H200", "gpus": [], "answered": True} for i in range(n)]
    doc = {"nodes": nodes, "pairings": pairings, "world": world}
    slow, _w, _ref = analyse.world_slow(world, pairings)
    levels = 0
    explained = [x for x in analyse.judge(doc)["suspects"] if x["what"] in ("node", "rail", "gpu")]
    if slow and not explained:  # as the pass does: isolate only what no suspect explains
        med, spread_ = analyse.spread([p["allreduce"]["busbw"] for p in pairings])
        doc["isolation"] = schedule.isolate(list(range(n)), lambda gs: [ring(g) for g in gs], med,
                                            lambda f, r: analyse.is_slow("world", f, r, spread_))
        levels = len(doc["isolation"]["levels"])
    verdicts = analyse.judge(doc)
    named = set()
    for s in verdicts["suspects"]:
        if s["what"] == "node":
            named.add(("node", s["node"]))
        elif s["what"] == "rail":
            named.add(("rail", s["node"], s["part"]))
        elif s["what"] == "link":
            named.add(("link", *sorted((s["node"], s["part"]))))
        elif s["what"] == "group" and len(doc["isolation"]["found"]) + len(doc["isolation"]["between"]):
            pass  # a group: the isolation's answer, judged below
    groups = [set(g) for g in (doc.get("isolation") or {}).get("found", []) + (doc.get("isolation") or {}).get(
        "between", [])]
    if fault == "link":  # a link on the world's ring is found when a slow group holds both ends
        for p in planted:
            if p not in named and any({p[1], p[2]} <= g and len(g) <= 4 for g in groups):
                named.add(p)
    return {"rounds": len(rounds), "found": planted <= named, "false": bool(named - planted), "levels": levels}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--sizes", default="16,64,256,1024,4096,16384")
    ap.add_argument("--noise", type=float, default=0.03, help="relative noise of one measurement")
    ap.add_argument("--round-s", type=float, default=2.0, help="wall seconds of one link round")
    ap.add_argument("--node-s", type=float, default=30.0, help="wall seconds of the node pass")
    a = ap.parse_args()
    print(f"noise {100 * a.noise:.0f}% per measurement, {RAILS} rails of {RATE / 1e9:.0f} GB/s, half-rate faults; "
          f"round {a.round_s:g} s, node pass {a.node_s:g} s")
    print("| nodes | fault | trials | rounds | found | false suspects | isolation levels | modelled wall |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.sizes.split(",")):
        trials = a.trials if n <= 1024 else max(10, a.trials // 10)
        cases = [("node", 1, 0), ("node", 3, 0), ("rail", 1, 0), ("link", 1, 0)]
        if n <= 256:
            cases.append(("link", 1, n - 1))  # --rounds N-1: every pair meets once
        for fault, count, rounds_ in cases:
            res = [simulate(n, fault, count, a.noise, seed, rounds_) for seed in range(trials)]
            rounds = res[0]["rounds"]
            levels = max(r["levels"] for r in res)
            wall = a.node_s + (rounds + 1 + levels) * a.round_s
            print(f"| {n} | {count} bad {fault} | {trials} | {rounds} | {sum(r['found'] for r in res)} | "
                  f"{sum(r['false'] for r in res)} | {levels} | {wall / 60:.1f} min |", flush=True)


if __name__ == "__main__":
    main()
