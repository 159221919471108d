"""model on the terminal: one row per configuration: throughput by the wall clock over every timed
step, the steady-state (median) step of the stable window beside it."""

from __future__ import annotations

from .figures import ModelRun


def render_terminal(run: ModelRun, console) -> None:
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    unit = "GPU" if run.config.device == "cuda" else "proc"
    tokens = any(s.derived.get("tokens_per_s") for s in run.stats)
    size = size_text(run.config)
    t = Table(title=f"{run.config.model} training steps ({run.config.parallel}{', ' + size if size else ''}, batch "
                    f"{run.config.batch_size} x {run.config.grad_accum} per {unit}); throughput: samples / the wall "
                    "clock over every timed step; step and phases: medians over the stable window",
              title_justify="left", pad_edge=False, box=None, header_style="bold")
    rate = ("tok/s\ntotal", f"tok/s\nper {unit}") if tokens else ("samples/s\ntotal", f"samples/s\nper {unit}")
    for name in (f"{unit}s", "data", "steady\nstep ms", *rate, "TFLOP/s\nper GPU",
                 "MFU\n%", "data\n%", "fwd\nms", "bwd\nms", "opt\nms", "exposed\ncomm %", "peak mem\nGiB"):
        t.add_column(name, justify="left" if name == "data" else "right")
    per = ("tokens_per_s", "tokens_per_s_per_gpu") if tokens else ("samples_per_s", "samples_per_s_per_gpu")
    for s in run.stats:
        d = s.derived
        if not d:  # the error goes below the table: a long text in a column would wrap letter by letter
            t.add_row(str(s.world), s.data, "failed", *[""] * 10)
            continue

        def f(key, scale=1.0, fmt=".1f", d=d):
            v = d.get(key)
            return "-" if v is None else format(v * scale, fmt)

        t.add_row(str(s.world), "synth" if s.data == "synthetic" else s.data, f("step_s", 1e3), f(per[0], 1, ".0f"),
                  f(per[1], 1, ".0f"), tflops(d.get("flops_per_s_per_gpu")), f("mfu", 100),
                  f("data_share", 100), f("forward_s", 1e3), f("backward_s", 1e3), f("optimizer_s", 1e3),
                  f("exposed_comm_share", 100), f("peak_reserved", 2**-30, ".2f"))
    print_table(console, t)
    if flops_text(run):
        console.print(f"  {flops_text(run)}", highlight=False, soft_wrap=True)
    for s in run.stats:
        if s.error:
            console.print(f"  {s.world} {unit}(s), {s.data}: failed: {s.error}", highlight=False, soft_wrap=True)
        if s.derived:
            console.print(f"  {s.world} {unit}(s), {s.data}: {wall_text(s)}; window steps {s.window[0]}-{s.window[1] - 1} "
                          f"of {len(s.ranks[0].get('phases', {}).get('step', []))} after {run.config.warmup_steps} "
                          f"warm-up{'' if s.window[2] else ' (not stable)'}; {_per_step(s)}"
                          + _profile_text(s.derived) + _compile_text(s.ranks),
                          highlight=False, soft_wrap=True)


def wall_text(s) -> str:
    """The wall clock's throughput and the steady-state rate beside it, in words."""
    d = s.derived
    if d.get("elapsed_s") is None:  # documents before the wall-clock rate: the median step's
        return "throughput = batch / the median step"
    u, wall = ("tok/s", d.get("tokens_per_s")) if d.get("tokens_per_s") else ("samples/s", d.get("samples_per_s"))
    steady = d.get("steady_tokens_per_s") if d.get("tokens_per_s") else d.get("steady_samples_per_s")
    text = (f"{wall:,.0f} {u} by the wall clock ({d['measured_steps']} steps in {d['elapsed_s']:.2f} s, "
            f"{1e3 * d['wall_step_s']:.1f} ms a step); steady-state {steady:,.0f} {u} (the median step "
            f"{1e3 * d['step_s']:.1f} ms)")
    eff = d.get("effective_tokens_per_s") if d.get("tokens_per_s") else d.get("effective_samples_per_s")
    if eff:
        text += f"; effective {eff:,.0f} {u} (the time inside compute: forward, backward, optimizer)"
    return text


