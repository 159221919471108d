"""Which GPUs a command measures: discovery, the --gpus forms, and pinning child processes.

Every probe selects its GPUs here, so the forms and the messages are the same for all of them.
Indices count within what this process can see (after CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import os
import sys

from mgpu_bench.core.errors import InputError, MgpuError


def visible_gpu_count() -> int:
    """0 when there is no driver or no GPU."""
    from mgpu_bench import _native

    try:
        return _native.device_count()
    except MgpuError:
        return 0


def no_gpu_reason() -> str:
    """Why no GPU is usable here, in a few words (the driver's message, or none visible)."""
    from mgpu_bench import _native

    try:
        _native.device_count()
    except MgpuError as exc:
        return str(exc).split(" [", 1)[0]
    return "none visible (check CUDA_VISIBLE_DEVICES)"


def cpu_commands() -> list[str]:
    """The commands that run without a GPU, on CPU processes (gloo), as the probes say of
    themselves (Probe.cpu: True, or the condition, "fleet (under torchrun)"), in the registry's
    order. The registry sits above this module, which never imports it: every command runs once
    the CLI has loaded it (before that, the list is empty)."""
    registry = sys.modules.get("mgpu_bench.results.probe")
    if registry is None:
        return []
    out = []
    for name in registry.names():
        cpu = registry.get(name).cpu
        if cpu:
            out.append(name if cpu is True else f"{name} ({cpu})")
    return out


def without_gpu() -> str:
    """'without a GPU, comm, model, fleet (under torchrun), overlap and suite run on CPU
    processes (gloo)': one sentence for every GPU-only command's error, the group's help and the
    suite."""
    names = cpu_commands()
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1] if names else "nothing"
    return f"without a GPU, {listed} run{'s' if len(names) == 1 else ''} on CPU processes (gloo)"


def require_gpus(command: str, spec: str | None) -> tuple[list[int], list[dict]]:
    """The GPUs --gpus names and their device_info; InputError (exit code 2) naming what is
    missing when the machine has no usable NVIDIA GPU."""
    from mgpu_bench import _native

    n = visible_gpu_count()
    if n == 0:
        raise InputError(f"{command} needs NVIDIA GPUs: {no_gpu_reason()}; {without_gpu()}")
    gpus = parse_gpus(spec, n)
    return gpus, [_native.device_info(g) for g in gpus]


def _visible_text(available: int) -> str:
    """How many GPUs this process sees and why: "2 visible", or with CUDA_VISIBLE_DEVICES set,
    which physical GPUs its indices are."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return f"{available} visible (indices 0..{available - 1})" if available else "none visible"
    shown = [v.strip() for v in cvd.split(",") if v.strip()]
    if not available:
        return f"none visible (CUDA_VISIBLE_DEVICES={cvd!r})"
    mapping = ", ".join(f"{i} = {v}" for i, v in enumerate(shown[:available]))
    return f"{available} visible: CUDA_VISIBLE_DEVICES={cvd} numbers them {mapping}"


def parse_gpus(spec: str | None, available: int) -> list[int]:
    """None or "all" -> all; "N" -> the first N (a count); "a,b" -> those indices; "a," -> GPU a
    alone (an index list of one: a lone number is a count)."""
    if spec is None or spec.strip().lower() == "all":
        return list(range(available))
    text = spec.strip()
    forms = "a count (--gpus 2: the first two), indices (--gpus 0,1), or one GPU by its index (--gpus 1,)"
    try:  # InputError is a ValueError: only int() is inside
        idx = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise InputError(f"--gpus '{spec}': write {forms}") from None
    if "," not in text:
        n = idx[0]
        if n < 1:
            raise InputError(f"--gpus {text} is a count of GPUs; for GPU {n} alone write --gpus {n}, "
                             f"({_visible_text(available)})")
        if n > available:
            raise InputError(f"--gpus {text} asks for {n} GPUs, {_visible_text(available)}")
        return list(range(n))
    if not idx:
        raise InputError(f"--gpus '{spec}': write {forms}")
    bad = [i for i in idx if i < 0 or i >= available]
    if bad:
        raise InputError(f"--gpus: GPU {bad[0]} does not exist here, {_visible_text(available)}")
    if len(set(idx)) != len(idx):
        raise InputError(f"--gpus '{spec}' names a GPU twice")
    return idx


def gpus_without_gpus() -> InputError:
    """The error for --gpus on a machine where no GPU is visible, the same for every command."""
    return InputError(f"--gpus needs NVIDIA GPUs and none is usable here ({no_gpu_reason()}): drop --gpus; on CPU "
                      "processes give their number with --nproc")


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
