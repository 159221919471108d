"""The terminal: stdout and stderr consoles, and the progress display every command shares.

stdout carries results (tables, findings, one closing line); stderr carries notes, progress and
errors. Markup is off everywhere: error texts carry "[file:line]" and other outside text that
rich would otherwise read as markup tags.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Self


def out_console():
    """stdout, 100 columns wide when not a terminal."""
    from rich.console import Console

    return Console(width=100 if not sys.stdout.isatty() else None, soft_wrap=False, markup=False)


def err_console():
    from rich.console import Console

    return Console(stderr=True, markup=False, soft_wrap=True)  # one line per message, whatever the width


class Progress:
    """Progress on stderr for a run. say(text): what is happening now; step(i, total, text):
    position i of total. `style` bar: a bar with the count and the elapsed time; status: a
    spinner with the text; lines: one printed line "<name>: <text>" per say(). Off: nothing."""

    def __init__(self, err, name: str, style: str, show: bool) -> None:
        self.err, self.name, self.style, self.show = err, name, style, show
        self._stack = contextlib.ExitStack()
        self._bar = self._task = self._status = None

    def __enter__(self) -> Self:
        if self.show and self.style == "bar":
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = self._stack.enter_context(Bar(TextColumn("{task.description}"), BarColumn(),
                                                      MofNCompleteColumn(), TimeElapsedColumn(),
                                                      console=self.err, transient=True))
            self._task = self._bar.add_task(self.name, total=None)
        elif self.show and self.style == "status":
            self._status = self._stack.enter_context(self.err.status(self.name))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def say(self, text: str) -> None:
        if not self.show:
            return
        if self._bar is not None:
            self._bar.update(self._task, description=text)
        elif self._status is not None:
            self._status.update(f"{self.name}: {text}")
        else:
            self.err.print(f"{self.name}: {text}", highlight=False)

    def step(self, i: int, total: int, text: str) -> None:
        if not self.show:
            return
        if self._bar is not None:
            self._bar.update(self._task, total=total, completed=i, description=text)
        else:
            self.say(text)

    @property
    def say_fn(self):
        """say, or None when nothing is shown (for code that skips work to describe itself)."""
        return self.say if self.show else None
