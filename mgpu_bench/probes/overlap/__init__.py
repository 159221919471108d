"""`mgpu-bench overlap`: compute and communication together. An allreduce stream and a bf16 GEMM
stream on every GPU at once, each alone and then together: how much each slows the other, the
SMs NCCL holds, clocks and power in each phase, and what that costs a training step.

    measure.py     the ranks (torch's elastic launcher, or a launcher's job), the timed streams
    analyse.py     the window both ran in, rates, slowdowns and their noise, NCCL's channels,
                   the training step beside it, findings
    render.py      terminal tables and CSV
    report.py      plots, HTML page, Markdown, the suite section
    document.py    the result document, written and read back
    shape.py       its declared shape, checked on every read (no backend imported)
    headline.py    the metrics history compares
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import GPUS_HELP, Finding, PlanContext, Probe, Step, option

MAX_DIM = 65536
MAX_GPU_BYTES = 64 << 30  # one buffer or GEMM operand: larger is a typo on any GPU of today

HELP = """Compute and communication together: how much an allreduce and a GEMM slow each other.

\b
One process per GPU (gloo processes on a machine without GPUs, --nproc of them), started
through torch's elastic launcher, or joined when torchrun/srun started this command. Each
rank warms up (2 untimed iterations per side), calibrates (3 timed ones; the allreduce's
time agreed on every rank, which must all run as many), then runs three phases:
  1. the allreduce alone for --duration (torch.distributed, NCCL; fp32, --size bytes per
     rank, in place),
  2. the GEMM alone for --duration (torch.matmul, bf16 on GPUs, fp32 on CPU; --shape),
  3. both together, each on its own CUDA stream (on CPU: its own thread), released by one
     event, the GEMM loop sized to last as long as the collective loop did alone.
Every iteration is timed by a CUDA event on its stream (the host clock on CPU). Together,
each side counts only the iterations that ended while both ran (until the first finished).
busbw = algbw x 2(n-1)/n (nccl-tests); TFLOP/s = 2MNK / seconds; slowdown = time per
iteration together / alone - 1, reported when above max(2%, 3x its noise) (noise: standard
error of the means of 10 chunks of the samples). NVML samples clock and power every 0.1 s;
NCCL's INFO log at set-up gives its channels (one CTA, so one SM, each while a collective
runs); NCCL_MAX_CTAS and the like are recorded where set.

