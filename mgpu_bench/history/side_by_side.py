"""Machines side by side: N stored runs of one kind, each figure set against its own machine's
theory. `mgpu-bench side-by-side RUN RUN [RUN ...]`; `compare` stays the two-run regression gate.

One table model (build), several renderers (side_by_side_render.py). Its rows are the runs'
headline metrics (what the history keeps, probe.headline), one row per figure:

- value per GPU: a figure of every GPU (gemm.gpu3.bf16.tflops, memory.gpu0.hbm.copy_ce, a links
  pair) is one row, the median over the run's GPUs; comm's busbw is per rank already and its
  rank count leaves the row's name (busbw is the figure that compares across rank counts); a
  model's samples/s and tokens/s are the run's total over its GPUs, divided by them;
- share of theory: busbw against the run's own link theory (its document's), else the datasheet
  platform's (theory.platform_theory, said as assumed); TFLOP/s against the dense datasheet peak
  of the GPU and dtype; HBM bandwidth against the datasheet's (hardware.json, figure by figure);
- ratio to the first column; per watt where NVML power was recorded beside the figure (gemm's
  own telemetry, the suite's samples beside a probe), value per GPU / mean power per GPU;
- the model step: model rows are keyed by workload, so only the same workload shares a row.

A figure a run lacks is None (shown as missing), never 0. The columns' header holds the machine
facts that differ between the runs (GPU, count, driver, NCCL, CUDA, topology, network, source),
those they share are said once.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mgpu_bench.core.errors import InputError
from mgpu_bench.machine import hardware, theory
from mgpu_bench.results.document import document_kind
from mgpu_bench.results.metrics import Metric

FACTS = ("host", "GPU", "GPUs", "driver", "CUDA", "NCCL", "topology", "network", "source", "created")
_PER_GPU = re.compile(r"^gpu\d+(?:-gpu\d+)?$")  # gemm.gpu0..., links.gpu0-gpu1...
_RANKS = re.compile(r"^\d+ranks$")
_MODEL_GPUS = re.compile(r"^(\d+)gpu$")
_SIZE = re.compile(r"^(\d+)(GiB|MiB|KiB|B)$")
TOTALS = ("samples_per_s", "tokens_per_s")  # a model run's figures over all its GPUs


@dataclass(frozen=True)
class Column:
    """One run: its id, kind and the machine facts of FACTS."""

    run_id: str
    kind: str
    facts: Mapping[str, str]

    @property
    def label(self) -> str:
        return f"{self.run_id} {self.facts.get('GPUs', '?')}x {self.facts.get('GPU', '?')}"


@dataclass(frozen=True)
class Cell:
    """One run's figure: `value` per GPU in the metric's base unit; `theory` the figure it is set
    against (same unit) with `theory_text` saying what it is; `ratio` to the first column's value;
    `power_w` mean NVML power per GPU while it was measured; `gpus` how many GPUs the value is
    the median of (1 for a per-rank or whole-run figure)."""

    value: float
    theory: float | None = None
    theory_text: str | None = None
    ratio: float | None = None
    power_w: float | None = None
    gpus: int = 1
    spread: tuple[float, float] | None = None  # min and max over those GPUs

    @property
    def share(self) -> float | None:
        return self.value / self.theory if self.theory else None

    @property
    def per_watt(self) -> float | None:
        return self.value / self.power_w if self.power_w else None


@dataclass(frozen=True)
class Row:
    key: str  # the figure's name with the per-GPU and rank-count segments taken out
    family: str  # what one chart shows: "comm allreduce busbw (out-of-place)", "gemm tflops"
    label: str  # the figure within its family: "1GiB fp32", "bf16"
    unit: str  # base unit
    better: str
    cells: tuple[Cell | None, ...]


@dataclass
class SideBySide:
    columns: list[Column]
    rows: list[Row]
    differ: list[str]  # fact names whose values differ between the runs
    same: dict[str, str]  # fact -> the value all runs share
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The JSON document (base units, shares as fractions, missing figures as null)."""
        def cell(c: Cell | None) -> dict | None:
            if c is None:
                return None
            return {"value": c.value, "share": c.share, "theory": c.theory, "theory_text": c.theory_text,
                    "ratio": c.ratio, "power_w": c.power_w, "per_watt": c.per_watt, "gpus": c.gpus,
                    "spread": list(c.spread) if c.spread else None}

        from .records import utc_now

        return {"schema": "mgpu-bench/side-by-side", "schema_version": 1, "created": utc_now(),
                "runs": [{"run": c.run_id, "kind": c.kind, "facts": dict(c.facts)} for c in self.columns],
                "facts_differ": self.differ, "facts_same": self.same, "notes": self.notes,
                "figures": [{"key": r.key, "family": r.family, "label": r.label, "unit": r.unit, "better": r.better,
                             "cells": [cell(c) for c in r.cells]} for r in self.rows]}


