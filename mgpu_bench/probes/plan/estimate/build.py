"""A plan from the evidence: the fit, the step per GPU count, days or GPUs, and what is missing,
every figure with its source (a run id, or "formula: ...", "scaled: ...", "assumed: ...").
Plain data out: the document's payload. Fit first (answer.py): a layout that does not fit gets no
days and no GPU count, and what fits instead is answered in its place."""

from __future__ import annotations

import shlex
from dataclasses import asdict, replace

from mgpu_bench.core.errors import InputError
from mgpu_bench.machine import hardware
from mgpu_bench.machine.theory import PRACTICAL_RING_SHARE

from .. import layout as layouts
from .. import text
from ..config import MAX_GPUS, PlanConfig
from ..layout import ZERO_STAGES, Layout
from ..sources import target
from ..sources.evidence import CPU, Evidence
from ..workload import Facts
from .answer import Planner
from .memory import STATE_BYTES, Memory, activations
from .project import Bandwidth, Compute, Parts, Projection, bandwidth_from, collectives, compute_time, curve_counts

SECONDS_PER_DAY = 86400.0
MODEL_SHARDS = ("ddp", "fsdp")  # what the model probe trains (and measures the overlap of)
DEFAULT_GPUS_PER_NODE = 8  # an HGX/DGX node; said as a default where the history does not tell
ACT_BYTES = 2  # bf16 activations: what tensor parallelism's collectives and a pipeline's sends move
DP_OPS = ("allreduce", "allgather", "reducescatter")  # DDP's, ZeRO's and FSDP's gradient collectives
ALL_OPS = (*DP_OPS, "sendrecv")  # and a pipeline's sends within a node


def figure(name: str, value, unit: str, source: str) -> dict:
    return {"name": name, "value": value, "unit": unit, "source": source}


class Scaled:
    """Evidence measured on another GPU model and the factor its step takes on the plan's GPU."""

    def __init__(self, ev: Evidence, ratio: float, how: str):
        self.ev, self.ratio, self.how = ev, ratio, how


