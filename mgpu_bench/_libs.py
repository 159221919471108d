"""Loads the NCCL and cuBLASLt shared libraries before the native module.

The NVIDIA wheels ship only versioned files (libnccl.so.2, libcublasLt.so.13) in
site-packages/nvidia/..., outside the loader's search path, so the module carries no RPATH and
this file, the only place that knows where libraries live, preloads them with RTLD_GLOBAL.
Order: MGPU_BENCH_NCCL_LIBRARY / MGPU_BENCH_CUBLASLT_LIBRARY, the files the module was built
against (if they still exist), the wheels in this Python environment, then the system loader.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

_LOADED: dict[str, str] = {}


def _wheel_candidates(subdirs: list[str], names: list[str]) -> list[str]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    found = []
    for root in spec.submodule_search_locations:
        for sub in subdirs:
            for name in names:
                path = Path(root) / sub / "lib" / name
                if path.exists():
                    found.append(str(path))
    return found


def _build_config_path(attr: str) -> list[str]:
    import importlib

    try:
        config = importlib.import_module(f"{__package__}._build_config")  # written by CMake at build time
    except ImportError:
        return []
    path = getattr(config, attr, "")
    return [path] if path and os.path.exists(path) else []


def _load(key: str, env: str, built_attr: str, subdirs: list[str], names: list[str]) -> None:
    candidates: list[str] = []
    if os.environ.get(env):
        candidates.append(os.environ[env])
    candidates += _build_config_path(built_attr)
    candidates += _wheel_candidates(subdirs, names)
    candidates += names  # plain sonames: the system loader's search path
    errors = []
    for cand in candidates:
        try:
            ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            errors.append(f"{cand}: {exc}")
            continue
        _LOADED[key] = cand
        return
    raise ImportError(
        f"mgpu-bench: cannot load {names[0]} (tried {'; '.join(errors)}). "
        f"Fix: pip install {'nvidia-nccl-cu13' if key == 'nccl' else 'nvidia-cublas'} "
        f"in this environment, or set {env} to the library file."
    )


def preload() -> dict[str, str]:
    """Loads both libraries once; returns {library: path loaded}."""
    if not _LOADED:
        _load("nccl", "MGPU_BENCH_NCCL_LIBRARY", "NCCL_LIBRARY", ["nccl"], ["libnccl.so.2"])
        _load(
            "cublaslt",
            "MGPU_BENCH_CUBLASLT_LIBRARY",
            "CUBLASLT_LIBRARY",
            ["cu13", "cublas"],
            ["libcublasLt.so.13", "libcublasLt.so.12"],
        )
    return dict(_LOADED)
