"""Exceptions raised by mgpu-bench.

The native core raises these (through pybind11) with the library's numeric code; they pickle,
so a worker process can hand one to its parent unchanged.
"""

from __future__ import annotations

import contextlib
import signal
import sys


class MgpuError(RuntimeError):
    """Base of every error the native core raises. ``code`` is the library's error code."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # keep the code across pickling
        return (type(self), (str(self), self.code))


class CudaError(MgpuError):
    """A CUDA runtime call failed (code: cudaError_t)."""


class NcclError(MgpuError):
    """An NCCL call failed (code: ncclResult_t)."""


class CublasError(MgpuError):
    """A cuBLAS/cuBLASLt call failed (code: cublasStatus_t)."""


class OutOfMemoryError(CudaError):
    """Device buffers for one measurement did not fit; earlier measurements stand."""


class CommTimeoutError(NcclError):
    """A collective did not finish within the timeout; the communicators were aborted."""


class InputError(ValueError):
    """Bad user input: the message names the fix. The CLI turns it into exit code 2."""


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling (to another process: MgpuError subclasses do), else an
    MgpuError that says what it was."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - whatever fails to pickle is described instead
        return MgpuError(f"{type(exc).__name__}: {exc}")


class Terminated(KeyboardInterrupt):
    """SIGTERM (scancel, a job's time limit, a launcher stopping its job after another rank
    failed, kill) or SIGHUP (the terminal or ssh session the command ran in closed): raised where
    the program is, as Ctrl-C's KeyboardInterrupt is, so every path that keeps what was measured
    on Ctrl-C keeps it on these too. `signum`: which of the two."""

    def __init__(self, context: str = "", signum: int | None = None) -> None:
        super().__init__(context)
        self.context = context  # what else is known: "rank 3 (cuda:3 on gpu07) is gone ..."
        self.signum = int(signal.SIGTERM if signum is None else signum)

    def __str__(self) -> str:
        return f"terminated ({signal_name(self.signum)})" + (f" [{self.context}]" if self.context else "")

    def __reduce__(self):
        return (type(self), (self.context, self.signum))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_terminated = False  # SIGTERM or SIGHUP received
_term_signal: int | None = None  # which of them came first (the exit code is 128 + it)
_interrupted = False  # SIGINT (Ctrl-C) received
_stopping = False  # a stop signal came: the orderly stop (or the writing of the results) is under way
_installed = False  # handle_stop_signals() ran in this process
_deferred = False  # the measurement is over: a stop signal no longer raises
_agent_exc: type | None = None  # torch's SignalException while its elastic agent runs here (under_agent)
_redeliver: BaseException | None = None  # a stop's exception a finalizer swallowed, to raise again (_stop_in_a_finalizer)
REDELIVER_S = 0.02  # when it is raised again: long past a finalizer's return, short beside any step a stop waits for
_last_press: float | None = None  # when the last Ctrl-C counted toward abandoning came (time.monotonic)
_presses = 0  # Ctrl-C presses counted toward abandoning, after the one that began the stop
_noted = False  # the "already stopping" note was printed since the last counted press

# The signals that stop a run as SIGTERM does (they keep what was measured; exit code 128 + the
# signal): SIGTERM, and SIGHUP, which a closing terminal or ssh session sends to its jobs.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)

# The Ctrl-C presses after the one that began the stop that abandon it (exit 130 at once, nothing
# more written), each at least PRESS_GAP_S after the last one counted: a burst (a key held down,
# a terminal's SIGINT reaching every process of the group, twenty in a second) counts once.
ABANDON_PRESSES = 3
PRESS_GAP_S = 1.0


def interruption(exc: BaseException | None) -> str:
    """How a run was stopped from outside, for its one-line message."""
    if isinstance(exc, Terminated):
        return str(exc)
    return f"terminated ({signal_name(termination_signal())})" if is_sigterm(exc) else "interrupted"


def is_sigterm(exc: BaseException | None) -> bool:
    """Whether `exc` is how SIGTERM or SIGHUP reached this code: Terminated, or the
    SignalException of torch's elastic agent (see under_agent; the process then counts as
    terminated)."""
    global _terminated, _term_signal

    if isinstance(exc, Terminated):
        return True
    sigval = getattr(exc, "sigval", None)
    if type(exc).__name__ == "SignalException" and sigval in TERMINATING:
        _terminated = True
        _term_signal = _term_signal or int(sigval)
        return True
    return False


def terminated() -> bool:
    """Whether this process received SIGTERM or SIGHUP (its exit code is then 143 or 129, not
    Ctrl-C's 130)."""
    return _terminated


def termination_signal() -> int:
    """The signal that terminated this process (SIGTERM unless SIGHUP came first)."""
    return int(_term_signal or signal.SIGTERM)


def termination_code() -> int:
    """The exit code of a process that a stop signal ended after writing its results: 128 + the
    signal, as a shell reports a process it ended (143 SIGTERM, 129 SIGHUP)."""
    return 128 + termination_signal()


def interrupted() -> bool:
    """Whether this process received SIGINT (Ctrl-C), whether or not it raised."""
    return _interrupted


def _say(line: str) -> None:
    """One line on stderr from a signal handler: os.write, as the main thread may be inside a
    buffered write to sys.stderr (a print there would raise "reentrant call")."""
    import os

    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode(errors="replace"))


