"""mgpu_bench.machine.topo and topo_view: the snapshot, the findings and the terminal view.

No GPU exists on the CPU machines, so NVML is replaced here (and only here) by a stand-in with
pynvml's function names, built from what a 2x H200 NV18 node and an 8-GPU HGX H200 node report;
it raises pynvml's own NVMLError classes. /sys is a tree built under tmp_path. The real pynvml
is exercised too: without a driver, collect() must say so and still describe the host.
"""

from __future__ import annotations

import io
import json
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from rich.console import Console

from mgpu_bench.machine import topo, topo_view

# ---------------------------------------------------------------------------------------------
# a stand-in for pynvml


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # maps to the subclass, e.g. NVMLError_NotSupported


NOT_SUPPORTED, INVALID_ARGUMENT = pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT


class FakeNvml:
    """pynvml's names over a node description (see h200x2() and hgx8()). `unsupported` holds
    (gpu index or None for all, function name) pairs that raise NVMLError_NotSupported."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = 36

    def __init__(self, node: dict):
        self.node = node
        self.gpus = node["gpus"]
        self.unsupported = node.get("unsupported", set())
        self.fields = node.get("fields", {"link_count", "get_speed", "common"})
        self.inits = 0
        self.calls: list[str] = []

    def _gpu(self, name: str, handle) -> dict:
        self.calls.append(name)
        i = handle.index
        if (i, name) in self.unsupported or (None, name) in self.unsupported:
            raise _err(NOT_SUPPORTED)
        return self.gpus[i]

    # library
    def nvmlInit(self):
        if "init_error" in self.node:
            raise self.node["init_error"]
        self.inits += 1

    def nvmlShutdown(self):
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self):
        return self.node["driver"]

    def nvmlSystemGetNVMLVersion(self):
        return self.node["nvml_version"]

    def nvmlSystemGetCudaDriverVersion(self):
        return self.node["cuda"]

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise _err(INVALID_ARGUMENT)
        return SimpleNamespace(index=i)

    # device facts
    def nvmlDeviceGetName(self, h):
        return self._gpu("nvmlDeviceGetName", h)["name"]

    def nvmlDeviceGetUUID(self, h):
        return self._gpu("nvmlDeviceGetUUID", h)["uuid"]

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._gpu("nvmlDeviceGetPciInfo", h)["bus"].encode())  # bytes, as ctypes

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self._gpu("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=g["mem"], free=g["mem"] - (1 << 29), used=1 << 29)

    def nvmlDeviceGetCpuAffinity(self, h, size):
        g = self._gpu("nvmlDeviceGetCpuAffinity", h)
        words = [0] * size
        for c in g["cpus"]:
            assert c // 64 < size, "cpuSetSize too small for the CPUs the kernel may use"
            words[c // 64] |= 1 << (c % 64)
        return words

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", h)["power_mW"]

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._gpu("nvmlDeviceGetClockInfo", h)["clocks"][clock][0]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._gpu("nvmlDeviceGetMaxClockInfo", h)["clocks"][clock][1]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", h)["pcie"][0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", h)["pcie"][1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", h)["pcie"][2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", h)["pcie"][3]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h):
        return self._gpu("nvmlDeviceGetGpuMaxPcieLinkGeneration", h)["pcie"][4]

    # NVLink
    def _link(self, name, h, link):
        links = self._gpu(name, h)["links"]
        if not links:
            raise _err(NOT_SUPPORTED)  # a GPU without NVLink
        if not 0 <= link < len(links):
            raise _err(INVALID_ARGUMENT)  # beyond the device's links
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h, link):
        return int(self._link("nvmlDeviceGetNvLinkState", h, link)["active"])

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self._link("nvmlDeviceGetNvLinkVersion", h, link)["version"]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        ln = self._link("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        if not ln["active"]:
            raise _err(NOT_SUPPORTED)
        return SimpleNamespace(busId=ln["remote"].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self._link("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)["type"]

    def nvmlDeviceGetFieldValues(self, h, ids):
        g = self._gpu("nvmlDeviceGetFieldValues", h)
        out = []
        for field, scope in ids:
            ret, value = NOT_SUPPORTED, 0
            if field == topo._FI_NVLINK_LINK_COUNT and "link_count" in self.fields:
                ret, value = 0, len(g["links"])
            elif field == topo._FI_NVLINK_GET_SPEED and "get_speed" in self.fields:
                if scope < len(g["links"]):
                    ret, value = 0, g["links"][scope]["speed"]
                else:
                    ret = INVALID_ARGUMENT
            elif field == topo._FI_NVLINK_SPEED_MBPS_COMMON and "common" in self.fields:
                ret, value = 0, g["common_speed"]
            out.append(SimpleNamespace(fieldId=field, scopeId=scope, nvmlReturn=ret,
                                       valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                       value=SimpleNamespace(uiVal=value)))
        return out

    # pairs
    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        self.calls.append("nvmlDeviceGetTopologyCommonAncestor")
        return self.node["topology"](a.index, b.index)

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        self.calls.append("nvmlDeviceGetP2PStatus")
        assert index in (0, 1, 2), index  # plain ints, not pynvml's (0,) for READ
        return self.node["p2p"](a.index, b.index, index)


# ---------------------------------------------------------------------------------------------
# node descriptions: figures as NVML reports them on H200 SXM (141 GB shown as 143771 MiB,
# 700 W, 1980 MHz SM, 3201 MHz HBM3e, 18 NVLink 4 links of 26562 MBps each)

H200_MEM = 143771 * (1 << 20)
NVLINK4 = pynvml.NVML_NVLINK_VERSION_4_0  # 6, the enum
H200_SPEED_MBPS = 26562
SOCKET0 = list(range(48)) + list(range(96, 144))
SOCKET1 = list(range(48, 96)) + list(range(144, 192))


def h200(bus: str, cpus: list[int], links: list[dict], pcie=(5, 16, 5, 16, 5), uuid_tail="0") -> dict:
    return {
        "name": "NVIDIA H200",
        "uuid": f"GPU-5c2b7a1e-43d0-9f6e-b1aa-0c8d2e4f6a{uuid_tail:>02}",
        "bus": bus,
        "mem": H200_MEM,
        "cpus": cpus,
        "power_mW": 700_000,
        "clocks": {topo._CLOCK_SM: (1980, 1980), topo._CLOCK_MEM: (3201, 3201)},
        "pcie": pcie,  # current gen, width, max gen, max width, the GPU's own max gen
        "links": links,
        "common_speed": H200_SPEED_MBPS,
    }


def link(remote: str, type_: int, active: bool = True) -> dict:
    return {"active": active, "remote": remote, "type": type_, "version": NVLINK4, "speed": H200_SPEED_MBPS}


BUS2 = ["00000000:18:00.0", "00000000:2A:00.0"]


def h200x2(**changes) -> dict:
    """Two H200s joined by 18 NVLink 4 links, PCIe Gen5 x16, NUMA node 0, under different host
    bridges of socket 0 (NODE)."""
    node = {
        "driver": "570.133.20",
        "nvml_version": "12.570.133.20",
        "cuda": 12080,
        "gpus": [
            h200(BUS2[0], SOCKET0, [link(BUS2[1], 0) for _ in range(18)], uuid_tail="1"),
            h200(BUS2[1], SOCKET0, [link(BUS2[0], 0) for _ in range(18)], uuid_tail="2"),
        ],
        "topology": lambda a, b: pynvml.NVML_TOPOLOGY_NODE,
        "p2p": lambda a, b, idx: pynvml.NVML_P2P_STATUS_OK,
    }
    node.update(changes)
    return node


BUS8 = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
        "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]
SWITCHES = ["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"]


def hgx8() -> dict:
    """8 H200s on four NVSwitches, 18 links each, GPUs 0-3 on socket 0 and 4-7 on socket 1.
    GPU 5 has links 3 and 11 down and its PCIe link at x8; GPU 6 idles at Gen1. This NVML has no
    link-count or per-link speed field (only the common speed), no remote-device-type query, and
    GPU 7 no GpuMaxPcieLinkGeneration."""
    gpus = []
    for i, bus in enumerate(BUS8):
        links = [link(SWITCHES[k % 4], 2, active=not (i == 5 and k in (3, 11))) for k in range(18)]
        pcie = (5, 8, 5, 16, 5) if i == 5 else (1, 16, 5, 16, 5) if i == 6 else (5, 16, 5, 16, 5)
        gpus.append(h200(bus, SOCKET0 if i < 4 else SOCKET1, links, pcie, uuid_tail=str(i)))
    return {
        "driver": "570.133.20",
        "nvml_version": "12.570.133.20",
        "cuda": 12080,
        "gpus": gpus,
        "fields": {"common"},
        "unsupported": {(None, "nvmlDeviceGetNvLinkRemoteDeviceType"), (7, "nvmlDeviceGetGpuMaxPcieLinkGeneration")},
        "topology": lambda a, b: pynvml.NVML_TOPOLOGY_NODE if (a < 4) == (b < 4) else pynvml.NVML_TOPOLOGY_SYSTEM,
        "p2p": lambda a, b, idx: pynvml.NVML_P2P_STATUS_OK,
    }


# ---------------------------------------------------------------------------------------------
# a /sys tree


def pci_device(root: Path, chain: list[str], numa: int, cpulist: str) -> Path:
    """A PCI function at sys/devices/<chain...> and its sys/bus/pci/devices link."""
    real = root / "sys/devices" / Path(*chain)
    real.mkdir(parents=True)
    (real / "numa_node").write_text(f"{numa}\n")
    (real / "local_cpulist").write_text(f"{cpulist}\n")
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / chain[-1]).symlink_to(os.path.relpath(real, bus))
    return real


def ib_device(root: Path, pci: Path, name: str, netdev: str, ports: dict[int, dict]) -> None:
    """sys/class/infiniband/<name> -> <pci>/infiniband/<name>, whose `device` points back."""
    dev = pci / "infiniband" / name
    for n, files in ports.items():
        port = dev / "ports" / str(n)
        port.mkdir(parents=True)
        for key, text in files.items():
            (port / key).write_text(text + "\n")
    (dev / "device").symlink_to("../..")
    (pci / "net" / netdev).mkdir(parents=True)
    cls = root / "sys/class/infiniband"
    cls.mkdir(parents=True, exist_ok=True)
    (cls / name).symlink_to(os.path.relpath(dev, cls))


def host_tree(root: Path) -> None:
    """Two sockets of 48 cores, two threads each (CPUs 0-191), NUMA nodes 0 and 1."""
    system = root / "sys/devices/system"
    for node in (0, 1):
        (system / "node" / f"node{node}").mkdir(parents=True)
    for cpu in range(192):
        t = system / "cpu" / f"cpu{cpu}" / "topology"
        t.mkdir(parents=True)
        (t / "physical_package_id").write_text("0\n" if cpu in SOCKET0 else "1\n")
    (system / "cpu/online").write_text("0-191\n")
    (system / "cpu/possible").write_text("0-191\n")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/hostname").write_text("h200-node-07\n")
    (root / "proc/sys/kernel/osrelease").write_text("6.8.0-60-generic\n")


S0, S1 = "0-47,96-143", "48-95,144-191"
NDR_ACTIVE = {"rate": "400 Gb/sec (4X NDR)", "state": "4: ACTIVE", "phys_state": "5: LinkUp",
              "link_layer": "InfiniBand"}
DOWN = {"rate": "10 Gb/sec (4X SDR)", "state": "1: DOWN", "phys_state": "3: Disabled", "link_layer": "InfiniBand"}


@pytest.fixture
def sys2(tmp_path) -> Path:
    """The 2x H200 node: GPU 0 and mlx5_0 share a PCIe switch under host bridge pci0000:15, GPU 1
    sits under pci0000:26 (NUMA 0 too); mlx5_1, DOWN, under pci0000:97 on NUMA node 1."""
    host_tree(tmp_path)
    sw = ["pci0000:15", "0000:15:01.0", "0000:16:00.0"]
    pci_device(tmp_path, sw + ["0000:17:00.0", "0000:18:00.0"], 0, S0)
    nic0 = pci_device(tmp_path, sw + ["0000:17:01.0", "0000:19:00.0"], 0, S0)
    pci_device(tmp_path, ["pci0000:26", "0000:26:01.0", "0000:27:00.0", "0000:28:00.0", "0000:2a:00.0"], 0, S0)
    nic1 = pci_device(tmp_path, ["pci0000:97", "0000:97:01.0", "0000:98:00.0", "0000:99:00.0", "0000:9b:00.0"], 1, S1)
    ib_device(tmp_path, nic0, "mlx5_0", "ibp25s0", {1: NDR_ACTIVE})
    ib_device(tmp_path, nic1, "mlx5_1", "ibp155s0", {1: DOWN})
    return tmp_path


@pytest.fixture
def sys8(tmp_path) -> Path:
    """The HGX node: each GPU behind its own switch on its own host bridge; one NDR NIC beside
    GPU 0 and one beside GPU 4, both up."""
    host_tree(tmp_path)
    for i, bus in enumerate(BUS8):
        b = topo.normalize_bus_id(bus)
        rb = f"{int(b[5:7], 16) - 3:02x}"
        pci_device(tmp_path, [f"pci0000:{rb}", f"0000:{rb}:01.0", f"0000:{rb}:02.0", f"0000:{rb}:03.0", b],
                   0 if i < 4 else 1, S0 if i < 4 else S1)
    nic0 = pci_device(tmp_path, ["pci0000:15", "0000:15:01.0", "0000:15:02.0", "0000:15:04.0", "0000:19:00.0"], 0, S0)
    nic1 = pci_device(tmp_path, ["pci0000:97", "0000:97:01.0", "0000:97:02.0", "0000:97:04.0", "0000:9b:00.0"], 1, S1)
    ib_device(tmp_path, nic0, "mlx5_0", "ibp25s0", {1: NDR_ACTIVE})
    ib_device(tmp_path, nic1, "mlx5_1", "ibp155s0", {1: NDR_ACTIVE})
    return tmp_path


def pair(snap: dict, i: int, j: int) -> dict:
    (p,) = [p for p in snap["pairs"] if (p["src"], p["dst"]) == (i, j)]
    return p


def render_text(snap: dict) -> str:
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    topo_view.render(snap, console)
    return console.export_text()


# ---------------------------------------------------------------------------------------------
# 2x H200


def test_h200x2_snapshot(sys2):
    fake = FakeNvml(h200x2())
    snap = topo.collect(fake, sys2)
    assert json.loads(json.dumps(snap)) == snap
    assert fake.inits == 0  # nvmlShutdown balanced nvmlInit
    assert snap["schema_version"] == 1
    assert snap["host"] == {"hostname": "h200-node-07", "kernel": "6.8.0-60-generic", "cpus": 192,
                            "sockets": 2, "numa_nodes": 2}
    assert snap["nvml"] == {"available": True, "error": None, "driver": "570.133.20",
                            "nvml_version": "12.570.133.20", "cuda_driver": "12.8"}

    g0, g1 = snap["gpus"]
    assert g0["errors"] == [] and g1["errors"] == []
    assert (g0["pci_bus_id"], g1["pci_bus_id"]) == ("0000:18:00.0", "0000:2a:00.0")
    assert g1["name"] == "NVIDIA H200" and g1["uuid"].startswith("GPU-")
    assert g0["memory_total_bytes"] == 150_754_820_096
    assert g0["numa_node"] == 0 and g0["cpu_affinity"] == SOCKET0
    assert g0["power_limit_W"] == 700.0
    assert g0["clocks"] == {"sm_Hz": 1_980_000_000, "sm_max_Hz": 1_980_000_000,
                            "mem_Hz": 3_201_000_000, "mem_max_Hz": 3_201_000_000}
    assert g0["pcie"] == {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "gpu_max_gen": 5}
    assert [ln["link"] for ln in g0["nvlinks"]] == list(range(18))
    assert g0["nvlinks"][7] == {"link": 7, "active": True, "version": "4.0", "version_enum": 6,
                                "remote_pci_bus_id": "0000:2a:00.0", "remote_type": "gpu", "rate_Bps": 26.562e9}

    p = pair(snap, 1, 0)
    assert p == {"src": 1, "dst": 0, "nvlinks": 18, "via_nvswitch": False, "pcie_path": "NODE", "path": "NV18",
                 "p2p": {"read": "ok", "write": "ok", "nvlink": "ok"}, "errors": []}
    assert len(snap["pairs"]) == 2


def test_h200x2_nics(sys2):
    snap = topo.collect(FakeNvml(h200x2()), sys2)
    up, down = snap["nics"]
    assert up == {
        "device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "link_layer": "InfiniBand",
        "rate_bps": 400e9, "rate_Bps": 50e9, "width": 4, "generation": "NDR", "rate_text": "400 Gb/sec (4X NDR)",
        "pci_bus_id": "0000:19:00.0", "numa_node": 0, "netdevs": ["ibp25s0"],
        "gpu_paths": [{"gpu": 0, "path": "PIX"}, {"gpu": 1, "path": "NODE"}], "nearest_gpus": [0],
    }
    assert (down["device"], down["state"], down["phys_state"], down["numa_node"]) == ("mlx5_1", "DOWN", "Disabled", 1)
    assert down["gpu_paths"] == [{"gpu": 0, "path": "SYS"}, {"gpu": 1, "path": "SYS"}]
    assert down["nearest_gpus"] == []  # across the socket is not near


def test_h200x2_findings_only_the_down_port(sys2):
    found = topo_view.findings(topo.collect(FakeNvml(h200x2()), sys2))
    assert found == [{"severity": "warning", "subject": "mlx5_1 port 1",
                      "message": "mlx5_1 port 1 is DOWN (physical Disabled), expected ACTIVE"}]


def test_h200x2_render(sys2):
    text = render_text(topo.collect(FakeNvml(h200x2()), sys2))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "driver 570.133.20" in lines[0]
    assert "mlx5_1 port 1 is DOWN" in text
    (row,) = [line for line in lines if line.startswith("GPU0 ")]
    assert row.split()[:3] == ["GPU0", "X", "NV18"]
    (nic,) = [line for line in lines if line.startswith("NIC0 ")]
    assert nic.split()[1:3] == ["PIX", "NODE"]
    (gpu0,) = [line for line in lines if line.startswith("  0  H200  0000:18:00.0")]
    assert gpu0.split()[3:] == ["140", "0", "700", "1980/1980", "3201/3201", "Gen5", "x16", "18/18", "4.0,", "26.6"]
    assert "400 Gb/s NDR" in text


# ---------------------------------------------------------------------------------------------
# 8-GPU HGX


def test_hgx8_snapshot(sys8):
    fake = FakeNvml(hgx8())
    snap = topo.collect(fake, sys8)
    assert json.loads(json.dumps(snap)) == snap
    gpus = snap["gpus"]
    assert len(gpus) == 8 and len(snap["pairs"]) == 56
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[4]["cpu_affinity"] == SOCKET1

    g5 = gpus[5]
    assert len(g5["nvlinks"]) == 18  # found by probing: links 18..35 answer InvalidArgument
    assert [ln["link"] for ln in g5["nvlinks"] if not ln["active"]] == [3, 11]
    inactive = g5["nvlinks"][3]
    assert inactive["remote_pci_bus_id"] is None and inactive["rate_Bps"] is None
    active = [ln for ln in g5["nvlinks"] if ln["active"]]
    assert {ln["rate_Bps"] for ln in active} == {26.562e9}  # from NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
    assert {ln["remote_type"] for ln in active} == {"switch"}  # inferred: every GPU links to it
    assert g5["pcie"]["width"] == 8
    assert any("NVML_FI_DEV_NVLINK_LINK_COUNT" in e for e in g5["errors"])
    assert any("NVML_FI_DEV_NVLINK_GET_SPEED" in e for e in g5["errors"])
    assert not any("nvlink 20" in e for e in g5["errors"])  # absent links are not errors

    assert gpus[7]["pcie"]["gpu_max_gen"] is None
    assert "pcie.gpu_max_gen: Not Supported" in gpus[7]["errors"]
    assert gpus[6]["pcie"]["gpu_max_gen"] == 5

    assert pair(snap, 0, 1)["path"] == "NV18" and pair(snap, 0, 1)["via_nvswitch"]
    assert pair(snap, 0, 4)["path"] == "NV18" and pair(snap, 0, 4)["pcie_path"] == "SYS"
    assert pair(snap, 5, 2)["path"] == "NV16" and pair(snap, 2, 5)["path"] == "NV16"
    assert pair(snap, 1, 2)["pcie_path"] == "NODE"

    nic0, nic1 = snap["nics"]
    assert nic0["nearest_gpus"] == [0] and nic1["nearest_gpus"] == [4]  # the NIC beside each is PIX
    assert {p["gpu"]: p["path"] for p in nic0["gpu_paths"]} == {0: "PIX", 1: "NODE", 2: "NODE", 3: "NODE",
                                                              4: "SYS", 5: "SYS", 6: "SYS", 7: "SYS"}
    assert fake.inits == 0


def test_hgx8_findings(sys8):
    found = topo_view.findings(topo.collect(FakeNvml(hgx8()), sys8))
    assert found == [
        {"severity": "warning", "subject": "GPU 5",
         "message": "GPU 5 PCIe Gen5 x8, capable of Gen5 x16: downgraded link; verify under load"},
        {"severity": "warning", "subject": "GPU 5",
         "message": "GPU 5 has 16 active NVLinks, its peers 18 (links 3, 11 of 18 inactive)"},
        {"severity": "info", "subject": "GPU 6",
         "message": "GPU 6 PCIe Gen1 x16, capable of Gen5 x16: idle GPUs lower the generation; check under load"},
    ]


def test_hgx8_render(sys8):
    text = render_text(topo.collect(FakeNvml(hgx8()), sys8))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    (row5,) = [line for line in lines if line.startswith("GPU5 ")]
    assert row5.split()[1:10] == ["NV16"] * 5 + ["X"] + ["NV16"] * 2 + ["1"]
    (row0,) = [line for line in lines if line.startswith("GPU0 ")]
    assert row0.split()[1:10] == ["X"] + ["NV18"] * 4 + ["NV16", "NV18", "NV18", "0"]
    assert "downgraded link" in text
    (gpu5,) = [line for line in lines if line.startswith("  5  H200")]
    assert gpu5.split()[-5:] == ["Gen5", "x8/x16", "16/18", "4.0,", "26.6"]
    (gpu6,) = [line for line in lines if line.startswith("  6  H200")]
    assert "Gen1/5 x16" in gpu6


# ---------------------------------------------------------------------------------------------
# failures and absences


def test_pair_without_nvlink_or_p2p(sys2):
    """NVLinks present but none up (no bridge), P2P refused by the chipset, the GPUs across
    sockets; and one GPU without an enforced power limit."""
    gpus = [h200(BUS2[0], SOCKET0, [link(BUS2[1], 0, active=False) for _ in range(4)]),
            h200(BUS2[1], SOCKET1, [link(BUS2[0], 0, active=False) for _ in range(4)])]
    node = h200x2(gpus=gpus, topology=lambda a, b: pynvml.NVML_TOPOLOGY_SYSTEM,
                  p2p=lambda a, b, idx: pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
                  unsupported={(1, "nvmlDeviceGetEnforcedPowerLimit")})
    snap = topo.collect(FakeNvml(node), sys2)
    assert snap["gpus"][1]["power_limit_W"] is None
    assert snap["gpus"][1]["errors"] == ["power_limit_W: Not Supported"]
    assert snap["gpus"][0]["power_limit_W"] == 700.0
    p = pair(snap, 0, 1)
    assert (p["nvlinks"], p["path"], p["p2p"]["read"]) == (0, "SYS", "chipset not supported")
    assert [ln["active"] for ln in snap["gpus"][0]["nvlinks"]] == [False] * 4
    found = topo_view.findings(snap)
    pairs = [f for f in found if f["subject"] == "GPU 0 <-> GPU 1"]
    assert len(pairs) == 1 and pairs[0]["severity"] == "warning"
    assert "no NVLink and no P2P (read chipset not supported" in pairs[0]["message"]
    none_up = "NVLinks present but none active (no bridge or NVSwitch fabric up?): GPUs talk over PCIe"
    assert {"severity": "info", "subject": "NVLink", "message": none_up} in found


def test_gpu_without_nvlink_and_slot_limit(sys2):
    """A PCIe GPU (NVLink queries NotSupported) in a Gen4 slot although Gen5 capable."""
    gpus = [h200(BUS2[0], SOCKET0, [], pcie=(4, 16, 4, 16, 5)), h200(BUS2[1], SOCKET0, [])]
    snap = topo.collect(FakeNvml(h200x2(gpus=gpus)), sys2)
    g0 = snap["gpus"][0]
    assert g0["nvlinks"] == [] and pair(snap, 0, 1)["path"] == "NODE"
    assert not any("nvlink" in e and "state" in e for e in g0["errors"])
    assert {"severity": "info", "subject": "GPU 0", "message": "GPU 0 is PCIe Gen5 capable but its slot allows Gen4"} \
        in topo_view.findings(snap)


@pytest.mark.parametrize("error, words", [
    (pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), "NVML Shared Library Not Found (no libnvidia-ml.so.1"),
    (pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "Driver Not Loaded (the NVIDIA kernel module"),
    (pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION), "Insufficient Permissions"),
    (OSError("libnvidia-ml.so.1: cannot open shared object file"), "cannot open shared object"),
])
def test_nvml_init_failure_is_data(sys2, error, words):
    snap = topo.collect(FakeNvml(h200x2(init_error=error)), sys2)
    assert snap["nvml"]["available"] is False and words in snap["nvml"]["error"]
    assert snap["gpus"] == [] and snap["pairs"] == []
    assert [n["device"] for n in snap["nics"]] == ["mlx5_0", "mlx5_1"]
    assert snap["nics"][0]["gpu_paths"] == [] and snap["nics"][0]["nearest_gpus"] == []
    found = topo_view.findings(snap)
    assert found[0]["subject"] == "NVML" and words in found[0]["message"]


def test_pynvml_not_installed(monkeypatch, sys2):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    snap = topo.collect(None, sys2)
    assert snap["nvml"]["available"] is False and "nvidia-ml-py is not installed" in snap["nvml"]["error"]
    assert snap["host"]["numa_nodes"] == 2


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_works(), reason="an NVIDIA driver is present: the no-driver path cannot be seen here")
def test_real_pynvml_without_driver():
    snap = topo.collect()
    assert json.loads(json.dumps(snap)) == snap
    assert snap["nvml"]["available"] is False and snap["nvml"]["error"]
    assert snap["gpus"] == [] and snap["pairs"] == []
    assert snap["host"]["hostname"] == socket.gethostname()
    assert snap["host"]["numa_nodes"] >= 1 and snap["host"]["cpus"] >= 1
    assert isinstance(snap["nics"], list)
    assert topo_view.findings(snap)[0]["subject"] == "NVML"
    text = render_text(snap)
    assert "NVML unavailable" in text and max(len(line) for line in text.splitlines()) <= 100


# ---------------------------------------------------------------------------------------------
# parsers


@pytest.mark.parametrize("text, bps, width, gen", [
    ("400 Gb/sec (4X NDR)", 400e9, 4, "NDR"),
    ("200 Gb/sec (2X NDR)", 200e9, 2, "NDR"),
    ("100 Gb/sec (4X EDR)", 100e9, 4, "EDR"),
    ("56 Gb/sec (4X FDR)", 56e9, 4, "FDR"),
    ("2.5 Gb/sec (1X SDR)", 2.5e9, 1, "SDR"),
    ("800 Gb/sec (4X XDR)\n", 800e9, 4, "XDR"),
    ("25 Gb/sec", 25e9, None, None),
])
def test_parse_ib_rate(text, bps, width, gen):
    r = topo.parse_ib_rate(text)
    assert (r["rate_bps"], r["rate_Bps"], r["width"], r["generation"]) == (bps, bps / 8, width, gen)


def test_parse_ib_rate_unreadable():
    assert topo.parse_ib_rate("")["rate_bps"] is None
    assert topo.parse_ib_rate("unknown")["rate_text"] == "unknown"


@pytest.mark.parametrize("raw, norm", [
    ("00000000:18:00.0", "0000:18:00.0"),
    (b"00000000:AB:00.0\x00", "0000:ab:00.0"),
    ("0001:C1:00.1", "0001:c1:00.1"),
    ("00010000:01:00.0", "10000:01:00.0"),
    (None, None),
    ("", None),
])
def test_normalize_bus_id(raw, norm):
    assert topo.normalize_bus_id(raw) == norm


def test_cpulists_round_trip():
    assert topo.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert topo.format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert topo.format_cpulist([]) == "-" and topo.parse_cpulist("") == []
    assert topo._mask_to_cpus([0b101, 1]) == [0, 2, 64]


@pytest.mark.parametrize("a, b, numa, path", [
    (["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0"],
     ["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0"], (0, 0), "PIX"),
    (["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0", "0000:19:00.0", "0000:1a:00.0"],
     ["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:1b:00.0"], (0, 0), "PXB"),
    (["pci0000:15", "0000:15:01.0", "0000:18:00.0"], ["pci0000:15", "0000:15:02.0", "0000:19:00.0"], (0, 0), "PHB"),
    (["pci0000:15", "0000:15:01.0", "0000:18:00.0"], ["pci0000:26", "0000:26:01.0", "0000:2a:00.0"], (0, 0), "NODE"),
    (["pci0000:15", "0000:15:01.0", "0000:18:00.0"], ["pci0000:97", "0000:97:01.0", "0000:9a:00.0"], (0, 1), "SYS"),
    (["pci0000:15", "0000:15:01.0", "0000:18:00.0"], None, (0, 0), None),
])
def test_pcie_path(a, b, numa, path):
    assert topo.pcie_path(a, b, *numa, numa_nodes=2) == path


def test_captured_2x_h200_snapshot_has_no_findings_and_nv18():
    """`mgpu-bench topo --json` as captured on the 2x H200 machine (2026-11-29)."""
    import json
    from pathlib import Path

    snap = json.loads((Path(__file__).with_name("fixtures") / "topo_2x_h200.json").read_text())
    assert [g["name"] for g in snap["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert all(p["path"] == "NV18" for p in snap["pairs"])
    assert all(ln["version"] == "4.0" and ln["rate_Bps"] == 26562000000.0
               for g in snap["gpus"] for ln in g["nvlinks"])
    assert topo_view.findings(snap) == []
