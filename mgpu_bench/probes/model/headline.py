"""model's headline metrics:

    model.{model}.{parallel}.{n}gpu.{data}.{tokens_per_s|mfu|exposed_comm|peak_memory}
    model.{model}.{parallel}.{n}gpu.scaling_efficiency          fraction, n > 1
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.metrics import Metric, finite, rates, slug


def _window_steps(run: Mapping) -> list[float]:
    """Per-step seconds of the stable window, the slowest rank per step (as analyse.analyse)."""
    good = [r for r in run.get("ranks") or [] if r.get("phases")]
    if not good:
        return []
    n = min(len(r["phases"]["step"]) for r in good)
    steps = [max(r["phases"]["step"][i] for r in good) for i in range(n)]
    start, end = (list(run.get("window") or [0, n]) + [0, n])[:2]
    return steps[int(start) : int(end)]


def headline(doc: Mapping) -> list[Metric]:
    cfg = doc.get("config") or {}
    model, parallel = (
        slug(cfg.get("model", "model")),
        slug(cfg.get("parallel", "ddp")),
    )
    out: list[Metric] = []
    for run in doc.get("runs") or []:
        d = run.get("derived") or {}
        if not d.get("tokens_per_s"):
            continue
        world, data = int(run["world"]), str(run["data"])
        prefix = f"model.{model}.{parallel}.{world}gpu.{slug(data)}"
        labels = {
            "model": str(cfg.get("model")),
            "parallel": str(cfg.get("parallel")),
            "world": str(world),
            "data": data,
        }
        steps = _window_steps(run)
        step_s = d.get("step_s")
        out.append(
            Metric(
                f"{prefix}.tokens_per_s",
                float(d["tokens_per_s"]),
                "tokens/s",
                "higher",
                rates(run.get("tokens_per_step") or 0, steps),
                labels,
            )
        )
        if d.get("mfu") is not None:
            # MFU is tokens/s times a constant: per step, mfu x median step / that step's seconds.
            mfu_samples = (
                finite(d["mfu"] * step_s / s for s in steps if s > 0) if step_s else ()
            )
            out.append(
                Metric(
                    f"{prefix}.mfu",
                    float(d["mfu"]),
                    "fraction",
                    "higher",
                    mfu_samples,
                    labels,
                )
            )
        if d.get("exposed_comm_share") is not None:
            out.append(
                Metric(
                    f"{prefix}.exposed_comm",
                    float(d["exposed_comm_share"]),
                    "fraction",
                    "lower",
                    (),
                    labels,
                )
            )
        if d.get("peak_reserved"):
            out.append(
                Metric(
                    f"{prefix}.peak_memory",
                    float(d["peak_reserved"]),
                    "B",
                    "lower",
                    (),
                    labels,
                )
            )
    for n, eff in (doc.get("scaling") or {}).items():
        if int(n) > 1 and eff is not None:
            labels = {
                "model": str(cfg.get("model")),
                "parallel": str(cfg.get("parallel")),
                "world": str(n),
            }
            out.append(
                Metric(
                    f"model.{model}.{parallel}.{int(n)}gpu.scaling_efficiency",
                    float(eff),
                    "fraction",
                    "higher",
                    (),
                    labels,
                )
            )
    return out
