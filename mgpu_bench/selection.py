"""Which GPUs a command measures: discovery, the --gpus forms, and pinning child processes.

Every probe selects its GPUs here, so the forms and the messages are the same for all of them.
Indices count within what this process can see (after CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import os

from .errors import InputError, MgpuError


def visible_gpu_count() -> int:
    """0 when there is no driver or no GPU."""
    from . import _native

    try:
        return _native.device_count()
    except MgpuError:
        return 0


def no_gpu_reason() -> str:
    """Why no GPU is usable here, in a few words (the driver's message, or none visible)."""
    from . import _native

    try:
        _native.device_count()
    except MgpuError as exc:
        return str(exc).split(" [", 1)[0]
    return "none visible (check CUDA_VISIBLE_DEVICES)"


def require_gpus(command: str, spec: str | None) -> tuple[list[int], list[dict]]:
    """The GPUs --gpus names and their device_info; InputError (exit code 2) naming what is
    missing when the machine has no usable NVIDIA GPU."""
    from . import _native

    n = visible_gpu_count()
    if n == 0:
        raise InputError(f"{command} needs NVIDIA GPUs: {no_gpu_reason()}")
    gpus = parse_gpus(spec, n)
    return gpus, [_native.device_info(g) for g in gpus]


def parse_gpus(spec: str | None, available: int) -> list[int]:
    """None -> all; "N" -> the first N; "a,b" -> those indices."""
    if spec is None or spec.strip().lower() == "all":
        return list(range(available))
    text = spec.strip()
    try:
        if "," not in text:
            n = int(text)
            if n < 1:
                raise InputError(f"--gpus {text}: give a GPU count of at least 1, or indices like 0,1")
            if n > available:
                raise InputError(f"--gpus {text}: only {available} GPU(s) visible (indices 0..{available - 1})")
            return list(range(n))
        idx = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise InputError(f"--gpus '{spec}': write a count (2) or comma-separated indices (0,1)") from None
    bad = [i for i in idx if i < 0 or i >= available]
    if bad:
        raise InputError(f"--gpus: GPU {bad[0]} does not exist; visible GPUs are 0..{available - 1}")
    if len(set(idx)) != len(idx):
        raise InputError(f"--gpus '{spec}' names a GPU twice")
    return idx


def pin_gpus(chosen: list[int]) -> None:
    """Child processes see only the chosen GPUs. The indices count within what is visible now,
    so they are mapped through an existing CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible[g] if g < len(visible) else str(g) for g in chosen)


def host_available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is none."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
