"""The environment fingerprint stored with every result.

Only an allowlist of environment variables is recorded (the ones that change what NCCL, CUDA
and torch do), never the whole environment.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import socket

from mgpu_bench import _libs, _native
from mgpu_bench.core.errors import MgpuError
from mgpu_bench.core.startup import process_seconds  # noqa: F401 - read here by comm and check; its home is startup.py

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_", "NVSHMEM_")
ENV_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_DISTRIBUTED_DEBUG", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
             "PYTORCH_CUDA_ALLOC_CONF")


def env_allowlist(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fmt_cuda(v: int) -> str | None:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else None


def _fmt_nccl(v: int) -> str:
    # NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z from 2.9 on, X*1000 + Y*100 + Z before.
    if v >= 10000:
        return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
    return f"{v // 1000}.{(v % 1000) // 100}.{v % 100}"


def nvidia_driver_release() -> str | None:
    """The driver's own version string (e.g. '580.159.04'), through NVML when available."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML missing or failing: the fingerprint says unknown
        return None


def gpu_list() -> list[dict]:
    """Every visible GPU's facts; [] without a driver or GPU."""
    try:
        n = _native.device_count()
    except MgpuError:
        return []
    out = []
    for i in range(n):
        try:
            info = dict(_native.device_info(i))
        except MgpuError as exc:  # a GPU that fails its query is recorded as such
            out.append({"index": i, "error": str(exc)})
            continue
        info["compute_capability"] = ".".join(str(x) for x in info["compute_capability"])
        out.append(info)
    return out


def backend_versions(backend: str) -> dict:
    """What a torch backend ran on: torch's own NCCL, which may differ from the native one."""
    if not backend.startswith("torch"):
        return {}
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    out = {"torch_backend": backend}
    with contextlib.suppress(Exception):  # a CPU build of torch has no NCCL
        out["torch_nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    return out


def fingerprint(gpus: list[dict] | None = None) -> dict:
    from mgpu_bench import __version__

    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mgpu_bench": __version__,
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "nccl": _fmt_nccl(_native.nccl_version()),
        "cuda_runtime": _fmt_cuda(_native.runtime_version()),
        "cuda_driver": _fmt_cuda(_native.driver_version()),
        "nvidia_driver": nvidia_driver_release(),
        "cublaslt": str(_native.cublaslt_version()),
        "libraries": _libs.preload(),  # the exact NCCL and cuBLASLt files loaded
        "gpus": gpu_list() if gpus is None else gpus,
        "env": env_allowlist(),
        "host_load": host_load(),
    }


def host_load() -> dict | None:
    """The host's 1-minute load average and its CPU count when the run starts: a load near the CPU
    count means other work shares the host, so its figures (CPU runs above all) drift between
    runs more than their own samples show."""
    try:
        return {"load_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    except (OSError, AttributeError):
        return None