def _stop_signal(signum, frame) -> None:
    """SIGINT, SIGTERM and SIGHUP: the first one, while measuring, raises (KeyboardInterrupt, Terminated;
    torch's SignalException inside its elastic agent) where the main thread is, and the probe keeps
    what it measured; every later one, and one that comes once the measurement is over, is noted
    and does not interrupt the writing of the results. Ctrl-C ABANDON_PRESSES more times, spaced,
    abandons: its children killed, one line, exit 130."""
    global _terminated, _interrupted, _stopping, _term_signal, _redeliver
    if _redeliver is not None and signum == signal.SIGINT and not _deferred:  # _stop_in_a_finalizer's call
        exc, _redeliver = _redeliver, None
        raise exc
    sigint = signum == signal.SIGINT
    first = not _stopping
    _stopping = True
    if sigint:
        _interrupted = True
    else:
        _terminated = True
        _term_signal = _term_signal or int(signum)
    if first and not _deferred:
        if sigint:
            _press(first=True, raised=True)
        if _agent_exc is not None:
            raise _agent_exc(f"Process got signal: {signal.Signals(signum).name}", sigval=signal.Signals(signum))
        raise KeyboardInterrupt if sigint else Terminated(signum=signum)
    if sigint:
        _press(first=_last_press is None)


def _press(first: bool, raised: bool = False) -> None:
    """Counts a Ctrl-C toward abandoning the stop, and says so once per counted press."""
    global _last_press, _presses, _noted
    import time

    now = time.monotonic()
    if first:  # the press that began the stop, or the first one once the results are being written
        _last_press, _presses, _noted = now, 0, False
        if not raised:
            _say(f"mgpu-bench: Ctrl-C: writing the results first (Ctrl-C {ABANDON_PRESSES} more times, "
                 "a second apart, abandons them)")
            _noted = True
        return
    if now - _last_press >= PRESS_GAP_S:
        _last_press, _presses, _noted = now, _presses + 1, False
        if _presses >= ABANDON_PRESSES:
            _abandon()
    if not _noted:
        left = ABANDON_PRESSES - _presses
        _say(f"mgpu-bench: already stopping: writing what was measured (Ctrl-C {left} more "
             f"time{'s' if left > 1 else ''}, a second apart, abandons it)")
        _noted = True


def _abandon() -> None:
    import os

    _say("mgpu-bench: abandoned after repeated Ctrl-C: what was measured is not written")
    with contextlib.suppress(Exception):
        from . import children

        children.abandon()
    os._exit(130)


def handle_stop_signals() -> None:
    """Installs _stop_signal for SIGINT and the TERMINATING signals, SIGTERM and SIGHUP (the CLI
    does, first thing; a hang-up, the terminal or ssh session closing, is a stop as SIGTERM is,
    not the loss of the run). Python runs it in the main thread between bytecodes; the native
    core polls for signals while it waits on the GPU. SIGKILL, which every launcher sends after
    its grace period, still ends the process (and its children with it: children.py)."""
    global _installed
    signal.signal(signal.SIGINT, _stop_signal)
    for sig in TERMINATING:
        if signal.getsignal(sig) is not signal.SIG_IGN or sig == signal.SIGTERM:  # nohup's SIGHUP stays ignored
            signal.signal(sig, _stop_signal)
    _spare_resource_tracker()
    if not _installed:
        import atexit

        atexit.register(_ignore_late_signals)
        global _other_unraisablehook
        if sys.unraisablehook is not _stop_in_a_finalizer:  # never its own fallback
            _other_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _stop_in_a_finalizer
    _installed = True


_other_unraisablehook = sys.__unraisablehook__  # the hook handle_stop_signals() found


