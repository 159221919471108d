"""`mgpu-bench plan`: will this model fit, how many GPUs, how many days, from what this cluster
measured (the history), each figure with the run it came from, formulas only where nothing was.

The question, at the top (what is asked; nothing here reads the history):

    config.py     the question and its parsers (token counts, bare sizes, rates)
    layout.py     how it trains: tp, pp, dp, DDP, ZeRO-1, ZeRO-2 or FSDP over the replicas, recomputation;
                  --parallel
    workload.py   the workload's parameters, tensors, blocks and FLOPs (mgpu_bench.workloads, meta device)

Where the figures come from, and the arithmetic from them (each folder's __init__ lists its files):

    sources/      what the history measured (index, clean, evidence) and another GPU's datasheet (target)
    estimate/     the fit (memory), the step on N GPUs (project), the answer, the goodput, the plan (build)

The command around them (the probe's roles, at the top):

    measure.py    --measure: the missing short measurements, as child commands
    analyse.py    findings: the fit, the answer, the goodput, what is missing
    render.py     terminal tables;  report.py  the curve beside the measured points, HTML, Markdown
    shape.py      the document's declared shape;  headline.py  its metrics;  text.py  figures in words
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import Probe, option, within

from .estimate.goodput import BATCH_HELP, NOISE_HELP
from .layout import PARALLEL_HELP

HELP = """Will this model fit, how many GPUs, how many days: from what this cluster measured.

\b
mgpu-bench plan --model 1.3b --tokens 300B --days 30      the GPUs that train it in 30 days
mgpu-bench plan --model 350m --tokens 300B --gpus 64      the days on 64 GPUs
mgpu-bench plan --model layers=96,width=12288 --tokens 300B --gpus 1024 --parallel tp=8,pp=16
        --checkpointing --global-batch 1536 --network HDR --gpu A100-SXM4-80GB --rate 140T

\b
Fit first: a layout that does not fit is given no days and no GPU count; the plan says what fits
instead (ZeRO-2, full sharding, activation checkpointing, a smaller micro-batch, tensor and pipeline
parallelism, optimizer states in host memory), each with its days, and exits with code 1.
--days D answers the fewest GPUs projected to train within D days, and the days they take.

