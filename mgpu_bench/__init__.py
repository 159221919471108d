"""mgpu-bench: is this GPU box delivering the throughput it should, and if not, where is it lost?

The measuring core is the private native module ``mgpu_bench._native``; import what you need
from here.
"""

from __future__ import annotations

from .core.children import adopt as _adopt

_adopt()  # first thing in a process the tool started: it dies with its parent (children.py)

from . import _libs

_libs.preload()

from . import _native
from .core.errors import CommTimeoutError, CublasError, CudaError, InputError, MgpuError, NcclError, OutOfMemoryError

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


# Where the package's modules lived before they moved into folders (0.1's layout; docs/changelog.md): a
# script's `import mgpu_bench.topo` or `from mgpu_bench import hardware` still gets the module, under
# its old name as well, with a DeprecationWarning naming the new place.
_MOVED = {**{n: "core." + n for n in ("errors", "children", "paths", "startup", "launch", "slurm")},
          **{n: "machine." + n for n in ("hardware", "topo", "theory", "telemetry", "occupancy", "health", "env",
                                         "per_gpu", "selection", "nccl_log")},
          **{n: "results." + n for n in ("schema", "document", "measurement", "metrics", "numbers", "sizes", "ops",
                                         "nccl_tests", "torch_timing", "probe")},
          **{n: "training." + n for n in ("gradsync", "noise_scale")},
          "runner": "run.runner", "models": "workloads.gpt"}


class _OldName:
    """A meta path finder for the old names only: it hands back the module of the new name."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        head, _, tail = name.partition(".")
        if head != __name__ or tail not in _MOVED:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, _OldName)

    @staticmethod
    def create_module(spec):
        import importlib
        import warnings

        new = f"{__name__}.{_MOVED[spec.name.partition('.')[2]]}"
        warnings.warn(f"{spec.name} is now {new}", DeprecationWarning, stacklevel=3)
        return importlib.import_module(new)

    @staticmethod
    def exec_module(module) -> None:
        pass


import sys as _sys

_sys.meta_path.append(_OldName)
