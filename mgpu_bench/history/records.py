"""A run as the history holds it, apart from the database: its public id (r12), the rows the
history hands back (RunInfo for a listing, RunRecord for one run in full, TrendPoint for one
metric's value), and prepare(): a result document read and checked for storing (its kind's
declared shape, its headline metrics, its JSON), before any database is touched, so that a
command checks every document it will store before it opens one. store.py writes what prepare()
gives and reads these rows back.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.document import RESULT_SCHEMA, document_kind
from mgpu_bench.results.metrics import Metric
from mgpu_bench.results.probe import headline as metrics_from_document
from mgpu_bench.results.probe import validate


def run_label(row_id: int) -> str:
    """The public id of a run: 'r12'."""
    return f"r{row_id}"


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _headline(doc: Mapping) -> builtins.list[Metric]:
    """The document's headline metrics; a document its probe cannot read (a shape its schema
    does not catch) is bad input, not a traceback."""
    try:
        return metrics_from_document(doc)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as exc:
        raise InputError(f"the {document_kind(doc)} document cannot be read ({type(exc).__name__}: {exc}): give one "
                         "written by a command's --json") from None


@dataclass(frozen=True)
class RunInfo:
    """One stored run as `history list` shows it. created: UTC ISO 8601."""

    run_id: str
    created: str
    kind: str
    host: str | None
    command: str | None
    metric_count: int
    baseline: bool  # this run is the baseline of its kind


@dataclass(frozen=True)
class RunRecord:
    """One stored run in full: the fingerprint and the result document as stored."""

    run_id: str
    created: str
    kind: str
    host: str | None
    command: str | None
    fingerprint: dict
    document: dict


@dataclass(frozen=True)
class TrendPoint:
    """One run's value of one metric (base units)."""

    run_id: str
    created: str
    host: str | None
    value: float
    unit: str
    better: str


@dataclass(frozen=True)
class Prepared:
    """A result document read and checked for storing (prepare()), before any database is touched."""

    created: str
    kind: str
    command: str | None
    host: object
    fingerprint_json: str
    document_json: str
    metrics: tuple[Metric, ...]
    keep: int | None


def prepare(doc: Mapping, metrics: Sequence[Metric] | None = None) -> Prepared:
    """A result document read for History.save / save_all: checked against its kind's declared
    shape (InputError naming the field), its headline metrics (by default metrics_from_document),
    its JSON. Reads no database: a command checks every document it will store before it opens one."""
    if not isinstance(doc, Mapping) or doc.get("schema") != RESULT_SCHEMA:
        raise InputError("not an mgpu-bench result document: give one written by a command's --json")
    if metrics is None:  # read here for its metrics: its declared shape first (mgpu_bench.results.schema),
        try:  # as the stored JSON holds it (a run's own document still has tuples, say)
            validate(json.loads(json.dumps(doc)))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InputError):
                raise
            raise ValueError(f"the result document cannot be stored as JSON: {exc}") from None
    kind = document_kind(doc) or "unknown"
    metrics = _headline(doc) if metrics is None else list(metrics)
    seen: set[str] = set()
    for m in metrics:
        if m.name in seen:
            raise InputError(f"the {kind} document measures {m.name} twice: give one run's document, not two joined")
        seen.add(m.name)
    environment = doc.get("environment") if isinstance(doc.get("environment"), Mapping) else {}
    command = doc.get("command")
    if isinstance(command, (list, tuple)):
        command = shlex.join(str(c) for c in command)
    created = doc.get("created") if isinstance(doc.get("created"), str) else utc_now()
    try:
        document_json = json.dumps(doc)
        fingerprint_json = json.dumps(environment)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the result document cannot be stored as JSON: {exc}") from None
    keep = doc.get("keep")
    return Prepared(created, kind, command, environment.get("host"), fingerprint_json, document_json, tuple(metrics),
                    keep if isinstance(keep, int) and not isinstance(keep, bool) and keep > 0 else None)
