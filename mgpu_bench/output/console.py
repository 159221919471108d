"""The terminal: stdout and stderr consoles, and the progress display every command shares.

stdout carries results (tables, findings, one closing line); stderr carries notes, progress and
errors. Markup is off everywhere: error texts carry "[file:line]" and other outside text that
rich would otherwise read as markup tags.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Self


def out_console():
    """stdout, 100 columns wide when not a terminal."""
    from rich.console import Console

    return Console(width=100 if not sys.stdout.isatty() else None, soft_wrap=False, markup=False)


def err_console():
    from rich.console import Console

    return Console(stderr=True, markup=False, soft_wrap=True)  # one line per message, whatever the width


PLAIN_EVERY_S = 10.0  # a plain progress line at least this often while something runs


class Progress:
    """Progress on stderr for a run. say(text): what is happening now; step(i, total, text):
    position i of total. `style` bar: a bar with the count and the elapsed time; status: a
    spinner with the text; lines: one printed line "<name>: <text>" per say(); plain (stderr
    not a terminal: CI logs, `| tee`, Slurm): a line "<name>: <text> [i/total], N s elapsed"
    when the text changes, at most every PLAIN_EVERY_S, and at least that often while the same
    step runs. Off: nothing."""

    def __init__(self, err, name: str, style: str, show: bool, every_s: float = PLAIN_EVERY_S) -> None:
        self.err, self.name, self.style, self.show = err, name, style, show
        self._stack = contextlib.ExitStack()
        self._bar = self._task = self._status = None
        self.every_s = every_s
        self._state: tuple[str, int | None, int | None] | None = None
        self._printed: tuple | None = None
        self._last = 0.0
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()

    def estimate(self, text: str | None) -> None:
        """The run's expected length, said once at the start (from the probe's plan)."""
        if self.show and text:
            self.err.print(f"{self.name}: {text}", highlight=False)

    def __enter__(self) -> Self:
        self._t0 = time.monotonic()
        if self.show and self.style == "plain":
            threading.Thread(target=self._tick, daemon=True, name="progress").start()
            self._stack.callback(self._done.set)
        elif self.show and self.style == "bar":
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

    def _plain(self, force: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if self._state is None or (not force and now - self._last < self.every_s):
                return
            if not force and self._state == self._printed and now - self._last < self.every_s:
                return
            text, i, total = self._state
            where = f" [{i}/{total}]" if total else ""
            self.err.print(f"{self.name}: {text}{where}, {now - self._t0:.0f} s elapsed", highlight=False)
            self._printed, self._last = self._state, now

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            self._plain(False)

    def say(self, text: str) -> None:
        if not self.show:
            return
        if self.style == "plain":
            first = self._state is None
            self._state = (text, None, None)
            self._plain(first)
        elif self._bar is not None:
            self._bar.update(self._task, description=text)
        elif self._status is not None:
            self._status.update(f"{self.name}: {text}")
        else:
            self.err.print(f"{self.name}: {text}", highlight=False)

    def step(self, i: int, total: int, text: str) -> None:
        if not self.show:
            return
        if self.style == "plain":
            first = self._state is None
            self._state = (text, i, total)
            self._plain(first)
        elif self._bar is not None:
            self._bar.update(self._task, total=total, completed=i, description=text)
        else:
            self.say(text)

    @property
    def say_fn(self):
        """say, or None when nothing is shown (for code that skips work to describe itself)."""
        return self.say if self.show else None
