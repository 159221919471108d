"""Exceptions raised by mgpu-bench.

The native core raises these (through pybind11) with the library's numeric code; they pickle,
so a worker process can hand one to its parent unchanged.
"""

from __future__ import annotations


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
    failed, kill): raised where the program is, as Ctrl-C's KeyboardInterrupt is, so every path
    that keeps what was measured on Ctrl-C keeps it on SIGTERM too."""

    def __init__(self, context: str = "") -> None:
        super().__init__(context)
        self.context = context  # what else is known: "rank 3 (cuda:3 on gpu07) is gone ..."

    def __str__(self) -> str:
        return "terminated (SIGTERM)" + (f" [{self.context}]" if self.context else "")


_terminated = False  # SIGTERM received
_installed = False  # raise_on_sigterm() ran in this process
_deferred = False  # the measurement is over: SIGTERM no longer raises


def interruption(exc: BaseException | None) -> str:
    """How a run was stopped from outside, for its one-line message."""
    if isinstance(exc, Terminated):
        return str(exc)
    return "terminated (SIGTERM)" if is_sigterm(exc) else "interrupted"


def is_sigterm(exc: BaseException | None) -> bool:
    """Whether `exc` is how SIGTERM reached this code: Terminated, or the SignalException of
    torch's elastic agent, which replaces the SIGTERM handler while it runs its workers (the
    process then counts as terminated)."""
    global _terminated
    import signal

    if isinstance(exc, Terminated):
        return True
    if type(exc).__name__ == "SignalException" and getattr(exc, "sigval", None) == signal.SIGTERM:
        _terminated = True
        return True
    return False


def terminated() -> bool:
    """Whether this process received SIGTERM (its exit code is then 143, not Ctrl-C's 130)."""
    return _terminated


def raise_on_sigterm() -> None:
    """While measuring, the first SIGTERM raises Terminated in the main thread (Python runs the
    handler between bytecodes; the native core polls for signals while it waits on the GPU).
    After defer_sigterm(), and for every later SIGTERM, it is only noted: the results are
    written and the exit code is 143. SIGKILL, which every launcher sends after its grace
    period, still ends the process."""
    global _installed
    import signal

    def handler(signum, frame) -> None:
        global _terminated
        first = not _terminated
        _terminated = True
        if first and not _deferred:
            raise Terminated()

    signal.signal(signal.SIGTERM, handler)
    _installed = True


def restore_sigterm() -> None:
    """Installs the handler again where raise_on_sigterm() had (torch's elastic agent replaces
    it for as long as it runs workers, and leaves its own behind)."""
    if _installed:
        raise_on_sigterm()


def defer_sigterm() -> None:
    """The measurement is over: from here on SIGTERM does not interrupt the writing of its
    results (the process exits 143 once they are written)."""
    global _deferred
    _deferred = True
