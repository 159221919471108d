"""Hardware reference figures: GPU peaks and memory, NVLink, PCIe and network link rates.

The figures are data, not code: ``mgpu_bench/data/hardware.json`` (schema_version 1). Every
figure there carries its value in a base unit (FLOP/s, OP/s for integer math, B/s, B), the
source it was taken from (a key of the file's ``sources`` table, resolved here to the
document's title and address) and, for a bandwidth, its direction:

    per_direction  one way (what a one-way copy or NCCL's busbw is set against)
    bidirectional  both ways added together, as NVIDIA quotes NVLink ("900 GB/s") and PCIe
    aggregate      all traffic through the interface, e.g. HBM reads plus writes

Peak FLOP/s are dense (datasheet figures quoted with 2:4 sparsity are halved; the figure's
note says so). A value of None means the GPU has no such unit, or no figure could be
confirmed; the note says which.

GPU lookup is exact: the device name as NVML/CUDA reports it (for AMD GPUs, as HIP's device
properties name it, which rccl-tests prints), trimmed and compared without regard to case,
against each model's ``match`` list. An unknown GPU gives None, never the nearest model: a wrong
peak would make every efficiency figure quietly wrong.

GPU-to-GPU links other than NVLink (AMD Infinity Fabric, Intel Gaudi's integrated RoCE ports)
are the ``gpu_links`` section: a per-link rate per direction, and, where the vendor says so, the
share of it that is usable after protocol overhead. A GPU names its link kind (``gpu_link``) and
count (``gpu_link_count``); ``platform`` says how the vendor's usual box joins its GPUs
("nvswitch": every GPU's links go to switches, so every pair has them all; "full_mesh": every
pair joined directly by ``links_per_peer`` links), which theory.platform_theory uses where a
run's own topology is unknown (an imported nccl-tests or rccl-tests log).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any, TypeGuard

from mgpu_bench.core.errors import InputError

SCHEMA_VERSION = 1
PEAK_DTYPES = ("fp64", "fp64_tensor", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
UNITS = ("FLOP/s", "OP/s", "B/s", "B")
TOPOLOGIES = ("nvswitch", "full_mesh")
DIRECTIONS = ("per_direction", "bidirectional", "aggregate")
PCIE_WIDTHS = (1, 2, 4, 8, 16)
USER_OVERRIDE = "user override"

_DTYPE_ALIASES = {
    "float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32", "half": "fp16",
    "float16": "fp16", "bfloat16": "bf16", "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
    "e4m3": "fp8", "e5m2": "fp8",
}
_DATA_FILE = "data/hardware.json"


@dataclass(frozen=True)
class Figure:
    """One reference figure. ``value`` is in ``unit`` (a base unit) or None (see ``note``);
    ``direction`` is set for bandwidths (B/s) only."""

    value: float | None
    unit: str
    source: str
    direction: str | None = None
    note: str | None = None


def figure_from_dict(d: Mapping | None) -> Figure | None:
    """A Figure as a result document stores it (its value, unit, source, note), or None."""
    if not d or d.get("value") is None:
        return None
    return Figure(
        d["value"], d.get("unit") or "", d.get("source") or "", note=d.get("note")
    )


@dataclass(frozen=True)
class GpuLink:
    """A GPU-to-GPU link kind that is not NVLink: its rate per link and direction, and the share
    of it that is usable after protocol overhead where the vendor says (None: not said)."""

    key: str
    name: str
    per_link: Figure
    practical_share: float | None = None
    practical_source: str | None = None


@dataclass(frozen=True)
class Platform:
    """How the vendor's usual box joins its GPUs (see the module's docs)."""

    gpus: int
    topology: str  # one of TOPOLOGIES
    links_per_peer: int | None
    source: str
    note: str | None = None


@dataclass(frozen=True)
class GpuModel:
    """One GPU model. ``peak`` holds a Figure for every name in PEAK_DTYPES (value None where
    there is no such unit); NVLink fields are None for cards without NVLink. A GPU that is not
    NVIDIA's has no compute capability (``isa`` names its target, "gfx942"); its PCIe generation
    is None where no vendor document at hand gives it."""

    key: str
    name: str
    match: tuple[str, ...]
    compute_capability: tuple[int, int] | None
    memory: Figure
    memory_bandwidth: Figure
    peak: Mapping[str, Figure]
    nvlink_generation: int | None
    nvlink_links: int | None
    pcie_generation: int | None
    pcie_width: int | None
    architecture: str = ""
    memory_type: str = ""
    nvlink_bandwidth: Figure | None = None  # as the datasheet quotes it (bidirectional)
    pcie_bandwidth: Figure | None = None  # as the datasheet quotes it (bidirectional)
    note: str | None = None
    vendor: str = "NVIDIA"
    isa: str | None = None
    gpu_link: GpuLink | None = None  # Infinity Fabric, Gaudi RoCE: the gpu_links entry
    gpu_link_count: int | None = None
    platform: Platform | None = None


@dataclass(frozen=True)
class NvlinkGeneration:
    generation: int
    per_link: Figure  # nominal, per link, per direction
    per_link_raw: Figure | None  # signalling rate as nvidia-smi prints it, per direction
    links_per_gpu: Mapping[str, int]


@dataclass(frozen=True)
class PcieGeneration:
    generation: int
    transfer_rate_gt_s: float
    encoding: str
    per_lane: Figure  # per direction, after line encoding
    x16: Figure


@dataclass(frozen=True)
class HardwareDB:
    schema_version: int
    gpus: Mapping[str, GpuModel]
    nvlink: Mapping[int, NvlinkGeneration]
    pcie: Mapping[int, PcieGeneration]
    network: Mapping[str, Figure]
    sources: Mapping[str, str]  # key -> "title, url"
    data: Mapping[str, Any] = field(repr=False)  # the parsed JSON, for validate()
    _by_name: Mapping[str, str | None] = field(repr=False, default_factory=dict)  # match -> key
    gpu_links: Mapping[str, GpuLink] = field(default_factory=dict)

    def find_gpu(self, device_name: str) -> GpuModel | None:
        key = self._by_name.get(_norm_name(device_name))
        return self.gpus[key] if key is not None else None


# ---------------------------------------------------------------------------------- loading

@functools.cache
def load() -> HardwareDB:
    """The shipped database (read once, with importlib.resources)."""
    text = resources.files("mgpu_bench").joinpath(_DATA_FILE).read_text(encoding="utf-8")
    return from_dict(json.loads(text))


def from_dict(data: Mapping[str, Any]) -> HardwareDB:
    """Build the typed database from parsed JSON. Checks only what parsing needs; run
    validate() for the full list of problems."""
    try:
        return _build(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"hardware data is malformed ({type(exc).__name__}: {exc}); "
                         "validate() lists every problem") from exc


def _build(data: Mapping[str, Any]) -> HardwareDB:
    sources = {k: _cite(v) for k, v in data["sources"].items()}

    def fig(d: Mapping[str, Any]) -> Figure:
        value = d.get("value")
        src = d.get("source") or ""
        return Figure(value=None if value is None else float(value), unit=d["unit"],
                      source=sources.get(src, src), direction=d.get("direction"), note=d.get("note"))

    def opt(d: Mapping[str, Any] | None) -> Figure | None:
        return None if d is None else fig(d)

    links = {key: GpuLink(key, e["name"], fig(e["per_link"]), e.get("practical_share"),
                          sources.get(e.get("practical_source") or "", e.get("practical_source")))
             for key, e in (data.get("gpu_links") or {}).items()}
    gpus: dict[str, GpuModel] = {}
    by_name: dict[str, str | None] = {}
    for key, g in data["gpus"].items():
        cc = g.get("compute_capability")
        capability = tuple(int(x) for x in str(cc).split(".")) if cc is not None else None
        match = tuple(g["match"])
        p = g.get("platform")
        platform = None if p is None else Platform(int(p["gpus"]), p["topology"], p.get("links_per_peer"),
                                                   sources.get(p["source"], p["source"]), p.get("note"))
        gpus[key] = GpuModel(
            key=key, name=g["name"], match=match, compute_capability=capability,  # type: ignore[arg-type]
            memory=fig(g["memory"]), memory_bandwidth=fig(g["memory_bandwidth"]),
            peak=MappingProxyType({dt: fig(f) for dt, f in g["peak"].items()}),
            nvlink_generation=g.get("nvlink_generation"), nvlink_links=g.get("nvlink_links"),
            pcie_generation=_int_or_none(g.get("pcie_generation")), pcie_width=_int_or_none(g.get("pcie_width")),
            architecture=g.get("architecture", ""), memory_type=g.get("memory_type", ""),
            nvlink_bandwidth=opt(g.get("nvlink_bandwidth")), pcie_bandwidth=opt(g.get("pcie_bandwidth")),
            note=g.get("note"), vendor=g.get("vendor", "NVIDIA"), isa=g.get("isa"),
            gpu_link=links.get(g.get("gpu_link") or ""), gpu_link_count=g.get("gpu_link_count"), platform=platform,
        )
        for m in match:
            n = _norm_name(m)
            # A string claimed by two models maps to neither (validate() reports it).
            by_name[n] = None if n in by_name and by_name[n] != key else key

    nvlink = {
        int(gen): NvlinkGeneration(int(gen), fig(e["per_link"]), opt(e.get("per_link_raw")),
                                   MappingProxyType(dict(e.get("links_per_gpu", {}))))
        for gen, e in data["nvlink"].items()
    }
    pcie = {
        int(gen): PcieGeneration(int(gen), float(e["transfer_rate_gt_s"]), e["encoding"],
                                 fig(e["per_lane"]), fig(e["x16"]))
        for gen, e in data["pcie"].items()
    }
    network = {name: fig(f) for name, f in data["network"].items()}
    return HardwareDB(
        schema_version=int(data["schema_version"]), gpus=MappingProxyType(gpus),
        nvlink=MappingProxyType(nvlink), pcie=MappingProxyType(pcie),
        network=MappingProxyType(network), sources=MappingProxyType(sources), data=data,
        _by_name=MappingProxyType(by_name), gpu_links=MappingProxyType(links),
    )


def _int_or_none(x: Any) -> int | None:
    return None if x is None else int(x)


def _cite(src: Mapping[str, Any]) -> str:
    title, url = src.get("title") or "", src.get("url")
    return f"{title}, {url}" if url else title


def _norm_name(name: str) -> str:
    return name.strip().casefold()


# ---------------------------------------------------------------------------------- lookups

def find_gpu(device_name: str) -> GpuModel | None:
    """The model whose match list holds ``device_name`` exactly (trimmed, any case); None for
    a GPU not listed. ``NVIDIA H20`` is the H20, never the H200, and vice versa."""
    return load().find_gpu(device_name)


def peak_dtype(text: str) -> str:
    """'bfloat16' -> 'bf16', 'fp8_e4m3' -> 'fp8', ...; InputError for a name not in PEAK_DTYPES."""
    name = text.strip().lower().replace("-", "_")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in PEAK_DTYPES:
        raise InputError(f"unknown dtype '{text.strip()}' for a peak figure: "
                         f"choose from {', '.join(PEAK_DTYPES)}")
    return name


def peak_flops(device_name: str, dtype: str, overrides: Mapping[str, float] | None = None) -> Figure | None:
    """Dense peak for ``dtype`` on this GPU, in FLOP/s (OP/s for int8).

    ``overrides`` (dtype -> FLOP/s, as parse_peak_overrides returns) win over the database and
    come back with source "user override". Without one, None when the GPU is not listed or has
    no figure for ``dtype`` (GpuModel.peak[dtype].note says why). Note that fp32 is the plain
    FP32 rate: a matmul run with TF32 allowed is measured against tf32.
    """
    want = peak_dtype(dtype)
    for key, value in (overrides or {}).items():
        if peak_dtype(key) == want:
            value = float(value)
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"peak override for {want} must be a positive number, got {value!r}")
            return Figure(value, _peak_unit(want), USER_OVERRIDE, note="given by the user")
    gpu = find_gpu(device_name)
    if gpu is None:
        return None
    fig = gpu.peak.get(want)
    return fig if fig is not None and fig.value is not None else None


def nvlink_rate(generation: int, raw: bool = False) -> Figure:
    """Per link, per direction. ``raw``: the signalling rate nvidia-smi prints (26.5625 GB/s on
    NVLink 4) instead of the nominal one NVIDIA's totals are built from (25 GB/s)."""
    db = load()
    gen = db.nvlink.get(_as_int(generation))
    if gen is None:
        raise InputError(f"no NVLink generation '{generation}' recorded: choose from "
                         + ", ".join(str(g) for g in sorted(db.nvlink)))
    if raw and gen.per_link_raw is not None:
        return gen.per_link_raw
    return gen.per_link


