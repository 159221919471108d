"""A plan from the evidence: the fit, the step per GPU count, days or GPUs, and what is missing,
every figure with its source (a run id, or "formula: ..."). Plain data out: the document's payload."""

from __future__ import annotations

import shlex
from dataclasses import asdict, replace

from mgpu_bench import hardware
from mgpu_bench.theory import PRACTICAL_RING_SHARE

from .config import MAX_GPUS, PlanConfig
from .evidence import CPU, Evidence
from .memory import STATE_BYTES, Memory, activations
from .project import Bandwidth, Projection, bandwidth_from, collectives, compute_time, counts, curve_counts
from .workload import Facts

SECONDS_PER_DAY = 86400.0
DEFAULT_GPUS_PER_NODE = 8  # an HGX/DGX node; said as a default where the history does not tell


def figure(name: str, value, unit: str, source: str) -> dict:
    return {"name": name, "value": value, "unit": unit, "source": source}


def plan(cfg: PlanConfig, facts: Facts, ev: Evidence, local_gpus: int, here: bool) -> dict:
    """The payload of the plan document (see document.py). `here`: this machine has the plan's
    device (--measure can run the missing commands), with `local_gpus` of them (0: CPU processes)."""
    on_gpu = ev.device != CPU
    figures: list[dict] = []
    missing: list[dict] = []
    notes: list[str] = []
    figures.append(figure("parameters", facts.params, "params", facts.params_source))
    if facts.flops_per_sample:
        figures.append(figure("FLOPs per sample (fwd + bwd)", facts.flops_per_sample, "FLOP", facts.flops_source))

    run_here = (here, local_gpus)
    gpn, gpn_source = _gpus_per_node(cfg, ev, local_gpus)
    figures.append(figure("GPUs per node", gpn, "GPUs" if on_gpu else "processes", gpn_source))
    batch, batch_source = _batch(cfg, ev, facts)
    figures.append(figure("batch per GPU", batch, "samples", batch_source))

    # -- fit
    param_bytes = 2 if on_gpu else 4
    acts = activations(facts, ev.memory, STATE_BYTES * facts.params)
    capacity, cap_source = _capacity(ev)
    ratio, ratio_source = _reserved_ratio(ev)
    mem = Memory(facts, acts, capacity, ratio, param_bytes)
    figures.append(figure("model states per GPU (DDP)", STATE_BYTES * facts.params, "B",
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
    coll = collectives(facts, cfg.parallel, param_bytes)
    figures.append(figure("gradient traffic per step", coll.total_bytes(), "B",
                          _traffic_source(cfg.parallel, coll)))
    compute = compute_time(ev, facts, batch)
    if compute is None:
        missing.append(_missing(f"the step time of {facts.key} at batch {batch}",
                                _model_cmd(cfg, facts, ev, batch, run_here)))
    else:
        figures.append(figure(f"step on 1 GPU at batch {batch}", compute.seconds, "s", compute.source))
    node_bw = _node_bandwidth(ev, coll, gpn, figures, missing, run_here, on_gpu)
    world_bw = _world_bandwidth(cfg, ev, coll.ops, node_bw, gpn, figures, missing)

    curve, answer, projection = [], None, None
    if compute is not None:
        projection = Projection(ev, facts, cfg.parallel, batch, compute, coll, node_bw or {}, world_bw, gpn)
        f, _, source = projection.overlap()
        if gpn > 1 and not any(p.world > 1 and p.parallel == cfg.parallel and p.exposed_s is not None
                               for p in ev.steps):
            missing.append(_missing("the overlap of the gradient collective with the backward pass",
                                    _model_cmd(cfg, facts, ev, batch, run_here, scaling=True)))
        figures.append(figure("collective hidden by backward", f, "fraction", source))
        answer = _answer(cfg, facts, projection, mem, batch, gpn)
        top = max(cfg.gpus or 0, (answer or {}).get("gpus_high") or (answer or {}).get("gpus") or 0, 8 * gpn, 8)
        top = min(MAX_GPUS, top)
        asked = {(answer or {}).get(k) for k in ("gpus", "gpus_low", "gpus_high")} | {cfg.gpus}
        ns = sorted({*curve_counts(gpn, top), *(n for n in asked if n)})
        curve = [_point(projection.estimate(n), facts, batch, cfg, compute.seconds) for n in ns]
        curve = [c for c in curve if c is not None]
    elif cfg.gpus or cfg.days:
        answer = {"question": "gpus" if cfg.gpus else "days", "gpus": cfg.gpus, "days": cfg.days if cfg.days else None,
                  "text": f"no estimate: the step time of {facts.key} is missing (see below)"}
    measured = [_point(projection.estimate(p.world), facts, batch, cfg, compute.seconds)
                for p in projection.measured.values()] if projection else []

    fit = {"bytes_per_param": STATE_BYTES, "param_bytes_gathered": param_bytes,
           "ddp": mem.fit("ddp", 1, batch).to_dict(),
           "fewest_gpus_ddp": mem.fewest_gpus("ddp", batch), "fewest_gpus_fsdp": mem.fewest_gpus("fsdp", batch),
           "largest_batch_ddp": mem.largest_batch("ddp", 1)}
    n_fsdp = (answer or {}).get("gpus") or cfg.gpus or fit["fewest_gpus_fsdp"] or gpn
    fit["fsdp"] = mem.fit("fsdp", n_fsdp, batch).to_dict()
    fit["largest_batch_fsdp"] = mem.largest_batch("fsdp", n_fsdp)
    fit["max_batch_measured"] = [{"max_batch": b, "run": r} for b, r in ev.max_batch[:3]]
    if cfg.parallel == "ddp" and fit["ddp"]["fits"] is False:
        notes.append(f"{facts.key} does not fit one {ev.device} at batch {batch} with DDP (every GPU holds the whole "
                     "model): --parallel fsdp shards it, or a smaller --batch-size")
    if facts.tokens_per_sample and curve:
        notes.append(f"the global batch grows with the GPUs ({batch} x N samples of {facts.tokens_per_sample} tokens): "
                     "the budget is the same, the optimizer's batch is not")
    return {
        "workload": facts.to_dict(), "budget": {"value": cfg.budget, "unit": cfg.budget_unit},
        "device": {"name": ev.device, "source": ev.device_source, "gpus_per_node": gpn, "memory": capacity},
        "batch": batch, "figures": figures, "fit": fit, "curve": curve, "measured_points": measured,
        "answer": answer, "missing": missing, "notes": notes,
    }


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
    args += ["--batch-size", str(batch), "--parallel", cfg.parallel]
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
    if local_gpus:
        return local_gpus, "this machine's GPUs"
    if ev.device == CPU:
        widest = max((p.ranks for p in ev.bus if p.scope == "node"), default=2)
        return widest, "CPU processes: the widest comm run on this host"
    return DEFAULT_GPUS_PER_NODE, "default (an 8-GPU node): give --gpus-per-node"


def _batch(cfg: PlanConfig, ev: Evidence, facts: Facts) -> tuple[int, str]:
    if cfg.batch_size:
        return cfg.batch_size, "--batch-size"
    one = ev.one_gpu()
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
    gpu = hardware.find_gpu(ev.device)
    if gpu is not None and gpu.memory.value:
        return float(gpu.memory.value), f"hardware database: {gpu.name} ({gpu.memory.source})"
    return None, "missing: not in the hardware database"


def _reserved_ratio(ev: Evidence) -> tuple[float, str]:
    pts = [p for p in ev.steps if p.world == 1 and p.peak_allocated and p.peak_reserved]
    if not pts:
        return 1.0, "no reserved figure stored: allocated bytes are what must fit"
    p = max(pts, key=lambda p: p.batch)
    return max(1.0, p.peak_reserved / p.peak_allocated), f"{p.run} at batch {p.batch} (the caching allocator's overhead)"


def _traffic_source(parallel: str, coll) -> str:
    if parallel == "fsdp":
        return "formula: all-gather each unit's parameters (forward; backward but the last block), reduce-scatter " \
               "its fp32 gradients (FSDP2 as the model probe sets it up)"
    return (f"formula: fp32 gradients all-reduced in {sum(k for _, _, k in coll.calls)} DDP bucket(s) "
            "(first 1 MiB, then 100 MiB: the model probe's bucket_cap_mb)")


def _node_bandwidth(ev, coll, gpn, figures, missing, run_here, on_gpu) -> dict[str, Bandwidth] | None:
    out: dict[str, Bandwidth] = {}
    if gpn <= 1:  # one GPU per node: every collective crosses nodes (_world_bandwidth)
        return out
    here, local_gpus = run_here
    for op in coll.ops:
        bw = bandwidth_from(ev.bus, op, "node", gpn)
        if bw is None and op != "allreduce":
            stand_in = bandwidth_from(ev.bus, "allreduce", "node", gpn)
            if stand_in is not None:
                bw = replace(stand_in, source=f"{stand_in.source}, the allreduce's busbw standing in for {op}")
        if bw is None:
            why = None
            if on_gpu and here and local_gpus < 2:
                why = (f"this machine has {local_gpus} GPU: run it on one of the cluster's {gpn}-GPU nodes, or give "
                       "--gpus-per-node 1 where the nodes have one GPU each")
            missing.append(_missing(f"{op} bus bandwidth within a node", _comm_cmd(coll, on_gpu, run_here), why))
            return None
        if bw.ranks < gpn:
            bw = replace(bw, source=f"{bw.source}, held for up to {gpn} GPUs")
        out[op] = bw
        figures.append(figure(f"{op} busbw, one node", bw.points[-1][1], "B/s",
                              f"{bw.source}, at {_size(bw.points[-1][0])}"))
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


def _world_bandwidth(cfg, ev, ops, node_bw, gpn, figures, missing) -> dict[str, Bandwidth] | None:
    """Bus bandwidth between nodes: --network (the node's ring or its NICs, the slower), else a
    multi-node comm run's world figures, else a fleet pass's world allreduce, else a rail figure
    times the rails (one NIC per GPU), capped by the node's ring (theory.hierarchy_theory)."""
    out: dict[str, Bandwidth] = {}
    for op in ops:
        bw = None
        if cfg.network:
            port = hardware.network_rate(cfg.network)
            exit_rate = gpn * float(port.value) * PRACTICAL_RING_SHARE
            ring = node_bw[op].points if node_bw else ((1, exit_rate),)
            bw = Bandwidth(tuple((size, min(b, exit_rate)) for size, b in ring),
                           f"formula: min(the node's ring, {gpn} x {cfg.network} {float(port.value) / 1e9:g} GB/s x "
                           f"{PRACTICAL_RING_SHARE:.0%}: one NIC per GPU, NCCL's ring share)", 1 << 20)
        else:
            bw = bandwidth_from(ev.bus, op, "world") or bandwidth_from(ev.bus, "allreduce", "world")
            if bw is None:
                rail = bandwidth_from(ev.bus, op, "rail") or bandwidth_from(ev.bus, "allreduce", "rail")
                if rail is not None and gpn <= 1:
                    bw = rail  # one GPU, one rail per node
                elif rail is not None and node_bw:
                    ring = node_bw[op].points[-1][1]
                    pts = tuple((s, min(ring, b * gpn)) for s, b in rail.points)
                    bw = Bandwidth(pts, f"{rail.source} x {gpn} rails, capped by the node's ring", rail.ranks, rail.noise)
        if bw is None:
            missing.append(_missing("bus bandwidth between nodes", None,
                                    "measure it where the nodes are: `srun --nodes 2 mgpu-bench comm --sizes 1M-1G` "
                                    "or `mgpu-bench fleet` under your launcher; or give --network NDR (hardware "
                                    "database)"))
            return None
        out[op] = bw
        figures.append(figure(f"{op} busbw, across nodes", bw.points[-1][1], "B/s", bw.source))
    return out


def _size(n: int) -> str:
    from mgpu_bench.metrics import size_key

    return size_key(int(n))


def _point(e, facts: Facts, batch: int, cfg: PlanConfig, one_gpu_s: float) -> dict | None:
    if e is None:
        return None
    per_step = batch * (facts.tokens_per_sample or 1)  # the rate's unit: tokens where the workload has them
    budget_per_step = batch * (facts.tokens_per_sample or 1) if cfg.tokens is not None else batch
    days = [cfg.budget / (e.gpus * budget_per_step) * s / SECONDS_PER_DAY if cfg.budget else None
            for s in (e.step_s, e.low_s, e.high_s)]
    d = asdict(e)
    d.update(rate_per_gpu=per_step / e.step_s, efficiency=one_gpu_s / e.step_s, days=days[0], days_low=days[1],
             days_high=days[2])
    return d


def _answer(cfg: PlanConfig, facts: Facts, proj: Projection, mem: Memory, batch: int, gpn: int) -> dict | None:
    """--gpus N: the days at N; --days D: the fewest GPUs (central, and the range's two ends)."""
    per_step = batch * (facts.tokens_per_sample or 1) if cfg.tokens is not None else batch
    if not cfg.budget:
        return {"question": "gpus", "gpus": cfg.gpus, "days": None,
                "text": "no --tokens or --samples: the step and throughput per GPU count only"}

    def days(e, attr: str) -> float:
        return cfg.budget / (e.gpus * per_step) * getattr(e, attr) / SECONDS_PER_DAY

    if cfg.gpus:
        e = proj.estimate(cfg.gpus)
        if e is None:
            return {"question": "gpus", "gpus": cfg.gpus, "days": None,
                    "text": f"{cfg.gpus} GPUs: no estimate (a figure is missing: see below)"}
        return {"question": "gpus", "gpus": cfg.gpus, "days": days(e, "step_s"), "days_low": days(e, "low_s"),
                "days_high": days(e, "high_s"), "measured": e.measured}
    if not cfg.days:
        return None
    least = 1
    if cfg.parallel == "fsdp":
        least = mem.fewest_gpus("fsdp", batch) or 1
    elif mem.fit("ddp", 1, batch).fits is False:
        return {"question": "days", "days": cfg.days, "gpus": None,
                "text": "DDP does not hold the model at this batch: see the fit"}
    found: dict[str, int | None] = {"step_s": None, "low_s": None, "high_s": None}
    for n in counts(gpn, MAX_GPUS):
        if n < least:
            continue
        e = proj.estimate(n)
        if e is None:
            break
        for attr, seen in found.items():
            if seen is None and days(e, attr) <= cfg.days:
                found[attr] = n
        if found["high_s"] is not None:
            break
    return {"question": "days", "days": cfg.days, "gpus": found["step_s"], "gpus_low": found["low_s"],
            "gpus_high": found["high_s"]}
