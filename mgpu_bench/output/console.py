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


# What a terminal would obey rather than show: C0 controls (ESC starts CSI/OSC sequences, BEL ends
# OSC), DEL, C1 controls (0x9b is a one-byte CSI) and the bidirectional overrides and isolates
# (U+202A-U+202E, U+2066-U+2069) that reorder a line. Each is shown as its escape instead.
_UNSAFE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
_UNSAFE |= {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_UNSAFE_KEEP_LINES = {c: v for c, v in _UNSAFE.items() if c not in (0x09, 0x0A)}


def safe_text(text: object, lines: bool = False) -> str:
    """Stored or outside text (a host, GPU or metric name, a command line, a note, an environment
    value) for the terminal: every control character is shown as its escape (\\x1b, \\n, \\u202e),
    so "\\x1b[2J\\x1b]0;pwn\\x07" in a host name is printed as those characters, never obeyed,
    and a newline cannot forge a line of output. `lines`: text of several lines keeps its
    newlines and tabs."""
    return str(text).translate(_UNSAFE_KEEP_LINES if lines else _UNSAFE)


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
        """The run's expected length (from the probe's plan), said once when the run reports its
        first progress: a run that stops on bad input before measuring says nothing more."""
        self._estimate = text if self.show else None

    def _said_estimate(self) -> None:
        text, self._estimate = getattr(self, "_estimate", None), None
        if text:
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
        self._said_estimate()
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
        self._said_estimate()
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
