"""Every terminal table is printed here: `print_table(console, table)`, and no figure is ever cut.

rich fits a table to the console by shrinking columns, and a shrunk cell loses its end to an
ellipsis ("153133..." for 153133.2 us). Here the columns are sized before rich sees them:

- a figure stays whole: a cell with a digit that is at most FIGURE_CELLS wide (a number with its
  unit, a shape such as 4096x4096x4096, a date and time) is never narrower than itself;
- no word is ever broken: text wraps at spaces only, so that a metric name, a path or a run id
  stays one piece that can be copied (`compare` in a pipe once cut `...samples_p` / `er_s`, which
  `history trend` could not take); nothing is ever ellipsized (overflow "fold", never "ellipsis"
  or "crop");
- a no_wrap column is never narrowed;
- when even the narrowest table that keeps every word whole is wider than the console, it is
  wrapped by column, never by row: printed as two or more tables stacked, each with some of the
  columns and each repeating the row's key columns (the leading columns before the first one
  whose header names a unit: size, type and placement of a comm row; GPUs and data of a model
  row), so that every line fits (80 columns of a terminal: a row wrapped by the terminal onto
  two lines is read as two rows). Only a single column too wide for the console by itself is
  printed wider, uncropped.

The table fits the console's width (100 columns when stdout is not a terminal) whenever it can.
Only rich is imported: any layer above the shared facts may use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

FIGURE_CELLS = 20  # a figure and its unit, a shape, a date and time: kept on one line up to this width
_BIG = 1 << 20


def print_table(console, table) -> None:
    """Prints `table` (a rich Table; its columns are changed in place) on `console` with every
    figure whole: columns are sized to the console's width where the figures allow it, else the
    table is split by column into tables stacked one below the other (split()); a part that still
    cannot fit (one column wider than the console) is printed wider rather than cut."""
    width = fit(console, table, console.width)
    if width <= console.width:
        console.print(table)
        return
    for n, part in enumerate(split(console, table, console.width)):
        if n:
            console.print()  # a blank line between the parts
        width = fit(console, part, console.width)
        console.print(part if width <= console.width else _AtWidth(part, width), crop=False)


# A column whose header has one of these words holds a measured figure; the columns before the
# first such one name the row (its keys), repeated in every part of a split table.
_UNIT_WORDS = {"us", "ms", "s", "%", "GiB", "MiB", "KiB", "W", "C", "MHz", "GHz"}


def _measured(column) -> bool:
    words = str(column.header).replace("\n", " ").split()
    return any(w in _UNIT_WORDS or w.endswith(("/s", "%")) or w.startswith("%") for w in words)


def key_columns(table) -> int:
    """How many leading columns name a row: those before the first whose header names a unit
    (at least 1, and every column but one at most)."""
    n = next((i for i, c in enumerate(table.columns) if _measured(c)), len(table.columns))
    return max(1, min(n, len(table.columns) - 1))


def split(console, table, width: int) -> list:
    """`table` as tables of some of its columns each, in order, every one repeating the key
    columns (key_columns(); only the first when the keys take more than 3/5 of `width`), each
    as wide as `width` allows with its words whole: the first carries the title, the last the
    caption."""
    cols = table.columns
    keys = key_columns(table)
    if _narrowest(console, table, list(range(keys))) > width * 3 // 5:
        keys = 1
    groups: list[list[int]] = []
    group: list[int] = []
    for i in range(keys, len(cols)):
        if group and _narrowest(console, table, [*range(keys), *group, i]) > width:
            groups.append(group)
            group = []
        group.append(i)
    groups.append(group)
    parts = []
    for n, group in enumerate(groups):
        part = _sub(table, [*range(keys), *group])
        part.title = table.title if n == 0 else None
        part.caption = table.caption if n == len(groups) - 1 else None
        parts.append(part)
    return parts


def _sub(table, indexes: list[int]):
    """A copy of `table` with the columns at `indexes` (their cells, their sizes reset)."""
    import copy
    from dataclasses import replace

    part = copy.copy(table)
    part.columns = [replace(table.columns[i], _index=k, _cells=list(table.columns[i]._cells), width=None)
                    for k, i in enumerate(indexes)]
    return part


def _narrowest(console, table, indexes: list[int]) -> int:
    """The width the columns at `indexes` take at the least, every word and short figure whole."""
    part = _sub(table, indexes)
    part.title = part.caption = None
    return fit(console, part, 1)


def fit(console, table, width: int) -> int:
    """Sizes `table`'s columns for `width` columns of output and returns the width it will take:
    `width` or less when its figures fit, else the narrowest width that keeps them whole."""
    from rich.measure import Measurement

    options = console.options.update_width(_BIG)
    for col in table.columns:
        if col.overflow in ("ellipsis", "crop"):
            col.overflow = "fold"
    natural = Measurement.get(console, options, table).maximum
    if natural <= width or not table.columns:
        return natural
    low, high = [], []  # content widths: every word and short figure whole; nothing wrapped
    for col in table.columns:
        if col.width is not None:
            lo = hi = col.width
        else:
            cells = [_plain(console, c) for c in [*col.cells, *_heads(table, col)]]
            hi = max((Measurement.get(console, options, c).maximum for c in [*col.cells, *_heads(table, col)]),
                     default=1)
            lo = hi if col.no_wrap else min(hi, max([1, col.min_width or 0, *_whole_widths(cells)]))
        low.append(lo), high.append(hi)
    overhead = natural - sum(high)  # padding and borders
    budget = width - overhead
    # words whole, the room left shared in proportion to what wraps; wider than the console when
    # even that does not fit
    widths = _spread(low, high, budget - sum(low)) if sum(low) <= budget else low
    for col, w in zip(table.columns, widths, strict=True):
        col.width = w
    return Measurement.get(console, options, table).maximum


def _spread(base: list[int], top: list[int], extra: int) -> list[int]:
    """`base` raised toward `top` by `extra` in all, in proportion to each column's gap."""
    gaps = [t - b for b, t in zip(base, top, strict=True)]
    total = sum(gaps)
    if total <= extra:
        return list(top)
    shares = [extra * g // total for g in gaps]
    left = extra - sum(shares)
    order = sorted(range(len(gaps)), key=lambda i: (extra * gaps[i]) % total, reverse=True)
    for i in order:
        if left <= 0:
            break
        if shares[i] < gaps[i]:
            shares[i] += 1
            left -= 1
    return [b + s for b, s in zip(base, shares, strict=True)]


def _whole_widths(texts: Iterable[str]) -> list[int]:
    """The widths that must not be broken: every word, and a short line with a digit (a figure
    with its unit, "1 GiB", up to FIGURE_CELLS)."""
    from rich.cells import cell_len

    out = []
    for text in texts:
        for line in text.splitlines():
            if any(ch.isdigit() for ch in line) and cell_len(line.strip()) <= FIGURE_CELLS:
                out.append(cell_len(line.strip()))
            out += [cell_len(word) for word in line.split()]
    return out


def _heads(table, col) -> list:
    return [*([col.header] if table.show_header else []), *([col.footer] if table.show_footer else [])]


def _plain(console, renderable) -> str:
    """The text a cell shows (as rich reads a str: markup and emoji as the console has them)."""
    from rich.text import Text

    if isinstance(renderable, str):
        return console.render_str(renderable, highlight=False).plain
    return renderable.plain if isinstance(renderable, Text) else ""


class _AtWidth:
    """A table rendered at a given width, whatever the console's."""

    def __init__(self, table, width: int) -> None:
        self.table, self.width = table, width

    def __rich_console__(self, console, options):
        yield from console.render(self.table, options.update_width(self.width))


def format_value(value: float | None, unit: str) -> str:
    """A base-unit value as a person reads it: GB/s or TB/s, TFLOP/s or GFLOP/s, s/ms/us, %
    for fractions, GiB for bytes."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if unit == "B/s":
        return (
            f"{value / 1e12:.2f} TB/s"
            if abs(value) >= 1e12
            else f"{value / 1e9:.2f} GB/s"
        )
    if unit == "FLOP/s":
        return (
            f"{value / 1e12:.1f} TFLOP/s"
            if abs(value) >= 1e11
            else f"{value / 1e9:.2f} GFLOP/s"
        )
    if unit == "s":
        if abs(value) >= 1:
            return f"{value:.3f} s"
        return (
            f"{value * 1e3:.3f} ms" if abs(value) >= 1e-3 else f"{value * 1e6:.2f} us"
        )
    if unit == "fraction":
        return f"{100 * value:.1f}%"
    if unit == "B":
        return f"{value / 2**30:.2f} GiB"
    if unit == "tokens/s":
        return f"{value:,.0f} tok/s"
    if unit == "samples/s":
        return f"{value:,.0f} samples/s"
    if unit == "samples":
        return f"{value:.0f}"
    return f"{value:.4g} {unit}"