def _stop_in_a_finalizer(unraisable) -> None:
    """sys.unraisablehook: the exception of a stop signal that _stop_signal raised where Python
    cannot pass it on (a weakref callback or __del__ the garbage collector ran: torch's rendezvous
    timer joins its thread in one) would be printed with a traceback and dropped, and the run
    would go on as if no signal had come (a one-rank run in this process to its end). Nothing is
    printed; while measuring, the same exception is raised again in the main thread once the
    finalizer has returned, as if the signal had come a moment later: a thread sends the main
    thread SIGINT after REDELIVER_S, whose handler (_stop_signal) raises it (a signal handled
    inside this hook would raise into it; one that lands in another finalizer is sent again).
    Anything else goes to the hook that was there."""
    global _redeliver
    exc = unraisable.exc_value
    if _stopping and (isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "SignalException"):
        if not _deferred and signal.getsignal(signal.SIGINT) is _stop_signal:
            import threading

            _redeliver = exc
            main = threading.main_thread().ident
            later = threading.Timer(REDELIVER_S, signal.pthread_kill, (main, signal.SIGINT))
            later.daemon = True
            later.start()
        return
    _other_unraisablehook(unraisable)



def _spare_resource_tracker() -> None:
    """multiprocessing's resource tracker (the process that unlinks the semaphores of a run's
    queues should the run die) ignores SIGINT and SIGTERM, blocking them while it is started; a
    hang-up to the process group would still kill it, and the semaphores it tracks would be
    reported leaked. It is started with SIGHUP blocked as well (its module's _IGNORED_SIGNALS,
    which CPython 3.11-3.13 block around the start and unblock in the tracker's own copy): it keeps
    SIGHUP blocked, and ends as it always does, when this process closes its pipe."""
    try:
        import multiprocessing.resource_tracker as tracker
    except ImportError:
        return
    ignored = tuple(getattr(tracker, "_IGNORED_SIGNALS", ()))
    if ignored and signal.SIGHUP not in ignored:
        tracker._IGNORED_SIGNALS = (*ignored, signal.SIGHUP)


def _ignore_late_signals() -> None:
    """At exit (the command has chosen its exit code, its threads have ended): a stop signal from
    here on is ignored, whether one came before (the rest of a burst: twenty Ctrl-Cs in a second)
    or this is the first. The interpreter's finalisation puts back the default action of a signal
    that has a Python handler, which would end the process by the signal (exit -2, seen with a
    Ctrl-C in a run's last 50 ms) after it wrote and stored everything and chose its exit code; an
    ignored one it leaves ignored."""
    with contextlib.suppress(ValueError, OSError):
        for sig in (signal.SIGINT, *TERMINATING):
            signal.signal(sig, signal.SIG_IGN)


raise_on_sigterm = handle_stop_signals  # its former name


def restore_sigterm() -> None:
    """Installs the handlers again where handle_stop_signals() had (a torch elastic agent that
    does not read TORCHELASTIC_SIGNALS_TO_HANDLE replaces them, and leaves its own behind). Called
    in a `finally` while the agent's SignalException or a KeyboardInterrupt is on its way, that
    stop has begun: a later signal is only noted."""
    global _stopping
    if not _installed:
        return
    exc = sys.exc_info()[1]
    if isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "SignalException":
        _stopping = True
    handle_stop_signals()


@contextlib.contextmanager
def under_agent(signals: str | None = None):
    """While torch's elastic agent runs its workers in this process: yields the signals it
    should handle itself (`signals`, its LaunchConfig.signals_to_handle, without SIGINT, SIGTERM
    and SIGHUP; also set as TORCHELASTIC_SIGNALS_TO_HANDLE, which it reads), so that it leaves
    those to handle_stop_signals(); the first of them raises the agent's own
    SignalException, which it answers by stopping its workers with that signal, and later ones
    are only noted, so that they do not break its shutdown. Without handle_stop_signals() in this
    process (a library caller), it yields `signals` and changes nothing."""
    global _agent_exc
    import os

    from torch.distributed.elastic.multiprocessing.api import SignalException

    key = "TORCHELASTIC_SIGNALS_TO_HANDLE"
    before = os.environ.get(key)
    keep = signals
    if _installed:
        rest = [s.strip() for s in (signals or before or "SIGTERM,SIGINT,SIGHUP,SIGQUIT").split(",")
                if s.strip() and s.strip() not in ("SIGINT", "SIGTERM", "SIGHUP")]
        keep = ",".join(rest or ["SIGQUIT"])
        os.environ[key] = keep
        _agent_exc = SignalException
    try:
        yield keep
    finally:
        _agent_exc = None
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
        restore_sigterm()


def stop_pending() -> BaseException | None:
    """The stop to raise before new work starts, when a stop signal came while measuring but did
    not end the measurement (run_elastic kept the ranks' results it came after): Terminated or
    KeyboardInterrupt; None when no stop signal came, or the measurement is over."""
    if not _stopping or _deferred:
        return None
    return Terminated(signum=termination_signal()) if _terminated else KeyboardInterrupt()


def defer_sigterm() -> None:
    """The measurement is over: from here on neither SIGTERM, SIGHUP nor Ctrl-C interrupts the
    writing of its results (the process exits 143, 129 or 130 once they are written)."""
    global _deferred
    _deferred = True
