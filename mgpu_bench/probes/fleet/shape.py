"""The fleet result document's declared shape (mgpu_bench.results.schema), checked on every read: the
fleet document and the per-node documents (scope "node") alike. Import-light: the history
validates stored documents through it without loading a backend."""

from __future__ import annotations

from mgpu_bench.results.schema import MAX_BYTES, MAX_RANKS, STATUS, AnyValue, Bool, Int, List, Map, Num, Obj, Str

# What the headline, the verdict table, the heatmap and the per-node documents read. Nodes are
# numbered by their place in "nodes"; pairings, the nodes to drain and the suspects name nodes by
# that number.
_INDEX = Int(0, MAX_RANKS)
_SAMPLES = List(Num(null=True), null=True)
_FIGURE = Obj({"busbw": Num(0, null=True), "seconds": _SAMPLES, "samples": _SAMPLES, "ranks": Int(0, null=True),
               "wrong": Int(0, null=True)}, what="a figure", null=True)
GPU = Obj({
    "local": _INDEX, "rank": Int(0, MAX_RANKS, null=True), "flops_per_s": Num(0, null=True),
    "copy_bytes_per_s": Num(0, null=True), "flops_samples": _SAMPLES, "copy_samples": _SAMPLES,
    "health": List(Obj({"text": Str(), "severity": Str(("problem", "warning", "ok"))}, required=("text",),
                       what="a health finding"), null=True),
}, required=("local",), what="a node's GPU")
NODE = Obj({
    "index": _INDEX, "node": Str(max_len=1024), "host": Str(max_len=1024), "node_rank": Int(0, null=True),
    "ranks": List(Int(0, MAX_RANKS), null=True), "locals": List(Int(0, MAX_RANKS), null=True),
    "model": Str(max_len=200, null=True), "gpus": List(GPU, null=True), "answered": Bool(), "lost": Str(null=True),
}, required=("index", "node", "host"), what="a node")
PAIRING = Obj({
    "a": _INDEX, "b": _INDEX, "round": Int(0, MAX_RANKS), "rails": Map(Obj(_FIGURE.fields, what="a rail's figure"), keys=r"\d{1,6}", null=True,
                                                                       keys_what="a local rank"),
    "allreduce": _FIGURE,
}, required=("a", "b", "round"), what="a pairing")
SUSPECT = Obj({"what": Str(max_len=100), "node": Int(-1, MAX_RANKS), "part": Int(-1, MAX_RANKS, null=True),
               "text": Str(), "severity": Str(("problem", "warning")), "drain": Bool()},
              required=("what", "node", "part", "text"), what="a suspect", closed=True)
_STAT = List(Num(), min_len=2, max_len=2, null=True)  # [median, noise] (analyse.spread)
VERDICTS = Obj({
    "suspects": List(SUSPECT), "drain": List(_INDEX, null=True),
    "stats": Obj({"gpu": Map(_STAT), "sendrecv": _STAT, "allreduce": _STAT}, required=("gpu",), what="the stats"),
    "world": Obj({"busbw": Num(0, null=True), "reference": Num(0, null=True), "slow": Bool(null=True)},
                 what="the world verdict", null=True),
}, required=("suspects",), what="the verdicts", null=True)


def _numbering(doc) -> tuple[str, str] | None:
    """Nodes numbered by their place; every node a pairing, a drain entry or a suspect names
    exists (a node document holds one node, under its own number)."""
    nodes = doc.get("nodes") or []
    for i, n in enumerate(nodes):
        if n["index"] != i:
            return f"nodes[{i}].index", f"is {n['index']}, not {i} (nodes are numbered by their place)"
    known = {n["index"] for n in nodes} | ({doc["node"]["index"]} if isinstance(doc.get("node"), dict) else set())
    for i, p in enumerate(doc.get("pairings") or []):
        for end in ("a", "b"):
            if nodes and p[end] not in known:
                return f"pairings[{i}].{end}", f"is {p[end]}, not a node of this pass (0 to {len(nodes) - 1})"
    verdicts = doc.get("verdicts") or {}
    for i, d in enumerate(verdicts.get("drain") or []):
        if d not in known:
            return f"verdicts.drain[{i}]", f"is {d}, not a node of this pass"
    if doc.get("scope") == "node" and not isinstance(doc.get("node"), dict):
        return "node", "missing (a node document holds its node)"
    if doc.get("scope") != "node" and "nodes" not in doc:
        return "nodes", "missing (a fleet document holds every node's figures)"
    if doc.get("scope") != "node" and verdicts and "stats" not in verdicts:
        return "verdicts.stats", "missing (the verdicts of a pass hold the fleet's medians and noise)"
    return None


SCHEMA = Obj({
    "tool_version": Str(max_len=100), "created": Str(), "command": AnyValue(), "status": STATUS, "scope": Str(("node",)), "baseline_scope": Str(("host",)), "nodes": List(NODE),
    "node": NODE, "pairings": List(PAIRING, null=True), "world": _FIGURE, "intra": List(AnyValue(), null=True),
    "isolation": Obj({"found": List(List(_INDEX)), "between": List(List(_INDEX)), "levels": List(AnyValue())},
                     what="the isolation", null=True),
    "schedule": List(List(List(_INDEX)), null=True), "phase_seconds": Map(Num(0), null=True),
    "config": Obj({"size": Int(0, MAX_BYTES), "copy_bytes": Int(0, MAX_BYTES)}, what="a fleet config", null=True),
    "verdicts": VERDICTS, "findings": List(Str(), null=True),
    "drained": List(Obj({"node": Str(max_len=1024), "reason": Str(), "error": Str(null=True)}, required=("node", "reason"),
                        what="a drained node"), null=True),
}, required=("tool_version", "created", "command", "status", "verdicts"), what="a fleet result",
    rule=_numbering)
