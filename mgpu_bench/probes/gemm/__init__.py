"""`mgpu-bench gemm`: achievable TFLOP/s per GPU and dtype with the best cuBLASLt algorithm,
against the datasheet peak, with the clocks, power and throttle reasons seen while it ran.

    measure.py     parsing, the config, validation, the native probe on every GPU at once
    analyse.py     the slow GPU and its cause, wrong results, sustained drops; the suite's verdicts
    render.py      terminal table and CSV
    report.py      plots, HTML page, Markdown, the suite section
    document.py    the result document, written and read back
    shape.py       its declared shape, checked on every read (no backend imported)
    headline.py    the metrics history compares
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import GPUS_HELP, MAX_ITERS, PlanContext, Probe, Step, option

HELP = """GEMM compute probe: achievable TFLOP/s per GPU and dtype, against the datasheet peak.

\b
Per dtype and shape, cuBLASLt's heuristic proposes --candidates algorithms; each one is run
once and its output checked on 1024 sampled elements against an fp64 reference (a wrong
algorithm is reported and not counted), then --warmup untimed GEMMs, then --samples bursts
of about --sample-time seconds, each timed with CUDA events at its two ends. The figure is
the fastest candidate's median burst: TFLOP/s = 2*M*N*K / seconds per GEMM / 10^12.
Inputs are random (--init; fp8: e4m3 scaled by 1/8, bf16 output) and rotate among as many
buffer sets as make one GEMM's operands leave L2 before they come round again.

