"""The node's topology as data: its GPUs, their PCIe and NVLink links, GPU pairs and the NICs.

`collect()` takes a JSON-serialisable snapshot through NVML (nvidia-ml-py, module `pynvml`) and
/sys; what it says to a person (its findings, the terminal view) is topo_view.py's.

Never raises for a missing or failing driver: NVML's absence is recorded in the snapshot, and one
query a GPU does not support (NVMLError_NotSupported, ...) records null for that field and a line
in that GPU's `errors`, not a failed snapshot. Base units in data: bytes, bytes/s, bits/s, Hz, W.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import socket
from pathlib import Path

SCHEMA = "mgpu-bench/topo"
SCHEMA_VERSION = 1

# nvml.h values, spelled here rather than read from pynvml: older nvidia-ml-py releases lack some,
# and pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,) (a stray comma in its source).
_CLOCK_SM, _CLOCK_MEM = 1, 2  # nvmlClockType_t
_FI_NVLINK_SPEED_MBPS_COMMON = 90  # scope ignored; MBps common to all active links
_FI_NVLINK_LINK_COUNT = 91  # number of NVLinks the device has
_FI_NVLINK_GET_SPEED = 164  # scopeId = link index; MBps
_NVLINK_MAX_LINKS = 18  # fallback where pynvml lacks NVML_NVLINK_MAX_LINKS (36 in 13.x)
_ERR_INVALID_ARGUMENT, _ERR_NOT_SUPPORTED, _ERR_NOT_FOUND = 2, 3, 6
_ERR_DRIVER_NOT_LOADED, _ERR_LIBRARY_NOT_FOUND = 9, 12

# nvmlDeviceGetTopologyCommonAncestor's nvmlGpuTopologyLevel_t, in nvidia-smi topo -m's words.
# INTERNAL (two GPUs on one board, e.g. a K80) has no word in nvidia-smi's legend; the board's own
# PCIe switch joins them, so it reads as PIX.
_TOPOLOGY = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
PATH_RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}  # nearest first

_P2P_INDEX = {"read": 0, "write": 1, "nvlink": 2}  # NVML_P2P_CAPS_INDEX_*
_P2P_STATUS = {  # nvmlGpuP2PStatus_t
    0: "ok",
    1: "chipset not supported",
    2: "gpu not supported",
    3: "topology not supported",
    4: "disabled by regkey",
    5: "not supported",
    6: "unknown",
}
# nvmlDeviceGetNvLinkVersion returns the nvmlNvlinkVersion_t enum, not the version number
# (hwloc saw an A100 answer 5, the enum's 3.1; Hopper should answer 6, the enum's 4.0).
_NVLINK_VERSION = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
_REMOTE_TYPE = {0: "gpu", 1: "cpu", 2: "switch"}  # nvmlIntNvLinkDeviceType_t; 1 = IBM NPU

# nvmlFieldValue_t.valueType -> the member of its value union
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


# ---------------------------------------------------------------------------------------------
# small parsers


def normalize_bus_id(bus_id) -> str | None:
    """NVML's '00000000:18:00.0' (bytes or str) -> sysfs' '0000:18:00.0'."""
    if bus_id is None:
        return None
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    bus_id = bus_id.strip().strip("\x00").lower()
    m = re.fullmatch(r"([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])", bus_id)
    if not m:
        return bus_id or None
    return f"{int(m[1], 16):04x}:{m[2]}:{m[3]}.{m[4]}"


def parse_cpulist(text: str) -> list[int]:
    """The kernel's cpulist format '0-55,112-167' -> CPU ids."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus: list[int] | None) -> str:
    """CPU ids -> '0-55,112-167'."""
    if not cpus:
        return "-"
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _mask_to_cpus(words) -> list[int]:
    """nvmlDeviceGetCpuAffinity's bitmask, 64 CPUs per word, lowest CPU in bit 0 of word 0."""
    return [w * 64 + b for w, word in enumerate(words) for b in range(64) if (int(word) >> b) & 1]


