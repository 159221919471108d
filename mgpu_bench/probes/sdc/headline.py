"""sdc's headline metrics (read from the document alone: the history imports nothing else):

    sdc.gpu{i}.wrong_checks      fraction of the GPU's checks whose result was wrong (against its
                                 own first result, its peers', the pattern written or the exact
                                 sum; a GPU that mismatches its peers has every GEMM check wrong);
                                 0 on a healthy GPU, lower is better
    sdc.gpu{i}.gemm.tflops       FLOP/s of the pinned-algorithm GEMM, median over repetitions
    sdc.gpu{i}.hbm.check_bandwidth  B/s written plus read back by the HBM check, median over repetitions
    sdc.gpu{i}.hbm.checked_bytes    B of HBM the check covered (written and read back per pass)

Any wrong check is also exit code 1 (Probe.failure): the fraction says how much, over runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric


def _flops(doc: Mapping) -> int:
    shape = str((doc.get("config") or {}).get("shape") or "0x0x0")
    m, n, k = (int(x) for x in shape.split("x"))
    return 2 * m * n * k


def headline(doc: Mapping) -> list[Metric]:
    checks = [c for c in doc.get("checks") or [] if isinstance(c, Mapping)]
    out: list[Metric] = []
    flops = _flops(doc)
    for g in doc.get("gpus") or []:
        gpu = int(g["gpu"])
        mine = [c for c in checks if c.get("gpu") == gpu]
        if not mine:
            continue
        labels = {"gpu": str(gpu), "gpu_name": str(g.get("name") or "")}
        peer = "mismatch" in (g.get("issues") or [])
        wrong = sum(1 for c in mine if c.get("wrong") or (peer and c.get("work") == "gemm"))
        out.append(Metric(f"sdc.gpu{gpu}.wrong_checks", wrong / len(mine), "fraction", "lower", (),
                          {**labels, "checks": str(len(mine))}))
        gemm = [c["count"] * flops / c["seconds"] for c in mine
                if c.get("work") == "gemm" and c.get("seconds", 0) > 0 and c.get("count")]
        if gemm and flops:
            out.append(Metric(f"sdc.gpu{gpu}.gemm.tflops", statistics.median(gemm), "FLOP/s", "higher",
                              tuple(gemm), labels))
        hbm = [c for c in mine if c.get("work") == "hbm" and c.get("seconds", 0) > 0]
        if hbm:
            rates = [2 * c["bytes"] / c["seconds"] for c in hbm]
            out.append(Metric(f"sdc.gpu{gpu}.hbm.check_bandwidth", statistics.median(rates), "B/s", "higher",
                              tuple(rates), labels))
            out.append(Metric(f"sdc.gpu{gpu}.hbm.checked_bytes", float(max(c["bytes"] for c in hbm)), "B", "higher", (),
                              labels))
    return out
