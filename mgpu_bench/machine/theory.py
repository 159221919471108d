"""What a collective's bus bandwidth should reach on the path its data takes.

The model: NCCL's ring visits the ranks in order and every hop carries the same traffic, so
the ring runs at the speed of its slowest hop. A hop's rate, per direction:
- GPUs joined by NVLink (directly, or both through NVSwitches): active links x the per-link
  rate of their NVLink generation (hardware.json; nominal, e.g. 25 GB/s for NVLink 4);
- otherwise PCIe: the lower of the two GPUs' maximum generation x width (hardware.json, after
  line encoding), whatever switch or host bridge lies between;
- across nodes: the rate of the InfiniBand/RoCE port nearest the GPU (topo's NICs; NCCL's
  rings leave a node through the NIC on the GPU's PCIe switch), per direction.
busbw is set against that figure ("% of theory"). NCCL's ring protocols reach about 80% of it
after protocol overhead (shared/ANCHORS.md: 360-370 GB/s of 450 on 8x H100/H200 at >= 1 GiB),
the practical ceiling drawn beside the theory. Algorithms that are not rings (NVLS, CollNet)
move less data than the ring formula assumes, so their busbw can exceed the link rate.

Where a run's own topology is unknown (a nccl-tests or rccl-tests log names GPUs, not links),
platform_theory sets it against the vendor's usual box (hardware.json's `platform`): on NVSwitch
boards every GPU reaches every other with all its NVLinks; in a full mesh (AMD Infinity Fabric,
Gaudi 3's RoCE ports) a GPU has `links_per_peer` links to each of the other n-1 ranks, and the
collective libraries run their rings over all of them at once (RCCL's channels, HCCL's
scale-up), so a rank's ceiling is (n-1) x links_per_peer x the per-link rate: 7 x 64 GB/s on
8 MI300X, 21 x 25 GB/s = 525 GB/s on 8 Gaudi 3 (Intel's own scale-up figure, hardware.json's
intel-gaudi-network). The usable share is the vendor's where it gives one (AMD: about 48 of 64
GB/s per xGMI link, 75%), else NCCL's 80%. Said as an assumption, never as the run's topology.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import hardware

PRACTICAL_RING_SHARE = 0.80  # shared/ANCHORS.md, NCCL ring protocols at >= 1 GiB


@dataclass(frozen=True)
class Hop:
    src: int  # CUDA device index
    dst: int
    kind: str  # "nvlink", "pcie", "network" or "unknown"
    bandwidth: float | None  # bytes/s per direction
    detail: str  # "NVLink 4 x18", "PCIe Gen5 x16 via PHB", or why it is unknown


@dataclass(frozen=True)
class RingTheory:
    bandwidth: float | None  # bytes/s per direction: the slowest hop; None when unknown
    hops: tuple[Hop, ...]
    share: float = PRACTICAL_RING_SHARE  # the usable share of it after protocol overhead

    @property
    def bottleneck(self) -> Hop | None:
        known = [h for h in self.hops if h.bandwidth is not None]
        return min(known, key=lambda h: h.bandwidth) if len(known) == len(self.hops) and known else None

    @property
    def practical(self) -> float | None:
        return None if self.bandwidth is None else self.bandwidth * self.share

    @property
    def summary(self) -> str:
        b = self.bottleneck
        if b is None or self.bandwidth is None:
            unknown = [h.detail for h in self.hops if h.bandwidth is None]
            return "theory unknown: " + (unknown[0] if unknown else "no hops")
        return f"{b.detail}: {self.bandwidth / 1e9:.1f} GB/s per direction"

    def to_dict(self) -> dict:
        return {"bandwidth": self.bandwidth, "practical": self.practical, "summary": self.summary,
                "hops": [asdict(h) for h in self.hops]}


def _by_bus(snapshot: dict) -> dict[str, dict]:
    return {g["pci_bus_id"]: g for g in snapshot.get("gpus", []) if g.get("pci_bus_id")}


def _norm(bus: str) -> str:
    from .topo import normalize_bus_id

    return normalize_bus_id(bus) or bus


def hop(snapshot: dict, a_bus: str, b_bus: str, a: int, b: int) -> Hop:
    """The hop from the GPU at PCI bus id a_bus (CUDA index a) to b_bus (b)."""
    gpus = _by_bus(snapshot)
    ga, gb = gpus.get(_norm(a_bus)), gpus.get(_norm(b_bus))
    if ga is None or gb is None:
        return Hop(a, b, "unknown", None, "GPU not in the topology snapshot (NVML unavailable?)")
    pair = next((p for p in snapshot.get("pairs", []) if p["src"] == ga["index"] and p["dst"] == gb["index"]), None)
    links = pair["nvlinks"] if pair else 0
    if links:
        versions = {ln.get("version") for ln in ga.get("nvlinks", []) if ln.get("active")}
        versions.discard(None)
        if len(versions) != 1:
            return Hop(a, b, "unknown", None, f"NVLink x{links} of unknown generation")
        gen = str(versions.pop()).split(".")[0]  # NVML reports "4.0"
        try:
            rate = hardware.nvlink_rate(int(gen)).value
        except Exception:  # noqa: BLE001 - a generation the database does not know
            return Hop(a, b, "unknown", None, f"NVLink {gen} x{links}: generation not in hardware.json")
        via = " via NVSwitch" if pair.get("via_nvswitch") else ""
        return Hop(a, b, "nvlink", links * rate, f"NVLink {gen} x{links}{via}")
    caps = []
    for g in (ga, gb):
        pcie = g.get("pcie") or {}
        gen, width = pcie.get("max_gen"), pcie.get("max_width")
        if not gen or not width:
            return Hop(a, b, "unknown", None, f"PCIe capability of GPU {g['index']} unknown")
        caps.append((hardware.pcie_rate(int(gen), int(width)).value, int(gen), int(width)))
    rate, gen, width = min(caps)
    where = f" via {pair['pcie_path']}" if pair and pair.get("pcie_path") else ""
    return Hop(a, b, "pcie", rate, f"PCIe Gen{gen} x{width}{where}")


def ring_theory(snapshot: dict | None, devices: list[tuple[int, str]]) -> RingTheory:
    """devices: (CUDA index, PCI bus id) per rank in rank order."""
    if snapshot is None or not snapshot.get("gpus"):
        reason = (snapshot or {}).get("nvml", {}).get("error") or "no topology (NVML unavailable)"
        return RingTheory(None, tuple(Hop(a, b, "unknown", None, reason) for (a, _), (b, _) in
                                      zip(devices, devices[1:] + devices[:1])))
    hops = tuple(hop(snapshot, ab, bb, a, b) for (a, ab), (b, bb) in zip(devices, devices[1:] + devices[:1]))
    known = [h.bandwidth for h in hops]
    bw = min(known) if hops and all(x is not None for x in known) else None
    return RingTheory(bw, hops)


def cuda_devices(gpus: list[int]) -> list[tuple[int, str]]:
    """(CUDA index, PCI bus id) for each device, the key that ties CUDA to NVML's numbering."""
    from mgpu_bench import _native

    return [(g, str(_native.device_info(g)["pci_bus_id"])) for g in gpus]


