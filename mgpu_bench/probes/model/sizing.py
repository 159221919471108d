"""How long a `model` run takes, said before it starts, and how a run on CPU processes keeps to it.

The guess: per configuration, a start-up (the ranks' processes, their imports, the model built;
DataLoader workers where the loader runs) and every step it runs (warm-up, the timed steps, the
same steps without gradient sync for the exposed communication, the profiled ones on GPUs) at
the workload's FLOPs per step (as counted on meta, else its formula, else 6 x parameters x
tokens) over a guessed rate: 40% of the dtype's dense peak on a GPU (the 350m GPT reaches 40-45%
on one H200, ANCHORS), GUESS_CPU_FLOPS per core on CPU processes, the cores shared among the
ranks. A guess to say how long to wait, never a figure.

On CPU processes, where a machine can be ten times slower than another or than itself under load,
the defaults are sized so that the guess fits CPU_TARGET_S (fewer steps, then a smaller batch,
said), and every configuration gets a deadline at its share of the guess: after warm-up the ranks
agree on the slowest rank's warm-up step and run as many timed steps as fit before it (at least
MIN_TIMED_STEPS, said in the notes).
"""

from __future__ import annotations

import os

# A default `model` run on CPU processes (every configuration, start-up included) is sized to about
# this: a first try on a laptop or a CI machine answers in a couple of minutes.
CPU_TARGET_S = 120.0
# FLOP/s one CPU core is guessed to give a training step: the tiny GPT reached about 20 GFLOP/s per
# core on an idle 2-core VM, convolutions and small matmuls less; a low guess, so that a run keeps to it.
GUESS_CPU_FLOPS = 8e9
GUESS_GPU_SHARE = 0.40  # of the dense peak
START_GPU_S, START_CPU_S, START_WORKER_S = 15.0, 8.0, 1.5  # a configuration's start-up; each DataLoader worker's
# The estimate said before the run counts start-up as measured and modelled here now (mgpu_bench/
# startup.py): this process's own start-up so far, and per configuration on CPU processes its
# ranks' start on this host's share of the CPUs: the rank server (children.rank_start_method)
# imports torch once, SERVER_CPU_S of CPU, started before the model's FLOPs are counted and so
# beside them; a rank forked from it spends about RANK_CPU_S before its first step (the model
# built, the group formed, DDP's first broadcast), a single rank run in this process about
# IN_PROCESS_CPU_S (the model built); then END_CPU_S for the end (the analysis, the report's
# plots, the history row). Measured on the 2-core dev host (torch 2.14, 2026-12-07): 2 forked
# ranks of the tiny GPT 15.8 s of CPU in all, the whole command 10.8 s (spawned ranks importing
# torch each: 24.7 s of CPU, 17 s).
RANK_CPU_S, SERVER_CPU_S, IN_PROCESS_CPU_S, END_CPU_S = 1.5, 5.5, 1.0, 3.0
# Where the workload has a FLOPs formula (the built-in GPT), this process says the estimate before it
# imports torch (PROCESS_CPU_S after the line: the launcher, or the rank run here) and rank 0 counts
# the FLOPs on meta before its first step: COUNT_CPU_S in a rank forked from the server (torch._dynamo,
# which the meta device's reference ops import, preloaded there; the tiny GPT 0.2 s, the 350m 1.5 s),
# COUNT_IN_PROCESS_CPU_S where the single rank runs in this process and imports torch._dynamo itself
# (1.9 s of it; same host, 2026-12-07).
COUNT_CPU_S, COUNT_IN_PROCESS_CPU_S = 0.5, 2.5
# The stable window needs 5 steps (STABLE_K): a run cut to keep its deadline keeps at least these.
MIN_TIMED_STEPS = 5
DEFAULT_STEPS, DEFAULT_WARMUP = 30, 5


