"""The ring theory model on topology snapshots: NVLink, PCIe, unknown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_bench.machine import theory

FIXTURE = Path(__file__).with_name("fixtures") / "topo_2x_h200.json"


def gpu(index, bus, links=0, version="4.0", max_gen=5, max_width=16):
    return {"index": index, "pci_bus_id": bus, "pcie": {"max_gen": max_gen, "max_width": max_width},
            "nvlinks": [{"link": i, "active": True, "version": version} for i in range(links)]}


def snapshot(gpus, nvlinks=0, pcie_path="SYS", via_switch=False):
    pairs = [{"src": a["index"], "dst": b["index"], "nvlinks": nvlinks, "via_nvswitch": via_switch,
              "pcie_path": pcie_path} for a in gpus for b in gpus if a is not b]
    return {"gpus": gpus, "pairs": pairs, "nvml": {"available": True}}


def test_nvlink_pair_is_links_times_the_per_link_rate():
    snap = snapshot([gpu(0, "0000:18:00.0", 18), gpu(1, "0000:2a:00.0", 18)], nvlinks=18)
    t = theory.ring_theory(snap, [(0, "0000:18:00.0"), (1, "0000:2A:00.0")])
    assert t.bandwidth == pytest.approx(450e9)
    assert t.practical == pytest.approx(360e9)
    assert t.summary == "NVLink 4 x18: 450.0 GB/s per direction"


def test_pcie_pair_takes_the_slower_endpoint():
    snap = snapshot([gpu(0, "0000:18:00.0", max_gen=5), gpu(1, "0000:2a:00.0", max_gen=4)], pcie_path="PHB")
    t = theory.ring_theory(snap, [(0, "0000:18:00.0"), (1, "0000:2a:00.0")])
    assert t.bandwidth == pytest.approx(16 * 1.969e9, rel=0.01)
    assert t.hops[0].detail == "PCIe Gen4 x16 via PHB"


def test_ring_runs_at_its_slowest_hop():
    g = [gpu(i, f"0000:0{i}:00.0", 18) for i in range(3)]
    snap = snapshot(g, nvlinks=18)
    for p in snap["pairs"]:
        if {p["src"], p["dst"]} == {1, 2}:
            p["nvlinks"] = 12
    t = theory.ring_theory(snap, [(i, f"0000:0{i}:00.0") for i in range(3)])
    assert t.bandwidth == pytest.approx(12 * 25e9)
    assert t.bottleneck.detail == "NVLink 4 x12"


def test_unknown_without_topology_or_generation():
    t = theory.ring_theory({"gpus": [], "nvml": {"error": "nvmlInit failed"}}, [(0, "a"), (1, "b")])
    assert t.bandwidth is None and "nvmlInit failed" in t.summary
    snap = snapshot([gpu(0, "0000:18:00.0", 2, version=None), gpu(1, "0000:2a:00.0", 2, version=None)], nvlinks=2)
    t = theory.ring_theory(snap, [(0, "0000:18:00.0"), (1, "0000:2a:00.0")])
    assert t.bandwidth is None and "unknown generation" in t.summary


def test_real_2x_h200_snapshot():
    """A snapshot captured with `mgpu-bench topo --json` on the 2x H200 machine."""
    if not FIXTURE.exists():
        pytest.skip("fixture not captured")
    snap = json.loads(FIXTURE.read_text())
    devices = [(g["index"], g["pci_bus_id"]) for g in snap["gpus"]]
    t = theory.ring_theory(snap, devices)
    assert t.bandwidth == pytest.approx(450e9)
    # The VM's two GPUs sit on an NVSwitch board: NVML reports the links' far end as a switch.
    assert [h.detail for h in t.hops] == ["NVLink 4 x18 via NVSwitch"] * 2


def nic(device, rate_text, paths, state="ACTIVE"):
    from mgpu_bench.machine.topo import parse_ib_rate

    return {"device": device, "port": 1, "state": state, **parse_ib_rate(rate_text),
            "gpu_paths": [{"gpu": g, "path": p} for g, p in paths.items()]}


def test_inter_node_hop_is_the_nearest_active_nic():
    snap = snapshot([gpu(0, "0000:18:00.0", 18), gpu(1, "0000:2a:00.0", 18)], nvlinks=18)
    snap["nics"] = [nic("mlx5_0", "400 Gb/sec (4X NDR)", {0: "PIX", 1: "SYS"}),
                    nic("mlx5_1", "200 Gb/sec (4X HDR)", {0: "SYS", 1: "PIX"}),
                    nic("mlx5_2", "400 Gb/sec (4X NDR)", {0: "SYS", 1: "PIX"}, state="DOWN")]
    h0, h1 = theory.nic_hop(snap, 0, "0000:18:00.0"), theory.nic_hop(snap, 1, "0000:2a:00.0")
    assert (h0.kind, h0.bandwidth) == ("network", pytest.approx(50e9))
    assert h0.detail.startswith("mlx5_0 port 1 400 Gb/sec (4X NDR) (PIX")
    assert h1.bandwidth == pytest.approx(25e9)  # the DOWN NDR port next to it does not count
    none = theory.nic_hop({"gpus": snap["gpus"], "nics": []}, 0, "0000:18:00.0")
    assert none.bandwidth is None and "TCP sockets" in none.detail


def test_world_theory_leaves_the_node_through_all_its_nics():
    g = [gpu(i, f"0000:0{i}:00.0", 18) for i in range(4)]
    snap = snapshot(g, nvlinks=18, via_switch=True)
    snap["nics"] = [nic(f"mlx5_{i}", "400 Gb/sec (4X NDR)", {j: ("PIX" if j == i else "SYS") for j in range(4)})
                    for i in range(4)]
    t = theory.hierarchy_theory(snap, [(i, f"0000:0{i}:00.0") for i in range(4)])
    assert t["intra-node"].bandwidth == pytest.approx(450e9)
    assert t["inter-node"].bandwidth == pytest.approx(50e9)  # one rail: one NIC
    assert t["world"].bandwidth == pytest.approx(200e9)  # four rails in parallel, below the NVLink ring
    assert "4 NIC(s) out of the node" in t["world"].summary
    shared = dict(snap, nics=snap["nics"][:1])  # one NIC for all four GPUs: counted once
    assert theory.hierarchy_theory(shared, [(i, f"0000:0{i}:00.0") for i in range(4)])["world"].bandwidth == \
        pytest.approx(50e9)