def plan(cfg: PlanConfig, facts: Facts, ev: Evidence, local_gpus: int, here: bool,
         scaled: Scaled | None = None) -> dict:
    """The payload of the plan document. `here`: this machine has the plan's device (--measure can
    run the missing commands), with `local_gpus` of them (0: CPU processes); `scaled`: a measured
    GPU's evidence for a plan on another (--gpu)."""
    on_gpu = ev.device != CPU
    figures: list[dict] = []
    missing: list[dict] = []
    notes: list[str] = []
    figures.append(figure("parameters", facts.params, "params", facts.params_source))
    if facts.flops_per_sample:
        figures.append(figure("FLOPs per sample (fwd + bwd)", facts.flops_per_sample, "FLOP", facts.flops_source))

    run_here = (here, local_gpus)
    gpn, gpn_source = _gpus_per_node(cfg, ev, local_gpus)
    layouts.check(cfg.layout, facts, cfg.gpus, gpn)
    batch, batch_source = _batch(cfg, ev, facts, scaled)
    check_global_batch(cfg, batch)
    figures.append(figure("GPUs per node", gpn, "GPUs" if on_gpu else "processes", gpn_source))
    figures.append(figure("batch per GPU" if cfg.layout.plain else "micro-batch", batch, "samples", batch_source))

    # -- fit
    param_bytes = 2 if on_gpu else 4
    points = ev.memory or (scaled.ev.memory if scaled else [])
    acts = activations(facts, points, STATE_BYTES * facts.params)
    if scaled and not ev.memory and points:
        acts = replace(acts, source=f"{acts.source}; measured on the {scaled.ev.device} (the model's, not the GPU's)")
    capacity, cap_source = _capacity(ev)
    ratio, ratio_source = _reserved_ratio(ev if ev.steps or not scaled else scaled.ev)
    mem = Memory(facts, acts, capacity, ratio, param_bytes)
    figures.append(figure("model states, the whole model", STATE_BYTES * facts.params, "B",
                          "formula: 16 B/param, mixed-precision AdamW (ZeRO, Rajbhandari et al. 2020, section 3.1)"))
    figures.append(figure("activations per sample", acts.per_sample, "B", acts.source))
    if acts.other:
        figures.append(figure("other fixed memory", acts.other, "B", acts.source))
    figures.append(figure("device memory", capacity, "B", cap_source))
    if ratio != 1.0:
        figures.append(figure("reserved / allocated at peak", ratio, "x", ratio_source))
    if acts.per_sample is None:
        missing.append(_missing(f"activation memory of {facts.key}", _model_cmd(cfg, facts, ev, batch, run_here)))
    elif on_gpu and not acts.source.startswith("measured: peak memory at") and facts.kind != "bare":
        second = max(1, batch // 2) if batch > 1 else 2
        missing.append(_missing(f"peak memory of {facts.key} at a second batch size (the activation line)",
                                _model_cmd(cfg, facts, ev, second, run_here, one=True)))
    if capacity is None and on_gpu:
        missing.append(_missing(f"the memory of a {ev.device}", None, "not in the hardware database and no run "
                                "stored it: run `mgpu-bench model` on it"))

    # -- time
    asked = cfg.layout
    coll = collectives(facts, asked, param_bytes)
    figures.append(figure("gradient traffic per step", coll.total_bytes(), "B", _traffic_source(asked, coll)))
    compute = _compute(cfg, facts, ev, batch, scaled)
    if compute is None:
        unscaled = None
        if cfg.gpu and target.peak(ev.device) is None:
            unscaled = (f"the hardware database has no bf16 peak for the {ev.device}, so no other GPU's step scales to "
                        "it: measure it there, or give --rate (an achieved FLOP/s per GPU)")
        missing.append(_missing(f"the step time of {facts.key} at batch {batch}",
                                _model_cmd(cfg, facts, ev, batch, run_here), unscaled))
    elif compute.whole_step:
        figures.append(figure("FLOP/s per GPU over the whole step", batch * (facts.flops_per_sample or 0) /
                              compute.seconds, "FLOP/s", compute.source))
    else:
        figures.append(figure(f"step on 1 GPU at batch {batch}", compute.seconds, "s", compute.source))
    # every op any layout may use (what fits instead, a search), a missing figure said for the asked one's
    need = set(coll.ops) | ({"allgather", "reducescatter"} if asked.tp > 1 else set())
    node_bw = _node_bandwidth(cfg, ev, coll, ALL_OPS, need, gpn, missing, run_here, on_gpu)
    world_bw = _world_bandwidth(cfg, ev, DP_OPS, coll.ops, node_bw, gpn, missing)
    spans = asked.pp > 1 and asked.model_gpus > gpn
    pp_bw = _pp_bandwidth(cfg, ev, missing if spans else None)
    recompute = _recompute_factor(facts)

    def compute_at(b: int) -> Compute | None:
        return compute if b == batch else _compute(cfg, facts, ev, b, scaled)

    planner: Planner

    def make(lay: Layout, b: int) -> Projection | None:
        c = compute_at(b)
        if c is None:
            return None
        node = node_bw or {}
        p2p = (pp_bw if lay.model_gpus > gpn else _within(node, "sendrecv")) if lay.pp > 1 else None
        parts = Parts(recompute, node, p2p, planner.micro_batches(lay, b),
                      float(facts.tokens_per_sample or 0) * b * (facts.shape.width if facts.shape else 0) * ACT_BYTES)
        return Projection(ev, facts, lay, b, c, lambda m: collectives(facts, lay, param_bytes, m), node, world_bw,
                          gpn, parts)

    planner = Planner(cfg, facts, mem, make, gpn, batch, host_memory=not on_gpu)
    chosen = asked
    if cfg.search:
        found = planner.best(layouts.candidates(facts, gpn), batch) if (cfg.gpus or cfg.days) else None
        if found is None:
            notes.append("--parallel search: no layout fits" + ("" if compute else " or has a step time"))
        else:
            chosen = Layout(found["layout"]["tp"], found["layout"]["pp"], None, found["layout"]["shard"],
                            found["layout"]["checkpointing"])
            notes.append(f"--parallel search: {chosen.words(found['gpus'])} is the fastest layout that fits "
                         f"({len(layouts.candidates(facts, gpn))} tried)")
    projection = planner.projection(chosen, batch)
    if projection is not None and chosen.plain:
        f, _, source = projection.overlap()
        if gpn > 1 and chosen.shard in MODEL_SHARDS and not any(
                p.world > 1 and p.parallel == chosen.shard and p.exposed_s is not None for p in ev.steps) \
                and not compute.whole_step:
            missing.append(_missing("the overlap of the gradient collective with the backward pass",
                                    _model_cmd(cfg, facts, ev, batch, run_here, scaling=True)))
        figures.append(figure("collective hidden by backward", f, "fraction", source))
    answer = _answer(cfg, planner, chosen, batch)
    _used_figures([chosen, *(_layout_of(o) for o in (answer or {}).get("instead") or [] if o.get("host_bytes") is None)],
                  gpn, node_bw, world_bw, pp_bw, recompute, figures)
    curve, measured = [], []
    if projection is not None:
        top = max(cfg.gpus or 0, (answer or {}).get("gpus_high") or (answer or {}).get("gpus") or 0, 8 * gpn, 8)
        top = min(MAX_GPUS, max(top, chosen.model_gpus))
        wanted = {(answer or {}).get(k) for k in ("gpus", "gpus_low", "gpus_high")} | {cfg.gpus}
        ns = sorted({*(n * chosen.model_gpus for n in curve_counts(max(1, gpn // chosen.model_gpus), top)
                       if n * chosen.model_gpus <= top), *(n for n in wanted if n)})
        curve = [p for n in ns if chosen.ranks(n) and planner.fit(chosen, n, batch).fits is not False
                 and (p := _point(projection.estimate(n), planner, batch, compute.seconds)) is not None]
        measured = [p for w in projection.measured if (p := _point(projection.estimate(w), planner, batch,
                                                                     compute.seconds)) is not None]
    _layout_figures(cfg, chosen, answer, facts, batch, figures, projection)

    n_at = (answer or {}).get("gpus") or cfg.gpus or planner.fewest(chosen, batch) or chosen.model_gpus
    plain_n = cfg.gpus or (answer or {}).get("gpus") or mem.fewest_gpus(Layout(shard="fsdp"), batch) or gpn
    fit = {"bytes_per_param": STATE_BYTES, "param_bytes_gathered": param_bytes,
           "ddp": mem.fit(Layout(), 1, batch).to_dict(),
           "fewest_gpus_ddp": mem.fewest_gpus(Layout(), batch),
           "fewest_gpus_fsdp": mem.fewest_gpus(Layout(shard="fsdp"), batch),
           "largest_batch_ddp": mem.largest_batch(Layout(), 1),
           "fsdp": mem.fit(Layout(shard="fsdp"), plain_n, batch).to_dict(),
           "largest_batch_fsdp": mem.largest_batch(Layout(shard="fsdp"), plain_n),
           "max_batch_measured": [{"max_batch": b, "run": r} for b, r in ev.max_batch[:3]]}
    if chosen.plain and chosen.shard in ZERO_STAGES:  # the stage asked beside DDP and FSDP
        fit[chosen.shard] = mem.fit(chosen, plain_n, batch).to_dict()
        fit[f"fewest_gpus_{chosen.shard}"] = mem.fewest_gpus(chosen, batch)
        fit[f"largest_batch_{chosen.shard}"] = mem.largest_batch(chosen, plain_n)
    fit["asked"] = planner.fit(chosen, n_at, batch).to_dict()
    fit["fewest_gpus_asked"] = planner.fewest(chosen, batch)
    fit["largest_batch_asked"] = mem.largest_batch(chosen, n_at, planner.micro_batches(chosen, 1)(
        chosen.ranks(n_at) or 1) or 1) if chosen.ranks(n_at) else None
    if facts.tokens_per_sample and curve:
        gb = f"{cfg.global_batch} samples" if cfg.global_batch else \
            f"{batch} x {'micro-batches x ' if chosen.pp > 1 else ''}data-parallel ranks"
        notes.append(f"the global batch is {gb} of {facts.tokens_per_sample} tokens"
                     + ("" if cfg.global_batch else ": it grows with the GPUs (the budget is the same, the optimizer's "
                                                    "batch is not); --global-batch holds it"))
    return {
        "workload": facts.to_dict(), "budget": {"value": cfg.budget, "unit": cfg.budget_unit},
        "device": {"name": ev.device, "source": ev.device_source, "gpus_per_node": gpn, "memory": capacity},
        "batch": batch, "layout": chosen.to_dict(n_at), "figures": figures, "fit": fit, "curve": curve,
        "measured_points": measured, "answer": answer, "missing": missing, "notes": notes,
    }


def _answer(cfg: PlanConfig, planner: Planner, lay: Layout, batch: int) -> dict | None:
    """--gpus N: the days at N; --days D: the fewest GPUs (central, and the range's two ends) and
    the days those GPUs take (`days`: the projection, never the budget, which is `budget_days`);
    either only where `lay` fits, else what does instead (answer.py)."""
    if not cfg.gpus and not cfg.days:
        return None
    question = "gpus" if cfg.gpus else "days"
    base = {"question": question, "gpus": cfg.gpus, "days": None, "budget_days": cfg.days if cfg.days else None,
            "batch": batch}
    n = cfg.gpus or planner.fewest(lay, batch) or lay.model_gpus
    fit = planner.fit(lay, n, batch)
    base.update(layout=lay.to_dict(n), fits=fit.fits, memory=fit.allocated, capacity=fit.capacity,
                micro_batches=fit.micro_batches)
    does_not = fit.fits is False if cfg.gpus else (fit.fits is not None and planner.fewest(lay, batch) is None)
    if does_not:
        instead = planner.instead(lay, batch)
        if cfg.gpus and not any(o["at_asked"] for o in instead):
            instead.append(planner.host_offload(cfg.gpus, batch))
        where = f"on {cfg.gpus} GPUs" if cfg.gpus else "on any number of GPUs"
        states, usable = STATE_BYTES * planner.facts.params, planner.mem.usable
        alone = ""
        if cfg.gpus and usable and states > cfg.gpus * usable:
            alone = (f": its model states alone ({text.value(states, 'B')}) are more than the "
                     f"{text.value(cfg.gpus * (fit.capacity or 0), 'B')} of {cfg.gpus} GPUs, no sharding holds it")
        return {**base, "fits": False, "days": None, "gpus": None, "instead": instead,
                "text": f"{planner.facts.key} at micro-batch {batch} with {lay.words(n)} does not fit {where}{alone}"}
    if not cfg.budget:
        return {**base, "days": None, "text": "no --tokens or --samples: the step and throughput per GPU count only"}
    if planner.projection(lay, batch) is None:
        return {**base, "days": None, "text": f"no estimate: the step time of {planner.facts.key} is missing (see "
                                               "below)"}
    if cfg.gpus:
        e = planner.estimate(lay, cfg.gpus, batch)
        if e is None:
            return {**base, "days": None, "text": f"no estimate for {cfg.gpus} GPUs: a figure is missing (see below)"}
        return {**base, "days": planner.days(e), "days_low": planner.days(e, "low_s"),
                "days_high": planner.days(e, "high_s"), "measured": e.measured, "assumed": e.assumed}
    ends = {attr: planner.reach(lay, batch, cfg.days, attr) for attr in ("step_s", "low_s", "high_s")}
    central = ends["step_s"]
    out = {**base, "gpus": central[0] if central else None, "gpus_low": ends["low_s"][0] if ends["low_s"] else None,
           "gpus_high": ends["high_s"][0] if ends["high_s"] else None}
    if not central:
        out["text"] = _unreached(cfg, planner, lay, batch, out)
    if central:
        n, e = central
        f = planner.fit(lay, n, batch)
        out.update(layout=lay.to_dict(n), memory=f.allocated, micro_batches=f.micro_batches, assumed=e.assumed,
                   days=planner.days(e), days_low=planner.days(e, "low_s"), days_high=planner.days(e, "high_s"),
                   measured=e.measured)
    return out


def _unreached(cfg: PlanConfig, planner: Planner, lay: Layout, batch: int, out: dict) -> str:
    """Why --days D has no GPU count: the layout's fit or a figure is unknown (no estimate), or
    every count was projected and none trains within D (`unreachable`: an answer)."""
    amount = f"{text.count(cfg.budget)} {cfg.budget_unit}"
    start = planner.fewest(lay, batch)
    if start is None:
        return (f"no estimate: the fewest GPUs that hold {planner.facts.key} are not known (the device's memory is "
                "not: see the fit lines)")
    days = [(d, n) for n in planner.counts(lay, batch) if n >= start
            for d in [planner.days(planner.estimate(lay, n, batch))]]
    if not days or any(d is None for d, _ in days):
        return f"no estimate within {text.days(cfg.days)}: a figure for the larger GPU counts is missing (see below)"
    best, n = min(days)
    out["unreachable"] = True
    return (f"{text.days(cfg.days)} for {amount} is out of reach: the fastest of the GPU counts the plan considers "
            f"({start} to {days[-1][1]}), {n} GPUs, takes {text.days(best)}")


def _point(e, planner: Planner, batch: int, one_gpu_s: float) -> dict | None:
    if e is None:
        return None
    facts = planner.facts
    d = asdict(e)
    per_gpu = e.samples / e.gpus / e.step_s  # samples per GPU per second
    d.update(rate_per_gpu=per_gpu * (facts.tokens_per_sample or 1), efficiency=per_gpu * one_gpu_s / batch,
             days=planner.days(e), days_low=planner.days(e, "low_s"), days_high=planner.days(e, "high_s"))
    return d


def _layout_of(o: dict) -> Layout:
    lay = o["layout"]
    return Layout(lay["tp"], lay["pp"], None, lay["shard"], lay["checkpointing"])


def _used_figures(used: list[Layout], gpn: int, node_bw, world_bw, pp_bw, recompute: float,
                  figures: list[dict]) -> None:
    """The bus bandwidths and the recomputation factor the answered layouts (the one planned and
    those that fit instead) use, each with its source: the op within a node for data parallelism
    on one node and for tensor parallelism, between nodes for the gradient collectives, the
    pipeline's point-to-point figure where a replica spans nodes."""
    node: list[str] = []
    world: list[str] = []
    for lay in used:
        dp = ("allreduce",) if lay.shard == "ddp" else ("allgather", "reducescatter")
        node += [*dp, *(("allgather", "reducescatter") if lay.tp > 1 else ()),
                 *(("sendrecv",) if 1 < lay.pp and lay.model_gpus <= gpn else ())]
        world += dp
    for op in dict.fromkeys(node):
        bw = (node_bw or {}).get(op)
        if bw is not None:
            figures.append(figure(f"{op} busbw, one node", bw.points[-1][1], "B/s",
                                  f"{bw.source}, at {_size(bw.points[-1][0])}"))
    for op in dict.fromkeys(world):
        bw = (world_bw or {}).get(op)
        if bw is not None:
            figures.append(figure(f"{op} busbw, across nodes", bw.points[-1][1], "B/s", bw.source))
    if pp_bw is not None and any(lay.pp > 1 and lay.model_gpus > gpn for lay in used):
        figures.append(figure("sendrecv busbw, between nodes (pipeline)", pp_bw.points[-1][1], "B/s", pp_bw.source))
    if any(lay.checkpointing for lay in used):
        figures.append(figure("FLOPs with recomputation", recompute, "x",
                              "formula: 1 + the blocks' forward (2 x block parameters + 4 L d T per token) / 6N + "
                              "12 L d T"))


def _layout_figures(cfg: PlanConfig, lay: Layout, answer: dict | None, facts: Facts, batch: int,
                    figures: list[dict], projection: Projection | None) -> None:
    """What tensor and pipeline parallelism add, at the answer's GPU count."""
    if lay.plain or facts.shape is None:
        return
    n = (answer or {}).get("gpus") or lay.model_gpus
    size = float(facts.tokens_per_sample or 0) * batch * facts.shape.width * ACT_BYTES
    m = (answer or {}).get("micro_batches") or (projection.micro_batches(lay.ranks(n) or 1) if projection else 1)
    if lay.tp > 1:
        pairs = 6 if lay.checkpointing else 4
        figures.append(figure("tensor-parallel traffic per micro-batch", pairs * 2 * size * -(-facts.blocks // lay.pp),
                              "B", f"formula: {pairs // 2} x (all-gather + reduce-scatter) of s b h x 2 bytes, forward, "
                                   f"backward{' and recomputed forward' if lay.checkpointing else ''}, twice per layer "
                                   "(sequence parallelism, Korthikanti et al. 2022, section 4.2.2)"))
    if lay.pp > 1:
        figures.append(figure("micro-batches per step", m, "micro-batches",
                              f"--global-batch {cfg.global_batch} / (dp x micro-batch)" if cfg.global_batch else
                              "default: 8 x pp (--global-batch sets it)"))
        figures.append(figure("pipeline bubble", (lay.pp - 1) / max(1, m), "fraction",
                              "formula: (p - 1) / m, the idle slots of a 1F1B pipeline (Narayanan et al. 2021, "
                              "section 2.2.1)"))
        figures.append(figure("pipeline send per micro-batch", size / lay.tp, "B",
                              "formula: s b h x 2 / tp bytes forward and again backward (the scatter/gather of "
                              "Narayanan et al. 2021, section 4.1)"))


def check_global_batch(cfg: PlanConfig, batch: int) -> None:
    """--global-batch takes whole micro-batches: on the --gpus asked, on every data-parallel rank."""
    gb = cfg.global_batch
    if gb is None:
        return
    if gb % batch:
        raise InputError(f"--global-batch {gb}: not a multiple of the micro-batch {batch} (--batch-size)")
    dp = cfg.layout.ranks(cfg.gpus) if cfg.gpus and not cfg.search else None  # a search skips what does not divide
    if dp and gb % (dp * batch):
        raise InputError(f"--global-batch {gb}: {dp} data-parallel ranks x micro-batch {batch} do not divide it; give "
                         f"a multiple of {dp * batch}, or other --gpus")


def _recompute_factor(facts: Facts) -> float:
    """FLOPs of a step with every block's forward recomputed, over the step's (GPT-shaped only)."""
    if facts.shape is None or not facts.tokens_per_sample or not facts.flops_per_sample:
        return 1.0
    s, d, L = facts.tokens_per_sample, facts.shape.width, facts.blocks
    forward = s * (2.0 * L * facts.block_params + 4.0 * L * d * s)
    return 1.0 + forward / facts.flops_per_sample


def _compute(cfg: PlanConfig, facts: Facts, ev: Evidence, batch: int, scaled: Scaled | None) -> Compute | None:
    """The step's compute at `batch`: --rate or --mfu (assumed), else measured on this GPU, else
    measured on another and scaled (sources/target.py)."""
    if cfg.rate or cfg.mfu:
        if not facts.flops_per_sample:
            raise InputError(f"--rate/--mfu: the FLOPs of {facts.key} are not known ({facts.flops_source})")
        if cfg.rate:
            return Compute(batch * facts.flops_per_sample / cfg.rate, None,
                           f"assumed: --rate {cfg.rate / 1e12:.4g} TFLOP/s per GPU over the whole step (its FLOPs with "
                           "recomputation where --checkpointing, Megatron-LM's X); the collectives and the bubble are "
                           "inside it", whole_step=True, counts_recompute=True)
        peak = target.peak(ev.device)
        if peak is None:
            raise InputError(f"--mfu: the datasheet peak of a {ev.device} is not known: give --rate, or --gpu NAME of "
                             "the hardware database")
        return Compute(batch * facts.flops_per_sample / (cfg.mfu * peak[0]), None,
                       f"assumed: --mfu {cfg.mfu:g} (model FLOPs over the whole step) of the {peak[1]}",
                       whole_step=True, counts_recompute=False)
    c = compute_time(ev, facts, batch)
    if c is not None or scaled is None:
        return c
    c = compute_time(scaled.ev, facts, batch)
    if c is None:
        return None
    return Compute(c.seconds * scaled.ratio, c.noise, f"scaled: {c.source} on the {scaled.ev.device}, x "
                                                      f"{scaled.ratio:.3f}, {scaled.how}")


def _missing(what: str, cmd: tuple[list[str], bool] | None, why: str | None = None) -> dict:
    """A figure the history lacks and the command that measures it: `cmd` (its arguments, whether
    this machine can run it: --measure runs those), or None and `why`."""
    args, runnable = cmd if cmd else (None, False)
    command = "mgpu-bench " + shlex.join(args) if args else None
    return {"what": what, "command": command, "args": args if runnable else None, "why": why}


def _model_cmd(cfg: PlanConfig, facts: Facts, ev: Evidence, batch: int, run_here: tuple[bool, int], *,
               one: bool = False, scaling: bool = False) -> tuple[list[str], bool] | None:
    """`mgpu-bench model` measuring this workload at `batch` (with a 1 -> 2 scaling run where it can)."""
    if facts.kind == "bare":
        return None  # not a workload the model probe builds: measure a named GPT, the plan scales by FLOPs
    here, local_gpus = run_here
    args = ["model", "--model", facts.text]
    if facts.seq_len and facts.kind in ("gpt", "hf"):
        args += ["--seq-len", str(facts.seq_len)]
    if facts.image_size:
        args += ["--image-size", str(facts.image_size)]
    # the model probe trains DDP and FSDP: a ZeRO stage's step is measured as DDP's (the same compute)
    args += ["--batch-size", str(batch), "--parallel", cfg.layout.shard if cfg.layout.shard in MODEL_SHARDS else "ddp"]
    on_gpu = ev.device != CPU
    two = (local_gpus >= 2 or not here) if on_gpu else True
    if scaling or (not one and two):
        args += ["--scaling", "1,2"] + (["--gpus", "2"] if on_gpu else [])
    else:
        args += ["--gpus", "1"] if on_gpu else ["--nproc", "1"]
        args += ["--no-exposed-comm"]
    args += ["--steps", "12", "--warmup-steps", "3"] + (["--no-profile"] if on_gpu else [])
    return args, here and (two or not scaling)


def _gpus_per_node(cfg: PlanConfig, ev: Evidence, local_gpus: int) -> tuple[int, str]:
    if cfg.gpus_per_node:
        return cfg.gpus_per_node, "--gpus-per-node"
    if ev.gpus_per_node:
        return ev.gpus_per_node
    if local_gpus and not cfg.gpu:
        return local_gpus, "this machine's GPUs"
    if ev.device == CPU:
        widest = max((p.ranks for p in ev.bus if p.scope == "node"), default=2)
        return widest, "CPU processes: the widest comm run on this host"
    return DEFAULT_GPUS_PER_NODE, "default (an 8-GPU node): give --gpus-per-node"


def _batch(cfg: PlanConfig, ev: Evidence, facts: Facts, scaled: Scaled | None) -> tuple[int, str]:
    if cfg.batch_size:
        return cfg.batch_size, "--batch-size"
    if not cfg.layout.plain:
        return 1, "default for tensor and pipeline parallelism (Megatron-LM's large models train at micro-batch 1)"
    one = ev.one_gpu() or (scaled.ev.one_gpu() if scaled else [])
    if one:
        return one[0].batch, f"the batch of the newest run, {one[0].run}"
    return facts.default_batch, "the workload's default"


def _capacity(ev: Evidence) -> tuple[float | None, str]:
    for p in ev.steps:
        if p.total_memory:
            return float(p.total_memory), f"{p.run} (the device's total memory as torch reports it)"
    if ev.device == CPU:
        return None, "CPU processes: no device memory to fit in (host memory is the limit)"
    if ev.device_memory is not None:
        return ev.device_memory[0], f"{ev.device_memory[1]} (the device's total memory in its fingerprint)"
    found = target.memory(ev.device)
    if found is not None:
        return found
    return None, "missing: not in the hardware database"


def _reserved_ratio(ev: Evidence) -> tuple[float, str]:
    pts = [p for p in ev.steps if p.world == 1 and p.peak_allocated and p.peak_reserved]
    if not pts:
        return 1.0, "no reserved figure stored: allocated bytes are what must fit"
    p = max(pts, key=lambda p: p.batch)
    return max(1.0, p.peak_reserved / p.peak_allocated), f"{p.run} at batch {p.batch} (the caching allocator's overhead)"


def _traffic_source(lay: Layout, coll) -> str:
    where = "" if lay.plain else f" of the {lay.tp} x {lay.pp} split's share of the parameters"
    if lay.shard == "fsdp":
        return ("formula: all-gather each unit's parameters (forward; backward but the last block), reduce-scatter "
                f"its fp32 gradients (FSDP2 as the model probe sets it up){where}: ZeRO-3's 1.5x DDP's volume in "
                "elements (Rajbhandari et al. 2020, section 7), less the root and the last block, which FSDP2 does "
                "not gather again")
    if lay.shard in ZERO_STAGES:
        per = " on every micro-batch" if lay.shard == "zero2" else ""
        return (f"formula: {lay.shard_words} reduce-scatters the 16-bit gradients{where}{per} and all-gathers the "
                f"updated 16-bit weights after the optimizer step, in {sum(k for _, _, k in coll.after)} bucket(s) of "
                "up to 5e8 elements (DeepSpeed's defaults): DDP's volume in elements, 2 Psi (Rajbhandari et al. "
                "2020, section 7)")
    return (f"formula: fp32 gradients{where} all-reduced in {sum(k for _, _, k in coll.calls)} DDP bucket(s) "
            "(first 1 MiB, then 100 MiB: the model probe's bucket_cap_mb)")


def _within(node_bw: dict, op: str) -> Bandwidth | None:
    return node_bw.get(op) or node_bw.get("allreduce")


def _node_bandwidth(cfg, ev, coll, ops, need, gpn, missing, run_here, on_gpu) -> dict[str, Bandwidth] | None:
    """The bus bandwidth of each op within one node: measured (`comm` on this GPU model; the
    allreduce's standing in for an op not measured), else for --gpu the datasheet's (sources/target.py).
    A missing figure is said for the ops the asked layout needs (`need`)."""
    out: dict[str, Bandwidth] = {}
    if gpn <= 1:  # one GPU per node: every collective crosses nodes (_world_bandwidth)
        return out
    here, local_gpus = run_here
    sheet = target.node_rate(ev.device, gpn) if cfg.gpu else None
    for op in ops:
        bw = bandwidth_from(ev.bus, op, "node", gpn)
        if bw is None and op != "allreduce":
            stand_in = bandwidth_from(ev.bus, "allreduce", "node", gpn)
            if stand_in is not None:
                bw = replace(stand_in, source=f"{stand_in.source}, the allreduce's busbw standing in for {op}")
        if bw is None and sheet is not None and sheet[0] is not None:
            bw = Bandwidth(((1 << 20, sheet[0]),), sheet[1], gpn)
        if bw is None:
            if op in need:
                why = None
                if sheet is not None and sheet[0] is None:  # --gpu of the database, no link in it
                    why = (f"{sheet[1]}: measure `mgpu-bench comm` on one of its nodes (rccl-tests or nccl-tests logs "
                           "enter with `mgpu-bench history add`), or give --gpus-per-node 1 and --network where every "
                           "collective crosses nodes")
                elif on_gpu and here and local_gpus < 2:
                    why = (f"this machine has {local_gpus} GPU: run it on one of the cluster's {gpn}-GPU nodes, or "
                           "give --gpus-per-node 1 where the nodes have one GPU each")
                missing.append(_missing(f"{op} bus bandwidth within a node", _comm_cmd(coll, on_gpu, run_here), why))
                return None
            continue
        if bw.ranks < gpn:
            bw = replace(bw, source=f"{bw.source}, held for up to {gpn} GPUs")
        out[op] = bw
    return out


def _comm_cmd(coll, on_gpu: bool, run_here: tuple[bool, int]) -> tuple[list[str], bool]:
    """`mgpu-bench comm` for the plan's collectives: on GPUs the usual 1M-1G sweep; on CPU
    processes only the sizes around the step's own calls, 10 iterations each (gloo is slow)."""
    here, local_gpus = run_here
    args = ["comm", "--ops", ",".join(coll.ops)]
    if on_gpu:
        return args + ["--sizes", "1M-1G"] + (["--gpus", str(local_gpus)] if here and local_gpus >= 2 else []), \
            here and local_gpus >= 2
    sizes = [size for _, size, _ in coll.calls]
    lo, hi = 1 << max(18, int(min(sizes)).bit_length() - 1), 1 << max(18, (int(max(sizes)) - 1).bit_length())
    return args + ["--backend", "torch", "--nproc", "2", "--sizes", f"{_size(lo)}-{_size(hi)}", "--iters", "10",
                   "--warmup-iters", "2"], here


def _world_bandwidth(cfg, ev, ops, need, node_bw, gpn, missing) -> dict[str, Bandwidth] | None:
    """Bus bandwidth between nodes: --network (the node's ring or its NICs, the slower), else a
    multi-node comm run's world figures, else a fleet pass's world allreduce, else a rail figure
    times the rails (one NIC per GPU), capped by the node's ring (theory.hierarchy_theory). A
    missing figure is said for the ops of `need`."""
    out: dict[str, Bandwidth] = {}
    for op in ops:
        bw = None
        if cfg.network:
            port = hardware.network_rate(cfg.network)
            exit_rate = gpn * float(port.value) * PRACTICAL_RING_SHARE
            ring = node_bw[op].points if node_bw and op in node_bw else ((1, exit_rate),)
            bw = Bandwidth(tuple((size, min(b, exit_rate)) for size, b in ring),
                           f"formula: min(the node's ring, {gpn} x {cfg.network} {float(port.value) / 1e9:g} GB/s x "
                           f"{PRACTICAL_RING_SHARE:.0%}: one NIC per GPU, NCCL's ring share)", 1 << 20)
        else:
            bw = bandwidth_from(ev.bus, op, "world") or bandwidth_from(ev.bus, "allreduce", "world")
            if bw is None:
                rail = bandwidth_from(ev.bus, op, "rail") or bandwidth_from(ev.bus, "allreduce", "rail")
                if rail is not None and gpn <= 1:
                    bw = rail  # one GPU, one rail per node
                elif rail is not None and node_bw and op in node_bw:
                    ring = node_bw[op].points[-1][1]
                    pts = tuple((s, min(ring, b * gpn)) for s, b in rail.points)
                    bw = Bandwidth(pts, f"{rail.source} x {gpn} rails, capped by the node's ring", rail.ranks, rail.noise)
        if bw is None:
            if op in need:
                missing.append(_missing("bus bandwidth between nodes", None,
                                        "measure it where the nodes are: `srun --nodes 2 mgpu-bench comm --sizes 1M-1G` "
                                        "or `mgpu-bench fleet` under your launcher; or give --network NDR (hardware "
                                        "database)"))
                return None
            continue
        out[op] = bw
    return out


def _pp_bandwidth(cfg, ev, missing) -> Bandwidth | None:
    """What one GPU's sends to the next pipeline stage on another node get: a measured rail's
    (one GPU per node) sendrecv, else one port of --network at NCCL's share. `missing` None: the
    asked layout does not need it (a search may)."""
    bw = bandwidth_from(ev.bus, "sendrecv", "rail")
    if bw is None and cfg.network:
        port = float(hardware.network_rate(cfg.network).value)
        bw = Bandwidth(((1 << 20, port * PRACTICAL_RING_SHARE),),
                       f"formula: one {cfg.network} port, {port / 1e9:g} GB/s x {PRACTICAL_RING_SHARE:.0%} (one NIC per "
                       "GPU)", 2)
    if bw is None:
        if missing is not None:
            missing.append(_missing("point-to-point bandwidth between nodes (the pipeline's sends)", None,
                                    "measure it where the nodes are: `srun --nodes 2 --ntasks-per-node 1 mgpu-bench "
                                    "comm --ops sendrecv --sizes 1M-1G`; or give --network NDR (hardware database)"))
        return None
    return bw


def _size(n: int) -> str:
    from mgpu_bench.results.metrics import size_key

    return size_key(int(n))
