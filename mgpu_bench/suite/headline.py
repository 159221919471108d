"""The suite's headline metrics: the union of its probes' own, each labelled with its probe and
round. A name that an earlier probe already gave is qualified as NAME@PROBE, so adding a probe
never renames the metrics of the probes before it."""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results import probe as registry
from mgpu_bench.results.document import document_kind
from mgpu_bench.results.metrics import Metric, slug


def headline(doc: Mapping) -> list[Metric]:
    out: list[Metric] = []
    seen: set[str] = set()
    for probe in doc.get("probes") or []:
        sub = probe.get("document") if isinstance(probe, Mapping) else None
        if not isinstance(sub, Mapping) or document_kind(sub) == "suite":
            continue  # a skipped probe, or one that failed before writing anything
        name = str(probe.get("name") or document_kind(sub) or "probe")
        extra = {"probe": name, "round": str(probe.get("round", ""))}
        for m in registry.headline(sub):
            key = m.name if m.name not in seen else f"{m.name}@{slug(name)}"
            n = 2
            while key in seen:  # the same probe name twice: number the repeats
                key = f"{m.name}@{slug(name)}-{n}"
                n += 1
            seen.add(key)
            out.append(Metric(key, m.value, m.unit, m.better, m.samples, {**m.labels, **extra}))
    return out
