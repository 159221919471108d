"""`mgpu-bench comm`: collective bus bandwidth sweeps, checked, against the theory of the path.

    plan.py           the config, the backend and ranks, every input check, the requests
    cpu_sizing.py     a sweep on CPU processes (gloo): its estimate, each size's share, a size left out
    measure.py        runs them: the native core, torch.distributed workers (torch_backend.py),
                      or one rank of a launcher's job (joined.py)
    torch_backend.py  the torch backend: the native core's sweep run through torch.distributed,
                      the parent's side (it starts the ranks and gathers; no torch imported)
    torch_rank.py     one rank of it: the data pattern, the timing loop and the check, on torch
    joined.py         one rank of a launcher's job (torchrun, srun, mpirun), whatever the backend
    analyse.py        busbw against theory, the summary per op, stragglers, the suite's verdicts
    render.py         terminal table and CSV
    report.py         busbw-vs-size plots, HTML page, Markdown, the suite section
    document.py       the result document, written and read back
    shape.py          its declared shape, checked on every read (no backend imported)
    headline.py       the metrics history compares
    imported.py       nccl-tests and rccl-tests logs as comm runs (`mgpu-bench history add LOG`)
    tune/             `--tune`: the settings tried per size band (trials.py), the rule that recommends
                      (rule.py), each setting measured in a fresh process (run.py)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import GPUS_HELP, MAX_ITERS, WARNING, Finding, PlanContext, Probe, Step, option, within

HELP = """Collective bandwidth sweeps: time, algbw and busbw per size, checked.

\b
Sizes mean what nccl-tests' size column means: the per-rank buffer for allreduce,
broadcast, reduce and sendrecv; the whole gathered output for allgather; the whole input
for reducescatter; the whole per-rank buffer for alltoall. They are rounded down to whole
elements (for allgather, reducescatter and alltoall, to a multiple of the rank count), and
the rounding is printed. alltoall and sendrecv run out-of-place only: with one buffer,
received data would overwrite data not yet sent.

