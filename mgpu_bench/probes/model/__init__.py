"""`mgpu-bench model`: full training steps of a workload (the built-in GPT, torchvision,
transformers or the user's module: mgpu_bench.workloads) under DDP or FSDP2 on 1..N GPUs:
samples/s and tokens/s gross and effective, MFU, the step's phases, exposed communication,
scaling, verdict.

    config.py      the training configuration and the plan (plain data)
    sizing.py      the estimate said before the run, CPU defaults sized to it, the deadline kept
    measure.py     the ranks (torch's elastic launcher, or a launcher's job), the training loop
    figures.py     each configuration's figures: the stable window, throughput, MFU, shares (no judgement)
    analyse.py     the verdict, the findings, scaling against the healthy figure, the key figure
    ledger.py      the step ledger: every second of the timed steps under one cause
    kernels.py     where profiled GPU time went, from the kernels' intervals (compute, NCCL, idle)
    wallclock.py   the ranks' totals over every timed step, the all-reduce's figures, the straggler
    stalls.py      long steps: found, placed (outside compute, the GPU idle or busy), described
    straggler.py   the rank the others wait for (shared with the in-job monitor)
    render.py      terminal table
    report.py      plots, HTML page, Markdown, the suite section
    document.py    the result document, written and read back
    shape.py       its declared shape, checked on every read (no backend imported)
    headline.py    the metrics history compares
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import GPUS_HELP, PlanContext, Probe, Step, Verdict, option, within

SUITE_MODEL = "350m"  # rounds 1 and 3 on GPUs (ANCHORS: 40% MFU on one H200)

HELP = """Full training steps of a workload: throughput, MFU, where the step time goes.

