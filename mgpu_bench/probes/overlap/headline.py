"""overlap's headline metrics (n: the ranks; size as metrics.size_key writes it):

    overlap.{n}ranks.allreduce.{size}.busbw_alone           B/s, 2+ ranks
    overlap.{n}ranks.allreduce.{size}.busbw_overlapped      B/s, beside the GEMM stream
    overlap.{n}ranks.allreduce.{size}.slowdown              fraction: time together / alone - 1
    overlap.{n}ranks.gemm.{dtype}.{MxNxK}.tflops_alone      FLOP/s per GPU (the ranks' mean)
    overlap.{n}ranks.gemm.{dtype}.{MxNxK}.tflops_overlapped FLOP/s per GPU, beside the allreduce stream
    overlap.{n}ranks.gemm.{dtype}.{MxNxK}.slowdown          fraction

On one rank the allreduce metrics are left out (NCCL's allreduce is then a no-op; the comm side
is a stand-in) and the GEMM's are beside that stand-in.
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric, finite, rates, size_key

from .analyse import analyse, comm_measurement, side_samples


def headline(doc: Mapping) -> list[Metric]:
    from .document import run_from_document

    run = run_from_document(dict(doc))
    if not run.ranks:
        return []
    a = analyse(run)
    c, n = run.config, run.world
    out: list[Metric] = []
    if n >= 2 and a.comm_alone and a.comm_together:
        prefix = f"overlap.{n}ranks.allreduce.{size_key(c.count * 4)}"
        labels = {"side": "allreduce", "ranks": str(n), "size": str(c.count * 4), "dtype": "fp32"}
        for what, phase, side in (("alone", "comm_alone", a.comm_alone), ("overlapped", "together", a.comm_together)):
            m = comm_measurement(run, phase)
            per = finite(m.spec.bytes * 2 * (n - 1) / n / s for s in m.per_sample if s > 0) if m else ()
            out.append(Metric(f"{prefix}.busbw_{what}", side.rate, "B/s", "higher", per, labels))
        out.append(Metric(f"{prefix}.slowdown", a.comm_slowdown.value, "fraction", "lower", (), labels))
    if a.gemm_alone and a.gemm_together:
        prefix = f"overlap.{n}ranks.gemm.{c.gemm_dtype}.{c.shape}"
        labels = {"side": "gemm", "ranks": str(n), "dtype": c.gemm_dtype, "shape": c.shape,
                  "beside": "allreduce" if n >= 2 else "elementwise stand-in"}
        for what, phase, side in (("alone", "gemm_alone", a.gemm_alone), ("overlapped", "together", a.gemm_together)):
            per = tuple(x for r in run.ranks for x in rates(c.flops, side_samples(r, phase, "gemm")))
            out.append(Metric(f"{prefix}.tflops_{what}", side.rate, "FLOP/s", "higher", per, labels))
        out.append(Metric(f"{prefix}.slowdown", a.gemm_slowdown.value, "fraction", "lower", (), labels))
    return out
