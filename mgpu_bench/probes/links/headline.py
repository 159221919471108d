"""links' headline metrics:

    links.gpu{a}-gpu{b}.{ce|sm}.{uni|bidir}.bandwidth           B/s per direction
    links.gpu{a}-gpu{b}.latency                                 s
    links.gpu{i}.{h2d|d2h}.host_bandwidth                       B/s
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric, finite, rates


def headline(doc: Mapping) -> list[Metric]:
    from .result import LinkMeasurement, LinkSpec

    out: list[Metric] = []
    for d in doc.get("measurements") or []:
        if d.get("kind") != "link":
            continue
        m = LinkMeasurement(LinkSpec(**d["spec"]), tuple(d["seconds"]))
        s = m.spec
        if s.kind == "copy":
            mode = "bidir" if s.bidirectional else "uni"
            out.append(
                Metric(
                    f"links.gpu{s.src}-gpu{s.dst}.{s.engine}.{mode}.bandwidth",
                    m.bandwidth,
                    "B/s",
                    "higher",
                    rates(s.bytes, m.seconds),
                    {
                        "src": str(s.src),
                        "dst": str(s.dst),
                        "engine": str(s.engine),
                        "mode": mode,
                    },
                )
            )
        elif s.kind == "latency":
            out.append(
                Metric(
                    f"links.gpu{s.src}-gpu{s.dst}.latency",
                    m.median_s,
                    "s",
                    "lower",
                    finite(m.seconds),
                    {"src": str(s.src), "dst": str(s.dst)},
                )
            )
        elif s.kind == "host":
            out.append(
                Metric(
                    f"links.gpu{s.src}.{s.direction}.host_bandwidth",
                    m.bandwidth,
                    "B/s",
                    "higher",
                    rates(s.bytes, m.seconds),
                    {"gpu": str(s.src), "direction": str(s.direction)},
                )
            )
    return out
