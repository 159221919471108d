"""mgpu-bench: is this GPU box delivering the throughput it should, and if not, where is it lost?

The measuring core is the private native module ``mgpu_bench._native``; import what you need
from here.
"""

from __future__ import annotations

from .children import adopt as _adopt

_adopt()  # first thing in a process the tool started: it dies with its parent (children.py)

from . import _libs

_libs.preload()

from . import _native
from .errors import (
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
