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
