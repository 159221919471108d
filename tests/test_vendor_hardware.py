"""The other vendors' GPUs in mgpu_bench/data/hardware.json (AMD Instinct MI300X, MI325X, MI355X,
Intel Gaudi 3), their GPU-to-GPU links, and the platform theory a run of unknown topology (an
imported nccl-tests or rccl-tests log) is set against (theory.platform_theory)."""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

from mgpu_bench.machine import hardware, theory


def _data() -> dict:
    return json.loads(resources.files("mgpu_bench").joinpath("data/hardware.json").read_text())


def test_mi300x_has_amds_figures_with_their_sources():
    g = hardware.find_gpu("AMD Instinct MI300X")
    assert g.key == "mi300x" and g.vendor == "AMD" and g.isa == "gfx942" and g.compute_capability is None
    assert {dt: g.peak[dt].value for dt in ("fp64", "fp64_tensor", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")} == {
        "fp64": 81.7e12, "fp64_tensor": 163.4e12, "fp32": 163.4e12, "tf32": 653.7e12, "fp16": 1307.4e12,
        "bf16": 1307.4e12, "fp8": 2614.9e12, "int8": 2614.9e12}
    assert "rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300.html" in g.peak["bf16"].source
    assert g.memory.value == 192 * 2**30 and g.memory_bandwidth.value == 5.3e12
    assert g.gpu_link.per_link.value == 64e9 and g.gpu_link.per_link.direction == "per_direction"
    assert g.gpu_link_count == 7 and g.platform.topology == "full_mesh" and g.platform.links_per_peer == 1
    assert "rocm.blogs.amd.com" in g.gpu_link.per_link.source and g.gpu_link.practical_share == 0.75


@pytest.mark.parametrize("name, gib, isa", [("AMD Instinct MI325X", 256, "gfx942"), ("AMD Instinct MI355X", 288, "gfx950")])
def test_mi325x_and_mi355x_keep_what_no_amd_document_at_hand_gave_null(name, gib, isa):
    g = hardware.find_gpu(name)
    assert g.memory.value == gib * 2**30 and g.isa == isa and "gpu-arch-specs" in g.memory.source
    assert g.memory_bandwidth.value is None and "left unknown" in g.memory_bandwidth.note
    assert all(f.value is None and f.note for f in g.peak.values())
    assert g.gpu_link is None and g.platform is None and hardware.peak_flops(name, "bf16") is None


def test_gaudi3_from_intels_documents():
    g = hardware.find_gpu("Intel Gaudi 3")
    assert g.vendor == "Intel" and g.peak["bf16"].value == g.peak["fp8"].value == 1835e12
    assert g.peak["fp16"].value is None and "not in Intel's table" in g.peak["fp16"].note
    assert g.memory.value == 128 * 2**30 and g.memory_bandwidth.value == 3.67e12
    assert g.gpu_link.per_link.value == 25e9 and g.gpu_link_count == 21 and g.platform.links_per_peer == 3
    assert "docs.habana.ai" in g.gpu_link.per_link.source


@pytest.mark.parametrize("name, nranks, bandwidth, share, kind", [
    ("AMD Instinct MI300X", 8, 7 * 64e9, 0.75, "infinity_fabric"), ("AMD Instinct MI300X", 2, 64e9, 0.75, "infinity_fabric"),
    ("Intel Gaudi 3", 8, 21 * 25e9, 0.80, "roce"),  # Intel's own scale-up peak: 525 GB/s per direction
    ("NVIDIA H200", 2, 450e9, 0.80, "nvlink"), ("NVIDIA H100 80GB HBM3", 8, 450e9, 0.80, "nvlink"),
    ("NVIDIA A100-SXM4-80GB", 4, 300e9, 0.80, "nvlink")])
def test_platform_theory_per_vendor(name, nranks, bandwidth, share, kind):
    t = theory.platform_theory(name, nranks)
    assert t.bandwidth == pytest.approx(bandwidth) and t.practical == pytest.approx(share * bandwidth)
    assert {h.kind for h in t.hops} == {kind} and len(t.hops) == nranks and "assumed" in t.summary


@pytest.mark.parametrize("name, nranks, hosts, words", [
    ("AMD Instinct MI300X", 16, 2, "2 hosts"), ("AMD Instinct MI300X", 9, 1, "joins 8 GPUs"),
    ("NVIDIA L4", 2, 1, "no platform topology"), ("Some GPU", 2, 1, "Some GPU is not in hardware.json"),
    (None, 2, 1, "the GPU is not in hardware.json")])
def test_platform_theory_is_unknown_rather_than_a_guess(name, nranks, hosts, words):
    t = theory.platform_theory(name, nranks, hosts)
    assert t.bandwidth is None and t.practical is None and words in t.summary


def test_the_shipped_file_validates_and_vendor_mistakes_are_named():
    data = _data()
    assert hardware.validate(data) == []
    bad = copy.deepcopy(data)
    bad["gpus"]["mi300x"]["compute_capability"] = "9.4"
    bad["gpus"]["gaudi3"]["gpu_link"] = "nvlink_9"
    del bad["gpus"]["mi300x"]["platform"]["links_per_peer"]
    bad["gpu_links"]["infinity_fabric_mi300x"]["practical_share"] = 1.5
    problems = "\n".join(hardware.validate(bad))
    assert "gpus.mi300x: a GPU by AMD has no compute capability but an isa" in problems
    assert "gpus.gaudi3.gpu_link: 'nvlink_9' is not in the gpu_links section" in problems
    assert "gpus.mi300x.platform: a full mesh needs the GPU's gpu_link and links_per_peer" in problems
    assert "gpu_links.infinity_fabric_mi300x.practical_share: 1.5 must be a fraction" in problems
    nvidia = copy.deepcopy(data)
    nvidia["gpus"]["h200_sxm"]["pcie_generation"] = None  # an NVIDIA part always has its PCIe in the datasheet
    assert any("gpus.h200_sxm.pcie_generation" in p for p in hardware.validate(nvidia))
