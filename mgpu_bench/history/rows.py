"""Stored rows read back through their declared shapes, as a document is (mgpu_bench.results.schema).

A row of the history can be changed by any program that opens the file (the sqlite3 shell, a
script): a metric's samples that are not JSON, a value stored as text, a document that is a list.
Every read goes through these shapes first, so that such a row is an InputError naming the run,
the metric and the field, not a traceback later (history.store reads every row here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from mgpu_bench.results.metrics import UNITS, Metric
from mgpu_bench.results.schema import (
    ENVIRONMENT,
    ISO_TIME,
    Bool,
    List,
    Map,
    Num,
    Obj,
    OneOf,
    SchemaError,
    Str,
    _Problem,
    real_time,
)

# A runs row's own columns (the document and the fingerprint are checked as documents are).
RUN_ROW = Obj({
    "created": Str(pattern=ISO_TIME, rule=real_time, what="an ISO 8601 time (2026-12-01T06:03:00+00:00)"),
    "kind": Str(max_len=200), "host": Str(max_len=1024, null=True), "command": Str(null=True),
}, what="a stored run")
FINGERPRINT = Obj({"fingerprint": Obj(ENVIRONMENT.fields, what="an environment")}, what="a stored run")
# A metrics row, its JSON columns decoded (what Metric and compare compute with).
METRIC_ROW = Obj({
    "name": Str(max_len=4096), "value": Num(finite=True), "unit": Str(UNITS), "better": Str(("higher", "lower")),
    "samples": List(Num()), "labels": Map(OneOf(Str(max_len=4096), Num(), Bool(), null=True)),
}, what="a stored metric")
_OUTSIDE = " (the database was changed outside mgpu-bench: give another --db path, or remove the run)"


def check_row(spec: Obj, row: Mapping, where: str, what: str = "") -> None:
    """SchemaError naming `where` (the run), `what` (a metric) and the field when `row` is not
    of its declared shape; only the fields present are checked (a listing reads some)."""
    try:
        Obj({k: v for k, v in spec.fields.items() if k in row}, what=spec.name).check(row, "")
    except _Problem as p:
        raise SchemaError(where, " ".join(x for x in (what, p.path) if x), p.problem + _OUTSIDE) from None
    except RecursionError:
        raise SchemaError(where, what, "is nested too deeply" + _OUTSIDE) from None


def json_field(text, where: str, field: str, what: str = ""):
    """A JSON column decoded; SchemaError naming the run and the field when it is not JSON text."""
    path = " ".join(x for x in (what, field) if x)
    if not isinstance(text, str):
        raise SchemaError(where, path, f"is {type(text).__name__} data, not JSON text" + _OUTSIDE)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise SchemaError(where, path, "is not JSON" + _OUTSIDE) from None


def metric_of_row(row: tuple, where: str) -> Metric:
    name, value, unit, better, samples, labels = row
    what = f"metric {name}" if isinstance(name, str) else "a metric"
    fields = {"name": name, "value": value, "unit": unit, "better": better,
              "samples": json_field(samples, where, "samples", what), "labels": json_field(labels, where, "labels", what)}
    check_row(METRIC_ROW, fields, where, what)
    return Metric(name, float(value), unit, better, tuple(float(x) for x in fields["samples"]), fields["labels"])
