"""The result document every command writes: a versioned JSON envelope around a probe's data.

Every kind (comm, gemm, memory, model, links, suite, ...) shares the envelope: `schema`,
`schema_version`, `kind`, `tool_version`, `created`, `command`, `environment` and `status`
({completed, stopped, message}); the rest is the probe's own payload, raw samples included. A
`Document` is such a dict that may also carry, unserialised, the run object its probe measured
(`run`), so that rendering right after a measurement does not rebuild it from the JSON.

Reading a document back goes through probe.load_document (a file) or probe.validate (a stored
one): each kind's shape is declared once, beside its writer (mgpu_bench.results.schema's specs), and
checked on every read.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping
from typing import Any

RESULT_SCHEMA = "mgpu-bench/result"
RESULT_SCHEMA_VERSION = 1


class Document(dict):
    """A result document (a plain dict to json) with the probe's run object beside it."""

    run: Any = None

    @classmethod
    def of(cls, payload: Mapping, run: Any = None) -> Document:
        doc = cls(payload)
        doc.run = run
        return doc


def envelope(kind: str, environment: Mapping | None, command: list[str] | None) -> dict:
    """The fields every result document starts with."""
    from mgpu_bench import __version__

    return {
        "schema": RESULT_SCHEMA,
        "schema_version": RESULT_SCHEMA_VERSION,
        "kind": kind,
        "tool_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "environment": environment,
    }


def status(stopped: str | None, message: str | None) -> dict:
    """The status block: completed, or where and why the run stopped early."""
    return {"completed": stopped is None, "stopped": stopped, "message": message}


def document_kind(doc: Mapping) -> str | None:
    """The kind of a result document: its "kind" field, or for the comm and links documents,
    which predate that field, what their measurements are; None when it is not a result."""
    if not isinstance(doc, Mapping):
        return None
    kind = doc.get("kind")
    if isinstance(kind, str) and kind:
        return kind
    measurements = doc.get("measurements")
    if isinstance(measurements, list) and measurements and isinstance(measurements[0], Mapping):
        first = measurements[0].get("kind")
        if first == "comm":
            return "comm"
        if first == "link":
            return "links"
    if isinstance(measurements, list) and "backend" in doc:
        return "comm"  # a comm sweep that measured nothing
    if isinstance(measurements, list) and "peer_access" in doc:
        return "links"
    return None


def write_json(path: str | os.PathLike, document: Mapping) -> None:
    """Writes atomically into an existing folder, as every output is written (paths.write_json:
    through a symbolic link, never over a FIFO or a device)."""
    from mgpu_bench.core.paths import write_json as write

    write(path, document)
