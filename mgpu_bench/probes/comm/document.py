"""The comm result document: written from a run, read back into one (one definition for both).

The document holds the spec and the raw per-rank seconds of every measurement; the figures
(time, algbw, busbw, percentiles) are derived again on reading, never stored twice. Its declared
shape is shape.py's. A run read from a nccl-tests or rccl-tests log (imported.py) is the same
document with a "source" naming the tool, its version and the log files.
"""

from __future__ import annotations

import json
from pathlib import Path

from mgpu_bench.results.document import RESULT_SCHEMA, RESULT_SCHEMA_VERSION, envelope, status
from mgpu_bench.results.measurement import CommMeasurement

from .analyse import summary, theory_dict
from .plan import CommRun


def result_document(run: CommRun, environment: dict, command: list[str] | None = None,
                    tuning: dict | None = None) -> dict:
    """The versioned JSON document: schema, tool version, time, environment, measurements; for
    `comm --tune`, `tuning` (tune.rule.Tuning.to_dict: every setting's measurements, the choices per
    band and the lines to paste), the measurements being the default's first run."""
    doc = {
        **envelope("comm", environment, command),
        "backend": run.backend,
        "devices": run.devices,
        "status": status(run.stopped, run.stop_message),
        "notes": run.notes,
        "wall_seconds": run.wall_seconds,
        "process_seconds": run.process_seconds,
        "summary": summary(run),
        "theory": theory_dict(run.theory),
        "scope_theory": {k: theory_dict(v) for k, v in run.scope_theory.items()} if run.scope_theory else None,
        "findings": run.findings,
        "transports": run.transports,
        "algorithms_modelled": run.algorithms,
        "topology": run.topology,
        "measurements": [m.to_dict() for m in run.measurements],
    }
    if tuning is not None:
        doc["tuning"] = tuning
    return doc


def load_measurements(path: str | Path) -> tuple[dict, list[CommMeasurement]]:
    """Reads a result file; raises ValueError on a schema it does not know."""
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != RESULT_SCHEMA:
        raise ValueError(f"{path}: not an mgpu-bench result file")
    if doc.get("schema_version") != RESULT_SCHEMA_VERSION:
        raise ValueError(f"{path}: schema version {doc.get('schema_version')} (this tool reads {RESULT_SCHEMA_VERSION})")
    return doc, [CommMeasurement.from_dict(d) for d in doc["measurements"] if d.get("kind") == "comm"]


def run_from_document(doc: dict) -> CommRun:
    """A CommRun rebuilt from a stored result document (theory kept as its dict)."""
    run = CommRun(backend=doc["backend"], devices=list(doc["devices"]), requests=[],
                  measurements=[CommMeasurement.from_dict(d) for d in doc["measurements"] if d.get("kind") == "comm"],
                  notes=list(doc.get("notes", [])), stopped=doc["status"]["stopped"],
                  stop_message=doc["status"]["message"], wall_seconds=doc.get("wall_seconds", 0.0),
                  process_seconds=doc.get("process_seconds"))
    run.theory = doc.get("theory")
    run.scope_theory = doc.get("scope_theory")
    run.findings = list(doc.get("findings") or [])
    run.transports = doc.get("transports")
    return run
