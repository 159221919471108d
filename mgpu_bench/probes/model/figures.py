"""What a training run measured, before any judgement: each configuration's figures (StepStats,
analyse()) and the run of every configuration (ModelRun); analyse.py judges them.

Throughput is samples (tokens) processed / the time it took, over every timed step after warm-up
(the seeds: "throughput = total processed / total time; exclude warm-up"): per rank its samples
over the sum of its steps' walls (each from its start to the next step's start, so nothing
between steps is lost), in total every rank's samples over the longest rank's time. Gross is the
whole step (data included), effective the time inside compute (forward, backward, optimizer)
alone. The stable window (stable_window) picks only the steady-state step: its median, and the
rate batch / that median beside the wall clock's (steady_gap: the share of the time the median
does not account for). Beside them: the long steps (stalls.py), MFU, the phases' shares, exposed
communication as it was measured, the straggler, the step ledger (ledger.py) and the noise scale.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import ledger
from .config import ModelConfig
from .wallclock import job_stalls, rank_totals, straggler_of, sync_figures

PHASES = ("data", "forward", "backward", "optimizer")
STABLE_TOLERANCE = 0.05
STABLE_K = 5


def stable_window(times: Sequence[float], warmup: int, tol: float = STABLE_TOLERANCE,
                  k: int = STABLE_K) -> tuple[int, int, bool]:
    """(start, end, stable) of the window the figures are taken over: after `warmup`, from the
    first step after which every rolling median of k steps stays within `tol` of the median of
    the last half. stable is False when fewer than k steps qualify (the figures then use every
    step after warm-up, and say so)."""
    n = len(times)
    xs = list(times[warmup:])
    if len(xs) < k:
        return warmup, n, False
    ref = statistics.median(xs[len(xs) // 2:])
    start = 0
    for i in range(len(xs) - k + 1):
        if abs(statistics.median(xs[i:i + k]) / ref - 1.0) > tol:
            start = i + 1
    if len(xs) - start < k:
        return warmup, n, False
    return warmup + start, n, True


def scaling_efficiency(tokens_per_s: dict[int, float]) -> dict[int, float]:
    """T_N / (N * T_1) for each GPU count N (T = total throughput, tokens/s or samples/s); needs the
    1-GPU figure."""
    base = tokens_per_s.get(1)
    if not base:
        return {}
    return {n: t / (n * base) for n, t in sorted(tokens_per_s.items())}


def throughput(d: Mapping) -> float | None:
    """A configuration's total throughput in the workload's unit: tokens/s where it has tokens,
    else samples/s (ratios of the two are the same)."""
    return d.get("tokens_per_s") or d.get("samples_per_s")


def unit(d: Mapping) -> str:
    return "tokens/s" if d.get("tokens_per_s") else "samples/s"


@dataclass
class StepStats:
    """One configuration (GPU count, data source) as measured."""

    world: int
    data: str
    ranks: list[dict]
    window: tuple[int, int, bool] = (0, 0, False)
    samples_per_step: int = 0
    tokens_per_step: int | None = 0  # None: a workload without tokens
    flops_per_token: float | None = 0.0
    error: str | None = None
    derived: dict = field(default_factory=dict)
    flops_per_sample: float | None = None
    stalls: dict | None = None  # stalls.describe of the rank whose stalls say most (None: documents before them)
    comm_method: str | None = None  # how exposed_comm_share was measured: "no_sync", "hook", "profile"
    straggler: dict | None = None  # straggler.straggler over every timed step (2+ ranks)
    noise: dict | None = None  # noise_scale.combine of the ranks' gradient norms (noise_scale on)
    ledger: dict | None = None  # ledger.build: the timed steps' wall clock by cause (None: documents before it)

    def to_dict(self) -> dict:
        out = {"world": self.world, "data": self.data, "window": list(self.window),
               "samples_per_step": self.samples_per_step, "tokens_per_step": self.tokens_per_step,
               "flops_per_token": self.flops_per_token, "error": self.error, "derived": self.derived,
               "ranks": self.ranks}
        if self.flops_per_sample is not None:  # counted FLOPs; documents before them have none
            out["flops_per_sample"] = self.flops_per_sample
        for key in ("stalls", "comm_method", "straggler", "ledger"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.noise is not None:
            out["noise_scale"] = self.noise
        return out


def analyse(cfg: ModelConfig, world: int, ranks: list[dict], peak_flops: float | None,
            flops_per_sample: float | None, tokens_per_sample: int | None) -> StepStats:
    """Per-step seconds per rank -> the wall clock's throughput (every timed step), the stable
    window's steady-state step, stalls, MFU, shares, the straggler. FLOPs per sample as counted
    (workloads.flops); tokens per sample where the workload has tokens."""
    st = StepStats(world=world, data=cfg.data, ranks=ranks)
    st.samples_per_step = cfg.batch_size * cfg.grad_accum * world
    st.tokens_per_step = st.samples_per_step * tokens_per_sample if tokens_per_sample else None
    st.flops_per_sample = flops_per_sample
    st.flops_per_token = flops_per_sample / tokens_per_sample if flops_per_sample and tokens_per_sample else None
    errors = [r["error"] for r in ranks if r.get("error")]
    if errors:
        st.error = errors[0]
    good = [r for r in ranks if (r.get("phases") or {}).get("step")]
    if not good:
        return st
    n = min(len(r["phases"]["step"]) for r in good)
    steps = [max(r["phases"]["step"][i] for r in good) for i in range(n)]
    start, end, stable = stable_window(steps, 0)
    st.window = (start, end, stable)
    win = steps[start:end]
    step_s = statistics.median(win)
    d: dict[str, Any] = {"step_s": step_s, "step_mean_s": statistics.fmean(win), "window_steps": len(win)}
    totals = [rank_totals(r, cfg.batch_size * cfg.grad_accum, tokens_per_sample) for r in good]
    elapsed = max(t["elapsed_s"] for t in totals)
    samples = sum(t["samples"] for t in totals)
    measured = max(int(t["steps"]) for t in totals)
    d["elapsed_s"], d["measured_steps"] = elapsed, measured
    d["wall_step_s"] = elapsed / measured if measured else step_s
    d["samples_per_s"] = samples / elapsed if elapsed > 0 else st.samples_per_step / step_s
    d["samples_per_s_per_gpu"] = d["samples_per_s"] / world
    d["steady_samples_per_s"] = st.samples_per_step / step_s
    compute = max(t["compute_s"] or 0.0 for t in totals)
    if compute > 0:
        d["effective_samples_per_s"] = samples / compute
    tokens = [t.get("tokens") for t in totals]
    if st.tokens_per_step and all(x is not None for x in tokens):
        total_tokens = sum(tokens)
        d["tokens_per_s"] = total_tokens / elapsed if elapsed > 0 else st.tokens_per_step / step_s
        d["tokens_per_s_per_gpu"] = d["tokens_per_s"] / world
        d["steady_tokens_per_s"] = st.tokens_per_step / step_s
        if compute > 0:
            d["effective_tokens_per_s"] = total_tokens / compute
    for r, t in zip(good, totals):  # each rank's own wall-clock rate
        if t["elapsed_s"] > 0:
            r["samples_per_s"] = t["samples"] / t["elapsed_s"]
    d["flops_per_s_per_gpu"] = d["samples_per_s_per_gpu"] * (flops_per_sample or 0.0)
    d["mfu"] = d["flops_per_s_per_gpu"] / peak_flops if peak_flops and flops_per_sample else None
    r0 = good[0]["phases"]
    for p in (*PHASES, "compute"):  # the in-job monitor times data and compute, not forward/backward/optimizer
        if p in r0:
            d[f"{p}_s"] = statistics.median(r0[p][start:end])
    d["data_share"] = d["data_s"] / step_s
    st.stalls = job_stalls(good, totals, step_s)
    d["stall_share"], d["stall_count"] = st.stalls["share"], st.stalls["count"]
    nosync = [r.get("no_sync_phases") for r in good if r.get("no_sync_phases")]
    if nosync:
        ns = [max(x["step"][i] for x in nosync) for i in range(min(len(x["step"]) for x in nosync))]
        s2, e2, _ = stable_window(ns, 0)
        d["no_sync_step_s"] = statistics.median(ns[s2:e2])
        d["exposed_comm_share"] = max(0.0, (step_s - d["no_sync_step_s"]) / step_s)
        st.comm_method = "no_sync"
    d.update(sync_figures(good, start, end, step_s, world))
    ref = ledger.reference_exposed(good)
    if d.get("exposed_comm_share") is None and ref is not None:
        d["reference_step_s"], d["reference_steps"] = ref["step_s"], ref["steps"]
        d["exposed_comm_share"] = max(0.0, (step_s - ref["step_s"]) / step_s)
        # their cost: their walls over as many steady-state steps, of the wall clock (the totals hold them)
        d["reference_cost_share"] = max(0.0, ref["wall_s"] - ref["steps"] * step_s) / elapsed if elapsed > 0 else 0.0
        st.comm_method = "reference"
    if d.get("exposed_comm_share") is None and d.get("hook_exposed_share") is not None:
        d["exposed_comm_share"] = d["hook_exposed_share"]
        st.comm_method = "hook" if d.get("sync_busy_s") is not None else "marks"
    prof = good[0].get("profile")
    if prof and prof.get("window_s"):
        w = prof["window_s"]
        d["comm_kernel_share"] = prof["nccl_s"] / w
        d["comm_exposed_kernel_share"] = prof["nccl_exposed_s"] / w
        d["gpu_idle_share"] = prof["idle_s"] / w
        d["matmul_share"] = prof["matmul_s"] / w
        d["attention_share"] = prof["attention_s"] / w
        d["other_kernel_share"] = prof["other_s"] / w
    ceilings = [r["matmul_ceiling"]["flops_per_s"] for r in good if (r.get("matmul_ceiling") or {}).get("flops_per_s")]
    if ceilings:
        d["matmul_ceiling"] = statistics.median(ceilings)
        d["of_ceiling"] = d["flops_per_s_per_gpu"] / d["matmul_ceiling"]
    mems = [r.get("peak_allocated") for r in good if r.get("peak_allocated") is not None]
    if mems:
        d["peak_allocated"] = max(mems)
        d["peak_reserved"] = max(r.get("peak_reserved") or 0 for r in good)
        d["total_memory"] = good[0].get("total_memory")
    st.derived = d
    if len(good) > 1:
        # over every timed step, as the ledger counts them: the stable window is the steady state's, and it
        # leaves out the very steps an intermittent straggler makes late (on a busy host it shrank to 5 steps)
        st.straggler = straggler_of(good, 0, n, step_s)
    st.ledger = ledger.of_run(cfg.device == "cuda", st, good, n)
    if all(r.get("noise") for r in good):
        from mgpu_bench.training import noise_scale

        st.noise = noise_scale.combine([r["noise"] for r in good], step_s)
    return st


def steady_gap(d: Mapping) -> float | None:
    """1 - the wall clock's rate / the steady-state rate (batch / median step): the share of the
    time the median step does not account for; None for documents before the wall-clock rate."""
    steady = d.get("steady_tokens_per_s") if d.get("tokens_per_s") else d.get("steady_samples_per_s")
    wall = throughput(d)
    if not steady or not wall:
        return None
    return 1.0 - wall / steady


@dataclass
class ModelRun:
    config: ModelConfig
    gpu_counts: list[int]
    data_modes: list[str]
    gpu_name: str | None
    peak: Any  # hardware.Figure or None
    stats: list[StepStats] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None
    stop_message: str | None = None
    wall_seconds: float = 0.0
    workload: dict = field(default_factory=dict)  # Workload.facts() and "flops" (measure.flop_facts)
    job: dict = field(default_factory=dict)  # the in-job monitor's own figures (straggler, ranks), for a job

    def get(self, world: int, data: str) -> StepStats | None:
        return next((s for s in self.stats if s.world == world and s.data == data), None)

    def effective(self, world: int) -> StepStats | None:
        """Synthetic data (compute only) where it ran, else the loader's."""
        for mode in ("synthetic", "loader"):
            s = self.get(world, mode)
            if s is not None and s.derived:
                return s
        return self.get(world, "synthetic") or self.get(world, "loader")

    def scaling(self) -> dict[int, float]:
        tps = {n: throughput(s.derived) for n in self.gpu_counts
               if (s := self.effective(n)) is not None and s.derived}
        return scaling_efficiency(tps)
