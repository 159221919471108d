"""The links result document: written from a run, read back into one (one definition for both).
Its declared shape is shape.py's."""

from __future__ import annotations

from mgpu_bench.results.document import envelope

from .analyse import outliers
from .result import LinkMeasurement, LinkSpec, LinksRun


def document(run: LinksRun, hops: dict | None = None, environment: dict | None = None,
             command: list[str] | None = None, topology: dict | None = None) -> dict:
    return {
        **envelope("links", environment, command),
        "topology": topology,
        "theory": [{"src": a, "dst": b, "bandwidth": h.bandwidth, "detail": h.detail}
                   for (a, b), h in sorted((hops or {}).items())],
        "gpus": run.gpus,
        "peer_access": [{"src": a, "dst": b, "ok": ok} for (a, b), ok in run.peer_access.items()],
        "notes": run.notes,
        "wall_seconds": run.wall_seconds,
        "per_pair_seconds": run.per_pair_seconds,
        "host_seconds": run.host_seconds,
        "estimated_seconds_8_gpus": run.estimate_seconds(8),
        "outliers": outliers(run),
        "measurements": [m.to_dict() for m in run.measurements],
    }


def run_from_document(doc: dict) -> tuple[LinksRun, dict]:
    """(the LinksRun, per-pair theory hops {(src, dst): theory.Hop}) rebuilt from the document
    document() wrote."""
    from mgpu_bench.machine.theory import Hop

    run = LinksRun(
        gpus=list(doc.get("gpus") or []),
        notes=list(doc.get("notes") or []),
        wall_seconds=doc.get("wall_seconds") or 0.0,
        per_pair_seconds=doc.get("per_pair_seconds") or 0.0,
        host_seconds=doc.get("host_seconds") or 0.0,
    )
    run.measurements = [
        LinkMeasurement(LinkSpec(**m["spec"]), tuple(m["seconds"]))
        for m in doc.get("measurements") or []
        if m.get("kind") == "link"
    ]
    run.peer_access = {
        (p["src"], p["dst"]): bool(p["ok"]) for p in doc.get("peer_access") or []
    }
    hops = {
        (t["src"], t["dst"]): Hop(
            t["src"],
            t["dst"],
            "nvlink" if "NVLink" in str(t.get("detail")) else "pcie",
            t.get("bandwidth"),
            str(t.get("detail")),
        )
        for t in doc.get("theory") or []
    }
    return run, hops
