"""plan's headline metrics: what the plan projects, so that `history trend` shows a projection move
when the figures under it do (a driver upgrade, a slower link):

    plan.{model}.{parallel}.{n}gpu.step               s, the step time on n GPUs (the answer's n)
    plan.{model}.{parallel}.{n}gpu.time_to_train      s, for the plan's budget on n GPUs

    plan.{model}.{parallel}.largest_batch             samples per GPU that fit (the fit, answered even
                                                      where the time is not)
    plan.{model}.{parallel}.b{batch}.memory            B allocated per GPU at the plan's batch

{model} is the workload's key, {parallel} the layout's name (ddp, zero1, zero2, fsdp, tp8-pp16-ddp, ddp-ckpt).
No samples: a projection has no noise of its own (its range is in the document). A layout that
does not fit has no step and no time to train (fit first), only its memory."""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric, slug

from .layout import SHARDS


def headline(doc: Mapping) -> list[Metric]:
    out: list[Metric] = []
    fit = doc.get("fit") or {}
    name = (doc.get("layout") or {}).get("name") or (doc.get("config") or {}).get("parallel")
    key, parallel = slug((doc.get("workload") or {}).get("key")), slug(name)
    model = str((doc.get("workload") or {}).get("key"))
    plain = parallel in SHARDS
    largest = fit.get(f"largest_batch_{parallel}") if plain else fit.get("largest_batch_asked")
    if largest is not None:
        out.append(Metric(f"plan.{key}.{parallel}.largest_batch", float(largest), "samples", "higher", (),
                          {"model": model, "parallel": parallel}))
    at = (fit.get(parallel) if plain else None) or fit.get("asked") or {}
    if at.get("allocated") is not None and at.get("batch"):
        out.append(Metric(f"plan.{key}.{parallel}.b{int(at['batch'])}.memory", float(at["allocated"]), "B", "lower",
                          (), {"model": model, "parallel": parallel, "batch": str(at["batch"])}))
    answer = doc.get("answer") or {}
    n = answer.get("gpus")
    point = next((p for p in doc.get("curve") or [] if p.get("gpus") == n), None)
    if not n or point is None or answer.get("fits") is False:
        return out
    prefix = f"plan.{key}.{parallel}.{int(n)}gpu"
    labels = {"model": model, "parallel": parallel, "gpus": str(n)}
    out.append(Metric(f"{prefix}.step", float(point["step_s"]), "s", "lower", (), labels))
    if point.get("days") is not None:
        out.append(Metric(f"{prefix}.time_to_train", float(point["days"]) * 86400.0, "s", "lower", (), labels))
    return out