\b
--model takes the built-in GPT sizes (tiny, 125m, 350m, 760m, 1.3b), torchvision:NAME
(resnet50, vit_b_16, ...: weights=None, --image-size images, channels-last, SGD with momentum),
hf:NAME (bert-base, bert-large, gpt2, llama-1b: published dimensions, random weights) or
hf:path/config.json, and your own module:function or path/file.py:function (README: "Your
model"). torchvision and transformers: the [models] extra, torchvision the release of your
torch (0.N for torch 2.(N-15): pip install "torchvision==0.29.*" beside torch 2.14).

\b
One process per GPU (gloo processes on a machine without GPUs, --nproc of them), started
through torch's elastic launcher, or joined when torchrun/srun started this command. Each
configuration runs --warmup-steps untimed steps, then --steps timed ones with CUDA events at
the phase boundaries (data, forward, backward, optimizer), read back at the end. The figures
come from the stable window: after warm-up, from the first step after which every rolling
median of 5 steps stays within 5% of the median of the last half (its length is printed).
samples/s = batch x grad-accum x GPUs / median step time; tokens/s = samples/s x tokens per
sample, where the workload has tokens. FLOPs per sample are counted by torch's FlopCounterMode
over one forward and backward on the meta device (on the GPU where the model does not run on
meta); for the GPT the formula 6N + 12 L d T is shown beside the count. MFU = samples/s per GPU
x FLOPs per sample / the bf16 dense peak of the GPU (hardware database, or --peak-tflops).
Exposed communication (2+ GPUs) = 1 - step time without gradient sync (DDP's no_sync(), FSDP2's
set_requires_gradient_sync(False)) / step time; healthy is under 10%. --data both runs
synthetic (effective) and a real DataLoader (gross) and names the gap as input-pipeline loss.
--scaling 1,2 repeats the run at each GPU count with the same per-GPU batch: efficiency = T_N /
(N x T_1). FSDP is FSDP2 per block with bf16 parameters and fp32 gradient reduction, the next
block's all-gather prefetched.

\b
On GPUs the verdict is read from a profile of 3 steps (kernel intervals: matmuls, attention,
other kernels, NCCL with nothing beside it, GPU idle) and from the model's own matmul shapes
(its matmuls and convolutions, as counted) timed alone: the ceiling they could reach on this
GPU: communication-, input-, memory-, launch- (GPU idle over 10%) or compute-bound (GPU busy),
or an unexplained gap below that ceiling.
"""


class ModelProbe(Probe):
    name = "model"
    cpu = True
    summary = "training steps: tokens/s, MFU, exposed communication, verdict"
    help = HELP
    payload = "runs"
    outputs = ("json", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the result document.",
        "report": "Write PNGs (step time, phases, scaling), report.html and summary.md.",
        "progress": "Per-step progress on stderr; in a log or pipe a line every 10 s [default: on].",
    }
    progress = "lines"

    def options(self) -> list:
        import click

        return [
            option("--model", "model_name", default=None,
                   help="tiny, 125m, 350m, 760m, 1.3b, torchvision:NAME, hf:NAME, hf:path/config.json, "
                        "module:function [default: 350m on GPUs, tiny on CPU]."),
            option("--seq-len", default=None, type=int,
                   help="Tokens per sample [default: 2048 on GPUs, 128 on CPU, at most the model's positions (tiny: 256)]."),
            option("--image-size", default=None, type=int,
                   help="Pixels per side, torchvision models [default: 224 on GPUs, 64 on CPU]."),
            option("--batch-size", default=None, type=int,
                   help="Samples per GPU per micro-batch [default: 8 on GPUs, 4 on CPU; torchvision 128 and 4; "
                        "a module's fixed DataLoader: its own]."),
            option("--grad-accum", default=1, show_default=True, type=int, help="Micro-batches per optimizer step."),
            option("--steps", default=None, type=int,
                   help="Timed steps per configuration [default: 30; on CPU processes fewer where the run would "
                        "take over 2 min at the guessed rate, and each configuration keeps to its share of the "
                        "estimate]."),
            option("--warmup-steps", default=None, type=int, help="Untimed steps first [default: 5; on CPU "
                                                                   "processes 2 where the run is sized down]."),
            option("--parallel", default="ddp", show_default=True, type=click.Choice(["ddp", "fsdp"])),
            option("--data", "data_mode", default="synthetic", show_default=True,
                   type=click.Choice(["synthetic", "loader", "both"]),
                   help="synthetic: batches made on the device (effective); loader: a DataLoader (gross): a token "
                        "file, images decoded and normalised per sample, or the module's own."),
            option("--num-workers", default=2, show_default=True, type=int, help="DataLoader workers per GPU."),
            option("--preprocess-ms", default=0.0, show_default=True, type=float,
                   help="Simulated preprocessing cost per sample in the DataLoader."),
            option("--data-dir", default=None, type=click.Path(file_okay=False),
                   help="Where the token file is written [default: /tmp]."),
            option("--checkpointing", is_flag=True, help="Activation checkpointing per repeated block."),
            option("--compile", "compile_model", is_flag=True,
                   help="torch.compile the model (after DDP/FSDP wrapping, as training scripts do); the compile "
                        "time, the first warm-up step's wall, is reported apart and never timed. Needs at least 2 "
                        "warm-up steps."),
            option("--scaling", "scaling_text", default=None, help="GPU counts to run, e.g. 1,2 (same per-GPU batch)."),
            option("--gpus", default=None, help=GPUS_HELP),
            option("--nproc", default=2, show_default=True, type=int, help="Processes on a machine without GPUs."),
            option("--peak-tflops", default=None, type=float,
                   help="Dense bf16 peak per GPU for MFU (GPUs not in the database)."),
            option("--exposed-comm/--no-exposed-comm", default=True, show_default=True,
                   help="Also run the steps under no_sync() to measure exposed communication (DDP)."),
            option("--noise-scale", is_flag=True,
                   help="Also estimate the gradient noise scale B_simple (McCandlish et al. 2018) from each rank's "
                        "gradient and the all-reduced one, in DDP's communication hook (2+ ranks): the synthetic "
                        "data's own, not your data's; StepMonitor(noise_scale=True) gives your job's."),
            option("--profile/--no-profile", default=True, show_default=True,
                   help="Profile 3 steps on GPUs: where the step's time goes by kernel intervals (matmuls, "
                        "attention, other kernels, NCCL alone, GPU idle); the verdict is read from it."),
        ]

    def configure(self, o: dict):
        from mgpu_bench import workloads
        from mgpu_bench.core import launch
        from mgpu_bench.machine import hardware, selection

        from .config import ModelConfig, ModelPlan

        ngpu = selection.visible_gpu_count()
        on_gpu = ngpu > 0
        for flag, key in (("--seq-len", "seq_len"), ("--image-size", "image_size")):
            if o[key] is not None:
                within(flag, o[key], 1, 1 << 16)
        wl = workloads.resolve(o["model_name"] or ("350m" if on_gpu else "tiny"), seq_len=o["seq_len"],
                               image_size=o["image_size"], cpu_defaults=not on_gpu)
        from . import sizing

        batch_size = wl.default_batch(on_gpu) if o["batch_size"] is None else o["batch_size"]
        within("--batch-size", batch_size, 1, 1_000_000, "samples per GPU per micro-batch")
        within("--grad-accum", o["grad_accum"], 1, 10_000, "micro-batches per step")
        steps = sizing.DEFAULT_STEPS if o["steps"] is None else o["steps"]
        warmup = sizing.DEFAULT_WARMUP if o["warmup_steps"] is None else o["warmup_steps"]
        within("--steps", steps, 1, 1_000_000, "timed steps per configuration")
        within("--warmup-steps", warmup, 0, 1_000_000)
        within("--num-workers", o["num_workers"], 0, 256, "DataLoader workers per GPU")
        within("--preprocess-ms", o["preprocess_ms"], 0, 60_000, "milliseconds per sample")
        peak_tflops = o["peak_tflops"]
        if peak_tflops is not None:
            within("--peak-tflops", peak_tflops, 0, 1e6, "TFLOP/s per GPU", above=True)
        if o["data_mode"] in ("loader", "both"):
            from mgpu_bench.core.paths import check_folder

            check_folder(o["data_dir"] or "/tmp", "--data-dir")  # the token file is written there
            if not wl.has_loader:
                raise InputError(f"--data {o['data_mode']}: {wl.key} has no DataLoader (a module gives one as "
                                 "'loader'); use --data synthetic")
        if o["checkpointing"]:
            wl.check_checkpointing()  # InputError where there are no blocks to checkpoint
        chosen: tuple[int, ...] = ()
        if on_gpu:
            chosen = tuple(selection.parse_gpus(o["gpus"], ngpu))
            available = len(chosen)
        else:
            if o["gpus"] is not None:
                raise selection.gpus_without_gpus()
            within("--nproc", o["nproc"], 1, 64, "processes on this machine")
            available = o["nproc"]
        le = launch.detect()
        if le is not None:  # the launcher decided the process count
            if o["scaling_text"]:
                raise InputError(f"--scaling starts its own processes: drop it under {le.launcher} "
                                 f"(this job has {le.world_size})")
            available = le.world_size
        counts = [available]
        if o["scaling_text"]:
            try:
                counts = sorted({int(x) for x in o["scaling_text"].split(",") if x.strip()})
            except ValueError:
                raise InputError(f"--scaling '{o['scaling_text']}': write GPU counts like 1,2") from None
            if not counts or counts[0] < 1 or counts[-1] > available:
                raise InputError(f"--scaling '{o['scaling_text']}': counts must be 1..{available} "
                                 f"({'GPUs selected' if on_gpu else '--nproc'})")
        if le is None and max(counts) > 1:  # ranks to start: their server imports torch meanwhile
            from mgpu_bench.core import children

            children.rank_start_method()
        # The count on meta in this process where the estimate needs it (a workload without a FLOPs
        # formula); with one (the GPT: no torch here before the first line), rank 0 counts instead.
        count, note = _count(wl, batch_size) if wl.formula_flops(1) is None else (None, None)
        peak = None
        if peak_tflops is not None:
            peak = hardware.Figure(peak_tflops * 1e12, "FLOP/s", hardware.USER_OVERRIDE)
        elif on_gpu:
            from mgpu_bench import _native

            peak = hardware.peak_flops(_native.device_info(chosen[0])["name"], "bf16")
        cfg = ModelConfig(model=wl.key, seq_len=wl.seq_len, batch_size=batch_size, grad_accum=o["grad_accum"],
                          steps=steps, warmup_steps=warmup, parallel=o["parallel"], data="synthetic",
                          num_workers=o["num_workers"], preprocess_ms=o["preprocess_ms"], data_dir=o["data_dir"],
                          checkpointing=o["checkpointing"], exposed_comm=o["exposed_comm"], profile=o["profile"],
                          device="cuda" if on_gpu else "cpu", progress=False, compile=o["compile_model"],
                          noise_scale=o["noise_scale"],
                          workload=wl.text if wl.text != wl.key else None, image_size=wl.image_size)
        if cfg.noise_scale and (cfg.parallel != "ddp" or max(counts) < 2):
            fix = ([] if cfg.parallel == "ddp" else ["--parallel ddp"]) + (
                [] if max(counts) >= 2 else ["--nproc 2" if not on_gpu else "--gpus with 2 or more"])
            raise InputError("--noise-scale needs DDP on 2 or more ranks (two batch sizes: each rank's and the whole "
                             f"batch's); this run is {cfg.parallel.upper()} on {max(counts)}: give {' and '.join(fix)}")
        if cfg.compile and cfg.warmup_steps < 2:
            raise InputError(f"--compile with --warmup-steps {cfg.warmup_steps}: the first warm-up step compiles "
                             "the model, so give at least 2 (--warmup-steps 3)")
        modes = ("synthetic", "loader") if o["data_mode"] == "both" else (o["data_mode"],)
        facts = wl.facts()
        per_sample = sizing.flops_per_sample(facts, count)
        notes: tuple[str, ...] = ()
        budgets: tuple[float, ...] = ()
        if not on_gpu:
            given = {"steps": o["steps"] is not None, "warmup_steps": o["warmup_steps"] is not None,
                     "batch_size": o["batch_size"] is not None or wl.kind == "module"}
            if cfg.compile:
                given["warmup_steps"] = True
            cfg, sized = sizing.size_for_cpu(cfg, counts, modes, per_sample, given)
            notes = (sized,) if sized else ()
            budgets = tuple(sizing.seconds(cfg, counts, modes, per_sample, peak))
        return ModelPlan(cfg, tuple(counts), modes, peak, chosen, facts, count, note, budgets, notes)

    def estimate(self, plan) -> str | None:
        """The whole command: start-up (this process's so far, each configuration's processes on
        this host now, the end) and every configuration's steps at a guessed rate (sizing.whole).
        A guess to say how long to wait, never a figure; on CPU processes each configuration keeps
        to its share."""
        from . import sizing

        cfg = plan.config
        per_sample = sizing.flops_per_sample(plan.workload, plan.count)
        total, spent, start = sizing.whole(cfg, plan.counts, plan.modes, per_sample, plan.peak, plan.budgets,
                                           ranks_count=plan.count is None)
        return sizing.text(total, len(plan.counts) * len(plan.modes), cfg, cfg.device == "cuda", plan.peak,
                           max(plan.counts), spent, start)

    def run(self, plan, ctx):
        from dataclasses import replace

        from mgpu_bench.machine import selection
        from mgpu_bench.results.document import Document

        from .document import document
        from .measure import run_model

        if plan.gpus:
            selection.pin_gpus(list(plan.gpus))  # child processes see only the chosen GPUs
        cfg = replace(plan.config, progress=ctx.progress.show and ctx.rank == 0)
        run = run_model(cfg, plan.counts, plan.modes, plan.peak, ctx.progress.say_fn, plan.workload, plan.count,
                        plan.budgets, count_on="device" if plan.count_note else "meta")
        run.notes[:0] = list(plan.notes)
        if plan.count_note:
            run.notes.append(plan.count_note)
        if plan.peak is None:
            run.notes.append("no MFU: " + ("this GPU has no bf16 peak in the hardware database; give --peak-tflops"
                                            if cfg.device == "cuda" else
                                            "CPU processes have no peak figure; give --peak-tflops"))
        occupancy = ctx.occupancy.to_dict() if ctx.occupancy is not None else None  # before the findings
        return Document.of(document(run, ctx.environment, ctx.command, occupancy), run)

    def verdict(self, doc: Mapping) -> Verdict | None:
        from mgpu_bench.machine.occupancy import from_document

        from .analyse import verdicts

        found = verdicts(self.load(doc), from_document(doc))
        return found[-1] if found else None

    def failure(self, doc: Mapping) -> str | None:
        run = self.load(doc)
        failed = [s for s in run.stats if s.error]
        if not failed:
            return None
        fit = [s for s in run.stats if not s.error]
        c = run.config
        size = (f" --seq-len {c.seq_len}" if c.seq_len else "") + (f" --image-size {c.image_size}" if c.image_size else "")
        hint = (f"; run 'mgpu-bench memory --no-churn --max-batch {c.workload_text}{size}' for the largest batch that "
                "fits" if any("out of memory" in (s.error or "") for s in failed) else "")
        return (f"{len(failed)} configuration(s) failed: {failed[0].error}{hint}"
                + (f" ({len(fit)} measured and kept)" if fit else ""))

    def render(self, doc: Mapping, console) -> None:
        from .render import render_terminal

        run = self.load(doc)
        if run.stats:
            render_terminal(run, console)
        console.print(f"model: {run.wall_seconds:.1f} s wall, process start-up included", highlight=False)

    def suite_steps(self, plan: PlanContext) -> list[Step]:
        # suite --model: the user's workload at its own defaults; else the 350m GPT as the anchors ran it
        mine = ("--model", plan.model) if plan.model else None
        if plan.ngpu:
            model = mine or ("--model", SUITE_MODEL, "--seq-len", "2048", "--batch-size", "8")
            steps = ("--steps", "12", "--warmup-steps", "3") if plan.quick else ("--steps", "30", "--warmup-steps", "5")
            counts, k = [], 1  # 1, 2, 4, ... up to the GPU count, and the count itself
            while k < plan.ngpu:
                counts.append(k)
                k *= 2
            counts.append(plan.ngpu)
            return [
                Step(1, 30, "model-1gpu", "training step on one GPU",
                     ("model", *model, *steps, *plan.gpus_args(first=True),
                      *(("--data", "both") if not plan.quick else ()))),
                Step(2, 30, "model-scaling", "training steps over GPU counts",
                     ("model", *model, *steps, "--scaling", ",".join(map(str, counts)), *plan.gpus_args()),
                     min_gpus=2),
                Step(3, 30, "model-sustained", "sustained training",
                     ("model", *model, "--steps", "50", "--warmup-steps", "3", "--no-exposed-comm",
                      *plan.gpus_args()), telemetry=True, timeout_s=plan.duration_s * 3 + 600,
                     prepare=_sustained(plan.duration_s)),
            ]
        cpu_model = mine or ("--model", "tiny")
        tiny = (*cpu_model, "--steps", "8" if plan.quick else "20", "--warmup-steps", "2")
        return [
            Step(1, 30, "model-1gpu", "training step on one process", ("model", *tiny, "--nproc", "1"), min_gpus=0),
            Step(2, 30, "model-scaling", "training steps over process counts", ("model", *tiny, "--scaling", "1,2"),
                 min_gpus=0),
            Step(3, 30, "model-sustained", "sustained training",
                 ("model", *cpu_model, "--steps", "40", "--warmup-steps", "2", "--nproc", "1",
                  "--no-exposed-comm", "--no-profile"), min_gpus=0, timeout_s=plan.duration_s * 3 + 600,
                 prepare=_sustained(plan.duration_s)),
        ]


def _count(wl, batch_size: int):
    """(the workload's FlopCount on the meta device, None) or, where the model does not run on
    meta (data-dependent operations), (None, the note that the ranks count on their device)."""
    from mgpu_bench.workloads import last_line

    try:
        return wl.count_flops(batch_size), None
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any op without a meta kernel: count on the device instead
        return None, f"FLOPs counted on the ranks' device: {wl.key} does not run on the meta device ({last_line(exc)})"


def _sustained(duration_s: float):
    """Step.prepare for the sustained run: as many steps as fill `duration_s` at the step time
    of the latest earlier model run, or of a short calibration run when there is none."""
    from mgpu_bench.results.probe import replace_option

    from .analyse import steps_to_fill

    def prepare(step: Step, earlier: list[dict], run_step) -> Step:
        n = next((k for e in reversed(earlier) if e["name"].startswith("model")
                  and (k := steps_to_fill(e["document"], duration_s))), 0)
        if not n:  # no earlier model run (round 1 not asked for, or it failed): time a few steps
            args = replace_option(replace_option(step.args, "--steps", "5"), "--warmup-steps", "2")
            calib = run_step(step.with_args(args, name="model-calibration", title="step time for the sustained run",
                                            telemetry=False, prepare=None))
            n = steps_to_fill(calib["document"], duration_s)
        return step.with_args(replace_option(step.args, "--steps", str(n)), prepare=None) if n else step

    return prepare


PROBE = ModelProbe()
