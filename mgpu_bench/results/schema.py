"""The declared shape of result documents, checked wherever a document is read.

A document's shape is declared once, as data: the envelope every kind shares (here) and each
kind's own fields (SCHEMA in the probe's shape module, `probes/<name>/shape.py`, found
through `Probe.schema()`). `validate(doc, where)` checks a document against both and raises
`SchemaError` (an InputError: exit code 2) naming the file, the field and what it should be:

    r.json: results[0].gpu: missing (a gemm result needs gpu, dtype, m, n, k and flops)

The checks cover what the readers rely on (a field they index, the type they compute with, a
name that becomes part of a file or metric name, sizes within what any machine can hold); fields
a reader does not use are free, so documents of older releases and new optional fields load.

Specs: Int, Num, Str, Bool, List, Obj (named fields; `required` must be present; `closed` for an
object unpacked into a dataclass, which refuses unknown keys), Map (any keys, one value spec),
OneOf, Tagged (an object whose kind field picks its shape), AnyValue and Doc (a nested result
document, checked by its own kind). Each takes `null=True` where None is a value the writers
produce. The writers' output is checked by the same specs: the store validates every document
it derives metrics from, a run's own included, and tests/test_schema.py runs each writer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mgpu_bench.core.errors import InputError

MAX_BYTES = 1 << 50  # 1 PiB (sizes.MAX_SIZE): a larger buffer is a typo or a forged document
MAX_GPU_INDEX = 1 << 16
MAX_RANKS = 1 << 20
# A name that becomes part of a file or metric name (a model, a host-free label): no path
# separators, no dots at the start, no spaces or control characters.
NAME = r"[A-Za-z0-9][A-Za-z0-9_+\-.:]{0,63}"
ISO_TIME = r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?"


def real_time(text: str) -> bool:
    """An ISO_TIME string that names a real time: ASCII digits, a month 1-12, a day of that month,
    hours below 24 ... (9999-99-99T99:99:99 has the form and is none)."""
    import datetime as _dt

    if not text.isascii():
        return False
    try:
        _dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return False
    return True


class SchemaError(InputError):
    """A document that does not have its declared shape: `path` is the field ("results[0].m"),
    `problem` what is wrong with it."""

    def __init__(self, where: str | None, path: str, problem: str) -> None:
        self.where, self.path, self.problem = where, path, problem
        super().__init__(f"{where + ': ' if where else ''}{path or 'the document'}: {problem}")


class _Problem(Exception):
    """Raised inside a check: the field's path and what is wrong (SchemaError adds the file)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path, self.problem = path, problem


