"""How a monitored job that ends without finish() still keeps its figures: the interpreter's exit
hook (an exception out of the training loop, sys.exit) and a SIGTERM handler (a scheduler's time
limit, torchrun stopping the job) that store the windows measured so far, marked as ended early,
then do what was there before (the default: the process ends by the signal, as it would have).
While a run is gathered and stored a SIGTERM waits and is delivered after. A mixin of StepMonitor:
its _end(why) does the work."""

from __future__ import annotations


class Ending:
    """StepMonitor's end without finish()."""

    def _hook_exit(self) -> None:
        """The job's end without finish(): the interpreter's exit (an exception out of the loop)
        and SIGTERM (in the main thread only, where handlers are set)."""
        import atexit
        import signal
        import threading

        atexit.register(self._at_exit)
        if threading.current_thread() is threading.main_thread():
            try:
                previous = signal.getsignal(signal.SIGTERM)
                if previous is not signal.SIG_IGN and previous is not None:
                    self._previous_term = previous
                    signal.signal(signal.SIGTERM, self._on_term)
            except (ValueError, OSError):  # not the main interpreter, or no signals here
                self._previous_term = None

    def _defer_term(self) -> list:
        """While the run is gathered and stored, a SIGTERM waits (the list it is noted in) instead of
        ending the process with the figures half kept; the exit hook is taken off."""
        import atexit
        import signal
        import threading

        atexit.unregister(self._at_exit)
        pending: list = []
        if threading.current_thread() is not threading.main_thread():
            return pending
        try:
            self._restore_term = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, lambda signum, frame: pending.append(signum))
        except (ValueError, OSError):
            self._restore_term = None
        return pending

    def _redeliver(self, pending: list) -> None:
        """The handler there before the monitor's back in place; a SIGTERM that waited is delivered."""
        import os
        import signal

        restore = getattr(self, "_restore_term", None)
        if restore is None:
            return
        if restore == self._on_term:
            restore = self._previous_term
        try:
            signal.signal(signal.SIGTERM, restore if restore is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            return
        if pending:
            os.kill(os.getpid(), signal.SIGTERM)

    def _at_exit(self) -> None:
        if self._doc is None and self._seen:
            self._end("the job ended without finish() (an exception out of the loop, or sys.exit)")

    def _on_term(self, signum, frame) -> None:
        """SIGTERM: the figures kept first, then what the handler before would have done (the
        default: the process ends by the signal, as it would have without the monitor)."""
        import signal

        if self._doc is None and self._seen and not self._ending:
            self._end("SIGTERM (a scheduler's time limit, or the job stopped)")
        previous = self._previous_term
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            import os

            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