def tflops(flops_per_s: float | None) -> str:
    """FLOP/s as TFLOP/s, one way in every medium (terminal, Markdown, HTML): one decimal from 10
    TFLOP/s up, else three significant digits, so that a CPU process's 0.03 never reads 0.0."""
    if flops_per_s is None:
        return "-"
    t = flops_per_s / 1e12
    return f"{t:.1f}" if abs(t) >= 10 else f"{t:.3g}"


def size_text(cfg) -> str:
    """The sample's size as the config has it: "seq 2048", "224 px" or "" (a module's own)."""
    return f"{cfg.image_size} px" if cfg.image_size else (f"seq {cfg.seq_len}" if cfg.seq_len else "")


def _per_step(s) -> str:
    """Samples (and tokens) per step and the FLOPs each costs."""
    text = f"{s.samples_per_step} samples" + (f", {s.tokens_per_step} tokens" if s.tokens_per_step else "") + " per step"
    if s.flops_per_sample:
        text += f"; {s.flops_per_sample / 1e9:.3f} GFLOP per sample"
        if s.flops_per_token:
            text += f" ({s.flops_per_token / 1e9:.4f} per token)"
    elif s.flops_per_token:  # documents before FLOPs were counted
        text += f"; {s.flops_per_token / 1e9:.3f} GFLOP per token (6N + 12 L d T)"
    return text


def flops_text(run: ModelRun) -> str | None:
    """How the FLOPs were counted, and the formula beside the count where the workload has one."""
    w = run.workload or {}
    counted = w.get("flops") or {}
    if not counted.get("per_sample"):
        return None
    text = (f"FLOPs: {counted['per_sample'] / 1e9:.3f} GFLOP per sample counted by FlopCounterMode over one forward "
            f"and backward (batch {counted['batch_size']}, on {counted['device']}; {counted.get('dense_ops', 0)} "
            "distinct matmuls and convolutions)")
    if w.get("formula_per_sample"):
        apart = counted["per_sample"] / w["formula_per_sample"] - 1
        text += (f"; {w['formula']}: {w['formula_per_sample'] / 1e9:.3f} GFLOP per sample, the count "
                 f"{100 * apart:+.1f}% from it")
    return text


def _compile_text(ranks: list[dict]) -> str:
    """torch.compile's time (the first warm-up step's wall, the slowest rank's), not in any figure."""
    took = [r["compile_s"] for r in ranks if isinstance(r.get("compile_s"), (int, float))]
    return f"; torch.compile took {max(took):.1f} s (the first step, not timed)" if took else ""


def _profile_text(d: dict) -> str:
    """The profiled split of the step and the matmul ceiling, where measured."""
    text = ""
    if d.get("gpu_idle_share") is not None:
        text += (f"; profiler: GPU busy {100 * (1 - d['gpu_idle_share']):.0f}% (matmuls "
                 f"{100 * d['matmul_share']:.0f}%, attention {100 * d['attention_share']:.0f}%, other "
                 f"{100 * d['other_kernel_share']:.0f}%), NCCL kernels {100 * d['comm_kernel_share']:.1f}% of the step "
                 f"({100 * d['comm_exposed_kernel_share']:.1f}% with nothing beside them)")
    elif d.get("comm_kernel_share") is not None:  # documents before the interval split
        text += f"; profiler: NCCL kernels {100 * d['comm_kernel_share']:.1f}% of the step"
    if d.get("matmul_ceiling"):
        text += (f"; matmul ceiling {d['matmul_ceiling'] / 1e12:.0f} TFLOP/s on the model's shapes, the step at "
                 f"{100 * d['of_ceiling']:.0f}% of it")
    return text
