"""The gemm result document: written from a run, read back into one (one definition for both).
Its declared shape is shape.py's."""

from __future__ import annotations

from mgpu_bench.results.document import envelope, status

from .analyse import findings
from .measure import (
    DEFAULT_WORKSPACE,
    FP8_FAST_ACCUM_TOLERANCE,
    Candidate,
    GemmConfig,
    GemmResult,
    GemmRun,
    Shape,
    parse_shapes,
)


def document(run: GemmRun, environment: dict, command: list[str] | None = None, occupancy: dict | None = None) -> dict:
    from mgpu_bench.machine.occupancy import from_document

    shared = from_document({"occupancy": occupancy or {}})
    return {
        **envelope("gemm", environment, command), "devices": run.devices,
        "config": {"dtypes": list(run.config.dtypes), "shapes": [str(s) for s in run.config.shapes],
                   "layout": run.config.layout, "candidates": run.config.candidates,
                   "samples": run.config.samples, "sample_s": run.config.sample_s,
                   "one_at_a_time": run.config.one_at_a_time,
                   "search": list(run.config.search) if run.config.search else None,
                   "duration_s": run.config.duration_s, "workspace": run.config.workspace,
                   "fp8_fast_accum": run.config.fp8_fast_accum, "init": run.config.init},
        "status": status(run.stopped, run.stop_message),
        "notes": run.notes, "telemetry_error": run.telemetry_error, "wall_seconds": run.wall_seconds,
        "findings": [f.text for f in findings(run, shared)],
        **({"occupancy": occupancy} if occupancy is not None else {}),
        "results": [r.to_dict() for r in run.results],
    }


def run_from_document(doc: dict) -> GemmRun:
    """A GemmRun rebuilt from the document document() wrote."""
    from mgpu_bench.machine.hardware import figure_from_dict

    c = doc.get("config") or {}
    shapes = (
        parse_shapes(",".join(c["shapes"]))
        if c.get("shapes")
        else GemmConfig.shapes
    )
    cfg = GemmConfig(
        dtypes=tuple(c.get("dtypes") or ()),
        shapes=shapes,
        layout=c.get("layout", "auto"),
        gpus=tuple(d.get("index", i) for i, d in enumerate(doc.get("devices") or [])),
        candidates=c.get("candidates", 8),
        samples=c.get("samples", 5),
        sample_s=c.get("sample_s", 0.02),
        one_at_a_time=bool(c.get("one_at_a_time")),
        search=tuple(c["search"]) if c.get("search") else None,
        duration_s=c.get("duration_s") or 0.0,
        workspace=c.get("workspace", DEFAULT_WORKSPACE),
        fp8_fast_accum=bool(c.get("fp8_fast_accum")),
        init=c.get("init", "uniform"),
    )
    own = ("index", "seconds", "iters_per_sample", "max_error", "error")
    st = doc.get("status") or {}
    run = GemmRun(
        cfg,
        list(doc.get("devices") or []),
        notes=list(doc.get("notes") or []),
        telemetry_error=doc.get("telemetry_error"),
        stopped=st.get("stopped"),
        stop_message=st.get("message"),
        wall_seconds=doc.get("wall_seconds") or 0.0,
    )
    for r in doc.get("results") or []:
        cands = [
            Candidate(
                cd["index"],
                {k: v for k, v in cd.items() if k not in own},
                list(cd.get("seconds") or []),
                cd.get("iters_per_sample", 1),
                cd.get("max_error"),
                cd.get("error"),
            )
            for cd in r.get("candidates") or []
        ]
        series = r.get("series")
        run.results.append(
            GemmResult(
                gpu=r["gpu"],
                gpu_name=r.get("gpu_name") or "",
                dtype=r["dtype"],
                shape=Shape(r["m"], r["n"], r["k"]),
                layout=r.get("layout") or "",
                candidates=cands,
                buffer_sets=r.get("buffer_sets", 0),
                checked_elements=r.get("checked_elements", 0),
                seconds_wall=r.get("seconds_wall") or 0.0,
                peak=figure_from_dict(r.get("peak")),
                telemetry=r.get("telemetry"),
                series=None
                if series is None
                else [(p["t"], p["seconds"]) for p in series],
                series_telemetry=r.get("series_telemetry"),
                phase=r.get("phase", "shape"),
                fast_accum=r.get("tolerance") == FP8_FAST_ACCUM_TOLERANCE,
            )
        )
    return run