\b
Stopping rule per size: max(2, --warmup-iters) warm-up iterations (the later ones give a
per-iteration estimate, the slowest rank's wins), then --iters iterations, or by default
enough to fill --min-time (0.03 s) at that estimate, at least 20 and at most 10000. The
burst is timed with CUDA events at its two ends only (time = burst / iterations, slowest
rank: nccl-tests' time column); a second pass of the same length records an event every
batch of iterations lasting >= 0.5 ms, which gives the median, p99 and CoV without event
overhead in the time column. --check (on) then runs the op once on known data and counts
wrong elements on the GPU; any wrong element makes the exit code 1.

\b
busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather, reducescatter, alltoall),
x 1 (broadcast, reduce, sendrecv). GB/s = 10^9 bytes/s.
"""


class CommProbe(Probe):
    name = "comm"
    cpu = True
    summary = "collective bus bandwidth (NCCL), checked"
    help = HELP
    payload = "measurements"
    outputs = ("json", "csv", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the versioned result document (raw samples included).",
        "csv": "Write one row per measurement, base units.",
        "report": "Write busbw-vs-size PNGs with the theory line, a self-contained HTML page and a Markdown "
                  "summary into this folder.",
        "progress": "Progress bar on stderr; in a log or pipe a line every 10 s [default: on].",
    }
    progress = "bar"

    def options(self) -> list:
        import click

        from mgpu_bench.results.measurement import TimingOptions

        return [
            option("--ops", "ops_text", default=None,
                   help="Comma list of allreduce, allgather, reducescatter, broadcast, reduce, alltoall, "
                        "sendrecv, or 'all' [default: allreduce,allgather; allreduce with --tune]."),
            option("--sizes", "sizes_text", default=None,
                   help="A range 1M-1G (see --factor/--step) or a list 8,1K,64M; K/M/G = 1024^n. "
                        "Default 1M-1G on GPUs, 1K-4M on CPU ranks."),
            option("--factor", type=float, default=None, help="Multiply sizes by this over a range [default: 2]."),
            option("--step", "step_text", default=None, help="Add this many bytes over a range instead."),
            option("--dtype", "dtype_text", default="fp32", show_default=True,
                   help="fp32, fp16, bf16, fp64, int32, int8, fp8_e4m3 (fp8, as gemm names it), fp8_e5m2."),
            option("--redop", default="sum", show_default=True, help="sum, max, min or avg (reducing ops only)."),
            option("--inplace", "only_inplace", is_flag=True, help="In-place only (default: both)."),
            option("--outofplace", "only_outofplace", is_flag=True, help="Out-of-place only (default: both)."),
            option("--gpus", default=None, help=GPUS_HELP),
            option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "native", "torch"]),
                   help="auto: native where NVIDIA GPUs are visible, else torch.distributed with gloo on "
                        "CPU processes. torch on GPUs: torch.distributed with NCCL, one process per GPU."),
            option("--nproc", default=2, show_default=True, type=int, help="Ranks for torch on CPU."),
            option("--iters", default=0, type=int, help="Fixed timed iterations per size (default: by --min-time)."),
            option("--warmup-iters", default=5, show_default=True, type=int),
            option("--min-time", default=TimingOptions.min_time_s, show_default=True, type=float,
                   help="Seconds of timed iterations per size when --iters is not given."),
            option("--graph", is_flag=True, help="Capture the timed iterations into CUDA graphs (native)."),
            option("--check/--no-check", default=True, show_default=True, help="Count wrong elements."),
            option("--timeout", default=120.0, show_default=True, type=float,
                   help="Seconds one size may take before the communicators are aborted."),
            option("--launch", "launch_mode", default="single", show_default=True,
                   type=click.Choice(["single", "processes"]),
                   help="processes: start one process per local GPU (--nproc on CPU) through torch's elastic "
                        "launcher and measure as torchrun would (native backend on GPUs, one communicator per "
                        "process); single: one process drives all GPUs."),
            option("--tune", is_flag=True,
                   help="Which NCCL setting to use: NCCL_ALGO and NCCL_PROTO per collective, NCCL_MIN_NCHANNELS / "
                        "NCCL_MAX_NCHANNELS (twice / half the default's channels) and NCCL_BUFFSIZE (8, 16 MiB), "
                        "each in a fresh process with its own communicator over the GPUs, at 2 sizes per band "
                        "(<= 4 MiB, <= 64 MiB, above) of --sizes, out-of-place unless --inplace, checked. A setting "
                        "is recommended, with the export lines to paste, only where it beats the default at every "
                        "size of a band by more than max(2%, 3 x noise) (noise: the samples' CoV and the spread of "
                        "two default runs); never one that gave a wrong element or an NVLS algorithm where NVLS "
                        "is off. NCCL on 2+ GPUs only; how long it takes is said when it starts."),
        ]

    def configure(self, o: dict):
        from mgpu_bench.machine import selection
        from mgpu_bench.results import ops
        from mgpu_bench.results.measurement import TimingOptions
        from mgpu_bench.results.sizes import parse_sizes

        from .plan import CommConfig

        ops_text = o["ops_text"] or ("allreduce" if o.get("tune") else "allreduce,allgather")
        op_names = ops.parse_ops(ops_text)
        dtype = ops.parse_dtype(o["dtype_text"])
        redop = o["redop"].strip().lower()
        if redop not in ops.REDOPS:
            raise InputError(f"unknown --redop '{redop}': choose from {', '.join(ops.REDOPS)}")
        iters, warmup = o["iters"], o["warmup_iters"]
        if not (0 <= iters <= MAX_ITERS and 0 <= warmup <= MAX_ITERS):
            raise InputError(f"--iters and --warmup-iters must be between 0 and {MAX_ITERS}")
        if not (0 < o["min_time"] <= 1e4):
            raise InputError("--min-time must be a positive number of seconds (at most 1e4)")
        only_in, only_out = o["only_inplace"], o["only_outofplace"]
        placements = (True,) if only_in and not only_out else (False,) if only_out and not only_in else (False, True)
        sizes_text = o["sizes_text"]
        on_gpus = selection.visible_gpu_count() > 0
        if o["gpus"] is not None and not on_gpus:
            raise selection.gpus_without_gpus()  # before the estimate is said
        if not on_gpus:  # as plan.py checks it, before the estimate (--nproc 0 was a traceback there)
            if o["nproc"] < 2:
                raise InputError(f"--nproc {o['nproc']}: collectives need at least 2 ranks")
            within("--nproc", o["nproc"], 2, 256, "gloo processes on this machine's CPUs")
        if sizes_text is None:
            sizes_text = "1M-1G" if on_gpus else "1K-4M"
        sizes = parse_sizes(sizes_text, o["factor"], o["step_text"])
        timing = TimingOptions(warmup_iters=warmup, iters=iters, min_time_s=o["min_time"], graph=o["graph"],
                               check=o["check"])
        cfg = CommConfig(ops=tuple(op_names), dtype=dtype, redop=redop, sizes=tuple(sizes), inplace=placements,
                         backend=o["backend"], gpus=o["gpus"], nproc=o["nproc"], timing=timing,
                         timeout_s=o["timeout"], launch=o["launch_mode"])
        if o.get("tune"):
            from .tune.trials import tune_config

            return tune_config(cfg)
        return cfg

    def gpus(self, cfg) -> tuple[int, ...]:
        from mgpu_bench.core import launch
        from mgpu_bench.machine import selection

        n = selection.visible_gpu_count()
        if not n:
            return ()
        le = launch.detect()
        if le is not None:  # one GPU per rank: the local rank's, or the only one it sees
            return (le.local_rank,) if le.local_rank < n else (0,) if n == 1 else ()
        try:
            return tuple(selection.parse_gpus(cfg.gpus, n))
        except InputError:
            return ()  # run() says what is wrong with --gpus

    def delegate(self, cfg) -> int | None:
        """--launch processes outside a launcher: the same command in one process per GPU."""
        import sys

        from mgpu_bench.core import launch
        from mgpu_bench.machine import selection

        from .plan import native_error_as_input

        if cfg.launch != "processes" or launch.detect() is not None:
            return None
        ngpu = selection.visible_gpu_count()
        if cfg.backend == "native" and ngpu == 0:
            native_error_as_input()
        if ngpu:
            chosen = selection.parse_gpus(cfg.gpus, ngpu)
            selection.pin_gpus(chosen)  # the GPUs are chosen through CUDA_VISIBLE_DEVICES instead of --gpus
            n = len(chosen)
        else:
            if cfg.gpus is not None:
                raise selection.gpus_without_gpus()
            n = cfg.nproc
        if n < 2:
            raise InputError(f"--launch processes needs at least 2 processes ({n} selected)")
        return launch.relaunch(launch.strip_options(sys.argv[1:], ("--launch", "--gpus")), n, cfg.timeout_s)

    def estimate(self, cfg) -> str | None:
        from mgpu_bench.machine.selection import visible_gpu_count

        from .plan import estimate_seconds
        from .tune.trials import TuneConfig, estimate

        if isinstance(cfg, TuneConfig):
            return estimate(cfg)

        return estimate_seconds(cfg, visible_gpu_count() > 0)

    def run(self, cfg, ctx):
        from mgpu_bench.core import launch
        from mgpu_bench.machine.env import backend_versions
        from mgpu_bench.results.document import Document
        from mgpu_bench.results.sizes import format_bytes

        from .document import result_document
        from .measure import run_comm

        said = [None]

        def progress(i, total, req, note=None):
            """The step; a revised estimate (`note`) rides on the plain lines, and above a live bar
            is printed once on its own line (the bar keeps its count in view)."""
            label = f"{req.op} {format_bytes(req.size)} {'in' if req.inplace else 'out'}"
            bar = getattr(ctx.progress, "style", None) == "bar"
            if bar and note and note != said[0] and getattr(ctx.progress, "show", False):
                ctx.progress.err.print(f"{self.name}: {note}", highlight=False)
            said[0] = note
            ctx.progress.step(i, total, label if bar or not note else f"{label} ({note})")

        from .tune.run import run_tune
        from .tune.trials import TuneConfig

        tuning = None
        if isinstance(cfg, TuneConfig):
            run, tuning = run_tune(cfg, lambda i, total, label: ctx.progress.step(i, total, label))
        else:
            run = run_comm(cfg, progress)
        environment = {**ctx.environment, **backend_versions(run.backend)}
        le = launch.detect()
        if le is not None:
            environment["launcher"] = {"kind": le.launcher, "world_size": le.world_size,
                                       "nnodes": run.nnodes or le.nnodes, "master": f"{le.master_addr}:{le.master_port}"}
        return Document.of(result_document(run, environment, ctx.command,
                                           tuning.to_dict() if tuning is not None else None), run)

    def notes(self, doc: Mapping) -> list[str]:
        return list(self.load(doc).notes)

    def findings(self, doc: Mapping) -> list[Finding]:
        return [Finding(WARNING, f) for f in self.load(doc).findings]

    def failure(self, doc: Mapping) -> str | None:
        wrong = self.load(doc).total_wrong
        if not wrong and doc.get("tuning"):
            from .tune.rule import Tuning

            bad = Tuning.from_dict(doc["tuning"]).wrong
            if bad:
                return (f"{sum(t.wrong for t in bad)} wrong element(s) with {', '.join(t.candidate.label for t in bad)}: "
                        "the data did not arrive intact")
        return f"{wrong} wrong element(s): the data did not arrive intact" if wrong else None

    def render(self, doc: Mapping, console) -> None:
        from .render import render_terminal, summary_lines

        run = self.load(doc)
        if doc.get("tuning"):
            from .render import render_tuning

            render_tuning(doc["tuning"], console, run)
            return
        if run.measurements:
            render_terminal(run, console)
            for line in summary_lines(run):
                console.print(line, highlight=False, soft_wrap=True)  # one line each, for grep
        source = doc.get("source") if isinstance(doc.get("source"), Mapping) else None
        if source:  # a nccl-tests or rccl-tests log (imported.py): no wall time of ours
            files = ", ".join(str(x.get("file")) for x in source.get("logs") or [] if isinstance(x, Mapping))
            console.print(f"{len(run.measurements)} measurement(s) read from {source.get('tool')} "
                          f"{source.get('version') or ''} log(s) {files}".replace("  ", " "), highlight=False,
                          soft_wrap=True)
            return
        whole = (f"; {run.process_seconds:.2f} s since the process started (Python and torch imports "
                 "included)" if run.process_seconds else "")
        console.print(f"{len(run.measurements)} measurement(s) in {run.wall_seconds:.2f} s wall, "
                      f"communicator set-up included{whole}", highlight=False, soft_wrap=True)

    def csv(self, doc: Mapping) -> str:
        from .render import render_csv, tuning_csv

        return tuning_csv(doc["tuning"]) if doc.get("tuning") else render_csv(self.load(doc))

    def suite_steps(self, plan: PlanContext) -> list[Step]:
        if plan.ngpu:
            ops = "allreduce,allgather,reducescatter" if plan.quick else \
                "allreduce,allgather,reducescatter,alltoall,broadcast,sendrecv"
            args = ("comm", "--ops", ops, "--sizes", "1M-1G", "--factor", "4" if plan.quick else "2", "--outofplace",
                    *plan.gpus_args())
            return [Step(2, 10, "comm", "collective bus bandwidth", args, min_gpus=2)]
        return [Step(2, 10, "comm", "collective bus bandwidth",
                     ("comm", "--backend", "torch", "--nproc", "2", "--ops", "allreduce,allgather", "--sizes",
                      "1K-1M", "--factor", "32", "--outofplace"), min_gpus=0)]


PROBE = CommProbe()
