"""`mgpu-bench suite`: the three rounds in one report, stored and compared with the baseline.

    run.py        the plan (every probe's suite steps), each step as a child command, the document
    judge.py      the verdicts over the probes' documents, read through the probe protocol
    report.py     Markdown summary and the HTML page over the rounds
    headline.py   the union of the probes' headline metrics
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.results.probe import GPUS_HELP, Finding, Probe, option

HELP = """The three rounds of a throughput stress test, one report, stored and compared.

\b
Round 1, single-GPU baseline: GEMM per dtype on every GPU (gemm), HBM bandwidth and
  fragmentation (memory), the 350m GPT's training step on one GPU (model; --model: yours).
Round 2, multi-GPU scaling: collective busbw against theory (comm), GPU-to-GPU links (links),
  the model over 1, 2, 4 ... N GPUs with scaling efficiency (model --scaling).
Round 3, limit throughput: the largest batch that fits (memory --max-batch), then a sustained
  GEMM and a sustained training run of --duration each, with clocks, power, temperature and
  throttle reasons sampled over time.

Each probe runs as its own mgpu-bench command in a child process; one that fails is recorded
with its reason and the suite goes on. --quick (a few minutes on 2 GPUs: fewer dtypes, sizes
and steps, --duration 20s) is the monthly patrol; the full suite takes longer. Without GPUs the
probes that run on CPU ranks (comm with gloo, the tiny model) run and the rest are skipped.

The report folder gets report.html (one self-contained page), summary.md, suite.json and the
PNGs. The run is stored in the history database and compared with the suite baseline when one
is set (mgpu-bench baseline set RUN).

\b
Exit codes: 0 all probes ran and nothing regressed against the baseline; 1 a probe failed or a
metric regressed beyond --tolerance and the noise; 2 bad input; 130 Ctrl-C, 143 SIGTERM (what was measured
is written).
"""


class SuiteProbe(Probe):
    name = "suite"
    cpu = True
    summary = "the three rounds in one report, stored and compared"
    help = HELP
    payload = "probes"
    outputs = ("json", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Also write the suite document here (it is always in the report folder).",
        "report": "Report folder [default: mgpu-bench-suite-DATE-TIME in the current folder].",
        "progress": "A line per probe on stderr.",
    }
    gates = True
    progress = "lines"
    progress_default = True

    def options(self) -> list:
        return [
            option("--quick", is_flag=True, help="The short patrol: fewer dtypes, sizes and steps."),
            option("--rounds", "rounds_text", default="1,2,3", show_default=True, help="Rounds to run, e.g. 1,2."),
            option("--duration", "duration_text", default=None,
                   help="Round 3's sustained runs, each [default: 20s with --quick, else 5m]."),
            option("--gpus", default=None, help=GPUS_HELP),
            option("--tolerance", "tolerance_text", default="5%", show_default=True,
                   help="Smallest change that counts against the baseline (noise permitting)."),
            option("--model", "model_name", default=None,
                   help="Your workload for the training steps and the max-batch search, in the forms `model "
                        "--model` takes (torchvision:NAME, hf:NAME, module:function, ...) [default: 350m on "
                        "GPUs, tiny on CPU]."),
        ]

    def configure(self, o: dict):
        from mgpu_bench.history.cli_compare import parse_tolerance
        from mgpu_bench.machine import selection
        from mgpu_bench.results.sizes import parse_duration

        from .run import SuiteConfig, parse_rounds

        rounds = parse_rounds(o["rounds_text"])
        duration_s = parse_duration(o["duration_text"]) if o["duration_text"] else (20.0 if o["quick"] else 300.0)
        tolerance = parse_tolerance(o["tolerance_text"])
        ngpu = selection.visible_gpu_count()
        if ngpu:
            chosen = tuple(selection.parse_gpus(o["gpus"], ngpu))
        elif o["gpus"] is not None:  # the suite has no --nproc: its CPU probes choose their own processes
            from mgpu_bench.core.errors import InputError

            raise InputError(f"--gpus needs NVIDIA GPUs and none is usable here ({selection.no_gpu_reason()}): drop "
                             "--gpus; without GPUs the suite runs the probes that work on CPU processes (comm with "
                             "gloo, the tiny model) by itself and records the others as skipped")
        else:
            chosen = ()
        model = None
        if o["model_name"]:
            from mgpu_bench import workloads

            model = workloads.resolve(o["model_name"], cpu_defaults=not ngpu).text  # bad input: exit 2 here
        return SuiteConfig(quick=o["quick"], rounds=rounds, duration_s=duration_s, gpus=chosen, tolerance=tolerance,
                           model=model)

    def estimate(self, cfg) -> str | None:
        """None here: the suite's estimate (run.estimate) configures every step's probe (torch
        imported, the model's FLOPs counted), seconds of work on a small host, so run_suite says
        it after its first line."""
        return None

    def default_report_dir(self, cfg) -> str:
        from .run import default_report_dir

        return default_report_dir()

    def tolerance(self, cfg) -> float:
        return cfg.tolerance

    def run(self, cfg, ctx):
        from mgpu_bench.results.document import Document

        from .judge import findings
        from .run import document, run_suite

        bus_ids = {g: str(d.get("pci_bus_id")) for g, d in enumerate(ctx.environment.get("gpus", []))
                   if g in cfg.gpus}
        run = run_suite(cfg, bus_ids, ctx.progress.say_fn)
        doc = Document.of(document(run, ctx.environment, ctx.command), run)
        doc["findings"] = [f.to_dict() for f in findings(doc)]
        return doc

    def measured(self, doc: Mapping) -> bool:
        return True  # a suite that skipped everything still says so, in history and the report

    def findings(self, doc: Mapping) -> list[Finding]:
        from .judge import findings

        return findings(doc)

    def finding_label(self, finding: Finding) -> str:
        return finding.severity

    def notes(self, doc: Mapping) -> list[str]:
        return []

    def failure(self, doc: Mapping) -> str | None:
        failed = (doc.get("status") or {}).get("failed") or []
        return f"{len(failed)} probe(s) failed: {', '.join(failed)}" if failed else None

    def render(self, doc: Mapping, console) -> None:
        for p in doc.get("probes") or []:
            console.print(f"round {p['round']} {p['name']:<16} {p['status']:<11} {p['seconds']:7.1f} s"
                          + (f"  {p['error']}" if p["error"] else ""), highlight=False, soft_wrap=True)
        console.print(f"suite: {doc.get('wall_seconds', 0.0):.1f} s wall", highlight=False)

    def report(self, doc: Mapping, out_dir, history=None):
        from pathlib import Path

        from mgpu_bench.core.paths import write_json

        from .report import write_report
        from .run import history_trend

        trend = history_trend(history, doc) if history is not None else None
        paths = write_report(doc, out_dir, history_trend=trend)
        write_json(Path(out_dir) / "suite.json", doc)
        return [*paths, Path(out_dir) / "suite.json"]


PROBE = SuiteProbe()