def nvlink_total(model: GpuModel, raw: bool = False) -> Figure | None:
    """All of a GPU's NVLinks together, per direction (18 x 25 GB/s = 450 GB/s on an H200);
    None for a card without NVLink."""
    if model.nvlink_generation is None or not model.nvlink_links:
        return None
    link = nvlink_rate(model.nvlink_generation, raw)
    assert link.value is not None
    return Figure(model.nvlink_links * link.value, link.unit, link.source, link.direction,
                  note=f"{model.nvlink_links} links x {link.value / 1e9:g} GB/s per direction")


def pcie_rate(generation: int, width: int = 16) -> Figure:
    """A PCIe link of ``width`` lanes, per direction, after line encoding (128b/130b from Gen3,
    FLIT overhead on Gen6); TLP/DLLP protocol overhead is not deducted."""
    db = load()
    gen = db.pcie.get(_as_int(generation))
    if gen is None:
        raise InputError(f"no PCIe generation '{generation}' recorded: choose from "
                         + ", ".join(str(g) for g in sorted(db.pcie)))
    w = _as_int(width)
    if w not in PCIE_WIDTHS:
        raise InputError(f"PCIe width x{width} is not a link width: choose from "
                         + ", ".join(f"x{x}" for x in PCIE_WIDTHS))
    lane = gen.per_lane
    assert lane.value is not None
    return Figure(lane.value * w, lane.unit, lane.source, lane.direction,
                  note=f"Gen{gen.generation} x{w}: {w} lanes x {lane.value / 1e9:.4g} GB/s ({gen.encoding})")