\b
Every figure comes from the history (--db) with the id of the run that measured it, for this
workload at this sample size on this GPU model (--gpu's, else this machine's, else the newest stored
run's), leaving out runs whose own documents say their figures are not the GPU's alone (another
process on it, throttled, interrupted, below a check floor; each named): the step time per GPU at
the batch (`model`; two batches give a + c x batch; else the FLOP rate of the nearest GPT), the peak
memory at two or more batches (`model`, `memory --max-batch`: activations per sample), the bus
bandwidth of the collectives within a node (`comm`) and between nodes (a multi-node `comm`, `fleet`,
or --network from the hardware database: min(the node's ring, GPUs per node x the port rate x 80%)),
and the overlap `model` measured (exposed = step - step without gradient sync). For a --gpu the
history has no run on: the step of the nearest measured GPU x the ratio of the two GPUs' matmul
ceilings (`gemm`), else of their datasheet peaks; memory and NVLink from the datasheet; each
labelled scaled. --rate (an achieved FLOP/s per GPU over the whole step, as Megatron-LM reports
it) or --mfu (of the datasheet peak) replaces the step, labelled assumed. Formulas only where
nothing was measured, labelled: 16 bytes per parameter for mixed-precision AdamW (ZeRO, Rajbhandari
et al. 2020, section 3.1) on every GPU under DDP, 4 + 12 / N under ZeRO-1 (the optimizer states
partitioned over the N data-parallel ranks), 2 + 14 / N under ZeRO-2 (the gradients too), 16 / N
under FSDP (ZeRO-3, plus the units it gathers); activations per layer s b h x 34 (/ tp with
sequence parallelism; 2 s b h with recomputation) + logits (Korthikanti et al. 2022). The gradient
collectives: DDP all-reduces; ZeRO-1 and 2 reduce-scatter the gradients and all-gather the updated
weights after the optimizer step (DDP's volume, the all-gather never hidden); FSDP gathers the
parameters twice and reduce-scatters the gradients (1.5x DDP's volume; ZeRO, section 7).

\b
Step on N GPUs = (m + pp - 1) x (compute / (tp x pp) + tp's all-gathers and reduce-scatters + pp's
sends) + the data-parallel gradient collectives at the measured bus bandwidth x (1 - the share the
backward pass hid where it was measured; nothing hidden after a pipeline's flush), for m
micro-batches a step (pipeline bubble (pp - 1) / m). Range: that share held, or the hidden time
held, or the share at the exposed time +- twice its noise, divided and multiplied by 1 + twice the
measured noise. Days = tokens / (samples per step x seq) x step / 86400.
A line for every figure the history lacks names the command that measures it; --measure runs
the ones this machine can (child commands storing into the same history), then plans.
Exit code: 0 planned; 1 the layout asked does not fit (the plan is written, with what fits
instead), or the question has no estimate because a figure is missing (the plan is stored marked
incomplete, with the commands that measure what is missing); 2 bad input.

\b
--noise-scale r12 (a job monitored with StepMonitor(..., noise_scale=True): its B_noise, with its
jackknife error, and B_0 = its global batch then) or --noise-scale N --noise-batch B0: beside each
GPU count's plain figures, its global batch B's statistical efficiency E = (B_noise + B_0) /
(B_noise + B) (Pollux, Qiao et al. OSDI 2021; B_noise of McCandlish et al. 2018), goodput =
throughput x E, and the days to the same training progress = days / E; ranges at B_noise +- twice
its standard error.
"""


@dataclass(frozen=True)
class Request:
    """The parsed question (config.PlanConfig) and the workload as configure() built it."""

    config: Any
    facts: Any
    local_gpu: str | None
    local_gpus: int


class PlanProbe(Probe):
    name = "plan"
    summary = "will it fit, how many GPUs, how many days: from what this cluster measured"
    help = HELP
    payload = "figures"
    outputs = ("json", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the plan document.",
        "report": "Write the scaling curve beside the measured points (PNG), report.html and summary.md.",
    }
    progress = "lines"

    def options(self) -> list:
        return [
            option("--model", "model_text", required=True,
                   help="The workload (tiny, 125m, 350m, 760m, 1.3b, torchvision:NAME, hf:NAME, module:function), or "
                        "a bare GPT size layers=L,width=D[,heads=H][,vocab=V] (parameters from the GPT formula)."),
            option("--tokens", "tokens_text", default=None, help="The token budget: 300B, 1.2T, 5e11 (K M B T)."),
            option("--samples", "samples_text", default=None,
                   help="The sample budget, for a workload without tokens (images): 1.2B, 5e9."),
            option("--days", default=None, type=float, help="The time to train in: how many GPUs."),
            option("--gpus", "gpus_count", default=None, type=int, help="The GPUs to train on: how many days."),
            option("--parallel", default="ddp", show_default=True, help=PARALLEL_HELP),
            option("--checkpointing", is_flag=True,
                   help="Activation recomputation: each layer keeps its input, its activations rebuilt in the "
                        "backward (about a third more FLOPs); GPT-shaped models."),
            option("--global-batch", default=None, type=int,
                   help="Samples per optimizer step over all GPUs: micro-batches = it / (dp x --batch-size) "
                        "[default: one micro-batch per GPU; 8 x pp with a pipeline]."),
            option("--seq-len", default=None, type=int,
                   help="Tokens per sample [default: the newest stored run's, else the workload's]."),
            option("--image-size", default=None, type=int,
                   help="Pixels per side, vision workloads [default: the newest stored run's, else the workload's]."),
            option("--batch-size", default=None, type=int,
                   help="Samples per GPU per step; the micro-batch of one tp x pp replica with tensor or pipeline "
                        "parallelism [default: the newest stored run's, else the workload's; 1 with tp or pp]."),
            option("--network", default=None,
                   help="The network between nodes, from the hardware database (NDR, HDR, 400GbE, RoCE400, ...), "
                        "where the history has no multi-node figure or to ask what if."),
            option("--gpus-per-node", default=None, type=int, help="[default: the stored runs' hosts]"),
            option("--gpu", "gpu_name", default=None,
                   help="Plan for this GPU of the hardware database (a100_sxm4_80gb, 'NVIDIA H100 80GB HBM3', "
                        "h200...): its runs where stored, else the nearest measured GPU's step scaled to it."),
            option("--rate", "rate_text", default=None,
                   help="An achieved FLOP/s per GPU over the whole step (140T), as Megatron-LM reports it: it "
                        "replaces the measured step, labelled assumed."),
            option("--mfu", default=None, type=float,
                   help="An assumed model FLOPs utilisation (0.4; from 0.01 to 1) of the GPU's datasheet bf16 peak, "
                        "over the whole step: it replaces the measured step, labelled assumed."),
            option("--measure", is_flag=True,
                   help="Run the short measurements the history lacks first (stored there too), then plan."),
            option("--noise-scale", "noise_scale", default=None, help=NOISE_HELP),
            option("--noise-batch", "noise_batch", default=None, type=float, help=BATCH_HELP),
        ]

    def configure(self, o: dict) -> Request:
        from mgpu_bench.machine import hardware

        from . import layout
        from .config import MAX_DAYS, MAX_GPUS, MIN_MFU, PlanConfig, parse_count, parse_rate
        from .estimate import goodput
        from .sources import target
        from .workload import describe

        if o.get("days") is not None and o.get("gpus_count") is not None:
            raise InputError("--days and --gpus together: give one (--gpus N: how many days; --days D: how many GPUs)")
        if o.get("tokens_text") is not None and o.get("samples_text") is not None:
            raise InputError("--tokens and --samples together: give one budget")
        tokens = parse_count(o["tokens_text"], "--tokens") if o.get("tokens_text") is not None else None
        samples = parse_count(o["samples_text"], "--samples") if o.get("samples_text") is not None else None
        if o.get("days") is not None:
            within("--days", o["days"], 0, MAX_DAYS, "days to train in", above=True)
            if tokens is None and samples is None:
                raise InputError("--days needs the budget to train: give --tokens (or --samples for images)")
        if o.get("gpus_count") is not None:
            within("--gpus", o["gpus_count"], 1, MAX_GPUS, "GPUs to train on")
        if o.get("seq_len") is not None:
            within("--seq-len", o["seq_len"], 1, 1 << 20, "tokens per sample")
        if o.get("image_size") is not None:
            within("--image-size", o["image_size"], 1, 1 << 16, "pixels per side")
        if o.get("batch_size") is not None:
            within("--batch-size", o["batch_size"], 1, 1_000_000, "samples per GPU per step")
        if o.get("global_batch") is not None:
            within("--global-batch", o["global_batch"], 1, 1 << 40, "samples per optimizer step")
        if o.get("gpus_per_node") is not None:
            within("--gpus-per-node", o["gpus_per_node"], 1, 1024, "GPUs in one node")
        if o.get("network") is not None:
            if not o["network"].strip():
                raise InputError(f"--network {o['network']!r}: name a network of the hardware database: "
                                 f"{', '.join(hardware.load().network)}")
            hardware.network_rate(o["network"])  # an unknown name is InputError naming the known ones
        if o.get("rate_text") is not None and o.get("mfu") is not None:
            raise InputError("--rate and --mfu together: give one (an achieved FLOP/s per GPU, or a utilisation)")
        rate = parse_rate(o["rate_text"]) if o.get("rate_text") is not None else None
        if o.get("mfu") is not None:
            within("--mfu", o["mfu"], MIN_MFU, 1, "a fraction of the datasheet peak: 0.4 is 40%")
        goodput.check(o.get("noise_scale"), o.get("noise_batch"))
        gpu = target.resolve(o["gpu_name"]) if o.get("gpu_name") is not None else None
        parallel = o["parallel"] if o.get("parallel") is not None else "ddp"
        lay, search = layout.parse(parallel, bool(o.get("checkpointing")))
        gpus = o.get("gpus_count")
        if not search and lay.dp is not None:
            if o.get("days") is not None:
                raise InputError(f"--parallel dp={lay.dp} fixes the GPUs (tp x pp x dp = {lay.model_gpus * lay.dp}): "
                                 "ask --gpus, or leave dp out with --days")
            gpus = gpus if gpus is not None else lay.model_gpus * lay.dp
        if search and gpus is None and o.get("days") is None:
            raise InputError("--parallel search needs the question: --gpus N (the fastest layout on N GPUs) or "
                             "--days D (the fewest GPUs)")
        cfg = PlanConfig(model=o["model_text"], tokens=tokens, samples=samples, days=o.get("days"), gpus=gpus,
                         parallel=parallel.strip().lower(), layout=lay, search=search,
                         checkpointing=bool(o.get("checkpointing")), global_batch=o.get("global_batch"),
                         seq_len=o.get("seq_len"), image_size=o.get("image_size"), batch_size=o.get("batch_size"),
                         network=o.get("network"), gpus_per_node=o.get("gpus_per_node"),
                         gpu=gpu.key if gpu else None, rate=rate, mfu=o.get("mfu"), measure=bool(o.get("measure")),
                         noise_scale=o["noise_scale"].strip() if o.get("noise_scale") is not None else None,
                         noise_batch=o.get("noise_batch"))
        local_gpu, local_n = _local_gpus()
        on_gpu = local_n > 0 or gpu is not None
        facts = describe(cfg.model, cfg.seq_len, on_gpu, cfg.image_size)  # one that cannot be built: exit 2 now
        if tokens is not None and not facts.tokens_per_sample:
            raise InputError(f"--tokens: {facts.key} has no tokens (its samples are {facts.sample_text}): give "
                             "--samples")
        layout.check(lay, facts, gpus, cfg.gpus_per_node)
        if cfg.global_batch is not None and (cfg.batch_size or not lay.plain):  # the micro-batch is known already
            from .estimate.build import check_global_batch

            check_global_batch(cfg, cfg.batch_size or 1)
        return Request(cfg, facts, local_gpu, local_n)

    def finding_label(self, finding) -> str:
        return "plan"

    def gpus(self, config) -> tuple[int, ...]:
        return ()  # it runs nothing on a GPU itself (--measure's children watch their own)

    def estimate(self, request) -> str | None:
        return "the missing measurements first (--measure), a few minutes" if request.config.measure else None

    def run(self, request: Request, ctx):
        from dataclasses import asdict

        from mgpu_bench.results.document import Document, envelope, status

        from .analyse import NO_ESTIMATE, findings, no_estimate

        if ctx.history is None:
            raise InputError("mgpu-bench plan reads the history database: run it as a command")
        history = ctx.history()
        try:
            payload, stopped = _plan(request, history, ctx.progress.say_fn)
        finally:
            history.close()
        cfg = {k: v for k, v in asdict(request.config).items()}
        cfg["layout"] = request.config.layout.to_dict(request.config.gpus)
        unanswered = None if stopped else no_estimate(payload)
        doc = {**envelope("plan", ctx.environment, ctx.command), "config": cfg, **payload,
               "status": status("interrupted" if stopped else NO_ESTIMATE if unanswered else None,
                                "interrupted while measuring: the plan is from what was stored" if stopped else
                                unanswered)}
        doc["findings"] = [f.text for f in findings(doc)]
        return Document.of(doc)


def _local_gpus() -> tuple[str | None, int]:
    """This machine's first GPU's name and its GPU count ((None, 0) without GPUs)."""
    from mgpu_bench.machine import selection

    n = selection.visible_gpu_count()
    if not n:
        return None, 0
    from mgpu_bench import _native

    return str(_native.device_info(0)["name"]), n


def _plan(request: Request, history, say) -> tuple[dict, bool]:
    """The payload from the history; with --measure, the missing measurements first."""
    from .estimate import goodput
    from .sources import evidence

    noise = goodput.resolve(request.config.noise_scale, request.config.noise_batch, history)  # exit 2 before any work
    reader = evidence.Reader(history)
    try:
        return _plan_from(request, reader, say, noise)
    finally:
        reader.close()


def _device(request: Request, reader) -> tuple[str, str, int | None]:
    """The device the plan is for (--gpu's NVML name, else as evidence.newest finds it)."""
    from mgpu_bench.machine import hardware

    from .sources import evidence

    cfg = request.config
    if cfg.gpu:
        g = hardware.load().gpus[cfg.gpu]
        name = g.match[0] if g.match else g.name
        _, _, seq = evidence.newest(reader, name, request.facts.key)
        return name, f"--gpu {cfg.gpu} ({g.name})", seq
    return evidence.newest(reader, request.local_gpu, request.facts.key)


def _scaled(request: Request, reader, facts, ev):
    """For --gpu with no step of its own: the nearest measured GPU's evidence and the ratio its
    step takes here (target.py); None where there is none, or a rate is given."""
    from .estimate import build
    from .sources import evidence, target

    cfg = request.config
    if not cfg.gpu or cfg.rate or cfg.mfu or ev.one_gpu() or ev.flop_rates:
        return None
    src, why, _ = evidence.newest(reader, None, facts.key)
    if src == evidence.CPU or evidence.same_device(src, ev.device):
        return None
    other = evidence.read(reader, facts, src, why)
    ratio = target.step_ratio(src, ev.device, evidence.ceilings(reader))
    return None if ratio is None else build.Scaled(other, *ratio)


def _plan_from(request: Request, reader, say, noise=None) -> tuple[dict, bool]:
    from . import measure
    from .estimate import build, goodput
    from .sources import evidence
    from .workload import describe

    cfg, facts = request.config, request.facts
    device, source, seq = _device(request, reader)
    on_gpu = device != evidence.CPU
    if cfg.seq_len is None and seq is not None and seq != facts.seq_len and facts.kind in ("gpt", "hf"):
        facts = describe(cfg.model, seq, on_gpu, cfg.image_size)
    elif on_gpu != (request.local_gpus > 0 or bool(cfg.gpu)) and cfg.seq_len is None and cfg.image_size is None:
        facts = describe(cfg.model, None, on_gpu)  # the other device's default sample size
    here = evidence.same_device(device, request.local_gpu or evidence.CPU)
    local = request.local_gpus if here else 0

    def build_once() -> dict:
        ev = evidence.read(reader, facts, device, source)
        payload = build.plan(cfg, facts, ev, local, here, _scaled(request, reader, facts, ev))
        goodput.apply(payload, noise)
        payload["left_out"] = [{"run": run, "why": why} for run, why in reader.left_out.items()]
        payload["documents_read"] = reader.reads
        return payload

    payload = build_once()
    stopped = False
    if cfg.measure:
        commands = measure.runnable(payload["missing"]) if here else []
        entries: list[dict] = []
        if commands:
            entries, stopped = measure.run_all(commands, str(reader.history.path), say)
            payload = build_once()
        payload["measured_now"] = entries
        if not here:
            payload["notes"].append(f"--measure: the plan is for a {device}, this machine has "
                                    f"{request.local_gpu or 'no GPU'}: nothing measured here")
        elif not commands:
            payload["notes"].append("--measure: nothing this machine can measure is missing")
    return payload, stopped


PROBE = PlanProbe()