def flops_per_sample(facts: dict | None, count) -> float | None:
    """FLOPs of one sample's forward and backward: as counted on meta, else the workload's formula,
    else 6 x parameters x tokens per sample (Kaplan et al. 2020's 6N per token)."""
    if count is not None and getattr(count, "per_sample", None):
        return float(count.per_sample)
    facts = facts or {}
    if facts.get("formula_per_sample"):
        return float(facts["formula_per_sample"])
    if facts.get("params"):
        return 6.0 * facts["params"] * (facts.get("tokens_per_sample") or 1)
    return None


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def rate(on_gpu: bool, peak, ranks: int) -> float:
    """FLOP/s one rank is guessed to reach."""
    if on_gpu:
        return GUESS_GPU_SHARE * (peak.value if peak is not None else 989e12)
    return GUESS_CPU_FLOPS * max(1, cores() // max(1, ranks)) / max(1.0, ranks / cores())


def seconds(cfg, counts, modes, per_sample: float | None, peak) -> list[float]:
    """The guessed seconds of each configuration (GPU count x data mode), in run order; None
    FLOPs: start-up only."""
    return [start + work for start, work in parts(cfg, counts, modes, per_sample, peak)]


def parts(cfg, counts, modes, per_sample: float | None, peak) -> list[tuple[float, float]]:
    """(start-up as guessed, steps) seconds of each configuration, in run order (seconds())."""
    on_gpu = cfg.device == "cuda"
    out = []
    for n in counts:
        step = (per_sample or 0.0) * cfg.batch_size * cfg.grad_accum / rate(on_gpu, peak, n)
        steps = cfg.warmup_steps + cfg.steps * (2 if n > 1 and cfg.exposed_comm else 1) + (3 if on_gpu and cfg.profile
                                                                                         else 0)
        for mode in modes:
            start = START_GPU_S if on_gpu else START_CPU_S
            if mode == "loader":
                start += START_WORKER_S * cfg.num_workers * (n if not on_gpu else 1)
                step = max(step, cfg.preprocess_ms / 1e3 * cfg.batch_size / max(1, cfg.num_workers))
            out.append((start, steps * step))
    return out


def whole(cfg, counts, modes, per_sample: float | None, peak, budgets=(),
          ranks_count: bool = False) -> tuple[float, float, float]:
    """(total, spent, start-up) seconds of the whole command as said before it runs: what this
    process has spent so far (startup.spent_s()) and will spend importing torch where it has not
    yet, every configuration's start-up on this host now (its ranks' processes on CPU, modelled by
    startup.process_s(); START_GPU_S on GPUs), rank 0's FLOP count where `ranks_count`, and its
    steps (the share the configuration keeps to on CPU processes: `budgets` less its guessed
    start-up), and the end (END_CPU_S on this host's share of a CPU)."""
    import sys

    from mgpu_bench.core import startup

    on_gpu = cfg.device == "cuda"
    spent = startup.spent_s()
    guessed = parts(cfg, counts, modes, per_sample, peak)
    budgets = list(budgets) or [start + work for start, work in guessed]
    starts = work = 0.0
    if not on_gpu:
        if "torch" not in sys.modules:  # this process imports it after the line (the launcher, a rank run here)
            starts += startup.process_s(1, startup.PROCESS_CPU_S)
        if ranks_count:
            starts += startup.process_s(1, COUNT_CPU_S if counts[0] > 1 else COUNT_IN_PROCESS_CPU_S)
    if not on_gpu and max(counts) > 1:  # the rank server's import, once: what is left of it
        from mgpu_bench.core import children

        starts += max(0.0, startup.process_s(1, SERVER_CPU_S) - children.rank_server_age())
    i = 0
    for n in counts:
        for mode in modes:
            start, _ = guessed[i]
            work += max(0.0, budgets[i] - start)
            if on_gpu:
                starts += start
            else:
                loader = START_WORKER_S * cfg.num_workers * n if mode == "loader" else 0.0
                starts += startup.process_s(n, RANK_CPU_S if n > 1 else IN_PROCESS_CPU_S) + loader
            i += 1
    end = startup.process_s(1, END_CPU_S)
    return spent + starts + work + end, spent, spent + starts + end


def size_for_cpu(cfg, counts, modes, per_sample: float | None, given: dict) -> tuple[object, str | None]:
    """cfg with the options the user did not give (given: option -> bool) made smaller until the
    guess fits CPU_TARGET_S: --steps 30 -> 20 -> 10, --warmup-steps 5 -> 2, then the batch halved
    down to 1. (the config, the line that says what was chosen, or None when nothing changed)."""
    from dataclasses import replace

    if per_sample is None:
        return cfg, None
    start = cfg
    tries = []
    if not given.get("steps"):
        tries += [{"steps": 20}, {"steps": 10}]
    if not given.get("warmup_steps"):
        tries += [{"warmup_steps": 2}]
    if not given.get("batch_size"):
        b = cfg.batch_size
        while b > 1:
            b = max(1, b // 2)
            tries.append({"batch_size": b})
    for change in tries:
        if sum(seconds(cfg, counts, modes, per_sample, None)) <= CPU_TARGET_S:
            break
        cfg = replace(cfg, **change)
    if cfg == start:
        return cfg, None
    parts = [f"--{k.replace('_', '-')} {getattr(cfg, k)}" for k in ("steps", "warmup_steps", "batch_size")
             if getattr(cfg, k) != getattr(start, k)]
    return cfg, (f"defaults sized for CPU processes ({', '.join(parts)}) so that the run takes about "
                 f"{CPU_TARGET_S / 60:.0f} min or less at the guessed rate; give them to choose")


def timed_steps(steps: int, passes: int, step_s: float, remaining_s: float) -> int:
    """How many timed steps of `step_s` fit `passes` times into `remaining_s` (at least
    MIN_TIMED_STEPS, at most `steps`)."""
    if step_s <= 0:
        return steps
    return max(min(steps, MIN_TIMED_STEPS), min(steps, int(remaining_s / (passes * step_s))))


def text(total: float, configs: int, cfg, on_gpu: bool, peak, ranks: int, spent: float = 0.0,
         start: float = 0.0) -> str:
    """'about 55 s for 1 configuration(s) of 5 + 30 steps, start-up included (26 s of it: 9 s before
    this line, the ranks' processes on this host now, the end) (a guess at ...)'."""
    from mgpu_bench.core.startup import seconds_text

    r = rate(on_gpu, peak, ranks)
    return (f"{seconds_text(total)} for {configs} configuration(s) of {cfg.warmup_steps} + {cfg.steps} steps, start-up "
            f"included ({start:.0f} s of it: {spent:.0f} s before this line, the "
            f"{'GPUs' if on_gpu else 'ranks'}' processes on this host now, the end) (a guess at "
            f"{r / 1e12:.3g} TFLOP/s per {'GPU' if on_gpu else 'process'}"
            + ("" if on_gpu else "; on CPU processes each configuration keeps to its share of the steps' time") + ")")