\b
All GPUs run at once (the hotter, realistic case) unless --one-at-a-time; NVML samples
SM clock, power, temperature and throttle reasons every 0.1 s beside each figure. A GPU
below the node's median by more than max(2%, 3x its noise) is named with its likely cause.
--search sweeps M, N and K over --search-range (one short run per shape with the
heuristic's first choice), then measures the best --search-refine shapes in full.
--duration runs the best algorithm that long on every GPU: a TFLOP/s series with clocks,
power and temperature (the limit-throughput round).
"""


class GemmProbe(Probe):
    name = "gemm"
    summary = "achievable TFLOP/s per GPU (cuBLASLt), the slow GPU named"
    help = HELP
    payload = "results"
    outputs = ("json", "csv", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the result document (every candidate's raw seconds, telemetry).",
        "csv": "One row per GPU, dtype and shape.",
        "report": "Write PNGs (TFLOP/s per GPU against the peak; sustained series), report.html, summary.md.",
    }
    progress = "status"
    own_telemetry = True  # it samples clocks beside each figure and judges them itself

    def options(self) -> list:
        import click

        return [
            option("--dtype", "dtype_text", default="bf16", show_default=True,
                   help="Comma-separated: fp64, fp32 (no TF32), tf32, fp16, bf16, fp8 (fp8_e4m3, as comm names it)."),
            option("--shape", "shape_text", default="8192", show_default=True,
                   help="N for NxNxN, or MxNxK; comma-separated for several."),
            option("--layout", default="auto", show_default=True,
                   help="cuBLAS op(A) op(B), column-major: NN, NT, TN, TT; auto = NN (torch.matmul's), TN for fp8."),
            option("--gpus", default=None, help=GPUS_HELP),
            option("--one-at-a-time", is_flag=True, help="Measure the GPUs one after another instead of together."),
            option("--candidates", default=8, show_default=True, type=int, help="Heuristic algorithms timed per shape."),
            option("--samples", default=5, show_default=True, type=int, help="Timed bursts per candidate."),
            option("--sample-time", default=0.02, show_default=True, type=float, help="Seconds per burst."),
            option("--warmup", default=3, show_default=True, type=int, help="Untimed GEMMs per candidate first."),
            option("--check/--no-check", default=True, show_default=True, help="Check each candidate's output."),
            option("--search", is_flag=True, help="Find the shape with the highest TFLOP/s over --search-range."),
            option("--search-range", default="2048:16384:2048", show_default=True,
                   help="START:STOP:STEP for each of M, N and K (the grid is the cube of these values)."),
            option("--search-refine", default=4, show_default=True, type=int,
                   help="Best shapes of the search measured again with every candidate."),
            option("--duration", "duration_text", default=None, help="Sustained run per dtype, e.g. 60s, 5m."),
            option("--interval", default=0.5, show_default=True, type=float,
                   help="Seconds per point of the sustained TFLOP/s series."),
            option("--peak", "peak_text", default=None,
                   help="Your own dense peaks in TFLOP/s, e.g. bf16=989,fp8=1979 (for GPUs not in the database)."),
            option("--fp8-fast-accum", is_flag=True, help="fp8: cuBLASLt's fast accumulation (faster, less exact)."),
            option("--init", default="uniform", show_default=True,
                   type=click.Choice(["uniform", "normal", "positive"]),
                   help="Input values: uniform in [-1, 1), standard normal, or uniform in [0, 1). They change the "
                        "power drawn, so TFLOP/s on a power-capped GPU."),
            option("--workspace", "workspace_text", default="32M", show_default=True,
                   help="cuBLASLt workspace per GPU."),
        ]

    def configure(self, o: dict):
        from mgpu_bench import _native
        from mgpu_bench.machine import hardware, selection
        from mgpu_bench.results.sizes import parse_duration, parse_size

        from . import measure as m

        dtypes = m.parse_dtypes(o["dtype_text"])
        shapes = m.parse_shapes(o["shape_text"])
        layout = m.parse_layout(o["layout"])
        for d in dtypes:
            m.layout_for(d, layout)
        if not (1 <= o["candidates"] <= 64):
            raise InputError("--candidates must be between 1 and 64")
        if not (1 <= o["samples"] <= 10_000 and 0 <= o["warmup"] <= MAX_ITERS):
            raise InputError(f"--samples must be between 1 and 10000, --warmup between 0 and {MAX_ITERS}")
        if not (0 < o["sample_time"] <= 60):
            raise InputError("--sample-time must be a positive number of seconds (at most 60)")
        if not (0.01 <= o["interval"] <= 3600):
            raise InputError("--interval must be between 0.01 and 3600 seconds")
        if not (1 <= o["search_refine"] <= 64):
            raise InputError("--search-refine must be between 1 and 64")
        grid = m.parse_range(o["search_range"]) if o["search"] else None
        duration = parse_duration(o["duration_text"]) if o["duration_text"] else 0.0
        peaks = hardware.parse_peak_overrides(o["peak_text"]) if o["peak_text"] else {}
        workspace = parse_size(o["workspace_text"])
        if workspace > (4 << 30):
            raise InputError("--workspace above 4G is not useful: cuBLASLt asks for tens of MiB at most")
        gpu_list, devices = selection.require_gpus("gemm", o["gpus"])
        cfg = m.GemmConfig(dtypes=dtypes, shapes=shapes, layout=layout, gpus=tuple(gpu_list),
                           candidates=o["candidates"], samples=o["samples"], sample_s=o["sample_time"],
                           warmup=o["warmup"], check=o["check"], one_at_a_time=o["one_at_a_time"], search=grid,
                           search_refine=o["search_refine"], duration_s=duration, interval_s=o["interval"],
                           workspace=workspace, peak_overrides=peaks, fp8_fast_accum=o["fp8_fast_accum"],
                           init=o["init"])
        m.validate(cfg, devices, {g: _native.mem_get_info(g)[0] for g in gpu_list})
        return cfg

    def run(self, cfg, ctx):
        from mgpu_bench import _native
        from mgpu_bench.results.document import Document

        from .document import document
        from .measure import peak_for, run_gemm

        devices = [_native.device_info(g) for g in cfg.gpus]
        run = run_gemm(cfg, devices, ctx.progress.say_fn)
        for dev in devices:
            for d in cfg.dtypes:
                if peak_for(dev["name"], d, cfg.peak_overrides) is None:
                    run.notes.append(f"GPU {dev['index']} ({dev['name']}) has no {d} peak in the hardware database: "
                                     f"% of peak is not shown; give one with --peak {d}=TFLOPS")
        if run.telemetry_error:
            run.notes.append(f"no clock/power telemetry: {run.telemetry_error}")
        occupancy = ctx.occupancy.to_dict() if ctx.occupancy is not None else None  # before the findings
        return Document.of(document(run, ctx.environment, ctx.command, occupancy), run)

    def failure(self, doc: Mapping) -> str | None:
        run = self.load(doc)
        if any(r.wrong for r in run.results):
            return "wrong GEMM results (see the findings)"
        if any(r.best is None for r in run.results):
            return "no algorithm ran for some GEMMs (see the findings)"
        return None

    def render(self, doc: Mapping, console) -> None:
        from .render import render_terminal

        run = self.load(doc)
        if run.results:
            render_terminal(run, console)
        console.print(f"{len(run.results)} measurement(s) in {run.wall_seconds:.2f} s wall, probe set-up and "
                      "algorithm selection included", highlight=False)

    def suite_steps(self, plan: PlanContext) -> list[Step]:
        if not plan.ngpu:
            return [Step(1, 10, "gemm", "GEMM per GPU and dtype", ("gemm",)),
                    Step(3, 20, "gemm-sustained", "sustained GEMM", ("gemm", "--duration", f"{plan.duration_s:g}s"))]
        dtypes = "bf16,fp8" if plan.quick else "fp64,tf32,fp16,bf16,fp8"
        return [Step(1, 10, "gemm", "GEMM per GPU and dtype", ("gemm", "--dtype", dtypes, *plan.gpus_args())),
                Step(3, 20, "gemm-sustained", "sustained GEMM",
                     ("gemm", "--dtype", "bf16", "--duration", f"{plan.duration_s:g}s", *plan.gpus_args()),
                     telemetry=True, timeout_s=plan.duration_s + 600)]


PROBE = GemmProbe()
