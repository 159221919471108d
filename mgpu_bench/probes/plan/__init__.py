"""`mgpu-bench plan`: will this model fit, how many GPUs, how many days, from what this cluster
measured (the history), each figure with the run it came from, formulas only where nothing was.

    config.py     the question and its parsers (token counts, bare sizes)
    workload.py   the workload's parameters, tensors, blocks and FLOPs (mgpu_bench.workloads, meta device)
    evidence.py   what the history measured: model, memory, comm and fleet runs
    memory.py     the fit: model states, activations, the fewest GPUs, the largest batch
    project.py    the step on N GPUs: measured, or compute + the exposed gradient collectives
    build.py      the plan from those, and what is missing
    measure.py    --measure: the missing short measurements, as child commands
    analyse.py    findings: the fit, the answer, what is missing
    render.py     terminal tables;  report.py  the curve beside the measured points, HTML, Markdown
    document.py   the result document;  shape.py  its declared shape;  headline.py  its metrics
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from mgpu_bench.errors import InputError
from mgpu_bench.probe import Probe, option, within

HELP = """Will this model fit, how many GPUs, how many days: from what this cluster measured.

\b
mgpu-bench plan --model 1.3b --tokens 300B --days 30      the GPUs that train it in 30 days
mgpu-bench plan --model 350m --tokens 300B --gpus 64      the days on 64 GPUs
mgpu-bench plan --model layers=48,width=6144 --tokens 1T --parallel fsdp --network NDR

\b
Every figure comes from the history (--db) with the id of the run that measured it, for this
workload at this sample size on this GPU model (this machine's, else the newest stored run's):
the step time per GPU at the batch (`model`; two batches give a + c x batch), the peak memory at
two or more batches (`model`, `memory --max-batch`: activations per sample), the bus bandwidth of
the gradient collectives within a node (`comm`) and between nodes (a multi-node `comm`, `fleet`,
or --network from the hardware database: min(the node's ring, GPUs per node x the port rate x
80%)), and the overlap `model` measured (exposed = step - step without gradient sync). Formulas
only where nothing was measured, labelled: 16 bytes per parameter for mixed-precision AdamW (ZeRO,
Rajbhandari et al. 2020, section 3.1), activations L s h x 34 + logits (Korthikanti et al. 2022).

