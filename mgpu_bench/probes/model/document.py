"""The model result document: written from a run, read back into one (one definition for both).
Its declared shape is shape.py's."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict

from mgpu_bench.results.document import envelope, status

from .analyse import findings
from .config import ModelConfig
from .figures import ModelRun, StepStats


def _config(run: ModelRun) -> dict:
    """The config as written; `compile` only when on, `workload` and `image_size` only where set,
    so that a run without them writes what the releases before them wrote."""
    cfg = asdict(run.config)
    for key in ("compile", "workload", "image_size", "deadline", "noise_scale"):
        if not cfg.get(key):
            cfg.pop(key, None)
    cfg.pop("deadline", None)  # a moment of this run, not its configuration
    return cfg


def document(run: ModelRun, environment: dict, command: list[str] | None = None, occupancy: dict | None = None) -> dict:
    from mgpu_bench.machine.occupancy import from_document

    shared = from_document({"occupancy": occupancy or {}})
    peak = run.peak
    return {
        **envelope("model", environment, command), "config": _config(run),
        "gpu_counts": run.gpu_counts, "data_modes": run.data_modes, "gpu_name": run.gpu_name,
        "peak": None if peak is None else {"value": peak.value, "unit": peak.unit, "source": peak.source},
        "status": status(run.stopped, run.stop_message),
        "notes": run.notes, "wall_seconds": run.wall_seconds, "findings": [f.text for f in findings(run, shared)],
        **({"occupancy": occupancy} if occupancy is not None else {}),
        "scaling": {str(n): e for n, e in run.scaling().items()},
        **({"workload": run.workload} if run.workload else {}),
        "runs": [s.to_dict() for s in run.stats],
    }


def run_from_document(doc: dict) -> ModelRun:
    """A ModelRun rebuilt from the document document() wrote."""
    from mgpu_bench.machine.hardware import figure_from_dict

    known = {f.name for f in dataclasses.fields(ModelConfig)}
    cfg = ModelConfig(
        **{k: v for k, v in (doc.get("config") or {}).items() if k in known}
    )
    st = doc.get("status") or {}
    run = ModelRun(
        cfg,
        list(doc.get("gpu_counts") or []),
        list(doc.get("data_modes") or []),
        doc.get("gpu_name"),
        figure_from_dict(doc.get("peak")),
        notes=list(doc.get("notes") or []),
        stopped=st.get("stopped"),
        stop_message=st.get("message"),
        wall_seconds=doc.get("wall_seconds") or 0.0,
        workload=dict(doc.get("workload") or {}),
        job=dict(doc.get("job") or {}),
    )
    for s in doc.get("runs") or []:
        w = s.get("window") or (0, 0, False)
        run.stats.append(
            StepStats(
                world=s["world"],
                data=s["data"],
                ranks=list(s.get("ranks") or []),
                window=(int(w[0]), int(w[1]), bool(w[2])),
                samples_per_step=s.get("samples_per_step", 0),
                tokens_per_step=s.get("tokens_per_step", 0),
                flops_per_token=s.get("flops_per_token", 0.0),
                error=s.get("error"),
                derived=dict(s.get("derived") or {}),
                flops_per_sample=s.get("flops_per_sample"),
                stalls=s.get("stalls"),
                comm_method=s.get("comm_method"),
                straggler=s.get("straggler"),
                noise=s.get("noise_scale"),
                ledger=s.get("ledger"),
            )
        )
    return run
