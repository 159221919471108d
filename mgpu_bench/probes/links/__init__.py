"""`mgpu-bench links`: GPU-to-GPU copy bandwidth and latency for every ordered pair, host copies
per GPU, and the slow pair or GPU named.

    measure.py     the config and the native copies, latency reads and host copies
    analyse.py     the slow pair, the GPU behind most slow pairs, copies against theory
    render.py      terminal matrices
    report.py      heatmaps and the suite section
    document.py    the result document, written and read back
    shape.py       its declared shape, checked on every read (no backend imported)
    headline.py    the metrics history compares
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import GPUS_HELP, MAX_ITERS, PlanContext, Probe, Step, option

HELP = """GPU-to-GPU copy bandwidth and latency for every ordered pair, host copies per GPU, and
the slow pair or GPU named (each pair against the node's median: robust z-score below -3
and 10% below the median; needs 3 pairs or more).

\b
GB/s = 10^9 bytes/s, per direction: a bidirectional copy moves --size each way.
"""


class LinksProbe(Probe):
    name = "links"
    summary = "GPU-to-GPU and host copy bandwidth, latency, the slow pair"
    help = HELP
    payload = "measurements"
    outputs = ("json", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the result document.",
        "report": "Write GPU x GPU heatmap PNGs into this folder.",
    }
    progress = "bar"

    def options(self) -> list:
        return [
            option("--gpus", default=None, help=GPUS_HELP),
            option("--size", "size_text", default="256M", show_default=True, help="Bytes per copy (K/M/G = 1024^n)."),
            option("--iters", default=10, show_default=True, type=int,
                   help="Timed copies per figure (median reported)."),
            option("--warmup", default=3, show_default=True, type=int, help="Untimed copies first."),
            option("--engines", default="ce,sm", show_default=True,
                   help="ce (copy engines), sm (a kernel reading peer memory)."),
            option("--latency/--no-latency", default=True, show_default=True, help="Dependent-read latency per pair."),
            option("--host/--no-host", default=True, show_default=True, help="Pinned host <-> GPU copies per GPU."),
        ]

    def configure(self, o: dict):
        from mgpu_bench.machine import selection
        from mgpu_bench.results.sizes import parse_size

        from .result import LinksConfig

        size = parse_size(o["size_text"])
        engines = tuple(e.strip() for e in o["engines"].split(",") if e.strip())
        if not (1 <= o["iters"] <= MAX_ITERS and 0 <= o["warmup"] <= MAX_ITERS):
            raise InputError(f"--iters must be between 1 and {MAX_ITERS}, --warmup between 0 and {MAX_ITERS}")
        gpus, _devices = selection.require_gpus("links", o["gpus"])
        return LinksConfig(tuple(gpus), size, o["iters"], o["warmup"], engines, o["latency"], o["host"])

    def run(self, cfg, ctx):
        from mgpu_bench.machine import theory, topo
        from mgpu_bench.results.document import Document

        from .document import document
        from .measure import run_links

        run = run_links(list(cfg.gpus), size=cfg.size, iters=cfg.iters, warmup=cfg.warmup, engines=cfg.engines,
                        latency=cfg.latency, host=cfg.host, progress=ctx.progress.step)
        run.topology = topo.collect()
        run.hops = theory.pair_hops(run.topology, list(cfg.gpus))
        doc = document(run, run.hops, ctx.environment, ctx.command, run.topology)
        return Document.of(doc, run)

    def from_document(self, doc: Mapping):
        from .document import run_from_document

        run, hops = run_from_document(dict(doc))
        run.hops = hops
        run.topology = doc.get("topology") if isinstance(doc.get("topology"), Mapping) else None
        return run

    def notes(self, doc: Mapping) -> list[str]:
        return []  # a pair without peer access is a finding here

    def render(self, doc: Mapping, console) -> None:
        from .render import render_terminal

        run = self.load(doc)
        render_terminal(run, console)
        console.print(f"{len(run.measurements)} measurement(s) in {run.wall_seconds:.2f} s; one ordered pair took "
                      f"{run.per_pair_seconds:.2f} s, so 8 GPUs (56 pairs) would take about "
                      f"{run.estimate_seconds(8):.0f} s", highlight=False, soft_wrap=True)

    def suite_steps(self, plan: PlanContext) -> list[Step]:
        args = ("links", *(("--iters", "5") if plan.quick else ()), *plan.gpus_args()) if plan.ngpu else ("links",)
        return [Step(2, 20, "links", "GPU-to-GPU links", args, min_gpus=2)]


PROBE = LinksProbe()
