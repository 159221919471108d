"""The sdc result document: written from a run, read back into one (one definition for both).
Its declared shape is shape.py's."""

from __future__ import annotations

from mgpu_bench.results.document import envelope, status

from .analyse import findings, verdicts
from .result import Check, SdcConfig, SdcRun, parse_shape, shape_text


def document(run: SdcRun, environment: dict, command: list[str] | None = None, occupancy: dict | None = None) -> dict:
    c = run.config
    v = verdicts(run)
    return {
        **envelope("sdc", environment, command), "devices": run.devices,
        "config": {"dtype": c.dtype, "shape": shape_text(c.shape), "gemms": c.gemms, "repetitions": c.repetitions,
                   "duration_s": c.duration_s, "memory_fraction": c.memory_fraction, "comm_bytes": c.comm_bytes,
                   "seed": c.seed, "timeout_s": c.timeout_s},
        "status": status(run.stopped, run.stop_message),
        "notes": run.notes, "wall_seconds": run.wall_seconds, "check_seconds": run.check_seconds,
        "repetitions_done": run.repetitions, "algo": run.algo,
        "gpus": [{"gpu": d["index"], "name": d.get("name"), "multiprocessors": d.get("multiprocessors"),
                  "reference_hash": run.references.get(d["index"]), "hbm_bytes": run.hbm_bytes.get(d["index"]),
                  **v.get(d["index"], {})} for d in run.devices],
        "peer_differences": run.peer_differences,
        "findings": [f.text for f in findings(run)],
        **({"occupancy": occupancy} if occupancy is not None else {}),
        "checks": [ch.to_dict() for ch in run.checks],
    }


def run_from_document(doc: dict) -> SdcRun:
    """An SdcRun rebuilt from the document document() wrote."""
    c = doc.get("config") or {}
    defaults = SdcConfig()
    cfg = SdcConfig(
        gpus=tuple(d.get("index", i) for i, d in enumerate(doc.get("devices") or [])),
        dtype=c.get("dtype", defaults.dtype),
        shape=parse_shape(c["shape"]) if c.get("shape") else defaults.shape,
        gemms=c.get("gemms", defaults.gemms), repetitions=c.get("repetitions", defaults.repetitions),
        duration_s=c.get("duration_s") or 0.0, memory_fraction=c.get("memory_fraction", defaults.memory_fraction),
        comm_bytes=c.get("comm_bytes", defaults.comm_bytes), seed=c.get("seed", defaults.seed),
        timeout_s=c.get("timeout_s", defaults.timeout_s),
    )
    st = doc.get("status") or {}
    gpus = doc.get("gpus") or []
    fields = ("gpu", "repetition", "work", "count", "bytes", "seconds", "wrong", "hash", "first")
    return SdcRun(
        cfg, list(doc.get("devices") or []), algo=doc.get("algo"),
        references={int(g["gpu"]): g["reference_hash"] for g in gpus if g.get("reference_hash")},
        hbm_bytes={int(g["gpu"]): int(g["hbm_bytes"]) for g in gpus if g.get("hbm_bytes")},
        checks=[Check(**{k: ch[k] for k in fields if k in ch}) for ch in doc.get("checks") or []],
        peer_differences=list(doc.get("peer_differences") or []),
        repetitions=int(doc.get("repetitions_done") or 0), notes=list(doc.get("notes") or []),
        stopped=st.get("stopped"), stop_message=st.get("message"), wall_seconds=doc.get("wall_seconds") or 0.0,
        check_seconds=doc.get("check_seconds") or 0.0,
    )
