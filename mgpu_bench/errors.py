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


_terminated = False


def interruption(exc: BaseException | None) -> str:
    """How a run was stopped from outside, for its one-line message."""
    return str(exc) if isinstance(exc, Terminated) else "interrupted"


def terminated() -> bool:
    """Whether this process received SIGTERM (its exit code is then 143, not Ctrl-C's 130)."""
    return _terminated


def raise_on_sigterm() -> None:
    """The first SIGTERM raises Terminated in the main thread; later ones are ignored while the
    results are written (SIGKILL, which every launcher sends after its grace period, still ends
    the process). Python runs the handler between bytecodes, and the native core polls for
    signals while it waits on the GPU, so it arrives within its poll interval."""
    import signal

    def handler(signum, frame) -> None:
        global _terminated
        if _terminated:
            return
        _terminated = True
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)
