"""`mgpu-bench check`: is this node fit to run jobs? One node, all its GPUs, inside a time budget,
the verdict told to the scheduler in its own contract.

    budget.py      the deadline and the parts planned against it (expected costs, slots)
    result.py      the config, the parts and the run they fill
    measure.py     the parts on GPUs: health, processes, GEMM, HBM copy, allreduce, sdc
    cpu.py         the CPU share (cpu_rank.py: one gloo rank): GEMM, copy and allreduce on --nproc processes
    reference.py   this node's reference from the history: its baseline, else its last passing checks
    analyse.py     floors from the datasheets, the figures against them and the reference, the verdict
    contract.py    the command as the scheduler sees it: the budget kept, exit 0/1/2, Slurm, NPD
    render.py      terminal
    document.py    the result document; shape.py its declared shape; headline.py its metrics
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.results.probe import Probe, option

HELP = """Is this node fit to run jobs? Checks one node, all its GPUs, within --budget, and tells the
scheduler.

\b
  mgpu-bench check                          the verdict, exit 0 ok, 1 problem, 2 unknown
  mgpu-bench check --drain --resume         as Slurm's HealthCheckProgram or from a Prolog
  mgpu-bench check --format npd             a node-problem-detector custom plugin

\b
Parts, cheapest first, each only when its expected cost fits in the time left (else it is
skipped, and the output says why): health facts from NVML (uncorrected ECC errors, retired
pages or remapped rows pending or failed, PCIe generation and width against the maximum,
NVLinks down, a power limit below the default, the driver against the CUDA runtime); other
processes on the GPUs; a bf16 8192^3 GEMM (cuBLASLt, checked) and an HBM copy on every GPU
at once, with the GPUs' throttle reasons; the node's own NCCL allreduce (2+ GPUs, checked); a
short silent-data-corruption pass (the same GEMMs hashed on every GPU, an HBM pattern read
back). Without GPUs: the host's facts and a gloo allreduce, GEMM and copy on --nproc processes.

