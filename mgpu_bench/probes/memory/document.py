"""The memory result document: written from a run, read back into one (one definition for both).
Its declared shape is shape.py's."""

from __future__ import annotations

import dataclasses

from mgpu_bench.results.document import envelope, status

from .analyse import findings
from .measure import ChurnResult, HbmResult, MemoryConfig, MemoryRun


def document(run: MemoryRun, environment: dict, command: list[str] | None = None) -> dict:
    c = run.config
    return {
        **envelope("memory", environment, command), "devices": run.devices,
        "config": {"patterns": list(c.patterns), "allocators": list(c.allocators), "budget": c.budget,
                   "seed": c.seed, "bandwidth": c.bandwidth, "hbm_bytes": c.hbm_bytes,
                   "torch_settings": list(c.torch_settings), "torch_model": c.torch_model,
                   "torch_batch": c.torch_batch, "torch_seq_lens": c.torch_seq_lens, "torch_steps": c.torch_steps,
                   "max_batch_model": c.max_batch_model, "max_batch_seq": c.max_batch_seq,
                   **{k: v for k, v in (("max_batch_image", c.max_batch_image),
                                        ("max_batch_workload", c.max_batch_workload)) if v is not None}},
        "status": status(run.stopped, run.stop_message),
        "notes": run.notes, "wall_seconds": run.wall_seconds, "findings": [f.text for f in findings(run)],
        "churn": [r.to_dict() for r in run.churn], "hbm": [h.to_dict() for h in run.hbm],
        "torch": run.torch, "max_batch": run.max_batch,
    }


def run_from_document(doc: dict) -> MemoryRun:
    """A MemoryRun rebuilt from the document document() wrote."""
    c = dict(doc.get("config") or {})
    known = {f.name for f in dataclasses.fields(MemoryConfig)}
    for key in ("patterns", "allocators", "torch_settings"):
        if key in c:
            c[key] = tuple(c[key] or ())
    cfg = MemoryConfig(
        **{k: v for k, v in c.items() if k in known},
        gpus=tuple(d.get("index", i) for i, d in enumerate(doc.get("devices") or [])),
        churn=bool(doc.get("churn")),
    )
    st = doc.get("status") or {}
    run = MemoryRun(
        cfg,
        list(doc.get("devices") or []),
        torch=dict(doc.get("torch") or {}),
        max_batch=list(doc.get("max_batch") or []),
        notes=list(doc.get("notes") or []),
        stopped=st.get("stopped"),
        stop_message=st.get("message"),
        wall_seconds=doc.get("wall_seconds") or 0.0,
    )
    run.churn = [
        ChurnResult(r["gpu"], r["allocator"], r["pattern"], dict(r))
        for r in doc.get("churn") or []
    ]
    run.hbm = [
        HbmResult(
            h["gpu"],
            h["kind"],
            h["bytes_read"],
            h["bytes_written"],
            list(h["seconds"]),
            h.get("peak"),
        )
        for h in doc.get("hbm") or []
    ]
    return run
