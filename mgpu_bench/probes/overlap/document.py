"""The overlap result document: written from a run, read back into one (one definition for both).

Raw data per rank (seconds per iteration of each side and phase, its start, telemetry
summaries, NCCL's channels) is what counts; "summary" repeats the derived figures for readers
of the JSON and is never read back. Its declared shape is shape.py's."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict

from mgpu_bench.results.document import envelope, status

from .analyse import OverlapConfig, OverlapRun, findings, summary


def document(run: OverlapRun, environment: dict, command: list[str] | None = None, occupancy: dict | None = None) -> dict:
    from mgpu_bench.machine.occupancy import from_document

    shared = from_document({"occupancy": occupancy or {}})
    return {
        **envelope("overlap", environment, command), "config": asdict(run.config), "gpus": list(run.gpus),
        "world": run.world, "status": status(run.stopped, run.stop_message), "notes": run.notes,
        "wall_seconds": run.wall_seconds, "model_ref": run.model_ref,
        "findings": [f.text for f in findings(run, shared)],
        **({"occupancy": occupancy} if occupancy is not None else {}),
        "summary": summary(run) if run.ranks else None,
        "ranks": run.ranks,
    }


def run_from_document(doc: dict) -> OverlapRun:
    """An OverlapRun rebuilt from the document document() wrote."""
    known = {f.name for f in dataclasses.fields(OverlapConfig)}
    cfg = OverlapConfig(**{k: v for k, v in (doc.get("config") or {}).items() if k in known})
    st = doc.get("status") or {}
    return OverlapRun(cfg, list(doc.get("ranks") or []), tuple(doc.get("gpus") or ()), doc.get("model_ref"),
                      list(doc.get("notes") or []), st.get("stopped"), st.get("message"),
                      doc.get("wall_seconds") or 0.0)