def _show(value: Any) -> str:
    """A value as a message quotes it: short, one line, control characters escaped."""
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _words(names: Sequence[str]) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class Spec:
    """One value's declared shape. `null`: None is allowed."""

    what = "a value"

    def __init__(self, null: bool = False) -> None:
        self.null = null

    def check(self, value: Any, path: str) -> None:
        if value is None:
            if not self.null:
                raise _Problem(path, f"is null, not {self.describe()}")
            return
        self._check(value, path)

    def _check(self, value: Any, path: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return self.what

    def _wrong(self, value: Any, path: str) -> _Problem:
        return _Problem(path, f"is {_show(value)}, not {self.describe()}")

    def takes(self, value: Any) -> bool:
        """Whether `value` is of the JSON type this spec checks (an object, a list, a string, a
        number, true or false), whatever its content: OneOf reports the problem of the option
        that takes it."""
        return True


class AnyValue(Spec):
    """Any JSON value (a field kept as it was written, read by nothing that computes with it)."""

    def __init__(self) -> None:
        super().__init__(null=True)

    def _check(self, value: Any, path: str) -> None:
        return None


class Bool(Spec):
    what = "true or false"

    def takes(self, value: Any) -> bool:
        return isinstance(value, bool)

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise self._wrong(value, path)


class Int(Spec):
    """An integer (not a bool, not 2.0) from lo to hi inclusive, where given."""

    def __init__(self, lo: int | None = None, hi: int | None = None, null: bool = False) -> None:
        super().__init__(null)
        self.lo, self.hi = lo, hi

    def describe(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"an integer from {self.lo} to {self.hi}"
        if self.lo is not None:
            return f"an integer of at least {self.lo}"
        if self.hi is not None:
            return f"an integer of at most {self.hi}"
        return "an integer"

    def takes(self, value: Any) -> bool:
        return _number(value)

    def _check(self, value: Any, path: str) -> None:
        if (not isinstance(value, int) or isinstance(value, bool)
                or (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi)):
            raise self._wrong(value, path)


class Num(Spec):
    """A number (int or float, not a bool) from lo to hi inclusive, where given, above 0 where
    `positive` (a time a figure is divided by). NaN passes unless `finite` (a measurement that
    produced none is written as NaN) and no bound is given: a bound (lo, hi, positive) refuses NaN
    and the infinities, as no comparison can place them within it (and a reader that relies on the
    bound, dividing by the value or scaling a plot axis by it, could not draw them)."""

    def __init__(self, lo: float | None = None, hi: float | None = None, null: bool = False,
                 finite: bool = False, positive: bool = False) -> None:
        super().__init__(null)
        self.lo, self.hi, self.finite, self.positive = lo, hi, finite, positive

    def describe(self) -> str:
        base = "a finite number" if self.finite else "a number"
        if self.positive:
            return "a positive number" if self.hi is None else f"a positive number of at most {self.hi:g}"
        if self.lo is not None and self.hi is not None:
            return f"{base} from {self.lo:g} to {self.hi:g}"
        if self.lo is not None:
            return f"{base} of at least {self.lo:g}"
        if self.hi is not None:
            return f"{base} of at most {self.hi:g}"
        return base

    def takes(self, value: Any) -> bool:
        return _number(value)

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self._wrong(value, path)
        v = float(value)
        if self.finite and not math.isfinite(v):
            raise self._wrong(value, path)
        if (self.lo is not None or self.hi is not None or self.positive) and not math.isfinite(v):
            raise self._wrong(value, path)
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi) or (self.positive and v <= 0):
            raise self._wrong(value, path)


_LONG = 1 << 16  # a string's default bound: any text a document holds, not a name
_LISTED = 6  # fields an object's description names before "..."


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Str(Spec):
    """A string: one of `choices`, or matching `pattern` (whole) and passing `rule`, at most
    `max_len` characters."""

    def __init__(self, choices: Sequence[str] | None = None, pattern: str | None = None, max_len: int = _LONG,
                 null: bool = False, what: str | None = None, rule: Callable[[str], bool] | None = None) -> None:
        super().__init__(null)
        self.choices = tuple(choices) if choices is not None else None
        self.pattern = re.compile(pattern) if pattern else None
        self.max_len = max_len
        self._what = what
        self.rule = rule  # a further test of the whole string (numbers inside it within bounds)

    def describe(self) -> str:
        if self._what:
            return self._what
        if self.choices is not None:
            return "one of " + ", ".join(self.choices) if self.choices else "a known name"
        if self.pattern is not None:
            return "a name of letters, digits and - _ + . : (no / or spaces)"
        return "a string" if self.max_len >= _LONG else f"a string of at most {self.max_len} characters"

    def takes(self, value: Any) -> bool:
        return isinstance(value, str)

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise self._wrong(value, path)
        if len(value) > self.max_len and self.max_len >= _LONG:  # "not a string" would say nothing of the length
            raise _Problem(path, f"is a text of {len(value)} characters, longer than the {self.max_len} allowed here")
        if len(value) > self.max_len:
            raise self._wrong(value, path)
        if self.choices is not None and value not in self.choices:
            raise self._wrong(value, path)
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise self._wrong(value, path)
        if self.rule is not None and not self.rule(value):
            raise self._wrong(value, path)


class List(Spec):
    """A list of `item`, min_len to max_len long. `rule(value) -> problem or None` checks the
    list as a whole (rows of one length)."""

    def __init__(self, item: Spec, min_len: int = 0, max_len: int | None = None, null: bool = False,
                 rule: Callable[[list], str | None] | None = None) -> None:
        super().__init__(null)
        self.item, self.min_len, self.max_len, self.rule = item, min_len, max_len, rule

    def describe(self) -> str:
        if self.min_len and self.max_len == self.min_len:
            return f"a list of {self.min_len}"
        return "a non-empty list" if self.min_len else "a list"

    def takes(self, value: Any) -> bool:
        return isinstance(value, (list, tuple))

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, (list, tuple)):  # a tuple: a document not yet written as JSON
            raise self._wrong(value, path)
        if len(value) < self.min_len or (self.max_len is not None and len(value) > self.max_len):
            raise _Problem(path, f"has {len(value)} entries, not {self.describe()[2:]}")
        for i, x in enumerate(value):
            self.item.check(x, _join(path, i))
        if self.rule is not None:
            problem = self.rule(value)
            if problem:
                raise _Problem(path, problem)


