"""Numbers as users type them: the ASCII digits 0-9, nothing else.

Python's int() and float() read any Unicode decimal digit ('１２' is 12, '٣' is 3) and underscores
('1_000'), and click's INT and FLOAT types take whatever they take: `--nproc １２` ran 12 ranks
while a run id written with the same digits was refused. Every option of every command gets its
type through ascii_type() (probe.option() and the history commands): whole numbers and decimals
are read from ASCII digits only, and a text option (a size, a list of GPU counts, a tolerance)
that holds any other digit is refused before the command parses it. Paths are left as they are:
a file may be named anything.
"""

from __future__ import annotations

import re
from typing import Any

import click

INT = re.compile(r"[+-]?[0-9]+")
FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
                   re.IGNORECASE)
ONLY = "write it with the digits 0-9"


def foreign_digit(text: str) -> str | None:
    """The first digit of `text` that is not one of ASCII's 0-9 ('１', '٣', '²'), or None."""
    return next((c for c in text if (c.isdigit() or c.isdecimal() or c.isnumeric()) and not c.isascii()), None)


def ascii_int(text: str) -> int | None:
    """A whole number written with ASCII digits (spaces around allowed), else None."""
    t = text.strip()
    return int(t) if INT.fullmatch(t) else None


def ascii_float(text: str) -> float | None:
    """A decimal number written with ASCII digits (as float() reads them, but no underscores and no
    other digits; nan and inf as float() spells them), else None."""
    t = text.strip()
    return float(t) if FLOAT.fullmatch(t) else None


def _refuse_foreign(self, value: Any, param, ctx) -> None:
    if isinstance(value, str):
        c = foreign_digit(value)
        if c is not None:
            self.fail(f"{value!r} has the digit {c!r} (U+{ord(c):04X}): {ONLY}", param, ctx)


class AsciiInt(click.types.IntParamType):
    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and ascii_int(value) is None:
            _refuse_foreign(self, value, param, ctx)
            self.fail(f"{value!r} is not a whole number: {ONLY}", param, ctx)
        return super().convert(value, param, ctx)


class AsciiIntRange(click.IntRange):
    def convert(self, value, param, ctx):
        if isinstance(value, str) and ascii_int(value) is None:
            _refuse_foreign(self, value, param, ctx)
            self.fail(f"{value!r} is not a whole number: {ONLY}", param, ctx)
        return super().convert(value, param, ctx)


class AsciiFloat(click.types.FloatParamType):
    name = "float"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and ascii_float(value) is None:
            _refuse_foreign(self, value, param, ctx)
            self.fail(f"{value!r} is not a number: {ONLY} (e.g. 0.5 or 1e-3)", param, ctx)
        return super().convert(value, param, ctx)


class AsciiFloatRange(click.FloatRange):
    def convert(self, value, param, ctx):
        if isinstance(value, str) and ascii_float(value) is None:
            _refuse_foreign(self, value, param, ctx)
            self.fail(f"{value!r} is not a number: {ONLY} (e.g. 0.5 or 1e-3)", param, ctx)
        return super().convert(value, param, ctx)


class AsciiText(click.types.StringParamType):
    """Text an option parses itself (sizes, GPU lists, counts, a tolerance): refused when it holds
    a digit other than 0-9, which Python's int() and float() would read."""

    def convert(self, value, param, ctx):
        _refuse_foreign(self, value, param, ctx)
        return super().convert(value, param, ctx)


def ascii_type(kind: Any = None, default: Any = None, is_flag: bool = False) -> Any:
    """The option type to give click for `kind` (int, float, click's INT, FLOAT, IntRange,
    FloatRange, STRING or None, inferred from `default` as click would): its ASCII-only twin.
    Choices, paths, flags and other types stay as they are."""
    if is_flag or isinstance(default, bool) or kind is bool or \
            isinstance(kind, (click.Choice, click.Path, click.File, click.types.BoolParamType)):
        return kind
    if kind is None and default is not None and not isinstance(default, (list, tuple)):
        kind = type(default)
    if isinstance(kind, click.IntRange) and not isinstance(kind, AsciiIntRange):
        return AsciiIntRange(kind.min, kind.max, kind.min_open, kind.max_open, kind.clamp)
    if isinstance(kind, click.FloatRange) and not isinstance(kind, AsciiFloatRange):
        return AsciiFloatRange(kind.min, kind.max, kind.min_open, kind.max_open, kind.clamp)
    if kind is int or (isinstance(kind, click.types.IntParamType) and type(kind) is click.types.IntParamType):
        return AsciiInt()
    if kind is float or (isinstance(kind, click.types.FloatParamType) and type(kind) is click.types.FloatParamType):
        return AsciiFloat()
    if kind in (None, str) or type(kind) is click.types.StringParamType:
        return AsciiText()
    return kind
