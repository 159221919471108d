"""mgpu-bench: is this GPU box delivering the throughput it should, and if not, where is it lost?

The measuring core is the private native module ``mgpu_bench._native``; import what you need
from here.
"""

from __future__ import annotations

from . import _libs

_libs.preload()

from . import _native  # noqa: E402
from .errors import (  # noqa: E402
    CommTimeoutError,
    CublasError,
    CudaError,
    InputError,
    MgpuError,
    NcclError,
    OutOfMemoryError,
)

__version__ = _native.__version__

__all__ = [
    "CommTimeoutError",
    "CublasError",
    "CudaError",
    "InputError",
    "MgpuError",
    "NcclError",
    "OutOfMemoryError",
    "__version__",
]