\b
Step on N GPUs = compute + the collectives' time at the measured bus bandwidth x (1 - the share
the backward pass hid where it was measured). Range: that share held, or the hidden time held,
or the share at the exposed time +- twice its noise, divided and multiplied by 1 + twice the
measured noise. Days = tokens / (N x batch x seq) x step / 86400.
A line for every figure the history lacks names the command that measures it; --measure runs
the ones this machine can (child commands storing into the same history), then plans.
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
        import click

        return [
            option("--model", "model_text", required=True,
                   help="The workload (tiny, 125m, 350m, 760m, 1.3b, torchvision:NAME, hf:NAME, module:function), or "
                        "a bare GPT size layers=L,width=D[,heads=H][,vocab=V] (parameters from the GPT formula)."),
            option("--tokens", "tokens_text", default=None, help="The token budget: 300B, 1.2T, 5e11 (K M B T)."),
            option("--samples", "samples_text", default=None,
                   help="The sample budget, for a workload without tokens (images): 1.2B, 5e9."),
            option("--days", default=None, type=float, help="The time to train in: how many GPUs."),
            option("--gpus", "gpus_count", default=None, type=int, help="The GPUs to train on: how many days."),
            option("--parallel", default="ddp", show_default=True, type=click.Choice(["ddp", "fsdp"])),
            option("--seq-len", default=None, type=int,
                   help="Tokens per sample [default: the newest stored run's, else the workload's]."),
            option("--image-size", default=None, type=int,
                   help="Pixels per side, vision workloads [default: the newest stored run's, else the workload's]."),
            option("--batch-size", default=None, type=int,
                   help="Samples per GPU per step [default: the newest stored run's, else the workload's]."),
            option("--network", default=None,
                   help="The network between nodes, from the hardware database (NDR, HDR, 400GbE, RoCE400, ...), "
                        "where the history has no multi-node figure or to ask what if."),
            option("--gpus-per-node", default=None, type=int, help="[default: the stored runs' hosts]"),
            option("--measure", is_flag=True,
                   help="Run the short measurements the history lacks first (stored there too), then plan."),
        ]

    def configure(self, o: dict) -> Request:
        from mgpu_bench import hardware

        from .config import MAX_DAYS, MAX_GPUS, PlanConfig, parse_count
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
        if o.get("gpus_per_node") is not None:
            within("--gpus-per-node", o["gpus_per_node"], 1, 1024, "GPUs in one node")
        if o.get("network"):
            hardware.network_rate(o["network"])  # an unknown name is InputError naming the known ones
        cfg = PlanConfig(model=o["model_text"], tokens=tokens, samples=samples, days=o.get("days"),
                         gpus=o.get("gpus_count"), parallel=o.get("parallel") or "ddp", seq_len=o.get("seq_len"),
                         image_size=o.get("image_size"), batch_size=o.get("batch_size"), network=o.get("network"),
                         gpus_per_node=o.get("gpus_per_node"), measure=bool(o.get("measure")))
        local_gpu, local_n = _local_gpus()
        facts = describe(cfg.model, cfg.seq_len, local_n > 0, cfg.image_size)  # one that cannot be built: exit 2 now
        if tokens is not None and not facts.tokens_per_sample:
            raise InputError(f"--tokens: {facts.key} has no tokens (its samples are {facts.sample_text}): give "
                             "--samples")
        return Request(cfg, facts, local_gpu, local_n)

    def finding_label(self, finding) -> str:
        return "plan"

    def gpus(self, config) -> tuple[int, ...]:
        return ()  # it runs nothing on a GPU itself (--measure's children watch their own)

    def estimate(self, request) -> str | None:
        return "the missing measurements first (--measure), a few minutes" if request.config.measure else None

    def run(self, request: Request, ctx):
        from dataclasses import asdict

        from mgpu_bench.document import Document, envelope, status

        from .analyse import findings

        if ctx.history is None:
            raise InputError("mgpu-bench plan reads the history database: run it as a command")
        history = ctx.history()
        try:
            payload, stopped = _plan(request, history, ctx.progress.say_fn)
        finally:
            history.close()
        cfg = {k: v for k, v in asdict(request.config).items()}
        doc = {**envelope("plan", ctx.environment, ctx.command), "config": cfg, **payload,
               "status": status("interrupted" if stopped else None,
                                "interrupted while measuring: the plan is from what was stored" if stopped else None)}
        doc["findings"] = [f.text for f in findings(doc)]
        return Document.of(doc)


def _local_gpus() -> tuple[str | None, int]:
    """This machine's first GPU's name and its GPU count ((None, 0) without GPUs)."""
    from mgpu_bench import selection

    n = selection.visible_gpu_count()
    if not n:
        return None, 0
    from mgpu_bench import _native

    return str(_native.device_info(0)["name"]), n


def _plan(request: Request, history, say) -> tuple[dict, bool]:
    """The payload from the history; with --measure, the missing measurements first."""
    from . import build, evidence, measure
    from .workload import describe

    cfg, facts = request.config, request.facts
    device, source, seq = evidence.newest(history, request.local_gpu, facts.key)
    on_gpu = device != evidence.CPU
    if cfg.seq_len is None and seq is not None and seq != facts.seq_len and facts.kind in ("gpt", "hf"):
        facts = describe(cfg.model, seq, on_gpu, cfg.image_size)
    elif on_gpu != (request.local_gpus > 0) and cfg.seq_len is None and cfg.image_size is None:
        facts = describe(cfg.model, None, on_gpu)  # the other device's default sample size
    here = device == (request.local_gpu or evidence.CPU)
    local = request.local_gpus if here else 0
    payload = build.plan(cfg, facts, evidence.read(history, facts, device, source), local, here)
    stopped = False
    if cfg.measure:
        commands = measure.runnable(payload["missing"]) if here else []
        entries: list[dict] = []
        if commands:
            entries, stopped = measure.run_all(commands, str(history.path), say)
            payload = build.plan(cfg, facts, evidence.read(history, facts, device, source), local, here)
        payload["measured_now"] = entries
        if not here:
            payload["notes"].append(f"--measure: the plan is for a {device}, this machine has "
                                    f"{request.local_gpu or 'no GPU'}: nothing measured here")
        elif not commands:
            payload["notes"].append("--measure: nothing this machine can measure is missing")
    return payload, stopped


PROBE = PlanProbe()