def network_rate(name: str) -> Figure:
    """One port, per direction: 'NDR' (also 'IB NDR', 'InfiniBand NDR'), 'HDR', '400GbE', ..."""
    db = load()
    want = _norm_net(name)
    for key, fig in db.network.items():
        if _norm_net(key) == want:
            return fig
    raise InputError(f"unknown network '{name}': choose from {', '.join(db.network)}")


def _norm_net(name: str) -> str:
    n = re.sub(r"[\s_\-]+", "", name).lower()
    for prefix in ("infiniband", "ib"):
        if n.startswith(prefix) and len(n) > len(prefix):
            return n[len(prefix):]
    return n


def _as_int(x: Any) -> int:
    """int(x), or -1 (never a key) for something that is not a whole number."""
    try:
        return int(x)
    except (TypeError, ValueError):
        return -1


def _peak_unit(dtype: str) -> str:
    return "OP/s" if dtype == "int8" else "FLOP/s"


# ------------------------------------------------------------------------------- user input

def parse_peak_overrides(text: str) -> dict[str, float]:
    """'bf16=989,fp8=1979' (TFLOP/s, TOP/s for int8) -> {'bf16': 989e12, 'fp8': 1979e12}."""
    out: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise InputError(f"peak override '{part}' has no '=': write dtype=TFLOP/s, e.g. bf16=989")
        name, _, number = part.partition("=")
        dtype = peak_dtype(name)
        try:
            tflops = float(number)
        except ValueError:
            raise InputError(f"peak override '{part}': '{number.strip()}' is not a number; "
                             "give TFLOP/s, e.g. bf16=989") from None
        if not (math.isfinite(tflops) and tflops > 0):
            raise InputError(f"peak override '{part}': the figure must be a positive number of TFLOP/s")
        if dtype in out:
            raise InputError(f"peak override for {dtype} is given twice: keep one")
        out[dtype] = tflops * 1e12
    return out