\b
On one GPU NCCL's allreduce is a no-op, so the comm side is an elementwise kernel over the
same bytes: the GEMM side is still measured, interference needs 2 GPUs. --model-result sets
the slowdowns beside a training step `mgpu-bench model` measured (its exposed
communication, and in its profile the NCCL time with compute beside it): does the
interference explain the exposed time? The suite passes its own model run.
"""


@dataclass(frozen=True)
class OverlapPlan:
    """What a run measures: the config, the process count (the launcher's world under one), the
    CUDA devices chosen (() on CPU processes) and the training step to set it beside."""

    config: Any  # analyse.OverlapConfig
    nprocs: int
    gpus: tuple[int, ...]
    model_ref: dict | None
    notes: tuple[str, ...] = ()


def parse_shape(text: str) -> tuple[int, int, int]:
    """'8192' (square), '8k', or 'MxNxK' -> (m, n, k)."""
    parts = text.lower().replace("*", "x").split("x")
    if len(parts) not in (1, 3):
        raise InputError(f"--shape '{text}' is neither N (square) nor MxNxK: write e.g. 8192 or 4096x8192x1024")
    dims = []
    for p in parts:
        t = p.strip()
        mult = 1024 if t.endswith("k") else 1
        try:
            v = int(t[:-1] if mult > 1 else t) * mult
        except ValueError:
            raise InputError(f"--shape '{text}': '{p.strip()}' is not a whole number (write e.g. 8192 or 8k)") from None
        if not 1 <= v <= MAX_DIM:
            raise InputError(f"--shape '{text}': every dimension must be 1..{MAX_DIM}")
        dims.append(v)
    return (dims[0],) * 3 if len(dims) == 1 else tuple(dims)  # type: ignore[return-value]


def read_model_result(path: str) -> dict:
    """The training step of a model (or suite) --json document at `path`; InputError naming
    what is wrong otherwise."""
    from .analyse import model_reference

    try:
        with open(path) as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise InputError(f"--model-result {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError:
        raise InputError(f"--model-result {path} is not JSON: give a file written by mgpu-bench model --json") from None
    if not isinstance(doc, dict) or doc.get("kind") not in ("model", "suite"):
        raise InputError(f"--model-result {path} is not a model or suite result: give a file written by "
                         "mgpu-bench model --json")
    ref = model_reference(doc, path)
    if ref is None:
        raise InputError(f"--model-result {path} has no model run on 2+ ranks with exposed communication: run "
                         "mgpu-bench model on 2+ GPUs (--scaling 1,2) with --exposed-comm")
    return ref


class OverlapProbe(Probe):
    name = "overlap"
    cpu = True
    summary = "allreduce and GEMM together: how much each slows the other"
    help = HELP
    payload = "ranks"
    outputs = ("json", "csv", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the result document (every iteration's seconds per rank and phase, telemetry).",
        "csv": "One row per rank, phase and side (base units).",
        "report": "Write PNGs (rates alone and together, the together phase, clocks and power), report.html, "
                  "summary.md.",
        "progress": "Rank 0's phases on stderr [default: on].",
    }
    progress = "lines"
    own_telemetry = True  # it samples clocks in each phase and judges them itself

    def options(self) -> list:
        return [
            option("--size", "size_text", default=None,
                   help="Bytes allreduced per rank, fp32 [default: 256M on GPUs, 4M on CPU processes]."),
            option("--shape", "shape_text", default=None,
                   help="The GEMM: N for NxNxN, or MxNxK [default: 8192 on GPUs, 512 on CPU processes]."),
            option("--duration", "duration_text", default=None,
                   help="Length of each phase, e.g. 5s [default: 5s on GPUs, 1s on CPU processes]."),
            option("--gpus", default=None, help=GPUS_HELP),
            option("--nproc", default=2, show_default=True, type=int, help="Processes on a machine without GPUs."),
            option("--model-result", "model_result", default=None, metavar="FILE",
                   help="A model (or suite) --json document: set the slowdowns beside its training step on 2+ GPUs."),
            option("--model-figures", "model_figures", default=None, hidden=True,
                   help="The training step as JSON (the suite passes its own model run this way)."),
        ]

    def configure(self, o: dict):
        from mgpu_bench.core import launch
        from mgpu_bench.machine import selection
        from mgpu_bench.results.sizes import parse_duration, parse_size

        from .analyse import OverlapConfig, check_reference

        on_gpu = selection.visible_gpu_count() > 0
        size = parse_size(o["size_text"] or ("256M" if on_gpu else "4M"))
        if size < 4:
            raise InputError(f"--size {o['size_text']}: at least 4 bytes (one fp32 element)")
        m, n, k = parse_shape(o["shape_text"] or ("8192" if on_gpu else "512"))
        duration = parse_duration(o["duration_text"] or ("5s" if on_gpu else "1s"))
        if not 0.01 <= duration <= 3600:
            raise InputError(f"--duration {o['duration_text']}: each phase takes 0.01 s to 1 h")
        elem = 2 if on_gpu else 4
        largest = max(size, elem * max(m * k, k * n, m * n))
        le = launch.detect()
        gpus: tuple[int, ...] = ()
        if le is not None:
            if o["gpus"] is not None:
                raise InputError(f"--gpus: under {le.launcher} every rank uses its local GPU; drop --gpus")
            nprocs = le.world_size
        elif on_gpu:
            gpus = tuple(selection.parse_gpus(o["gpus"], selection.visible_gpu_count()))
            nprocs = len(gpus)
        else:
            if o["gpus"] is not None:
                raise selection.gpus_without_gpus()
            if not 1 <= o["nproc"] <= 64:
                raise InputError("--nproc must be between 1 and 64")
            nprocs = o["nproc"]
        if on_gpu and largest > MAX_GPU_BYTES:
            raise InputError(f"--size / --shape: a buffer of {largest / (1 << 30):.0f} GiB; keep each under 64 GiB")
        if not on_gpu:
            avail = selection.host_available_memory()
            need = nprocs * (2 * size + elem * (m * k + k * n + m * n))
            if avail is not None and need > avail // 2:
                raise InputError(f"--size / --shape need {need / (1 << 30):.1f} GiB over {nprocs} processes, more than "
                                 f"half the {avail / (1 << 30):.1f} GiB of host memory available: choose smaller ones")
        ref = None
        if o["model_result"] and o["model_figures"]:
            raise InputError("give --model-result or --model-figures, not both")
        if o["model_result"]:
            ref = read_model_result(o["model_result"])
        elif o["model_figures"]:
            try:
                ref = json.loads(o["model_figures"])
            except ValueError:
                raise InputError("--model-figures is not JSON") from None
            why = check_reference(ref)
            if why:
                raise InputError(f"--model-figures {why}")
        cfg = OverlapConfig(size=size - size % 4, m=m, n=n, k=k, duration_s=duration,
                            device="cuda" if on_gpu else "cpu")
        notes = (f"--size rounded down to {cfg.size} bytes (whole fp32 elements)",) if size % 4 else ()
        return OverlapPlan(cfg, nprocs, gpus, ref, notes)

    def gpus(self, plan) -> tuple[int, ...]:
        return plan.gpus

    def estimate(self, plan) -> str | None:
        from .analyse import ranks_text

        c = plan.config
        return (f"about {3 * c.duration_s + (15 if c.device == 'cuda' else 5):.0f} s: 3 phases of {c.duration_s:g} s "
                f"on {ranks_text(plan.nprocs, c.device == 'cuda')}, start-up and calibration included")

    def run(self, plan, ctx):
        from dataclasses import replace

        from mgpu_bench.core import launch
        from mgpu_bench.machine import selection
        from mgpu_bench.results.document import Document

        from .document import document
        from .measure import run_overlap

        if plan.gpus and launch.detect() is None:
            selection.pin_gpus(list(plan.gpus))  # the ranks see only the chosen GPUs
        cfg = replace(plan.config, progress=bool(ctx.progress.show) and ctx.rank == 0)
        run = run_overlap(cfg, plan.nprocs, plan.gpus, ctx.progress.say_fn)
        run.model_ref = plan.model_ref
        run.notes += plan.notes
        if run.world < 2:
            run.notes.append("one rank: NCCL's allreduce of one rank is a no-op in place, so the comm side is an "
                             "elementwise kernel over the same bytes; interference with a collective needs 2 GPUs")
        if cfg.device == "cpu":
            run.notes.append("CPU processes: the two sides are threads sharing the host's cores, so their "
                             "interference is the CPU's, not a GPU's")
        for why in dict.fromkeys(r.get("telemetry_error") or (r.get("nccl") or {}).get("capture") for r in run.ranks):
            if why:
                run.notes.append(f"not recorded: {why}")
        occupancy = ctx.occupancy.to_dict() if ctx.occupancy is not None else None
        return Document.of(document(run, ctx.environment, ctx.command, occupancy), run)

    def finding_label(self, finding: Finding) -> str:
        return {"problem": "finding", "warning": "warning"}.get(finding.severity, "result")

    def failure(self, doc: Mapping) -> str | None:
        errors = [f"rank {r.get('rank')}: {r['error']}" for r in self.load(doc).ranks if r.get("error")]
        return f"{errors[0]} (the phases measured before it are kept)" if errors else None

    def render(self, doc: Mapping, console) -> None:
        from .render import render_terminal

        run = self.load(doc)
        if run.ranks:
            render_terminal(run, console)
        console.print(f"overlap: {run.wall_seconds:.1f} s wall, process start-up included", highlight=False)

    def suite_steps(self, plan: PlanContext) -> list[Step]:
        args = ("overlap", "--duration", "3s" if plan.quick else "5s", *plan.gpus_args())
        return [Step(2, 40, "overlap", "compute and communication together", args, min_gpus=2,
                     timeout_s=600.0, prepare=_beside_model)]


def _beside_model(step: Step, earlier: list[dict], run_step) -> Step:
    """Step.prepare: the suite's latest model run on 2+ GPUs, passed as --model-figures, so that
    the slowdowns are set beside the training step measured in the same suite."""
    from .analyse import model_reference

    for e in reversed(earlier):
        doc = e.get("document")
        if str(e.get("name", "")).startswith("model") and isinstance(doc, Mapping):
            ref = model_reference(doc, f"this suite's {e['name']}")
            if ref:
                return step.with_args((*step.args, "--model-figures", json.dumps(ref)), prepare=None)
    return step.with_args(step.args, prepare=None)


PROBE = OverlapProbe()
