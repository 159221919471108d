"""memory's headline metrics:

    memory.gpu{i}.hbm.{copy_ce|copy_sm|read|write}              B/s
    memory.gpu{i}.{allocator}.{pattern}.fragmentation           fraction, lower is better
    memory.{model}.{seq{n}|img{n}|own}.{ckpt|nockpt}.max_batch  samples per GPU

{model} is the workload's key (workloads.Workload.key); the second segment its sample: tokens,
pixels per side, or a module's own batches.
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.metrics import Metric, rates, slug


def headline(doc: Mapping) -> list[Metric]:
    out: list[Metric] = []
    for h in doc.get("hbm") or []:
        moved = int(h.get("bytes_read") or 0) + int(h.get("bytes_written") or 0)
        gpu, kind = int(h["gpu"]), str(h["kind"])
        out.append(
            Metric(
                f"memory.gpu{gpu}.hbm.{slug(kind)}",
                float(h["bandwidth"]),
                "B/s",
                "higher",
                rates(moved, h.get("seconds") or []),
                {"gpu": str(gpu), "kernel": kind},
            )
        )
    for c in doc.get("churn") or []:
        frag = c.get("fragmentation")
        if frag is None:
            continue
        gpu = int(c["gpu"])
        out.append(
            Metric(
                f"memory.gpu{gpu}.{slug(c['allocator'])}.{slug(c['pattern'])}.fragmentation",
                float(frag),
                "fraction",
                "lower",
                (),
                {
                    "gpu": str(gpu),
                    "allocator": str(c["allocator"]),
                    "pattern": str(c["pattern"]),
                },
            )
        )
    for mb in doc.get("max_batch") or []:
        if mb.get("error") or mb.get("max_batch") is None:
            continue
        ckpt = "ckpt" if mb.get("checkpointing") else "nockpt"
        size = (f"img{int(mb['image_size'])}" if mb.get("image_size") else
                f"seq{int(mb['seq_len'])}" if mb.get("seq_len") else "own")
        out.append(
            Metric(
                f"memory.{slug(mb['model'])}.{size}.{ckpt}.max_batch",
                float(mb["max_batch"]),
                "samples",
                "higher",
                (),
                {
                    "model": str(mb["model"]),
                    "sample": size,
                    "checkpointing": ckpt,
                },
            )
        )
    return out
