"""memory's headline metrics:

    memory.gpu{i}.hbm.{copy_ce|copy_sm|read|write}              B/s
    memory.gpu{i}.{allocator}.{pattern}.fragmentation           fraction, lower is better
    memory.{model}.{seq{n}|img{n}|own}.{ckpt|nockpt}.max_batch  samples per GPU
    memory.torch.{model}.b{batch}.{setting}.fragmentation       fraction of reserved unallocated at peak
    memory.torch.{model}.b{batch}.{setting}.peak_reserved       B, lower is better

{model} is the workload's key (workloads.Workload.key); the second segment its sample: tokens,
pixels per side, or a module's own batches.
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric, rates, slug


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
    for setting, t in (doc.get("torch") or {}).items():
        if not isinstance(t, Mapping) or t.get("kind") != "workload" or not t.get("peak_reserved_bytes"):
            continue  # a setting that failed (returncode, OOM) carries no peak to compare
        labels = {"model": str(t.get("model")), "batch": str(t.get("batch")), "seq_lens": str(t.get("seq_lens")),
                  "setting": str(setting)}
        prefix = f"memory.torch.{slug(str(t.get('model')))}.b{int(t.get('batch') or 0)}.{slug(str(setting))}"
        reserved = float(t["peak_reserved_bytes"])
        out.append(Metric(f"{prefix}.fragmentation", float(t.get("reserved_unallocated_at_peak_bytes") or 0) / reserved,
                          "fraction", "lower", (), labels))
        out.append(Metric(f"{prefix}.peak_reserved", reserved, "B", "lower", (), labels))
    return out
