"""The GPU a plan is for when it is not the one the history measured (--gpu NAME, a model of
mgpu_bench/data/hardware.json): what carries over from a measured GPU and how.

    the step        the nearest measured run's (this workload's, else the nearest GPT's FLOP rate),
                    times ceiling(measured GPU) / ceiling(this GPU): the two GPUs' matmul ceilings
                    where `gemm` measured both (bf16, the best GPU of the newest clean run of each),
                    else their datasheet dense bf16 peaks. The ratio of what the matmuls reach is
                    the ratio of the step only as far as the step is matmuls: the figure says it
                    is scaled, and from what.
    memory          the datasheet's (hardware.json)
    within a node   the datasheet's NVLink (all links, one direction) or PCIe link, times NCCL's
                    ring share (PRACTICAL_RING_SHARE, 80%): an NVSwitch node assumed for NVLink
    activations     per sample, as measured on the other GPU (they are the model's, not the GPU's)

--rate (an achieved FLOP/s per GPU over the whole step) or --mfu (an assumed model FLOPs
utilisation of this GPU's datasheet peak) replaces the step where the user knows better, or where
nothing was measured at all; the plan says it assumed it."""

from __future__ import annotations

import re

from mgpu_bench import hardware
from mgpu_bench.errors import InputError
from mgpu_bench.theory import PRACTICAL_RING_SHARE


def _norm(text: str) -> str:
    t = re.sub(r"[^0-9a-z]+", "", str(text).lower())
    return t.removeprefix("nvidia")


def resolve(text: str) -> hardware.GpuModel:
    """--gpu NAME: a key ("a100_sxm4_80gb"), a name ("NVIDIA A100 SXM4 80GB") or the name NVML
    gives ("NVIDIA A100-SXM4-80GB"), in any case and spacing, or a prefix of one that names one
    model only ("a100-sxm"). InputError (exit 2) listing the keys otherwise."""
    db = hardware.load()
    want = _norm(text or "")
    if not want:
        raise InputError(f"--gpu {text!r}: name a GPU of the hardware database: {', '.join(db.gpus)}")
    forms = {key: {_norm(key), _norm(g.name), *(_norm(m) for m in g.match)} for key, g in db.gpus.items()}
    exact = [key for key, names in forms.items() if want in names]
    if len(exact) == 1:
        return db.gpus[exact[0]]
    starts = [key for key, names in forms.items() if any(n.startswith(want) for n in names)]
    if len(starts) == 1:
        return db.gpus[starts[0]]
    if starts:
        raise InputError(f"--gpu {text!r} names {len(starts)} GPUs of the hardware database ({', '.join(starts)}): "
                         "give one of them")
    raise InputError(f"--gpu {text!r}: not a GPU of the hardware database; give one of {', '.join(db.gpus)}")


def model_of(device: str | None) -> hardware.GpuModel | None:
    """The hardware model of a device name (a run's NVML name, or a model's own name)."""
    if not device:
        return None
    return hardware.find_gpu(device) or next((g for g in hardware.load().gpus.values() if g.name == device), None)


def peak(device: str | None) -> tuple[float, str] | None:
    """(dense bf16 FLOP/s, its source) from the datasheet, or None."""
    g = model_of(device)
    f = g.peak.get("bf16") if g is not None else None
    if f is None or not f.value:
        return None
    return float(f.value), f"{g.name} datasheet dense bf16 {f.value / 1e12:g} TFLOP/s ({f.source})"


def step_ratio(measured_on: str, target: str, ceilings: dict) -> tuple[float, str] | None:
    """(the factor a step measured on `measured_on` is multiplied by on `target`, how it was found):
    the matmul ceilings both GPUs measured, else the datasheet peaks; None where neither is known."""
    from .evidence import same_device

    src = next((v for d, v in ceilings.items() if same_device(d, measured_on)), None)
    dst = next((v for d, v in ceilings.items() if same_device(d, target)), None)
    if src and dst:
        return src[0] / dst[0], (f"scaled by the matmul ceilings measured: {src[0] / 1e12:.4g} TFLOP/s on the "
                                 f"{measured_on} ({src[1]}) / {dst[0] / 1e12:.4g} on the {target} ({dst[1]})")
    a, b = peak(measured_on), peak(target)
    if a and b:
        return a[0] / b[0], f"scaled by the datasheet peaks: {a[1]} / {b[1]}"
    return None


def node_rate(device: str) -> tuple[float, str] | None:
    """(the bus bandwidth a ring within one node reaches, B/s, its source) from the datasheet:
    NVLink where the GPU has it (an NVSwitch node: every GPU at its full link rate), else PCIe."""
    g = model_of(device)
    if g is None:
        return None
    link = hardware.nvlink_total(g)
    if link is not None and link.value:
        return float(link.value) * PRACTICAL_RING_SHARE, (
            f"formula: {g.name} NVLink {link.note} x {PRACTICAL_RING_SHARE:.0%} (NCCL's ring share; an NVSwitch node "
            "assumed), datasheet")
    pcie = hardware.pcie_rate(g.pcie_generation, g.pcie_width)
    return float(pcie.value) * PRACTICAL_RING_SHARE, (
        f"formula: {g.name} PCIe {pcie.note} x {PRACTICAL_RING_SHARE:.0%} (NCCL's ring share), datasheet")


def memory(device: str) -> tuple[float, str] | None:
    g = model_of(device)
    if g is None or not g.memory.value:
        return None
    return float(g.memory.value), f"hardware database: {g.name} ({g.memory.source})"
