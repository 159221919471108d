"""The GPU a plan is for when it is not the one the history measured (--gpu NAME, a model of
mgpu_bench/data/hardware.json): what carries over from a measured GPU and how.

    the step        the nearest measured run's (this workload's, else the nearest GPT's FLOP rate),
                    times ceiling(measured GPU) / ceiling(this GPU): the two GPUs' matmul ceilings
                    where `gemm` measured both (bf16, the best GPU of the newest clean run of each),
                    else their datasheet dense bf16 peaks. The ratio of what the matmuls reach is
                    the ratio of the step only as far as the step is matmuls: the figure says it
                    is scaled, and from what.
    memory          the datasheet's (hardware.json)
    within a node   the datasheet's NVLink (all links, one direction) times NCCL's ring share
                    (PRACTICAL_RING_SHARE, 80%), an NVSwitch node assumed; else the vendor's
                    full-mesh platform (Infinity Fabric, Gaudi's RoCE ports: theory.platform_theory,
                    the links to the node's other GPUs at the link's usable share); else the PCIe
                    link at NCCL's share; none where the database gives no link (missing, said)
    activations     per sample, as measured on the other GPU (they are the model's, not the GPU's)

--rate (an achieved FLOP/s per GPU over the whole step) or --mfu (an assumed model FLOPs
utilisation of this GPU's datasheet peak) replaces the step where the user knows better, or where
nothing was measured at all; the plan says it assumed it."""

from __future__ import annotations

import re

from mgpu_bench.core.errors import InputError
from mgpu_bench.machine import hardware
from mgpu_bench.machine.theory import PRACTICAL_RING_SHARE


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


def node_rate(device: str, gpus_per_node: int = 8) -> tuple[float | None, str]:
    """(the bus bandwidth a ring within one node of `gpus_per_node` GPUs reaches, B/s, its source)
    from the datasheet (module docs); (None, why) where the database gives no link for the GPU."""
    from mgpu_bench.machine.theory import platform_theory

    g = model_of(device)
    if g is None:
        return None, f"{device} is not in the hardware database"
    link = hardware.nvlink_total(g)
    if link is not None and link.value:
        return float(link.value) * PRACTICAL_RING_SHARE, (
            f"formula: {g.name} NVLink {link.note} x {PRACTICAL_RING_SHARE:.0%} (NCCL's ring share; an NVSwitch node "
            "assumed), datasheet")
    plat = g.platform
    if plat is not None and plat.topology == "full_mesh" and g.gpu_link is not None and 2 <= gpus_per_node <= plat.gpus:
        ring = platform_theory(g.match[0] if g.match else g.name, gpus_per_node)
        if ring.practical:
            share = ring.share
            return float(ring.practical), (
                f"formula: {g.name} {g.gpu_link.name}, {plat.links_per_peer} link(s) to each of the other "
                f"{gpus_per_node - 1} GPUs of its {plat.gpus}-GPU platform at {g.gpu_link.per_link.value / 1e9:g} GB/s "
                f"x {share:.0%} (the link's usable share), datasheet; the full mesh assumed")
    if g.pcie_generation is not None:
        pcie = hardware.pcie_rate(g.pcie_generation, g.pcie_width or 16)
        return float(pcie.value) * PRACTICAL_RING_SHARE, (
            f"formula: {g.name} PCIe {pcie.note} x {PRACTICAL_RING_SHARE:.0%} (NCCL's ring share), datasheet")
    return None, (f"the hardware database gives no GPU-to-GPU link for the {g.name} (no NVLink, no "
                  f"{'platform link' if g.vendor != 'NVIDIA' else 'NVSwitch'} rate, no PCIe generation)")


def memory(device: str) -> tuple[float, str] | None:
    g = model_of(device)
    if g is None or not g.memory.value:
        return None
    return float(g.memory.value), f"hardware database: {g.name} ({g.memory.source})"
