"""model's headline metrics:

    model.{model}.{parallel}.{n}gpu.{data}.{samples_per_s|tokens_per_s|mfu|exposed_comm|peak_memory}
    model.{model}.{parallel}.{n}gpu.scaling_efficiency          fraction, n > 1

{model} is the workload's key (workloads.Workload.key: "350m", "torchvision:resnet50",
"hf:bert-large", "module:pkg.mod:fn"), so that no comparison sets one workload's figures against
another's. samples/s always; tokens/s where the workload has tokens.

Every metric but peak memory carries per-step samples, so that compare holds its change against
its noise: throughput's are each timed step's rate (every step after warm-up, as the figure is
the wall clock's), their robust spread a step's. The derived ones pair steps by their index in the stable windows: exposed
communication 1 - (step without gradient sync i) / (step i); scaling efficiency
(tokens/s at step i on n GPUs) / (n x tokens/s at step i on 1 GPU). Each pair is one estimate of
the figure, so their spread is the noise of a single estimate, as the step times' is for tokens/s.
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.metrics import Metric, finite, measured_steps, rates, slug, window_steps


def _no_sync_steps(run: Mapping) -> list[float]:
    """Per-step seconds without gradient sync, the slowest rank per step, over their own stable
    window (as figures.analyse)."""
    from .figures import stable_window

    good = [r["no_sync_phases"] for r in run.get("ranks") or [] if (r.get("no_sync_phases") or {}).get("step")]
    if not good:
        return []
    n = min(len(p["step"]) for p in good)
    steps = [max(p["step"][i] for p in good) for i in range(n)]
    start, end, _ = stable_window(steps, 0)
    return steps[start:end]


def _exposed_samples(run: Mapping) -> tuple[float, ...]:
    sync, nosync = window_steps(run), _no_sync_steps(run)
    return finite(max(0.0, 1.0 - ns / s) for s, ns in zip(sync, nosync) if s > 0)


def _scaling_samples(runs: list[Mapping], n: int) -> tuple[float, ...]:
    """Per-step-pair estimates of T_n / (n x T_1) from the runs that made the document's figure
    (synthetic data where measured, as ModelRun.effective)."""
    def effective(world: int) -> Mapping | None:
        mine = [r for r in runs if int(r.get("world", 0)) == world
                and ((r.get("derived") or {}).get("tokens_per_s") or (r.get("derived") or {}).get("samples_per_s"))]
        return next((r for r in mine if r.get("data") == "synthetic"), mine[0] if mine else None)

    one, many = effective(1), effective(n)
    if one is None or many is None:
        return ()
    r1 = rates(one.get("samples_per_step") or 0, window_steps(one))
    rn = rates(many.get("samples_per_step") or 0, window_steps(many))
    return finite(b / (n * a) for a, b in zip(r1, rn) if a > 0)


def headline(doc: Mapping) -> list[Metric]:
    cfg = doc.get("config") or {}
    model, parallel = (
        slug(cfg.get("model", "model")),
        slug(cfg.get("parallel", "ddp")),
    )
    out: list[Metric] = []
    for run in doc.get("runs") or []:
        d = run.get("derived") or {}
        if not (d.get("tokens_per_s") or d.get("samples_per_s")):
            continue
        world, data = int(run["world"]), str(run["data"])
        prefix = f"model.{model}.{parallel}.{world}gpu.{slug(data)}"
        labels = {
            "model": str(cfg.get("model")),
            "parallel": str(cfg.get("parallel")),
            "world": str(world),
            "data": data,
        }
        steps = measured_steps(run)
        step_s = d.get("wall_step_s") or d.get("step_s")
        if d.get("samples_per_s"):
            out.append(Metric(f"{prefix}.samples_per_s", float(d["samples_per_s"]), "samples/s", "higher",
                              rates(run.get("samples_per_step") or 0, steps), labels))
        if d.get("tokens_per_s"):
            out.append(Metric(f"{prefix}.tokens_per_s", float(d["tokens_per_s"]), "tokens/s", "higher",
                              rates(run.get("tokens_per_step") or 0, steps), labels))
        if d.get("mfu") is not None:
            # MFU is tokens/s times a constant: per step, mfu x the mean step / that step's seconds.
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
                    _exposed_samples(run),
                    labels,
                )
            )
        led = run.get("ledger") or {}
        if led.get("shares") and led.get("steps"):
            # the step ledger: each cause's share of the timed steps' wall clock, per window as its samples
            for cause, share in led["shares"].items():
                samples = finite((w.get("shares") or {}).get(cause) for w in led.get("windows") or []
                                 if (w.get("shares") or {}).get(cause) is not None)
                out.append(Metric(f"{prefix}.ledger_{slug(cause)}", float(share), "fraction",
                                  "higher" if cause == "gpu" else "lower", samples, {**labels, "cause": cause}))
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
                    _scaling_samples(list(doc.get("runs") or []), int(n)),
                    labels,
                )
            )
    return out
