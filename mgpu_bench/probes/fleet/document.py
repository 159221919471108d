"""The fleet result document, and one document per node for the history.

The fleet document holds every node's figures (per GPU: GEMM and copy samples, health), every
pairing's per-rail sendrecv and allreduce seconds, the world allreduce, the isolation levels and
the verdicts (analyse.judge: derived, kept beside the data as the other probes keep their
findings). Each node's document (kind "fleet", "scope": "node") holds that node and its pairings
under the node's own host, with "baseline_scope": "host": a baseline per node. The declared
shape of both is shape.py's.
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.document import envelope, status

from .analyse import judge


def as_doc(run) -> dict:
    """The measured parts of a FleetRun as the document holds them (what analyse.judge reads)."""
    return {"nodes": run.nodes, "pairings": run.pairings, "intra": run.intra, "world": run.world,
            "isolation": run.isolation, "schedule": run.schedule}


def document(run, environment: dict, command: list[str] | None = None) -> dict:
    c = run.config
    body = as_doc(run)
    verdicts = run.verdicts or judge(body)
    return {
        **envelope("fleet", environment, command),
        "status": status(run.stopped, run.stop_message),
        "config": {"size": c.size, "iters": c.iters, "warmup": c.warmup, "rounds": len(run.schedule),
                   "seed": c.seed, "timeout_s": c.timeout_s, "gemm_n": c.gemm_n, "copy_bytes": c.copy_bytes,
                   "phases": list(c.phases), "device": c.device},
        **body,
        "phase_seconds": run.phase_seconds,
        "notes": run.notes,
        "wall_seconds": run.wall_seconds,
        "verdicts": verdicts,
        "findings": [s["text"] for s in verdicts["suspects"]],
    }


def node_documents(doc: Mapping) -> list[dict]:
    """One document per node that answered, under its own host."""
    out = []
    verdicts = doc.get("verdicts") or {"suspects": []}
    for n in doc.get("nodes") or []:
        if not n.get("answered", True):
            continue
        i = n["index"]
        out.append({
            **{k: doc[k] for k in ("schema", "schema_version", "tool_version", "created", "command")},
            "kind": "fleet", "scope": "node", "baseline_scope": "host",
            "environment": {**(doc.get("environment") or {}), "host": n["node"]},
            "status": doc.get("status"), "node": n,
            "pairings": [p for p in doc.get("pairings") or [] if i in (p["a"], p["b"])],
            "verdicts": {"suspects": [s for s in verdicts["suspects"] if s["node"] == i]},
            "notes": [], "findings": [s["text"] for s in verdicts["suspects"] if s["node"] == i],
        })
    return out
