"""The terminal: stdout and stderr consoles, and the progress display every command shares.

stdout carries results (tables, findings, one closing line); stderr carries notes, progress and
errors. Markup is off everywhere: error texts carry "[file:line]" and other outside text that
rich would otherwise read as markup tags.

stdout is the reader's (guard_stdio, installed by the CLI first thing): a write to it that fails
never raises into the command, which goes on storing and writing its files; the failure is kept
and the CLI says it once at the end (stdout_verdict). A broken pipe (`| head -1`) is the reader's
choice: nothing is said and the exit code is what it would have been. A full (/dev/full) or
closed (`>&-`) stdout is one line on stderr and exit code 1. A closed descriptor 0, 1 or 2 is
held open on /dev/null first, so that no file the command opens (the history database) takes
its number and receives what is printed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
import time
from typing import Self


def _isatty(stream) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (OSError, ValueError, AttributeError):
        return False


PIPE_COLUMNS = 100  # stdout's width when it is not a terminal and COLUMNS does not say


def columns() -> int:
    """stdout's width when it is not a terminal: COLUMNS where it is set to a width (as a shell
    exports it, or `COLUMNS=80 mgpu-bench ... | less`), else PIPE_COLUMNS."""
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return PIPE_COLUMNS
    return width if 20 <= width <= 10_000 else PIPE_COLUMNS


def out_console():
    """stdout: a terminal's width, else columns() (100 unless COLUMNS says)."""
    from rich.console import Console

    return Console(width=columns() if not _isatty(sys.stdout) else None, soft_wrap=False, markup=False)


def err_console():
    from rich.console import Console

    return Console(stderr=True, markup=False, soft_wrap=True)  # one line per message, whatever the width


# What a terminal would obey rather than show: C0 controls (ESC starts CSI/OSC sequences, BEL ends
# OSC), DEL, C1 controls (0x9b is a one-byte CSI) and the bidirectional overrides and isolates
# (U+202A-U+202E, U+2066-U+2069), marks (U+061C, U+200E, U+200F) and line separators (U+2028,
# U+2029) that reorder or split a line. Each is shown as its escape instead.
_UNSAFE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x061C, 0x200E, 0x200F,
                                 0x2028, 0x2029)}
_UNSAFE |= {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
# Lone surrogates (JSON can carry "\\udcff"): no encoding writes them; shown as their escape too.
_UNSAFE |= {c: f"\\u{c:04x}" for c in range(0xD800, 0xE000)}
_UNSAFE_KEEP_LINES = {c: v for c, v in _UNSAFE.items() if c not in (0x09, 0x0A)}


def safe_text(text: object, lines: bool = False) -> str:
    """Stored or outside text (a host, GPU or metric name, a command line, a note, an environment
    value) for the terminal: every control character is shown as its escape (\\x1b, \\n, \\u202e),
    so "\\x1b[2J\\x1b]0;pwn\\x07" in a host name is printed as those characters, never obeyed,
    and a newline cannot forge a line of output. `lines`: text of several lines keeps its
    newlines and tabs."""
    return str(text).translate(_UNSAFE_KEEP_LINES if lines else _UNSAFE)


# -- stdout that the reader may close ------------------------------------------------------------


class GuardedStdout:
    """sys.stdout for the CLI: writes go to the real stream until one fails (EPIPE, ENOSPC, EBADF,
    EIO); then the failure is kept, descriptor 1 is pointed at /dev/null (the buffered rest, native
    code and child processes write nowhere, and Python's flush at exit raises nothing), and every
    later write is dropped. Nothing raises into the command."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.failure: OSError | None = None
        if stream is None:  # descriptor 1 was closed when the process started
            self.failure = OSError(errno.EBADF, "stdout is closed")

    def _fail(self, exc: OSError) -> None:
        if self.failure is None:
            self.failure = exc
        stream, self._stream = self._stream, None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)

    def write(self, text: str) -> int:
        if self._stream is not None and self.failure is None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._fail(exc)
        return len(text)

    def flush(self) -> None:
        if self._stream is not None and self.failure is None:
            try:
                self._stream.flush()
            except OSError as exc:
                self._fail(exc)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        return self.failure is None and _isatty(self._stream)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError(errno.EBADF, "stdout is not written any more")
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:
        return getattr(self._stream, "errors", None) or "strict"

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def guard_stdio() -> None:
    """First thing in the CLI: descriptors 0, 1 and 2 that are closed are held open on /dev/null,
    and sys.stdout becomes a GuardedStdout (idempotent); so does sys.stderr, whose failure is
    dropped (there is nowhere left to say it)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_RDWR)
                if devnull != fd:
                    os.dup2(devnull, fd)
                    os.close(devnull)
    if not isinstance(sys.stdout, GuardedStdout):
        sys.stdout = GuardedStdout(sys.stdout)
    if not isinstance(sys.stderr, GuardedStdout) and sys.stderr is not None:
        sys.stderr = GuardedStdout(sys.stderr)


def stdout_failure() -> OSError | None:
    """Why stdout could not be written (None: it could, or it is not guarded)."""
    return sys.stdout.failure if isinstance(sys.stdout, GuardedStdout) else None


def stdout_verdict(code: int) -> int:
    """The exit code once the command is done: a broken pipe changes nothing (the reader stopped
    reading); any other failure to write stdout is one line on stderr and exit code 1 where the
    command would have exited 0."""
    failure = stdout_failure()
    if failure is None or isinstance(failure, BrokenPipeError):
        return code
    why = failure.strerror or str(failure)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(f"mgpu-bench: could not write to stdout ({why}): what was not printed is lost; "
                         "the result files and the history were written as asked\n")
        sys.stderr.flush()
    return 1 if code == 0 else code


PLAIN_EVERY_S = 10.0  # a plain progress line at least this often while something runs


class Progress:
    """Progress on stderr for a run. say(text): what is happening now; step(i, total, text):
    position i of total. `style` bar: a bar with the count and the elapsed time; status: a
    spinner with the text; lines: one printed line "<name>: <text>" per say(); plain (stderr
    not a terminal: CI logs, `| tee`, Slurm): a line "<name>: <text> [i/total], N s elapsed"
    when the text changes, at most every PLAIN_EVERY_S, and at least that often while the same
    step runs. Off a terminal the lines style keeps the same heartbeat: when PLAIN_EVERY_S pass
    without a line (a probe in a child process, ranks starting), "<name>: <the last text>, N s
    elapsed" ("starting" before the first), so that a log shows the command alive at least every
    PLAIN_EVERY_S. Off: nothing."""

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
            self._line(f"{self.name}: {text}")

    def _line(self, text: str) -> None:
        """One line on stderr, its time kept for the heartbeat."""
        with self._lock:
            self.err.print(text, highlight=False)
            self._last = time.monotonic()

    @property
    def _heartbeat(self) -> bool:
        return self.show and (self.style == "plain" or (self.style == "lines" and not self.err.is_terminal))

    def __enter__(self) -> Self:
        self._t0 = self._last = time.monotonic()
        if self.style == "lines":  # the heartbeat's text until the first say()
            self._state = self._printed = ("starting", None, None)
        if self._heartbeat:
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
        while not self._done.wait(min(1.0, self.every_s / 4)):
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
            self._line(f"{self.name}: {text}")
            self._state = self._printed = (text.strip(), None, None)

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