# ------------------------------------------------------------------------------- validation

def validate(db: HardwareDB | Mapping[str, Any]) -> list[str]:
    """Problems in the data (empty: valid): every figure has a source listed in 'sources', a
    base unit and a positive value (or None with a note); every bandwidth a direction; no two
    GPU models share a match string; NVLink and PCIe entries agree with each other."""
    data = db.data if isinstance(db, HardwareDB) else db
    if not isinstance(data, Mapping):
        return ["hardware data is not a JSON object"]
    problems: list[str] = []
    add = problems.append
    if data.get("schema_version") != SCHEMA_VERSION:
        add(f"schema_version is {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")

    sources = data.get("sources")
    if not isinstance(sources, Mapping):
        add("'sources' is missing")
        sources = {}
    for key, src in sources.items():
        if not isinstance(src, Mapping) or not _text(src.get("title")):
            add(f"sources.{key}: no title")

    def fig(path: str, f: Any, units: tuple[str, ...], direction: str | None = None,
            optional: bool = False) -> float | None:
        """Check one figure; its value when usable."""
        if f is None:
            if not optional:
                add(f"{path}: missing")
            return None
        if not isinstance(f, Mapping):
            add(f"{path}: not a figure object")
            return None
        value, unit, src, d = f.get("value"), f.get("unit"), f.get("source"), f.get("direction")
        good = None
        if value is None:
            if not _text(f.get("note")):
                add(f"{path}: null value without a note saying why")
        elif (isinstance(value, bool) or not isinstance(value, (int, float))
              or not math.isfinite(value) or value <= 0):
            add(f"{path}: value {value!r} is not a positive number")
        else:
            good = float(value)
        if unit not in UNITS:
            add(f"{path}: unit {unit!r} is not a base unit ({', '.join(UNITS)})")
        elif unit not in units:
            add(f"{path}: unit {unit} where {' or '.join(units)} belongs")
        if not _text(src):
            add(f"{path}: no source")
        elif src not in sources:
            add(f"{path}: source '{src}' is not listed in 'sources'")
        if unit == "B/s":
            if d is None:
                add(f"{path}: bandwidth without a direction ({', '.join(DIRECTIONS)})")
            elif d not in DIRECTIONS:
                add(f"{path}: direction {d!r} is not one of {', '.join(DIRECTIONS)}")
            elif direction is not None and d != direction:
                add(f"{path}: direction is {d}, must be {direction}")
        elif d is not None:
            add(f"{path}: direction given for a figure that is not a bandwidth")
        return good

    nvlink = _section(data, "nvlink", add)
    pcie = _section(data, "pcie", add)
    gpus = _section(data, "gpus", add)
    network = _section(data, "network", add)
    gpu_links = _check_gpu_links(data, fig, add)

    per_link: dict[str, float | None] = {}
    for gen, e in nvlink.items():
        p = f"nvlink.{gen}"
        if not str(gen).isdigit() or not isinstance(e, Mapping):
            add(f"{p}: not a generation number with an entry")
            continue
        per_link[str(gen)] = fig(f"{p}.per_link", e.get("per_link"), ("B/s",), "per_direction")
        fig(f"{p}.per_link_raw", e.get("per_link_raw"), ("B/s",), "per_direction", optional=True)
        links = e.get("links_per_gpu", {})
        if not isinstance(links, Mapping):
            add(f"{p}.links_per_gpu: not a mapping")
            continue
        for model, n in links.items():
            if not _count(n):
                add(f"{p}.links_per_gpu.{model}: {n!r} is not a positive whole number")
            g = gpus.get(model)
            if isinstance(g, Mapping) and (g.get("nvlink_links") != n
                                           or str(g.get("nvlink_generation")) != str(gen)):
                add(f"{p}.links_per_gpu.{model}: {n} links of NVLink {gen}, but gpus.{model} says "
                    f"{g.get('nvlink_links')} of NVLink {g.get('nvlink_generation')}")

    for gen, e in pcie.items():
        p = f"pcie.{gen}"
        if not str(gen).isdigit() or not isinstance(e, Mapping):
            add(f"{p}: not a generation number with an entry")
            continue
        lane = fig(f"{p}.per_lane", e.get("per_lane"), ("B/s",), "per_direction")
        x16 = fig(f"{p}.x16", e.get("x16"), ("B/s",), "per_direction")
        if lane is not None and x16 is not None and not math.isclose(x16, 16 * lane, rel_tol=1e-9):
            add(f"{p}.x16: {x16:g} is not 16 x per_lane ({16 * lane:g})")
        if not isinstance(e.get("transfer_rate_gt_s"), (int, float)) or not _text(e.get("encoding")):
            add(f"{p}: transfer_rate_gt_s or encoding missing")

    claimed: dict[str, str] = {}
    for key, g in gpus.items():
        p = f"gpus.{key}"
        if not isinstance(g, Mapping):
            add(f"{p}: not an object")
            continue
        if not _text(g.get("name")):
            add(f"{p}: no name")
        match = g.get("match")
        if not isinstance(match, list) or not match:
            add(f"{p}.match: needs a non-empty list of device names")
            match = []
        for m in match:
            if not _text(m):
                add(f"{p}.match: empty or non-string entry {m!r}")
                continue
            n = _norm_name(m)
            if n in claimed:
                other = claimed[n]
                add(f"{p}.match: '{m}' is listed twice in this model" if other == key
                    else f"{p}.match: '{m}' is also a match string of gpus.{other}")
            else:
                claimed[n] = key
        nvidia = g.get("vendor", "NVIDIA") == "NVIDIA"
        if nvidia and not re.fullmatch(r"\d+\.\d+", str(g.get("compute_capability", ""))):
            add(f"{p}.compute_capability: {g.get('compute_capability')!r} is not like '9.0'")
        if not nvidia and (g.get("compute_capability") is not None or not _text(g.get("isa"))):
            add(f"{p}: a GPU by {g.get('vendor')} has no compute capability but an isa ('gfx942')")
        fig(f"{p}.memory", g.get("memory"), ("B",))
        fig(f"{p}.memory_bandwidth", g.get("memory_bandwidth"), ("B/s",))
        peak = g.get("peak")
        if not isinstance(peak, Mapping):
            add(f"{p}.peak: missing")
            peak = {}
        for dt in PEAK_DTYPES:
            fig(f"{p}.peak.{dt}", peak.get(dt), (_peak_unit(dt),))
        for dt in peak:
            if dt not in PEAK_DTYPES:
                add(f"{p}.peak.{dt}: unknown dtype (use one of {', '.join(PEAK_DTYPES)})")

        nv_gen, nv_links = g.get("nvlink_generation"), g.get("nvlink_links")
        if nv_gen is None:
            if nv_links is not None or g.get("nvlink_bandwidth") is not None:
                add(f"{p}: NVLink links or bandwidth given without nvlink_generation")
        else:
            if str(nv_gen) not in per_link:
                add(f"{p}.nvlink_generation: {nv_gen!r} is not in the nvlink section")
            if not _count(nv_links):
                add(f"{p}.nvlink_links: {nv_links!r} is not a positive whole number")
            total = fig(f"{p}.nvlink_bandwidth", g.get("nvlink_bandwidth"), ("B/s",), "bidirectional")
            link = per_link.get(str(nv_gen))
            if total is not None and link is not None and _count(nv_links) \
                    and not math.isclose(total, 2 * nv_links * link, rel_tol=0.01):
                add(f"{p}.nvlink_bandwidth: {total / 1e9:g} GB/s both ways is not {nv_links} links x "
                    f"{link / 1e9:g} GB/s x 2")
        unknown_pcie = not nvidia and g.get("pcie_generation") is None and g.get("pcie_width") is None
        if not unknown_pcie and str(g.get("pcie_generation")) not in {str(k) for k in pcie}:
            add(f"{p}.pcie_generation: {g.get('pcie_generation')!r} is not in the pcie section")
        if not unknown_pcie and g.get("pcie_width") not in PCIE_WIDTHS:
            add(f"{p}.pcie_width: {g.get('pcie_width')!r} is not one of {PCIE_WIDTHS}")
        _check_links(p, g, gpu_links, sources, add)
        fig(f"{p}.pcie_bandwidth", g.get("pcie_bandwidth"), ("B/s",), optional=True)

    for name, f in network.items():
        fig(f"network.{name}", f, ("B/s",), "per_direction")
    return problems