class Obj(Spec):
    """An object with declared `fields`; those in `required` must be present. Undeclared keys are
    free unless `closed` (an object the reader unpacks into a dataclass). `what` names the object
    in the message for a missing field ("a gemm result"). `rule(value)` checks what ties fields
    together: None, or (the field's path below this object, the problem). A value that is no
    object is told the fields expected: "an object with gpu, allocator and pattern"."""

    def __init__(self, fields: Mapping[str, Spec], required: Sequence[str] = (), what: str = "this object",
                 null: bool = False, closed: bool = False,
                 rule: Callable[[Mapping], tuple[str, str] | None] | None = None) -> None:
        super().__init__(null)
        self.fields, self.required, self.closed, self.rule = dict(fields), tuple(required), closed, rule
        self.name = what
        unknown = set(self.required) - set(self.fields)
        if unknown:
            raise ValueError(f"required but not declared: {sorted(unknown)}")

    def describe(self) -> str:
        names = list(self.required or self.fields)
        if not names:
            return "an object"
        if len(names) > _LISTED:
            return f"an object with {', '.join(names[:_LISTED])}, ..."
        return f"an object with {_words(names)}"

    def takes(self, value: Any) -> bool:
        return isinstance(value, Mapping)

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self._wrong(value, path)
        for key in self.required:
            if key not in value:
                raise _Problem(_join(path, key), f"missing ({self.name} needs {_words(self.required)})")
        if self.closed:
            extra = [k for k in value if k not in self.fields]
            if extra:
                raise _Problem(_join(path, str(extra[0])), f"is not a field of {self.name} "
                                                           f"(it has {_words(list(self.fields))})")
        for key, spec in self.fields.items():
            if key in value:
                spec.check(value[key], _join(path, key))
        if self.rule is not None:
            found = self.rule(value)
            if found:
                raise _Problem(_join(path, found[0]) if found[0] else path, found[1])


class Map(Spec):
    """An object with any keys (matching `keys`, a whole-string pattern, where given), each value
    of `value`. `keys_what` names a key ("a GPU count"); `what` the whole map where the default
    ("a map from a GPU count to a number") says less than the readers' terms do."""

    def __init__(self, value: Spec, keys: str | None = None, null: bool = False,
                 keys_what: str = "a name", what: str | None = None) -> None:
        super().__init__(null)
        self.value, self.keys, self.keys_what = value, re.compile(keys) if keys else None, keys_what
        self._what = what

    def describe(self) -> str:
        return self._what or f"a map from {self.keys_what} to {self.value.describe()}"

    def takes(self, value: Any) -> bool:
        return isinstance(value, Mapping)

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self._wrong(value, path)
        for k, v in value.items():
            if self.keys is not None and not self.keys.fullmatch(str(k)):
                raise _Problem(_join(path, str(k)), f"is not a valid key here ({self.keys_what})")
            self.value.check(v, _join(path, str(k)))


class OneOf(Spec):
    """The first of `options` that accepts the value. When none does, the message is the problem
    inside the option of the value's JSON type (an object against an object option: the field
    that is wrong in it; of several such options, the problem found deepest), or, where no option
    is of its type, the value against them all ("is true, not an integer or a string")."""

    def __init__(self, *options: Spec, null: bool = False) -> None:
        super().__init__(null)
        self.options = options

    def describe(self) -> str:
        return " or ".join(o.describe() for o in self.options)

    def takes(self, value: Any) -> bool:
        return any(o.takes(value) for o in self.options)

    def _check(self, value: Any, path: str) -> None:
        typed: list[_Problem] = []
        for o in self.options:
            try:
                o.check(value, path)
                return
            except _Problem as problem:
                if o.takes(value):
                    typed.append(problem)
        if typed:  # the first of the deepest: the most specific account of what is wrong
            raise max(typed, key=lambda p: len(p.path))
        raise self._wrong(value, path)


class Tagged(Spec):
    """An object whose `key` picks its shape from `cases`; other values of `key` (or none) get
    `other` (the entries of a list that readers pick by kind and skip otherwise)."""

    what = "an object"

    def __init__(self, key: str, cases: Mapping[str, Spec], other: Spec | None = None, null: bool = False) -> None:
        super().__init__(null)
        self.key, self.cases, self.other = key, dict(cases), other or Obj({})

    def takes(self, value: Any) -> bool:
        return isinstance(value, Mapping)

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self._wrong(value, path)
        tag = value.get(self.key)
        spec = self.cases.get(tag, self.other) if isinstance(tag, str) else self.other
        spec.check(value, path)


class Doc(Spec):
    """A nested result document (a suite's probe entries), checked by its own kind through
    `check(value, path)` (the registry's probe.check_document: this module knows no kinds)."""

    what = "a result document"

    def __init__(self, check: Callable[[Mapping, str], None], null: bool = False) -> None:
        super().__init__(null)
        self._check_document = check

    def takes(self, value: Any) -> bool:
        return isinstance(value, Mapping)

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self._wrong(value, path)
        self._check_document(value, path)