def build(history, runs: Sequence[str]) -> SideBySide:
    """The side-by-side of stored runs (r12, 12, latest), in the order given. InputError for
    fewer than two distinct runs, or runs of different kinds."""
    ids = [history.resolve(r) for r in runs]
    if len(set(ids)) != len(ids) or len(ids) < 2:
        raise InputError(f"side-by-side needs two or more different runs (got {', '.join(ids)}): name each once")
    records = [history.get(i) for i in ids]
    kinds = {r.kind for r in records}
    if len(kinds) > 1:
        listing = ", ".join(f"{r.run_id} is {r.kind}" for r in records)
        raise InputError(f"side-by-side sets runs of one kind side by side ({listing}): give suites, or runs of one "
                         "probe")
    columns = [Column(r.run_id, r.kind, machine_facts(r)) for r in records]
    per_run = [_figures(r, history.metrics(r.run_id)) for r in records]
    order: dict[str, tuple] = {}
    for figs in per_run:
        for key, (meta, _) in figs.items():
            order.setdefault(key, meta)
    rows = []
    for key, (family, label, unit, better) in order.items():
        cells = [figs[key][1] if key in figs else None for figs in per_run]
        first = cells[0]
        cells = [c if c is None or first is None or not first.value else
                 Cell(c.value, c.theory, c.theory_text, c.value / first.value, c.power_w, c.gpus, c.spread)
                 for c in cells]
        rows.append(Row(key, family, label, unit, better, tuple(cells)))
    families = list(dict.fromkeys(r.family for r in rows))
    rows.sort(key=lambda r: (families.index(r.family), _natural(r.label)))
    keys = [k for k in FACTS if any(c.facts.get(k) for c in columns)]
    differ = [k for k in keys if len({c.facts.get(k) for c in columns}) > 1]
    same = {k: columns[0].facts[k] for k in keys if k not in differ and columns[0].facts.get(k) not in (None, "-")}
    notes = [("value per GPU: a figure of every GPU is the median over the run's GPUs; busbw is per rank; a model's "
              "samples/s and tokens/s are the run's total / its GPUs")]
    if any(c is None for r in rows for c in r.cells):
        notes.append("missing: the run did not measure that figure (never read as 0)")
    return SideBySide(columns, rows, differ, same, notes)


def _natural(label: str) -> tuple:
    """Sort key: sizes by their bytes, numbers by value, words as text."""
    out = []
    for token in label.split():
        token = {"out-of-place": "0out", "in-place": "1in"}.get(token, token)  # out-of-place first, as comm prints
        m = _SIZE.match(token)
        if m:
            out.append((0, int(m.group(1)) << {"GiB": 30, "MiB": 20, "KiB": 10, "B": 0}[m.group(2)], ""))
        else:
            out.append((1, 0, token))
    return tuple(out)


# -- one run's figures ------------------------------------------------------------------------------


def _figures(rec, metrics: Sequence[Metric]) -> dict[str, tuple[tuple, Cell]]:
    """key -> ((family, label, unit, better), Cell) for one run: its metrics with the per-GPU and
    rank-count segments folded (the median over GPUs), totals divided by GPUs, theory and power."""
    groups: dict[str, list[Metric]] = {}
    for m in metrics:
        groups.setdefault(_key(m), []).append(m)
    out = {}
    for key, ms in groups.items():
        if key.startswith("comm."):  # one figure per rank count: the run's widest communicator
            most = max(int(m.labels.get("ranks") or 0) for m in ms)
            ms = [m for m in ms if int(m.labels.get("ranks") or 0) == most]
        values = [_per_gpu(m) for m in ms]
        value = statistics.median(values)
        spread = (min(values), max(values)) if len(values) > 1 else None
        m = ms[0]
        ref, text = _theory(rec, m)
        powers = [p for p in (_power(rec, x) for x in ms) if p]
        power = statistics.median(powers) if len(powers) == len(ms) and powers else None
        out[key] = (_describe(key, m), Cell(value, ref, text, None, power, len(ms), spread))
    return out


def _key(m: Metric) -> str:
    head, at, probe = m.name.partition("@")
    parts = [p for p in head.split(".") if not _PER_GPU.match(p) and not _RANKS.match(p)]
    return ".".join(parts) + (at + probe if at else "")


def _per_gpu(m: Metric) -> float:
    if m.kind == "model" and m.quantity in TOTALS:
        for part in m.name.split("@")[0].split("."):
            found = _MODEL_GPUS.match(part)
            if found and int(found.group(1)) > 0:
                return m.value / int(found.group(1))
    return m.value


