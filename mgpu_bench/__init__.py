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
    "MonitorError",
    "MonitorWarning",
    "NcclError",
    "OutOfMemoryError",
    "StepMonitor",
    "__version__",
]

_LAZY = {"StepMonitor", "MonitorError", "MonitorWarning"}  # the in-job monitor (mgpu_bench.monitor)


def __getattr__(name: str):
    """The monitor's names, imported when first used: importing mgpu_bench stays light."""
    if name in _LAZY:
        from . import monitor

        return getattr(monitor, name)
    raise AttributeError(f"module 'mgpu_bench' has no attribute {name!r}")
