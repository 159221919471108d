"""What the history commands share (cli.py: `history`; cli_compare.py: `baseline` and `compare`):
the --db option, the database opened for reading or for writing, the console their tables print
on, a change and a noise in words, and the command group that prints its help when given no
command.
"""

from __future__ import annotations

import math
import sys

import click

_DB_HELP = "History database [default: $MGPU_BENCH_DB, else $XDG_DATA_HOME/mgpu-bench/history.sqlite3]."


def _db_option(f):
    return click.option("--db", "db_path", default=None, metavar="PATH", help=_DB_HELP)(
        f
    )


def _out():
    """stdout at 100 columns when not a terminal; markup and highlighting off: run ids, host
    names and commands are outside text."""
    from rich.console import Console

    from mgpu_bench.output.console import _isatty

    return Console(
        width=100 if not _isatty(sys.stdout) else None,
        soft_wrap=False,
        markup=False,
        highlight=False,
    )


def _open(db_path: str | None, readonly: bool = False, create: bool = True):
    """The history database; `readonly` for the commands that only read (a missing database is
    one line naming its path, and no write lock is taken)."""
    from .store import History

    if create and not readonly:  # refused before anything is made (the XDG folder under HOME=/dev, say)
        History.check(db_path)
    elif not readonly:  # a write to what must be there: a missing database is said as the readers say it
        History.open(db_path, readonly=True).close()
    return History.open(db_path, readonly=readonly, create=create)


def _db(db_path: str | None):
    """The database path a command uses, for the checks of its outputs against it."""
    from .store import default_path

    return db_path or default_path()


def format_change(change: float | None, absolute: bool) -> str:
    """'+3.2%' (relative) or '+1.2 pp' (a fraction's change in percentage points)."""
    if change is None:
        return "-"
    if math.isinf(change):
        return "+inf" if change > 0 else "-inf"
    return f"{100 * change:+.1f} pp" if absolute else f"{100 * change:+.1f}%"


def format_noise(value: float | None, absolute: bool) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f} pp" if absolute else f"{100 * value:.1f}%"


class HelpGroup(click.Group):
    """A command group that, given no command, prints its help as --help prints it (stdout, its
    own lines) and exits 2, click's code for a missing command; click would put the help in a
    usage error, which the main group prints as one line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(2)
        return super().parse_args(ctx, args)