def _describe(key: str, m: Metric) -> tuple:
    """(family, label, unit, better): comm figures by op, with size, dtype and placement as the
    label; every other kind by its quantity, the rest of the name as the label."""
    head, at, probe = key.partition("@")
    parts = head.split(".")
    kind, quantity = parts[0], parts[-1]
    where = f" [{probe}]" if at else ""
    if kind == "comm" and len(parts) >= 6:
        op, dtype, size, place = parts[1], parts[2], parts[3], parts[4]
        scope = " ".join(parts[5:-1])
        family = f"comm {op} {quantity}{' (' + scope + ')' if scope else ''}{where}"
        return family, f"{size} {dtype} {'in-place' if place == 'in' else 'out-of-place'}", m.unit, m.better
    label = " ".join(parts[1:-1]) or quantity
    return f"{kind} {quantity}{where}", label, m.unit, m.better


def _sub_document(rec, m: Metric) -> Mapping:
    """The document a metric came from: a suite's probe entry's own document, else the run's."""
    doc = rec.document if isinstance(rec.document, Mapping) else {}
    probe = m.labels.get("probe")
    if rec.kind == "suite" and probe:
        for entry in doc.get("probes") or []:
            if isinstance(entry, Mapping) and entry.get("name") == probe and isinstance(entry.get("document"), Mapping):
                return entry["document"]
    return doc


def _gpu_name(rec, m: Metric, doc: Mapping) -> str | None:
    if m.labels.get("gpu_name"):
        return str(m.labels["gpu_name"])
    index = m.labels.get("gpu") or (m.labels.get("device") or "").removeprefix("gpu") or None
    gpus = [g for g in ((doc.get("environment") or {}).get("gpus") or rec.fingerprint.get("gpus") or [])
            if isinstance(g, Mapping)]
    for g in gpus:
        if index is not None and str(g.get("index")) == str(index) and g.get("name"):
            return str(g["name"])
    return str(gpus[0]["name"]) if gpus and gpus[0].get("name") else None


def _theory(rec, m: Metric) -> tuple[float | None, str | None]:
    """What the figure is set against on this run's machine, and what that is."""
    doc = _sub_document(rec, m)
    q = m.quantity
    if m.kind == "comm" and q == "busbw":
        return _comm_theory(rec, m, doc)
    name = _gpu_name(rec, m, doc)
    gpu = hardware.find_gpu(name or "")
    if gpu is None:
        return None, (f"{name} is not in hardware.json" if name else None)
    if q.endswith("tflops"):
        dtype = m.labels.get("dtype") or "bf16"  # check's and sdc's GEMM is bf16
        try:  # fp64 GEMMs run on the FP64 tensor cores, as the gemm probe sets them against
            key = "fp64_tensor" if dtype == "fp64" else hardware.peak_dtype(dtype)
        except InputError:
            return None, f"no {dtype} peak in hardware.json"
        peak = gpu.peak.get(key)
        if peak is not None and peak.value:
            return peak.value, f"{gpu.name}: dense datasheet peaks (hardware.json)"
        return None, f"no {dtype} peak for {gpu.name} in hardware.json"
    if m.unit == "B/s" and (m.kind == "memory" and ".hbm." in m.name or q in ("copy_bandwidth", "check_bandwidth")):
        bw = gpu.memory_bandwidth
        if bw.value:
            return bw.value, f"{gpu.name}: HBM {bw.value / 1e12:g} TB/s, reads plus writes (hardware.json)"
        return None, f"no HBM bandwidth for {gpu.name} in hardware.json"
    return None, None


def _comm_theory(rec, m: Metric, doc: Mapping) -> tuple[float | None, str | None]:
    scope = m.labels.get("scope") or "world"
    t = (doc.get("scope_theory") or {}).get(scope) if scope != "world" else doc.get("theory")
    if isinstance(t, Mapping) and t.get("bandwidth"):
        return float(t["bandwidth"]), str(t.get("summary") or "")
    if scope != "world" or str(doc.get("backend") or "").endswith("gloo"):
        return None, "no link theory" + (" (CPU processes)" if scope == "world" else "")
    gpus = [g for g in (doc.get("environment") or rec.fingerprint or {}).get("gpus") or [] if isinstance(g, Mapping)]
    hosts = {g.get("host") for g in gpus if g.get("host")} or {rec.host}
    names = {g.get("name") for g in gpus if g.get("name")}
    guess = theory.platform_theory(names.pop() if len(names) == 1 else None, int(m.labels.get("ranks") or 0),
                                   len(hosts))
    if guess.bandwidth:
        return guess.bandwidth, guess.summary
    return None, guess.summary