def pair_hops(snapshot: dict | None, gpus: list[int]) -> dict[tuple[int, int], Hop]:
    """The hop for every ordered pair of CUDA devices: NVLink links x rate, or PCIe."""
    bus = dict(cuda_devices(gpus))
    return {(a, b): hop(snapshot or {}, bus[a], bus[b], a, b) for a in gpus for b in gpus if a != b}


def nic_hop(snapshot: dict | None, gpu: int, bus: str) -> Hop:
    """The hop out of the node for CUDA device `gpu` (PCI bus id `bus`): its nearest active
    IB/RoCE port's rate (the best PCIe path in the snapshot; ties go to the faster port)."""
    nics = [n for n in (snapshot or {}).get("nics", []) if n.get("state") == "ACTIVE"]
    if not nics:
        return Hop(gpu, gpu, "unknown", None,
                   "no active InfiniBand/RoCE port in /sys/class/infiniband: NCCL would use TCP sockets")
    index = next((g["index"] for g in snapshot.get("gpus", []) if g.get("pci_bus_id") == _norm(bus)), None)
    from .topo import PATH_RANK

    def rank(n: dict) -> tuple:
        path = next((p["path"] for p in n.get("gpu_paths", []) if p["gpu"] == index), None)
        return (PATH_RANK.get(path, 99), -(n.get("rate_Bps") or 0))

    best = min(nics, key=rank)
    if not best.get("rate_Bps"):
        return Hop(gpu, gpu, "unknown", None, f"{best['device']} port {best['port']}: rate unknown")
    path = next((p["path"] for p in best.get("gpu_paths", []) if p["gpu"] == index), "?")
    return Hop(gpu, gpu, "network", float(best["rate_Bps"]),
               f"{best['device']} port {best['port']} {best.get('rate_text') or ''} ({path} from the GPU)".strip())