def rectangular(rows: list) -> str | None:
    """A list rule: every row of a matrix as long as the first."""
    if rows and any(len(r) != len(rows[0]) for r in rows):
        return "has rows of different lengths (one per rank, each with every sample)"
    return None


# -- the envelope every kind shares ----------------------------------------------------------------

STATUS = Obj({"completed": Bool(), "stopped": Str(max_len=200, null=True), "message": Str(null=True)},
             what="a status")
# The environment fingerprint (env.fingerprint): what the header, compare and the history read.
ENVIRONMENT = Obj({
    "host": Str(max_len=1024, null=True),
    "gpus": List(Obj({"index": Int(0, MAX_GPU_INDEX), "name": Str(null=True), "pci_bus_id": Str(null=True),
                      "uuid": Str(null=True)}, what="a GPU"), null=True),
    "env": Map(Str(null=True), null=True),
    "topology": Obj({"gpus": List(AnyValue(), null=True), "pairs": List(AnyValue(), null=True)},
                    what="a topology", null=True),
    "launcher": Obj({}, null=True),
}, what="an environment", null=True)
OCCUPANCY = Obj({
    "foreign": List(Obj({"gpu": Int(0, MAX_GPU_INDEX), "pid": Int(0), "name": Str(null=True),
                         "used_bytes": Int(0, null=True), "owner": Str(("ours", "foreign", "unknown")),
                         "busy": Bool(null=True)},
                        required=("gpu", "pid", "owner"), what="a process", closed=True), null=True),
    "before": Obj({"gpus": Map(Obj({"memory_total": Num(0, null=True)}, what="a GPU"), null=True)},
                  what="a snapshot", null=True),
    "after": Obj({"gpus": Map(Obj({"memory_total": Num(0, null=True)}, what="a GPU"), null=True)},
                 what="a snapshot", null=True),
}, what="an occupancy record", null=True)

# NVML telemetry as telemetry.py summarises it (a probe's own or the suite's samples beside it).
TELEMETRY_SUMMARY = Obj({
    **{k: Num(null=True) for k in ("samples", "sm_hz_median", "sm_hz_min", "sm_hz_max", "sm_max_hz", "mem_hz_median",
                                   "power_w_mean", "power_w_max", "power_limit_w", "power_default_w", "power_max_w",
                                   "temp_c_mean", "temp_c_max")},
    "limiting": List(Str(), null=True), "reasons": List(Str(), null=True),
}, what="a telemetry summary", null=True)
TELEMETRY_SERIES = Obj({
    **{k: List(Num(null=True), null=True) for k in ("t", "sm_hz", "power_w", "temp_c", "mem_hz")},
    "summary": TELEMETRY_SUMMARY,
}, what="a telemetry series", null=True)

# Fields of any kind: what store.save, the page header and the runner read.
ENVELOPE: dict[str, Spec] = {
    "schema": Str(),
    "schema_version": Int(1),
    "kind": Str(),
    "tool_version": Str(max_len=100, null=True),
    "created": Str(pattern=ISO_TIME, null=True, what="an ISO 8601 time (2026-12-01T06:03:00+00:00)", rule=real_time),
    "command": OneOf(List(Str()), Str(), null=True),
    "environment": ENVIRONMENT,
    "status": Obj({"completed": Bool(null=True), "stopped": Str(max_len=200, null=True),
                   "message": Str(null=True)}, what="a status", null=True),
    "notes": List(Str()),
    "findings": List(OneOf(Str(), Obj({"severity": Str(), "text": Str()}, required=("severity", "text"),
                                      what="a finding")), null=True),
    "wall_seconds": Num(0),
    "occupancy": OCCUPANCY,
}


def shown(name: object) -> str:
    """A file name as a one-line message shows it: as typed, or quoted with its control
    characters escaped when it has any (a newline would split the line)."""
    text = str(name)
    return repr(text) if any(ord(c) < 32 or 127 <= ord(c) < 160 or 0xD800 <= ord(c) < 0xE000 for c in text) \
        else text


def file_stem(name: str, fallback: str = "figure") -> str:
    """`name` made safe as a file name's stem: letters, digits and - _ + . only (anything else,
    a path separator included, becomes _), no leading dot, at most 100 characters."""
    stem = re.sub(r"[^A-Za-z0-9_+\-.]", "_", str(name)).lstrip(".")[:100]
    return stem or fallback