def _power(rec, m: Metric) -> float | None:
    """Mean NVML power (W) of the metric's GPU while it was measured: a gemm result's own
    telemetry (its --duration series for sustained_tflops), else the suite's samples beside the
    probe (the mean over its GPUs)."""
    doc = _sub_document(rec, m)
    if document_kind(doc) == "gemm" and m.labels.get("gpu") is not None:
        best = None
        for r in doc.get("results") or []:
            if (str(r.get("gpu")) == str(m.labels["gpu"]) and r.get("dtype") == m.labels.get("dtype")
                    and r.get("phase") != "search" and r.get("flops_per_s")
                    and (best is None or r["flops_per_s"] > best["flops_per_s"])):
                best = r
        if best is not None:
            tele = (best.get("series_telemetry") or {}).get("summary") if m.quantity == "sustained_tflops" \
                else best.get("telemetry")
            if isinstance(tele, Mapping) and tele.get("power_w_mean"):
                return float(tele["power_w_mean"])
    if rec.kind == "suite" and m.labels.get("probe"):
        for entry in (rec.document or {}).get("probes") or []:
            if isinstance(entry, Mapping) and entry.get("name") == m.labels["probe"]:
                gpus = ((entry.get("telemetry") or {}).get("gpus") or {}).values()
                watts = [float(g["summary"]["power_w_mean"]) for g in gpus if isinstance(g, Mapping)
                         and isinstance(g.get("summary"), Mapping) and g["summary"].get("power_w_mean")]
                return statistics.mean(watts) if watts else None
    return None


# -- the machine facts ------------------------------------------------------------------------------


def machine_facts(rec) -> dict[str, str]:
    """FACTS of a stored run, as text; "not in the log" for what an imported log could not tell."""
    fp = rec.fingerprint if isinstance(rec.fingerprint, Mapping) else {}
    doc = rec.document if isinstance(rec.document, Mapping) else {}
    unknown = set(fp.get("not_in_log") or [])

    def told(key: str, value) -> str:
        if value:
            return str(value)
        return "not in the log" if key in unknown else "-"

    gpus = [g for g in fp.get("gpus") or [] if isinstance(g, Mapping)]
    names = list(dict.fromkeys(str(g.get("name")) for g in gpus if g.get("name")))
    devices = doc.get("devices") if document_kind(doc) == "comm" else None
    count = len(devices) if isinstance(devices, list) and devices else len(gpus)
    source = doc.get("source") if isinstance(doc.get("source"), Mapping) else None
    return {
        "host": str(rec.host or "-"),
        "GPU": " + ".join(names) or ("CPU processes" if not gpus else "-"),
        "GPUs": str(count),
        "driver": told("nvidia_driver", fp.get("nvidia_driver")),
        "CUDA": told("cuda_runtime", fp.get("cuda_runtime")),
        "NCCL": told("nccl", fp.get("nccl")),
        "topology": told("topology", _topology(fp, doc)),
        "network": told("network", _network(fp, doc)),
        "source": (f"{source.get('tool')} {source.get('version') or ''} log".replace("  ", " ") if source
                   else f"mgpu-bench {fp.get('mgpu_bench') or doc.get('tool_version') or ''}".strip()),
        "created": str(rec.created)[:16].replace("T", " "),
    }


def _topology(fp: Mapping, doc: Mapping) -> str | None:
    """The GPU pairs' paths as nvidia-smi topo -m names them (NV18, PHB), from the run's topo
    snapshot; else the comm run's own link theory."""
    for topo in (doc.get("topology"), fp.get("topology")):
        if isinstance(topo, Mapping) and topo.get("pairs"):
            paths = sorted({str(p.get("path")) for p in topo["pairs"] if isinstance(p, Mapping) and p.get("path")})
            if paths:
                return "GPU pairs " + "/".join(paths)
    t = doc.get("theory")
    if isinstance(t, Mapping) and t.get("bandwidth") and "assumed" not in str(t.get("summary")):
        return str(t.get("summary")).split(":")[0]
    return None


def _network(fp: Mapping, doc: Mapping) -> str | None:
    for topo in (doc.get("topology"), fp.get("topology")):
        if isinstance(topo, Mapping) and topo.get("nics"):
            rates = [str(n.get("rate_text") or n.get("device")) for n in topo["nics"]
                     if isinstance(n, Mapping) and n.get("state") == "ACTIVE"]
            if rates:
                counts = {r: rates.count(r) for r in rates}
                return ", ".join(f"{n}x {r}" for r, n in counts.items())
    inter = (doc.get("scope_theory") or {}).get("inter-node") if isinstance(doc.get("scope_theory"), Mapping) else None
    if isinstance(inter, Mapping) and inter.get("summary"):
        return str(inter["summary"])
    return None
