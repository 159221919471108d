"""gemm's headline metrics:

    gemm.gpu{i}.{dtype}.tflops                FLOP/s, the best candidate of the fastest shape
    gemm.gpu{i}.{dtype}.sustained_tflops      FLOP/s, median of a --duration series
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric, rates, slug


def headline(doc: Mapping) -> list[Metric]:
    best: dict[tuple[int, str], Mapping] = {}
    for r in doc.get("results") or []:
        if r.get("phase") == "search" or not r.get("flops_per_s"):
            continue
        key = (int(r["gpu"]), str(r["dtype"]))
        if key not in best or r["flops_per_s"] > best[key]["flops_per_s"]:
            best[key] = r
    out: list[Metric] = []
    for (gpu, dtype), r in best.items():
        labels = {
            "gpu": str(gpu),
            "dtype": dtype,
            "shape": f"{r['m']}x{r['n']}x{r['k']}",
            "gpu_name": str(r.get("gpu_name") or ""),
        }
        cand = next(
            (c for c in r.get("candidates") or [] if c.get("index") == r.get("best")),
            None,
        )
        samples = rates(r["flops"], cand.get("seconds") or []) if cand else ()
        out.append(
            Metric(
                f"gemm.gpu{gpu}.{slug(dtype)}.tflops",
                float(r["flops_per_s"]),
                "FLOP/s",
                "higher",
                samples,
                labels,
            )
        )
        series = r.get("series") or []
        sustained = rates(r["flops"], [p.get("seconds") for p in series])
        if sustained:
            out.append(
                Metric(
                    f"gemm.gpu{gpu}.{slug(dtype)}.sustained_tflops",
                    statistics.median(sustained),
                    "FLOP/s",
                    "higher",
                    sustained,
                    labels,
                )
            )
    return out
