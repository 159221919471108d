"""fleet's headline metrics. A fleet document gives the fleet's own:

    fleet.nodes / fleet.suspect_nodes                            samples (counts)
    fleet.world.allreduce_busbw                                  B/s

and each node's document (stored under the node's own host, so that `history trend --host` and
`compare` follow one node) gives that node's:

    fleet.gpu{l}.tflops              FLOP/s, torch.matmul on local GPU l
    fleet.gpu{l}.copy_bandwidth      B/s, read plus written
    fleet.rail{r}.sendrecv_busbw     B/s, the median over the node's pairings on rail r
    fleet.pair_allreduce_busbw       B/s, the median over the node's pairings
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric


def node_metrics(node: Mapping, run_or_doc) -> dict:
    """{"node", "ranks", "metrics"} of one node from a FleetRun or a fleet document."""
    pairings = run_or_doc.pairings if hasattr(run_or_doc, "pairings") else run_or_doc.get("pairings") or []
    verdicts = run_or_doc.verdicts if hasattr(run_or_doc, "verdicts") else run_or_doc.get("verdicts")
    i = node["index"]
    base = {"node": node["node"]}
    out = []
    for g in node.get("gpus") or []:
        labels = {**base, "gpu": str(g["local"])}
        if g.get("flops_per_s"):
            out.append(Metric(f"fleet.gpu{g['local']}.tflops", g["flops_per_s"], "FLOP/s", "higher",
                              tuple(g.get("flops_samples") or ()), labels))
        if g.get("copy_bytes_per_s"):
            out.append(Metric(f"fleet.gpu{g['local']}.copy_bandwidth", g["copy_bytes_per_s"], "B/s", "higher",
                              tuple(g.get("copy_samples") or ()), labels))
    rails: dict[str, list[float]] = {}
    pair = []
    for pr in pairings:
        if i in (pr["a"], pr["b"]):
            for r, fig in (pr.get("rails") or {}).items():
                if fig.get("busbw"):
                    rails.setdefault(r, []).append(fig["busbw"])
            if (pr.get("allreduce") or {}).get("busbw"):
                pair.append(pr["allreduce"]["busbw"])
    for r, values in sorted(rails.items()):
        out.append(Metric(f"fleet.rail{r}.sendrecv_busbw", statistics.median(values), "B/s", "higher", tuple(values),
                          {**base, "rail": r}))
    if pair:
        out.append(Metric("fleet.pair_allreduce_busbw", statistics.median(pair), "B/s", "higher", tuple(pair), base))
    if verdicts is not None:
        bad = any(s["node"] == i and s["severity"] == "problem" for s in verdicts["suspects"])
        out.append(Metric("fleet.suspect", 1.0 if bad else 0.0, "fraction", "lower", (), base))
    return {"node": node["node"], "ranks": list(node.get("ranks") or []), "metrics": out}


def headline(doc: Mapping) -> list[Metric]:
    if doc.get("scope") == "node":
        return node_metrics(doc["node"], doc)["metrics"]
    out = [Metric("fleet.nodes", float(len(doc.get("nodes") or [])), "samples", "higher")]
    verdicts = doc.get("verdicts") or {}
    if verdicts:
        out.append(Metric("fleet.suspect_nodes", float(len(verdicts.get("drain") or [])), "samples", "lower"))
    w = doc.get("world") or {}
    if w.get("busbw"):
        out.append(Metric("fleet.world.allreduce_busbw", w["busbw"], "B/s", "higher", tuple(w.get("samples") or ())))
    return out
