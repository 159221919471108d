"""Every terminal table is printed here: `print_table(console, table)`, and no figure is ever cut.

rich fits a table to the console by shrinking columns, and a shrunk cell loses its end to an
ellipsis ("153133..." for 153133.2 us). Here the columns are sized before rich sees them:

- a figure stays whole: a cell with a digit that is at most FIGURE_CELLS wide (a number with its
  unit, a shape such as 4096x4096x4096, a date and time) is never narrower than itself, and in
  longer cells (error texts) every word with a digit that is no wider either; so is a short word
  of a cell (WORD_CELLS: "n/a", "fp32", "sum") and every word of a header ("#wrong", "%theo");
- text wraps at spaces, and folds a long word of a cell only when that makes the table fit;
  nothing is ever ellipsized (overflow "fold", never "ellipsis" or "crop");
- a no_wrap column is never narrowed;
- when even the narrowest table that keeps every figure whole is wider than the console, the
  table keeps every word whole too and is printed wider than the console, uncropped: a terminal
  wraps the long lines, a file keeps them.

The table fits the console's width (100 columns when stdout is not a terminal) whenever it can.
Only rich is imported: any layer above the shared facts may use it.
"""

from __future__ import annotations

from collections.abc import Iterable

FIGURE_CELLS = 20  # a figure and its unit, a shape, a date and time: kept whole up to this width
WORD_CELLS = 12  # a cell's words up to this width are never folded
_BIG = 1 << 20


def print_table(console, table) -> None:
    """Prints `table` (a rich Table; its columns are changed in place) on `console` with every
    figure whole: columns are sized to the console's width where the figures allow it, else the
    table is printed wider than the console rather than cut."""
    width = fit(console, table, console.width)
    if width <= console.width:
        console.print(table)
    else:
        console.print(_AtWidth(table, width), crop=False)


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
    lo, mid, hi = [], [], []  # content widths: figures whole, words whole, nothing wrapped
    for col in table.columns:
        if col.width is not None:
            low = middle = high = col.width
        else:
            cells = [_plain(console, c) for c in col.cells]
            heads = [_plain(console, h) for h in _heads(table, col)]
            sizes = [Measurement.get(console, options, r) for r in [*col.cells, *_heads(table, col)]]
            high = max((m.maximum for m in sizes), default=1)
            low = max([1, col.min_width or 0, *_figure_widths(cells, whole=True), *_word_widths(heads)])
            if col.no_wrap:
                low = high
            high = max(high, low)
            middle = min(high, max(low, max((m.minimum for m in sizes), default=1)))
        lo.append(low), mid.append(middle), hi.append(high)
    overhead = natural - sum(hi)  # padding and borders
    budget = width - overhead
    if sum(mid) <= budget:  # words whole; the room left shared in proportion to what wraps
        widths = _spread(mid, hi, budget - sum(mid))
    elif sum(lo) <= budget:  # as few columns with folded words as fit
        widths = _unfold(lo, mid, budget - sum(lo))
    else:  # wider than the console whatever is folded: words whole
        widths = mid
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


def _unfold(base: list[int], top: list[int], extra: int) -> list[int]:
    """`base` raised to `top` column by column while `extra` lasts, the smallest gap first (the
    most columns unfolded); what is left shared among the others in proportion."""
    out = list(base)
    for i in sorted(range(len(base)), key=lambda i: top[i] - base[i]):
        if top[i] - base[i] > extra:
            break
        extra -= top[i] - base[i]
        out[i] = top[i]
    return _spread(out, top, extra)


def _figure_widths(texts: Iterable[str], whole: bool) -> list[int]:
    """The widths that must not be broken: each word with a digit (up to FIGURE_CELLS: longer
    ones are names, paths); with `whole` (cells) also a short line with a digit and every short
    word."""
    from rich.cells import cell_len

    out = []
    for text in texts:
        for line in text.splitlines():
            digits = any(ch.isdigit() for ch in line)
            if whole and digits and cell_len(line.strip()) <= FIGURE_CELLS:
                out.append(cell_len(line.strip()))
                continue
            for word in line.split():
                n = cell_len(word)
                if n <= (FIGURE_CELLS if any(ch.isdigit() for ch in word) else WORD_CELLS if whole else 0):
                    out.append(n)
    return out


def _word_widths(texts: Iterable[str]) -> list[int]:
    """The width of every word of a header: a header word is never broken ("#wrong", "busbw")."""
    from rich.cells import cell_len

    return [cell_len(word) for text in texts for word in text.split()]


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
