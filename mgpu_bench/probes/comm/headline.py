"""comm's headline metrics (metrics.py names them): busbw per size from 64 MiB, where it has
settled, and the latency of the smallest size.

    comm.{op}.{dtype}.{size}.{in|out}.{n}ranks[.{scope}.{group}].busbw     B/s, sizes >= 64 MiB
    comm.{op}.{dtype}.{size}.{in|out}.{n}ranks[.{scope}.{group}].latency   s, the smallest size
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric, finite, rates, size_key, slug

LARGE = 64 << 20  # busbw is a headline from this size on (analyse.LARGE: where it has settled)


def _metric(
    m, quantity: str, value: float, unit: str, better: str, samples
) -> Metric:
    """One comm figure of measurement `m` (a CommMeasurement), named and labelled by its spec."""
    s = m.spec
    scope, group = getattr(s, "scope", "world"), getattr(s, "group", "")
    place, size = ("in" if s.inplace else "out"), size_key(s.size)
    where = "" if scope == "world" else f".{slug(scope)}.{slug(group) or 'all'}"
    labels = {"op": s.op, "dtype": s.dtype, "placement": place, "ranks": str(s.nranks)}
    labels.update(backend=s.backend, size=size)
    if scope != "world":
        labels.update(scope=scope, group=group)
    name = f"comm.{s.op}.{s.dtype}.{size}.{place}.{s.nranks}ranks{where}.{quantity}"
    return Metric(name, value, unit, better, samples, labels)


def headline(doc: Mapping) -> list[Metric]:
    """The metrics history keeps: busbw per size from 64 MiB, the latency of the smallest size."""
    return _metrics(doc, every_latency=False)


def comparable(doc: Mapping) -> list[Metric]:
    """What `compare` sets side by side (history/compare.py): the headline, and the latency of
    every size below 64 MiB, so that runs over different size ranges compare at the sizes both
    measured (a default CPU run's 1 KiB-4 MiB and a --sizes 8-1M run share 1 KiB-512 KiB)."""
    return _metrics(doc, every_latency=True)


def _metrics(doc: Mapping, every_latency: bool) -> list[Metric]:
    from mgpu_bench.results.measurement import CommMeasurement
    from mgpu_bench.results.ops import busbw_factor

    out: list[Metric] = []
    series: dict[
        tuple, list
    ] = {}  # one op on one communicator, one dtype and placement
    for d in doc.get("measurements") or []:
        if d.get("kind") == "comm":
            m = CommMeasurement.from_dict(d)
            s = m.spec
            key = (
                s.op,
                s.dtype,
                s.inplace,
                s.nranks,
                getattr(s, "scope", ""),
                getattr(s, "group", ""),
            )
            series.setdefault(key, []).append(m)
    for ms in series.values():
        for m in ms:
            if m.spec.size >= LARGE:
                moved = m.spec.bytes * busbw_factor(m.spec.op, m.spec.nranks)
                samples = rates(moved, m.per_sample.tolist())
                out.append(_metric(m, "busbw", m.busbw, "B/s", "higher", samples))
        smallest = min(ms, key=lambda m: m.spec.size)
        for small in (m for m in ms if m.spec.size < LARGE and (every_latency or m is smallest)):
            samples = finite(small.per_sample.tolist())
            out.append(
                _metric(small, "latency", small.time_s, "s", "lower", samples)
            )
    return out
