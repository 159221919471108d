"""check's headline metrics (reads the document, never a backend):

    check.gpu{i}.tflops             FLOP/s, the bf16 8192^3 GEMM on GPU i (check.rank{r}.* on CPU ranks)
    check.gpu{i}.copy_bandwidth     B/s, the device copy, read plus written
    check.allreduce_busbw           B/s, the node's own allreduce
    check.healthy                   fraction: 1 ok, 0 a problem (absent when the check could not tell)
    check.problems                  samples: how many problems the check found

Each with its per-burst samples, the noise the next check is judged with against this one.
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric

from .analyse import metric_name


def headline(doc: Mapping) -> list[Metric]:
    out = []
    node = {"node": str(doc.get("node") or "")}
    for p in doc.get("parts") or []:
        for f in p.get("figures") or []:
            labels = {**node, **({"device": f["device"]} if f["device"] != "node" else {})}
            out.append(Metric(metric_name(f), f["value"], f["unit"], "higher", tuple(f.get("samples") or ()), labels))
    v = doc.get("verdict") or {}
    if v.get("state") in ("ok", "problem"):
        out.append(Metric("check.healthy", 1.0 if v["state"] == "ok" else 0.0, "fraction", "higher", (), node))
        out.append(Metric("check.problems", float(sum(f["severity"] == "problem" for f in v.get("findings") or [])),
                          "samples", "lower", (), node))
    return out
