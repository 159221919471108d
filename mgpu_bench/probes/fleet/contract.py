"""The fleet pass told to Slurm (--drain): each node to drain is drained with the reason that named
it, "mgpu-bench: fleet: <the deciding figure>", through scontrol (mgpu_bench.core.slurm)."""

from __future__ import annotations

import re
from collections.abc import Mapping


def reason(node: Mapping, suspects: list[Mapping]) -> str:
    """The first problem that drains `node`, without the node's own name in front:
    "fleet: rank 0: GEMM 1.20 GFLOP/s, 60% below the fleet median 3.00 GFLOP/s"."""
    mine = [s for s in suspects if s["node"] == node["index"] and s.get("drain", True) and s["severity"] == "problem"]
    text = mine[0]["text"] if mine else "named by the fleet pass"
    for name in (node["node"], node["host"]):
        if text.startswith(name):
            text = text[len(name):].lstrip(": ")
            break
    return "fleet: " + re.sub(r" \([^()]*\)$", "", text)  # without the closing "(cpu; threshold 20%)"


def drain(doc: Mapping) -> list[dict]:
    """Drains every node of the document's drain list; [{node, reason, error}] in that order
    (error: None, or the one line naming the fix). A node known only as host#rank (several
    launcher nodes on one host) has no Slurm name to drain."""
    from mgpu_bench.core import slurm

    verdicts = doc.get("verdicts") or {}
    nodes = {n["index"]: n for n in doc.get("nodes") or []}
    out = []
    for i in verdicts.get("drain") or []:
        n = nodes[i]
        name = n["node"]
        why = slurm.reason(reason(n, verdicts.get("suspects") or []))
        if "#" in name:
            out.append({"node": name, "reason": why, "error": f"{name} is not a Slurm node name (launcher nodes that "
                                                              "share one host): nothing drained"})
            continue
        try:
            slurm.drain(name, why)
            out.append({"node": name, "reason": why, "error": None})
        except slurm.SlurmError as exc:
            out.append({"node": name, "reason": why, "error": str(exc)})
    return out