\b
Judged against this node's baseline (`mgpu-bench baseline set RUN` on one of its stored
checks), else the median of its last 5 passing checks (fewer cannot tell how much its figures
move: the floors alone judge until then, said), and on GPUs always against floors from
the datasheets (GEMM 50% of the dense bf16 peak, HBM copy 60% of the memory bandwidth,
allreduce 40% of the ring's slowest hop), printed with how each was set. The budget is the
whole command's wall time: the measuring runs in a process of its own, stopped at its
deadline; GPU work that never returns by then is a problem, a measuring process that dies or
hands nothing over is unknown. The run is stored and written like every probe's (--db, --json,
--prometheus); the newest --keep checks of the node stay in the history. Where the default
history cannot be used (no HOME, a read-only one: a daemon's), the check stores in
$XDG_STATE_HOME/mgpu-bench, else /var/lib/mgpu-bench (root) or a private folder under the
temporary folder, and says so; the shipped NHC and node-problem-detector configurations give --db.

\b
--drain: on a problem, scontrol update NodeName=<SLURMD_NODENAME or the short host name>
State=DRAIN Reason="mgpu-bench: <the first problem>". --resume: on ok, resumes the node only
when its reason starts with "mgpu-bench:" (another tool's or a person's reason is left
alone). Unknown (the check could not tell: too short a budget, a part that could not run)
never drains. Both need root or SlurmUser, as slurmd runs HealthCheckProgram and Prolog.
"""


class CheckProbe(Probe):
    name = "check"
    cpu = True
    summary = "this node fit to run jobs, within a budget: Slurm drain, NHC, node-problem-detector"
    help = HELP
    payload = "parts"
    outputs = ("json", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the result document (every part's raw samples, the reference, the verdict).",
        "report": "Write report.html and summary.md (the verdict, every part, the floors) to this folder.",
        "progress": "A line per part on stderr [default: on].",
    }
    progress = "lines"

    def options(self) -> list:
        import click

        from mgpu_bench.results.probe import GPUS_HELP

        from .budget import DEFAULT_BUDGET
        from .contract import format_option
        from .result import DEFAULT_KEEP

        return [
            option("--budget", "budget_text", default=DEFAULT_BUDGET, show_default=True,
                   help="Wall time for the whole command, start-up included (e.g. 50s, 2m); slurmd kills a "
                        "HealthCheckProgram after 60 s, NHC a check after its TIMEOUT (30 s by default)."),
            option("--gpus", default=None, help=GPUS_HELP),
            option("--nproc", default=2, show_default=True, type=int,
                   help="CPU processes for the gloo allreduce when there is no GPU."),
            option("--drain", is_flag=True, help="On a problem, drain this node in Slurm with the reason."),
            option("--resume", is_flag=True,
                   help="On ok, resume this node in Slurm if mgpu-bench drained it (its reason starts with "
                        "\"mgpu-bench:\")."),
            format_option("--format", "format_name", default="text", show_default=True,
                          type=click.Choice(["text", "npd"]),
                          help="npd: stdout is one line of at most 80 bytes naming the GPU and the figure (the "
                               "condition message of a node-problem-detector custom plugin), or what was wrong "
                               "with the input (\"error: ...\"); the rest goes to stderr."),
            option("--keep", default=DEFAULT_KEEP, show_default=True, type=int,
                   help="Stored checks of this node kept in the history, the newest (older ones are removed as "
                        "each check is stored; baselines and the runs they reference always stay); 0 keeps all. "
                        "At one check every 10 minutes the default is about a week."),
        ]

    def configure(self, o: dict):
        import os

        from mgpu_bench.core import slurm
        from mgpu_bench.core.errors import InputError
        from mgpu_bench.machine import selection
        from mgpu_bench.results.probe import within

        from .budget import parse_budget
        from .contract import history_place
        from .result import CheckConfig

        budget_s = parse_budget(o["budget_text"])
        within("--nproc", o["nproc"], 2, 64, "gloo processes on this host")
        within("--keep", o["keep"], 0, 10_000_000, "0 keeps every stored check")
        if o["drain"] or o["resume"]:  # what scontrol is told to act on: this node, and no other
            try:
                slurm.one_node(slurm.this_node(), "SLURMD_NODENAME" if os.environ.get("SLURMD_NODENAME")
                               else "this host's name")
            except slurm.SlurmError as exc:
                raise InputError(str(exc)) from None
        n = selection.visible_gpu_count()
        if o["gpus"] is not None and not n:
            raise selection.gpus_without_gpus()
        gpus = tuple(selection.parse_gpus(o["gpus"], n)) if n else ()
        history_place()  # a daemon's HOME that holds no history: stored elsewhere, said
        return CheckConfig(budget_s=budget_s, gpus=gpus, nproc=o["nproc"], drain=o["drain"], resume=o["resume"],
                           format=o["format_name"], keep=o["keep"])

    def delegate(self, cfg) -> int | None:
        """The command itself: the measuring process within the budget, then the contract
        (contract.py). The measuring process (budget.CHILD_ENV set) runs here instead."""
        import os

        from .budget import CHILD_ENV

        if os.environ.get(CHILD_ENV):
            return None
        from .contract import run

        return run(cfg)

    def estimate(self, cfg) -> str | None:
        from .budget import expected_text

        return expected_text(cfg.budget_s, "gpu" if cfg.gpus else "cpu")

    def run(self, cfg, ctx):
        import os

        from mgpu_bench.core import slurm
        from mgpu_bench.results.document import Document

        from . import reference
        from .analyse import verdict_of
        from .budget import CHILD_ENV, Budget
        from .contract import hand_over, typed_command
        from .document import document
        from .measure import run_check

        node = slurm.this_node()
        plan = Budget.from_env(cfg.budget_s, "gpu" if cfg.gpus else "cpu")
        state_path = (os.environ.get(CHILD_ENV) or "").partition(" ")[2] or None

        def state(part: str) -> None:
            if state_path:
                with open(state_path, "w") as f:
                    f.write(part)

        ref, notes = reference.load(ctx.history, node)
        run = run_check(cfg, node, plan, ctx.environment, ctx.occupancy, ctx.progress.say_fn, state)
        state("done")
        run.notes += notes
        if cfg.gpus:
            from mgpu_bench.machine import hardware

            for model in sorted({d["model"] for d in run.devices}):
                if hardware.find_gpu(model) is None:
                    run.notes.append(f"{model} is not in mgpu_bench/data/hardware.json: no floors, judged by its "
                                     "reference alone")
        run.notes += [f"{p.part} skipped: {p.why}" for p in run.parts if p.status == "skipped"]
        verdict = verdict_of([p.to_dict() for p in run.parts], run.devices, ref, cfg.budget_s, plan.need_s())
        doc = Document.of(document(run, ref, verdict, ctx.environment, typed_command(ctx.command)))
        hand_over(doc, state_path)  # the verdict, for the command that started this process: this run's alone
        return doc

    def measured(self, doc: Mapping) -> bool:
        return "verdict" in doc  # an unknown verdict is stored too: the node's history says it could not tell


PROBE = CheckProbe()
