"""`mgpu-bench sdc`: silent data corruption. Bitwise-deterministic work on every GPU, hashed on the
GPU and compared across the GPUs of a model, across repetitions and against known answers.

    measure.py     parsing, the config, the native probes on every GPU at once, the collective
    analyse.py     the hash on the host, locating the first difference, peers, verdicts, findings
    render.py      terminal table and CSV
    report.py      plot, HTML page, Markdown, the suite section
    document.py    the result document, written and read back
    shape.py       its declared shape, checked on every read (no backend imported)
    headline.py    the metrics history compares
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import GPUS_HELP, MAX_ITERS, Finding, PlanContext, Probe, Step, option, within

HELP = """Silent data corruption: the same bitwise-deterministic work on every GPU, hashed and compared.

\b
A repetition runs on every GPU at once:
  GEMM        --gemms GEMMs D = A B (--dtype, --shape) on inputs generated on the GPU from --seed
              by a counter-based generator (every GPU multiplies the same numbers), with one
              cuBLASLt algorithm without split-K or reduction, chosen on the first GPU of each
              model and pinned for its GPUs and every repetition. Each D is hashed on the GPU
              (64 bits, block sums chained in a fixed order: the same bits whatever order the
              hardware runs in).
  allreduce   bf16 sum of exact small integers (--comm-size per GPU), every element checked
              against the exact sum (one GPU: a 1-rank allreduce; --comm-size 0: none).
  HBM         an address- and seed-dependent pattern written over --memory-fraction of the free
              memory (measured once the other buffers exist), read back and compared on the GPU.

\b
Verdict per GPU: unstable (a GEMM gave another hash than the GPU's own first one), mismatch (its
hash differs from the other GPUs of its model; the majority decides, and with no majority each
is named), wrong (an HBM word or allreduce element differs from what was written or summed), or
ok. Each names the GPU, the work and the first differing element with both values. Any of them:
exit code 1.