def parse_ib_rate(text: str) -> dict:
    """The kernel's IB port rate, '400 Gb/sec (4X NDR)', into bits/s and bytes/s per direction,
    the width and the generation word. The kernel's figure is the nominal lane rate times width:
    the data rate for FDR10/EDR and newer (64b/66b encoding, within 3%), 80 % of it for
    SDR/DDR/QDR (8b/10b)."""
    m = re.match(r"\s*([\d.]+)\s*Gb/sec(?:\s*\((\d+)X\s*(\w+)\))?", text or "")
    if not m:
        return {"rate_bps": None, "rate_Bps": None, "width": None, "generation": None, "rate_text": text or None}
    bps = float(m[1]) * 1e9
    return {
        "rate_bps": bps,
        "rate_Bps": bps / 8,
        "width": int(m[2]) if m[2] else None,
        "generation": m[3],
        "rate_text": text.strip(),
    }


def _state_word(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp'."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip() or None


# ---------------------------------------------------------------------------------------------
# /sys


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _numa(path: Path) -> int | None:
    """A numa_node file; -1 (no affinity, e.g. a VM) becomes None."""
    text = _read(path)
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def _pci_dev(root: Path, bus_id: str | None) -> Path | None:
    if not bus_id:
        return None
    p = root / "sys/bus/pci/devices" / bus_id
    return p if p.exists() else None


def _pci_chain(root: Path, bus_id: str | None) -> list[str] | None:
    """The device's place in the PCI tree: ['pci0000:15', '0000:15:01.0', ..., bus_id], from the
    host bridge down, read from where /sys/bus/pci/devices/<bus_id> points."""
    dev = _pci_dev(root, bus_id)
    if dev is None:
        return None
    parts = Path(os.path.realpath(dev)).parts
    for k, part in enumerate(parts):
        if part.startswith("pci") and k > 0 and parts[k - 1] == "devices":
            return list(parts[k:])
    return None


def pcie_path(chain_a: list[str] | None, chain_b: list[str] | None,
              numa_a: int | None, numa_b: int | None, numa_nodes: int) -> str | None:
    """nvidia-smi topo -m's word for the PCIe path between two devices, from their sysfs chains:
    PIX through one switch, PXB through several, PHB through the host bridge, NODE across host
    bridges of one NUMA node, SYS across NUMA nodes (sockets)."""
    if not chain_a or not chain_b:
        return None
    common = 0
    for x, y in zip(chain_a, chain_b):
        if x != y:
            break
        common += 1
    if common == 0:  # different host bridges
        same = numa_a == numa_b if (numa_a is not None and numa_b is not None) else numa_nodes <= 1
        return "NODE" if same else "SYS"
    if common == 1:  # [host bridge]: they meet at the CPU's root complex
        return "PHB"
    # Below the common ancestor each side has a switch downstream port and the device: one switch.
    below = max(len(chain_a), len(chain_b)) - common
    return "PIX" if below <= 2 else "PXB"


def _host(root: Path) -> dict:
    system = root / "sys/devices/system"
    nodes = [p for p in (system / "node").glob("node*") if p.name[4:].isdigit()]
    packages = set()
    for p in (system / "cpu").glob("cpu[0-9]*/topology/physical_package_id"):
        text = _read(p)
        if text is not None:
            packages.add(text)
    online = _read(system / "cpu/online")
    if root == Path("/"):
        hostname, kernel = socket.gethostname(), platform.release()
    else:
        hostname = _read(root / "proc/sys/kernel/hostname") or socket.gethostname()
        kernel = _read(root / "proc/sys/kernel/osrelease") or platform.release()
    return {
        "hostname": hostname,
        "kernel": kernel,
        "cpus": len(parse_cpulist(online)) if online else os.cpu_count(),
        "sockets": len(packages) or None,
        "numa_nodes": len(nodes) or None,
    }


def _nics(root: Path, gpus: list[dict], numa_nodes: int) -> list[dict]:
    """One entry per IB/RoCE port under /sys/class/infiniband, with the GPUs nearest to it."""
    base = root / "sys/class/infiniband"
    if not base.is_dir():
        return []
    gpu_chains = [(g["index"], _pci_chain(root, g.get("pci_bus_id")), g.get("numa_node")) for g in gpus]
    out = []
    for dev in sorted(base.iterdir()):
        try:
            out.extend(_nic_ports(root, dev, gpu_chains, numa_nodes))
        except OSError:  # a device that vanished or cannot be read is left out, not fatal
            continue
    return out


def _nic_ports(root: Path, dev: Path, gpu_chains: list, numa_nodes: int) -> list[dict]:
    link = dev / "device"
    bus_id = os.path.basename(os.path.realpath(link)) if link.exists() else None
    if bus_id and not re.fullmatch(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", bus_id):
        bus_id = None  # a soft device (rxe, siw) has no PCI function of its own
    numa = _numa(link / "numa_node") if bus_id else None
    chain = _pci_chain(root, bus_id)
    paths = []
    for index, gchain, gnuma in gpu_chains:
        path = pcie_path(chain, gchain, numa, gnuma, numa_nodes)
        if path is not None:
            paths.append({"gpu": index, "path": path})
    # nearest: the GPUs on the best path, as long as that is within the NUMA node
    best = min((PATH_RANK[p["path"]] for p in paths), default=None)
    nearest = ([p["gpu"] for p in paths if PATH_RANK[p["path"]] == best]
               if best is not None and best <= PATH_RANK["NODE"] else [])
    netdevs = sorted(p.name for p in (link / "net").iterdir()) if (link / "net").is_dir() else []
    ports_dir = dev / "ports"
    ports = sorted(ports_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0) \
        if ports_dir.is_dir() else []
    return [{
        "device": dev.name,
        "port": int(port.name) if port.name.isdigit() else port.name,
        "state": _state_word(_read(port / "state")),  # '4: ACTIVE' -> 'ACTIVE'
        "phys_state": _state_word(_read(port / "phys_state")),  # '5: LinkUp' -> 'LinkUp'
        "link_layer": _read(port / "link_layer"),  # 'InfiniBand' or 'Ethernet' (RoCE)
        **parse_ib_rate(_read(port / "rate") or ""),
        "pci_bus_id": bus_id,
        "numa_node": numa,
        "netdevs": netdevs,
        "gpu_paths": paths,
        "nearest_gpus": nearest,
    } for port in ports]


# ---------------------------------------------------------------------------------------------
# NVML


class _Nvml:
    """Calls into the NVML binding (pynvml or a stand-in with the same names), turning each
    NVMLError into None plus a line in the caller's errors list."""

    def __init__(self, mod):
        self.mod = mod
        self.error_type = getattr(mod, "NVMLError", None) or Exception

    def call(self, errors: list[str] | None, what: str, name: str, *args):
        fn = getattr(self.mod, name, None)
        if fn is None:
            if errors is not None:
                errors.append(f"{what}: {name} is not in this nvidia-ml-py")
            return None
        try:
            return fn(*args)
        except self.error_type as exc:
            if errors is not None:
                errors.append(f"{what}: {exc}")
            return None

    def try_call(self, name: str, *args):
        """(value, error code or None): for probes whose failure means 'absent', not an error."""
        fn = getattr(self.mod, name, None)
        if fn is None:
            return None, _ERR_NOT_SUPPORTED
        try:
            return fn(*args), None
        except self.error_type as exc:
            return None, getattr(exc, "value", -1)

    def field_values(self, errors: list[str], handle, ids: list[tuple[int, int]], what: str) -> list:
        """nvmlDeviceGetFieldValues for (fieldId, scopeId) pairs; each value None where NVML
        returned an error for it (one line per distinct error, not per link)."""
        values = self.call(errors, what, "nvmlDeviceGetFieldValues", handle, ids)
        if values is None:
            return [None] * len(ids)
        out, seen = [], set()
        for v in values:
            ret = getattr(v, "nvmlReturn", 0)
            if ret != 0:
                if ret not in seen:
                    seen.add(ret)
                    errors.append(f"{what}: {self.error_text(ret)}")
                out.append(None)
                continue
            member = _VALUE_MEMBER.get(getattr(v, "valueType", 1), "uiVal")
            out.append(getattr(v.value, member))
        return out

    def error_text(self, code: int) -> str:
        try:
            return str(self.mod.NVMLError(code))
        except Exception:  # noqa: BLE001 - a stand-in without NVML's error table
            return f"NVML error {code}"


def _text(v) -> str | None:
    if v is None:
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _open(nvml) -> tuple[_Nvml | None, dict]:
    status = {"available": False, "error": None, "driver": None, "nvml_version": None, "cuda_driver": None}
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as exc:
            status["error"] = f"nvidia-ml-py is not installed (pip install nvidia-ml-py): {exc}"
            return None, status
    nv = _Nvml(nvml)
    try:
        nvml.nvmlInit()
    except nv.error_type as exc:
        code = getattr(exc, "value", None)
        hint = {
            _ERR_LIBRARY_NOT_FOUND: " (no libnvidia-ml.so.1: is the NVIDIA driver installed?)",
            _ERR_DRIVER_NOT_LOADED: " (the NVIDIA kernel module is not loaded)",
        }.get(code, "")
        status["error"] = f"nvmlInit failed: {exc}{hint}"
        return None, status
    except Exception as exc:  # noqa: BLE001 - a broken binding must not stop the rest of the snapshot
        status["error"] = f"nvmlInit failed: {exc!r}"
        return None, status
    status["available"] = True
    status["driver"] = _text(nv.call(None, "", "nvmlSystemGetDriverVersion"))
    status["nvml_version"] = _text(nv.call(None, "", "nvmlSystemGetNVMLVersion"))
    cuda = nv.call(None, "", "nvmlSystemGetCudaDriverVersion")  # 12080 -> '12.8'
    status["cuda_driver"] = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None
    return nv, status


def _empty_gpu(index: int) -> dict:
    return {
        "index": index,
        "name": None,
        "uuid": None,
        "pci_bus_id": None,
        "memory_total_bytes": None,
        "numa_node": None,
        "cpu_affinity": None,
        "power_limit_W": None,
        "clocks": {"sm_Hz": None, "sm_max_Hz": None, "mem_Hz": None, "mem_max_Hz": None},
        "pcie": {"gen": None, "width": None, "max_gen": None, "max_width": None, "gpu_max_gen": None},
        "nvlinks": [],
        "errors": [],
    }


def _gpu(nv: _Nvml, handle, index: int, root: Path, ncpus: int) -> dict:
    g = _empty_gpu(index)
    err = g["errors"]
    c = nv.call
    g["name"] = _text(c(err, "name", "nvmlDeviceGetName", handle))
    g["uuid"] = _text(c(err, "uuid", "nvmlDeviceGetUUID", handle))
    pci = c(err, "pci_bus_id", "nvmlDeviceGetPciInfo", handle)
    g["pci_bus_id"] = normalize_bus_id(getattr(pci, "busId", None)) if pci is not None else None
    mem = c(err, "memory_total_bytes", "nvmlDeviceGetMemoryInfo", handle)
    g["memory_total_bytes"] = int(mem.total) if mem is not None else None
    dev = _pci_dev(root, g["pci_bus_id"])
    g["numa_node"] = _numa(dev / "numa_node") if dev else None

    words = c(err, "cpu_affinity", "nvmlDeviceGetCpuAffinity", handle, max(1, -(-ncpus // 64)))
    if words is not None:
        g["cpu_affinity"] = _mask_to_cpus(words)
    elif dev is not None and (text := _read(dev / "local_cpulist")):
        g["cpu_affinity"] = parse_cpulist(text)  # the kernel's view of the same thing

    mw = c(err, "power_limit_W", "nvmlDeviceGetEnforcedPowerLimit", handle)  # milliwatts
    g["power_limit_W"] = mw / 1000 if mw is not None else None
    for key, fn, clock in (("sm_Hz", "nvmlDeviceGetClockInfo", _CLOCK_SM),
                           ("sm_max_Hz", "nvmlDeviceGetMaxClockInfo", _CLOCK_SM),
                           ("mem_Hz", "nvmlDeviceGetClockInfo", _CLOCK_MEM),
                           ("mem_max_Hz", "nvmlDeviceGetMaxClockInfo", _CLOCK_MEM)):
        mhz = c(err, f"clocks.{key}", fn, handle, clock)
        g["clocks"][key] = mhz * 1_000_000 if mhz is not None else None

    # Max* are what this GPU in this slot can reach; GpuMax* what the GPU alone could.
    for key, fn in (("gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                    ("width", "nvmlDeviceGetCurrPcieLinkWidth"),
                    ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                    ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
                    ("gpu_max_gen", "nvmlDeviceGetGpuMaxPcieLinkGeneration")):
        g["pcie"][key] = c(err, f"pcie.{key}", fn, handle)

    g["nvlinks"] = _nvlinks(nv, handle, err)
    return g


def _nvlinks(nv: _Nvml, handle, err: list[str]) -> list[dict]:
    """Every NVLink the GPU has: its state, and for active links the version, the remote end
    and the rate (NVML's per-link speed field, else the common speed; null when neither)."""
    count = nv.field_values(err, handle, [(_FI_NVLINK_LINK_COUNT, 0)],
                            "nvlink count (NVML_FI_DEV_NVLINK_LINK_COUNT)")[0]
    known = count is not None
    limit = int(count) if known else int(getattr(nv.mod, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS))
    links = []
    for link in range(limit):
        state, code = nv.try_call("nvmlDeviceGetNvLinkState", handle, link)
        if code is not None:
            # Beyond the device's links NVML answers InvalidArgument; a GPU without NVLink answers
            # NotSupported. Those mean "no such link" unless NVML said the link exists.
            if known or code not in (_ERR_INVALID_ARGUMENT, _ERR_NOT_SUPPORTED, _ERR_NOT_FOUND):
                err.append(f"nvlink {link} state: {nv.error_text(code)}")
                links.append({"link": link, "active": None, "version": None, "version_enum": None,
                              "remote_pci_bus_id": None, "remote_type": None, "rate_Bps": None})
            continue
        links.append({"link": link, "active": bool(state), "version": None, "version_enum": None,
                      "remote_pci_bus_id": None, "remote_type": None, "rate_Bps": None})
    # Version and remote end only for active links: NVML may refuse them for a link that is down.
    for ln in links:
        if not ln["active"]:
            continue
        i = ln["link"]
        v = nv.call(err, f"nvlink {i} version", "nvmlDeviceGetNvLinkVersion", handle, i)
        ln["version_enum"] = v
        ln["version"] = _NVLINK_VERSION.get(v) if v is not None else None
        remote_fn = ("nvmlDeviceGetNvLinkRemotePciInfo_v2" if hasattr(nv.mod, "nvmlDeviceGetNvLinkRemotePciInfo_v2")
                     else "nvmlDeviceGetNvLinkRemotePciInfo")  # pynvml's name for the _v2 C call
        pci = nv.call(err, f"nvlink {i} remote", remote_fn, handle, i)
        ln["remote_pci_bus_id"] = normalize_bus_id(getattr(pci, "busId", None)) if pci is not None else None
        t = nv.call(err, f"nvlink {i} remote type", "nvmlDeviceGetNvLinkRemoteDeviceType", handle, i)
        ln["remote_type"] = _REMOTE_TYPE.get(t, "unknown") if t is not None else None

    active = [ln for ln in links if ln["active"]]
    if active:
        speeds = nv.field_values(err, handle, [(_FI_NVLINK_GET_SPEED, ln["link"]) for ln in active],
                                 "nvlink speed (NVML_FI_DEV_NVLINK_GET_SPEED)")
        if all(s is None for s in speeds):
            common = nv.field_values(err, handle, [(_FI_NVLINK_SPEED_MBPS_COMMON, 0)],
                                     "nvlink speed (NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON)")[0]
            speeds = [common] * len(active)
        for ln, mbps in zip(active, speeds):
            # NVML's MBps read as 10^6 bytes/s (NCCL divides NVML's link MBps by 1000 for GB/s),
            # one direction, the raw line rate: a Hopper NVLink 4 link reads about 26.56 GB/s, of
            # which 25 GB/s carries data.
            ln["rate_Bps"] = float(mbps) * 1e6 if mbps is not None else None
    return links


def _classify_remotes(gpus: list[dict]) -> None:
    """Where nvmlDeviceGetNvLinkRemoteDeviceType failed: a remote end that is one of the GPUs is
    a GPU; a non-GPU end that several GPUs link to is an NVSwitch."""
    gpu_bus = {g["pci_bus_id"] for g in gpus if g["pci_bus_id"]}
    users: dict[str, set[int]] = {}
    for g in gpus:
        for ln in g["nvlinks"]:
            if ln["active"] and ln["remote_pci_bus_id"]:
                users.setdefault(ln["remote_pci_bus_id"], set()).add(g["index"])
    for g in gpus:
        for ln in g["nvlinks"]:
            if ln["active"] and ln["remote_type"] is None and ln["remote_pci_bus_id"]:
                bus = ln["remote_pci_bus_id"]
                ln["remote_type"] = ("gpu" if bus in gpu_bus
                                     else "switch" if len(users.get(bus, ())) > 1 else "unknown")


def _pairs(nv: _Nvml, handles: list, gpus: list[dict]) -> list[dict]:
    """Every ordered pair (i, j), i != j: NVLinks, nvidia-smi's path word and P2P status."""
    direct: dict[tuple[int, int], int] = {}
    switched: dict[int, int] = {}
    bus_index = {g["pci_bus_id"]: g["index"] for g in gpus if g["pci_bus_id"]}
    for g in gpus:
        for ln in g["nvlinks"]:
            if not ln["active"]:
                continue
            if ln["remote_type"] == "switch":
                switched[g["index"]] = switched.get(g["index"], 0) + 1
            elif ln["remote_pci_bus_id"] in bus_index:
                key = (g["index"], bus_index[ln["remote_pci_bus_id"]])
                direct[key] = direct.get(key, 0) + 1
    ancestor: dict[tuple[int, int], str | None] = {}
    out = []
    n = len(gpus)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            errors: list[str] = []
            hi, hj = handles[i], handles[j]
            key = (min(i, j), max(i, j))
            if key not in ancestor:
                level = (nv.call(errors, "path", "nvmlDeviceGetTopologyCommonAncestor", hi, hj)
                         if hi is not None and hj is not None else None)
                ancestor[key] = _TOPOLOGY.get(level) if level is not None else None
            # Through NVSwitches every pair gets the fewer of the two GPUs' switch links, which is
            # what nvidia-smi topo -m prints on an HGX board (NV18 everywhere).
            k = direct.get((i, j), 0)
            via_switch = k == 0 and switched.get(i, 0) > 0 and switched.get(j, 0) > 0
            if via_switch:
                k = min(switched[i], switched[j])
            p2p = {}
            for name, idx in _P2P_INDEX.items():
                s = (nv.call(errors, f"p2p {name}", "nvmlDeviceGetP2PStatus", hi, hj, idx)
                     if hi is not None and hj is not None else None)
                p2p[name] = _P2P_STATUS.get(s, f"status {s}") if s is not None else None
            out.append({
                "src": i,
                "dst": j,
                "nvlinks": k,
                "via_nvswitch": via_switch,
                "pcie_path": ancestor[key],
                "path": f"NV{k}" if k > 0 else ancestor[key],
                "p2p": p2p,
                "errors": errors,
            })
    return out


def collect(nvml=None, sysfs_root: str | os.PathLike = "/") -> dict:
    """A JSON-serialisable snapshot of the node (schema_version 1). `nvml` is the NVML binding,
    None for `import pynvml`; `sysfs_root` the root that holds sys/ (and proc/). Never raises."""
    root = Path(sysfs_root)
    host = _host(root)
    nv, status = _open(nvml)
    gpus: list[dict] = []
    pairs: list[dict] = []
    if nv is not None:
        try:
            errs: list[str] = []
            count = nv.call(errs, "nvmlDeviceGetCount", "nvmlDeviceGetCount")
            if count is None:
                status["error"] = errs[0]
            # nvmlDeviceGetCpuAffinity's mask needs a 64-bit word per 64 CPU ids the kernel may use
            possible = _read(root / "sys/devices/system/cpu/possible")
            ncpus = max(parse_cpulist(possible), default=0) + 1 if possible else (os.cpu_count() or 1)
            handles = []
            for i in range(count or 0):
                errs: list[str] = []
                h = nv.call(errs, "handle", "nvmlDeviceGetHandleByIndex", i)
                handles.append(h)
                if h is None:
                    g = _empty_gpu(i)
                    g["errors"] = errs
                else:
                    try:
                        g = _gpu(nv, h, i, root, ncpus)
                    except Exception as exc:  # noqa: BLE001 - a bug or binding surprise costs one GPU, not the snapshot
                        g = _empty_gpu(i)
                        g["errors"].append(f"unexpected: {exc!r}")
                gpus.append(g)
            _classify_remotes(gpus)
            pairs = _pairs(nv, handles, gpus)
        except Exception as exc:  # noqa: BLE001 - the snapshot says NVML failed rather than failing
            status["error"] = f"NVML query failed: {exc!r}"
        finally:
            with contextlib.suppress(Exception):  # shutting NVML down is best effort
                nv.mod.nvmlShutdown()
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "host": host,
        "nvml": status,
        "gpus": gpus,
        "pairs": pairs,
        "nics": _nics(root, gpus, host["numa_nodes"] or 1),
    }