def _check_gpu_links(data: Mapping[str, Any], fig, add) -> Mapping[str, Any]:
    """The gpu_links section (optional): each entry a name, a per-link rate per direction, and a
    usable share in (0, 1] with its source where one is given."""
    links = data.get("gpu_links") or {}
    if not isinstance(links, Mapping):
        add("'gpu_links' is not an object")
        return {}
    sources = data.get("sources") if isinstance(data.get("sources"), Mapping) else {}
    for key, e in links.items():
        p = f"gpu_links.{key}"
        if not isinstance(e, Mapping) or not _text(e.get("name")):
            add(f"{p}: needs a name and a per_link figure")
            continue
        fig(f"{p}.per_link", e.get("per_link"), ("B/s",), "per_direction")
        share = e.get("practical_share")
        if share is not None and not (isinstance(share, (int, float)) and 0 < share <= 1
                                      and e.get("practical_source") in sources):
            add(f"{p}.practical_share: {share!r} must be a fraction in (0, 1] with a practical_source of 'sources'")
    return links


def _check_links(p: str, g: Mapping[str, Any], links: Mapping[str, Any], sources: Mapping[str, Any], add) -> None:
    """A GPU's gpu_link (a key of gpu_links, with a positive count) and platform."""
    link, count = g.get("gpu_link"), g.get("gpu_link_count")
    if link is not None and link not in links:
        add(f"{p}.gpu_link: {link!r} is not in the gpu_links section")
    if (link is None) != (count is None) or (count is not None and not _count(count)):
        add(f"{p}: gpu_link and a positive gpu_link_count go together")
    plat = g.get("platform")
    if plat is None:
        return
    if not isinstance(plat, Mapping) or not _count(plat.get("gpus")) or plat.get("topology") not in TOPOLOGIES:
        add(f"{p}.platform: needs gpus (a count) and a topology ({', '.join(TOPOLOGIES)})")
        return
    if plat.get("source") not in sources:
        add(f"{p}.platform: source {plat.get('source')!r} is not listed in 'sources'")
    if plat["topology"] == "full_mesh" and (link is None or not _count(plat.get("links_per_peer"))):
        add(f"{p}.platform: a full mesh needs the GPU's gpu_link and links_per_peer")
    if plat["topology"] == "nvswitch" and g.get("nvlink_generation") is None:
        add(f"{p}.platform: an NVSwitch platform needs the GPU's NVLink generation and links")


def _section(data: Mapping[str, Any], name: str, add) -> Mapping[str, Any]:
    s = data.get(name)
    if not isinstance(s, Mapping) or not s:
        add(f"'{name}' is missing or empty")
        return {}
    return s


def _text(x: Any) -> bool:
    return isinstance(x, str) and bool(x.strip())


def _count(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0