def hierarchy_theory(snapshot: dict | None, devices: list[tuple[int, str]]) -> dict[str, RingTheory]:
    """Per scope, for a job whose nodes all look like this one (`devices`: (CUDA index, PCI bus
    id) of the local GPUs, one per local rank):
    - intra-node: the ring over the local GPUs;
    - inter-node (one GPU per node, a rail): the slowest local GPU's nearest NIC;
    - world: the slower of the intra-node ring and the node's way out, the sum of the distinct
      NICs nearest its GPUs (NCCL runs one ring channel per NIC, in parallel)."""
    intra = ring_theory(snapshot, devices)
    nic = tuple(nic_hop(snapshot, g, bus) for g, bus in devices)
    known = [h.bandwidth for h in nic]
    complete = all(x is not None for x in known)
    inter = RingTheory(min(known) if complete else None, nic)
    ports = {h.detail.split(" (")[0]: h.bandwidth for h in nic}  # "mlx5_0 port 1 ...": each NIC once
    out_of_node = sum(ports.values()) if complete else None
    exit_hop = Hop(nic[0].src, nic[0].dst, "network" if complete else "unknown", out_of_node,
                   f"{len(ports)} NIC(s) out of the node: {', '.join(ports)}" if complete else nic[0].detail)
    both = [intra.bandwidth, out_of_node]
    world = RingTheory(min(both) if all(x is not None for x in both) else None, intra.hops + (exit_hop,))
    return {"world": world, "intra-node": intra, "inter-node": inter}


def platform_theory(gpu_name: str | None, nranks: int, hosts: int = 1) -> RingTheory:
    """The theory of `nranks` ranks on GPUs named `gpu_name` within one box of its vendor's usual
    platform (see the module's docs), for a run whose own topology is unknown; unknown (with the
    reason as the hop's detail) where the name is not in hardware.json, it has no platform, the
    ranks span hosts (the log names no network) or more GPUs than one box holds."""
    ring = [(r, (r + 1) % max(nranks, 1)) for r in range(max(nranks, 1))]

    def unknown(why: str) -> RingTheory:
        return RingTheory(None, tuple(Hop(a, b, "unknown", None, why) for a, b in ring))

    model = hardware.find_gpu(gpu_name or "")
    if model is None:
        return unknown(f"{gpu_name or 'the GPU'} is not in hardware.json")
    plat = model.platform
    if hosts > 1:
        return unknown(f"the ranks are on {hosts} hosts and the log names no network between them")
    if plat is None:
        return unknown(f"hardware.json gives no platform topology for {model.name} (and the log names no links)")
    if nranks < 2 or nranks > plat.gpus:
        return unknown(f"{nranks} rank(s) on one host: the {model.name} platform joins {plat.gpus} GPUs")
    assumed = f"assumed from the {model.name} platform, not read from the run"
    if plat.topology == "nvswitch":
        total = hardware.nvlink_total(model)
        if total is None or total.value is None:
            return unknown(f"{model.name}: no NVLink figures in hardware.json")
        detail = f"NVLink {model.nvlink_generation} x{model.nvlink_links} via NVSwitch ({assumed})"
        return RingTheory(total.value, tuple(Hop(a, b, "nvlink", total.value, detail) for a, b in ring))
    link = model.gpu_link
    if link is None or link.per_link.value is None or not plat.links_per_peer:
        return unknown(f"{model.name}: no GPU-to-GPU link rate in hardware.json")
    count = (nranks - 1) * plat.links_per_peer
    bandwidth = count * link.per_link.value
    detail = (f"{link.name} x{count} to {nranks - 1} peer(s), {link.per_link.value / 1e9:g} GB/s each (full mesh; "
              f"{assumed})")
    kind = "infinity_fabric" if "Infinity" in link.name else "roce"
    return RingTheory(bandwidth, tuple(Hop(a, b, kind, bandwidth, detail) for a, b in ring),
                      link.practical_share or PRACTICAL_RING_SHARE)
