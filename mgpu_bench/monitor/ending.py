"""How a monitored job that ends without finish() still keeps its figures. A mixin of StepMonitor:
its _end(why) does the work; the windows measured so far are stored, marked as ended early.

- The interpreter's exit (an exception out of the loop, sys.exit): an exit hook.
- SIGTERM (a scheduler's time limit, torchrun stopping the job) and SIGHUP (the terminal or ssh
  session the job ran in closed): one handler per process, the relay. Python lets handlers be set
  from the main thread only, so the relay is set when this module is imported there (`from
  mgpu_bench import StepMonitor` at the top of the job's script) and again at the first step of a
  monitor in the main thread (over a handler the job set since). A monitor made and stepped in a
  worker thread is kept by the relay the main thread set; a job that imports the monitor only in a
  worker thread has no relay (signal.signal raises there) and keeps its figures at exit only.
- What the relay does: where the signal's action is the default one, it stores every monitor of
  this process that measured and did not finish, then the default action ends the process (by the
  signal, as it would have without the monitor). Where the job set a handler of its own, that
  handler decides: it runs, and if the job then ends (sys.exit, an exception) the exit hook stores
  the run; a handler that returns means the job, and the monitor, go on. An ignored signal (nohup's
  SIGHUP) stays ignored; a handler set outside Python is left alone.
- While a run is gathered and stored (finish() or an early end, in any thread) a signal waits and
  is delivered after, so that it never ends the process with the figures half kept.
- A process forked from the monitored one (os.fork, a fork-started DataLoader worker) inherits the
  exit hook and the relay but stores nothing: both act only in the process that ran the monitor's
  first step (its owner); elsewhere the relay only passes the signal on.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
import weakref

# What each signal the relay handles means, for the stored run's status.
SIGNALS = {signal.SIGTERM: "SIGTERM (a scheduler's time limit, or the job stopped)",
           signal.SIGHUP: "SIGHUP (the terminal or ssh session the job ran in closed)"}
# How long the relay waits for a worker thread to leave the monitor's own code (a step's edge, a
# window read: microseconds to milliseconds) before it reads the monitor from the main thread.
OUTSIDE_WAIT_S = 1.0

_HERE = os.path.dirname(os.path.abspath(__file__))
_live: list[tuple[weakref.ref, int]] = []  # (monitor, the thread that steps it), in the order of their first steps
_previous: dict[int, object] = {}  # signal -> what it did before the relay: the job's handler or SIG_DFL
_storing: list[tuple[int, object]] = []  # (pid, token) per _end under way, in any thread (appends are atomic)
_pending: list[int] = []  # signals that came while a run was stored: delivered once it is kept
_relaying = False  # the relay is storing the monitors for a signal; the process ends after


def install() -> bool:
    """The relay for SIGTERM and SIGHUP, set where they have the default action or a Python handler
    of the job's (which it then runs instead of storing: see the module's docs). From the main thread
    only; False elsewhere, nothing done."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in SIGNALS:
        with contextlib.suppress(ValueError, OSError):  # not the main interpreter, or no signals here
            current = signal.getsignal(sig)
            if current is _relay or current is signal.SIG_IGN or current is None:  # None: set outside Python
                continue
            _previous[sig] = current
            signal.signal(sig, _relay)
    return True


def _relay(signum, frame) -> None:
    global _relaying
    if _relaying:  # the first signal's storing is under way; the process ends by it after
        return
    if _storing_here():  # a run is being stored: the signal waits (Ending._redeliver sends it again)
        _pending.append(signum)
        return
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):  # the job's own handler decides; if the job then ends, the exit hook keeps the run
        previous(signum, frame)
        return
    _relaying = True
    try:
        _keep_all(SIGNALS.get(signum, signal.Signals(signum).name))
    finally:
        _relaying = False
        _pending.clear()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # the default action: the process ends by the signal


def _storing_here() -> bool:
    """A run of this process is being stored (a fork made meanwhile inherits the list, not the store)."""
    me = os.getpid()
    return any(pid == me for pid, _ in _storing)


def _keep_all(why: str) -> None:
    """Every monitor of this process that measured and has not finished, stored as ended early."""
    me = os.getpid()
    for ref, thread in _live:  # a monitor whose first step comes meanwhile is seen too
        mon = ref()
        if mon is not None and mon._owner_pid == me and mon._doc is None and mon._seen and not mon._ending:
            _wait_outside(thread)
            with contextlib.suppress(Exception):  # _end says its own failure; the next monitor is still kept
                mon._end(why)


def _wait_outside(thread: int) -> None:
    """Until `thread` (one that steps a monitor) is outside the monitor's own code, at most
    OUTSIDE_WAIT_S: its hot path is not locked, so the main thread reads the monitor between two of
    its calls. The calling thread itself is never waited for."""
    if thread == threading.get_ident():
        return
    end = time.monotonic() + OUTSIDE_WAIT_S
    while time.monotonic() < end:
        frame = sys._current_frames().get(thread)
        while frame is not None and os.path.dirname(frame.f_code.co_filename) != _HERE:
            frame = frame.f_back
        if frame is None:
            return
        time.sleep(0.001)


class Ending:
    """StepMonitor's end without finish()."""

    def _hook_exit(self) -> None:
        """At the first step: this process owns the monitor (a forked child stores nothing), its
        exit hook is set, and the relay, where the main thread can set it."""
        self._owner_pid = os.getpid()
        atexit.register(self._at_exit)
        _live.append((weakref.ref(self), threading.get_ident()))
        install()

    def _defer_term(self) -> object:
        """While the run is gathered and stored, a SIGTERM or SIGHUP waits (the relay notes it)
        instead of ending the process with the figures half kept; the exit hook is taken off. The
        token goes to _redeliver."""
        atexit.unregister(self._at_exit)
        token = (os.getpid(), object())
        _storing.append(token)
        return token

    def _redeliver(self, token: object) -> None:
        """The run is kept: a signal that waited is delivered, once no other run is being stored."""
        with contextlib.suppress(ValueError):
            _storing.remove(token)
        if _storing_here() or _relaying or not _pending:
            return
        waited = list(dict.fromkeys(_pending))
        _pending.clear()
        for sig in waited:
            os.kill(os.getpid(), sig)

    def _at_exit(self) -> None:
        if os.getpid() != getattr(self, "_owner_pid", None):  # a forked child's exit: the run is its parent's
            return
        if self._doc is None and self._seen:
            for ref, thread in _live:
                if ref() is self:
                    _wait_outside(thread)  # a daemon thread may still be stepping it
            self._end("the job ended without finish() (an exception out of the loop, or sys.exit)")


if threading.current_thread() is threading.main_thread():
    install()  # imported in the main thread: monitors made in worker threads are kept on a signal too