\b
--repetitions 20 by default: deterministic work shows a GPU that corrupts every time on its first
wrong bit, and repetitions give an intermittent one the chance to disagree with itself (each of
the 20 x --gemms GEMMs is compared with the first) while the run stays short enough for the
suite's first round (which runs 5 repetitions, 3 with --quick). Marginal hardware shows when
hot: burn in with --duration (e.g. 10m), which repeats until that time has passed. The GEMM
hash is printed and stored per GPU: another node's is comparable under the same --dtype, --shape
and --seed, GPU model and cuBLASLt version.
"""


class SdcProbe(Probe):
    name = "sdc"
    summary = "silent data corruption: deterministic work hashed and compared per GPU"
    help = HELP
    payload = "checks"
    outputs = ("json", "csv", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the result document (every check, its hash, the located differences).",
        "csv": "One row per GPU: verdict, GEMMs, hash, TFLOP/s, HBM checked, wrong items.",
        "report": "Write a PNG (throughput per repetition), report.html and summary.md.",
    }
    progress = "status"

    def options(self) -> list:
        import click

        from .measure import DEFAULT_GEMMS, DEFAULT_MEMORY_FRACTION, DEFAULT_REPETITIONS, DEFAULT_SEED, DTYPES

        return [
            option("--gpus", default=None, help=GPUS_HELP),
            option("--dtype", default="bf16", show_default=True, type=click.Choice(DTYPES),
                   help="GEMM input and output type (fp32 accumulation)."),
            option("--shape", "shape_text", default="8192", show_default=True,
                   help="GEMM size: N for NxNxN, or MxNxK."),
            option("--gemms", default=DEFAULT_GEMMS, show_default=True, type=int,
                   help="GEMMs per GPU and repetition, each hashed and compared with the GPU's first."),
            option("--repetitions", default=None, type=int,
                   help=f"Repetitions of GEMMs, allreduce and HBM check [default: {DEFAULT_REPETITIONS}]."),
            option("--duration", "duration_text", default=None,
                   help="Repeat until this much time has passed instead, e.g. 10m (a burn-in)."),
            option("--memory-fraction", default=DEFAULT_MEMORY_FRACTION, show_default=True, type=float,
                   help="Share of the free memory the HBM pattern covers."),
            option("--comm-size", "comm_text", default="256M", show_default=True,
                   help="Bytes per GPU of the checked allreduce; 0: none."),
            option("--seed", default=DEFAULT_SEED, show_default=True, type=int,
                   help="Seed of the GEMM inputs and the HBM patterns (the hash depends on it)."),
            option("--timeout", default=300.0, show_default=True, type=float,
                   help="Seconds an allreduce may take before the run stops as failed."),
        ]

    def configure(self, o: dict):
        from mgpu_bench import _native
        from mgpu_bench.machine import selection
        from mgpu_bench.results.sizes import parse_duration, parse_size

        from . import measure as m

        shape = m.parse_shape(o["shape_text"])
        within("--gemms", o["gemms"], 1, 100_000)
        duration = parse_duration(o["duration_text"]) if o["duration_text"] else 0.0
        if duration and o["repetitions"] is not None:
            raise InputError("give --repetitions or --duration, not both: --duration repeats until that time has "
                             "passed")
        repetitions = m.DEFAULT_REPETITIONS if o["repetitions"] is None else o["repetitions"]
        within("--repetitions", repetitions, 1, MAX_ITERS)
        within("--memory-fraction", o["memory_fraction"], *m.MEMORY_FRACTION_RANGE,
               "a share of the free memory; the rest stays for the GEMM, NCCL and other processes")
        try:
            comm = parse_size(o["comm_text"])
        except InputError as exc:
            raise InputError(f"--comm-size: {exc}") from None
        if comm and not 4096 <= comm <= m.MAX_COMM_BYTES:
            raise InputError(f"--comm-size {o['comm_text']}: 0 (no allreduce) or from 4K to "
                             f"{m.MAX_COMM_BYTES >> 30}G")
        within("--seed", o["seed"], 0, 2**63, "the hash depends on it")
        within("--timeout", o["timeout"], 0, 86400, "seconds", above=True)
        gpu_list, devices = selection.require_gpus("sdc", o["gpus"])
        cfg = m.SdcConfig(gpus=tuple(gpu_list), dtype=o["dtype"], shape=shape, gemms=o["gemms"],
                          repetitions=repetitions, duration_s=duration, memory_fraction=o["memory_fraction"],
                          comm_bytes=comm, seed=o["seed"], timeout_s=o["timeout"])
        mn, nk, mk = shape[0] * shape[1], shape[1] * shape[2], shape[0] * shape[2]
        need = 2 * (mk + nk + 2 * mn)  # A, B, D and the reference copy of D, 2 bytes an element
        for d in devices:
            free = _native.mem_get_info(d["index"])[0]
            if need > 0.5 * free:
                raise InputError(f"--shape {o['shape_text']} needs {need / 2**30:.1f} GiB for A, B, D and D's "
                                 f"reference copy on GPU {d['index']}, which has {free / 2**30:.1f} GiB free: the "
                                 "HBM check needs the rest; choose a smaller --shape")
        return cfg

    def estimate(self, cfg) -> str | None:
        if cfg.duration_s > 0:
            return (f"about {cfg.duration_s:g} s of checks (the repetition under way then ends the run), plus set-up "
                    "and NCCL start-up")
        return None

    def run(self, cfg, ctx):
        from mgpu_bench import _native
        from mgpu_bench.results.document import Document

        from .document import document
        from .measure import run_sdc

        devices = [_native.device_info(g) for g in cfg.gpus]
        run = run_sdc(cfg, devices, ctx.progress.say_fn)
        occupancy = ctx.occupancy.to_dict() if ctx.occupancy is not None else None
        return Document.of(document(run, ctx.environment, ctx.command, occupancy), run)

    def finding_label(self, finding: Finding) -> str:
        return {"problem": "finding", "warning": "warning"}.get(finding.severity, "note")

    def suite_steps(self, plan: PlanContext) -> list[Step]:
        """Round 1 runs a short version: a few repetitions (a burn-in is `sdc --duration`)."""
        short = ("--repetitions", "3", "--gemms", "16") if plan.quick else ("--repetitions", "5")
        return [Step(1, 40, "sdc", "silent data corruption", ("sdc", *short, *plan.gpus_args()), timeout_s=600.0)]


PROBE = SdcProbe()
