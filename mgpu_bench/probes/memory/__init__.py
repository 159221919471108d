"""`mgpu-bench memory`: fragmentation per allocator and pattern, HBM bandwidth, PyTorch's caching
allocator under several settings, the largest batch that fits.

    measure.py        the config, the native churn and HBM probes, the PyTorch workloads in children
    torch_memory.py   the PyTorch side: allocator workloads and the max-batch search (child processes)
    analyse.py        what fragmented, HBM against the datasheet; the suite's verdicts
    render.py         terminal tables
    report.py         plots, HTML page, Markdown, the suite section
    document.py       the result document, written and read back
    shape.py          its declared shape, checked on every read (no backend imported)
    headline.py       the metrics history compares
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import GPUS_HELP, PlanContext, Probe, Step, option, within

SUITE_MODEL = "350m"  # round 3's max-batch search on GPUs (the model probe's 350m)

HELP = """Device memory: fragmentation per allocator, HBM bandwidth, PyTorch's caching allocator.

\b
Churn probe (on by default): each --pattern runs seeded allocations under each --allocator
(cudaMalloc; async = a stream-ordered pool that keeps freed memory; vmm = cuMemCreate/cuMemMap,
the mechanism behind expandable segments) until --budget of the free memory is used; then
the largest block that can really be allocated is found by allocation: one probe at the free
memory less max(64 MiB, 0.1%), and if that fails a binary search to 0.25% of it, each probe
freed at once. fragmentation = 1 - largest block / free memory (for the pool, free includes
what it keeps reserved but unused). Allocation and free latency per size class come from the
pattern's own calls.

\b
--bandwidth: HBM copy (copy engine; SM kernel with 16-byte accesses), read-only and
write-only kernels over 4 GiB buffers; TB/s = (bytes read + bytes written) / median time.
--torch-allocators default,expandable,async,split512 runs a variable-sequence-length GPT
training workload under each PYTORCH_CUDA_ALLOC_CONF setting in its own process.
--max-batch MODEL finds the largest per-GPU batch (forward, backward, optimizer) with and
without activation checkpointing, for any workload `model --model` takes (the GPT sizes,
torchvision:NAME, hf:NAME, hf:path/config.json, module:function).
"""


class MemoryProbe(Probe):
    name = "memory"
    summary = "fragmentation per allocator, HBM bandwidth, torch allocator"
    help = HELP
    payload = "hbm"
    outputs = ("json", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the result document.",
        "report": "Write PNGs (fragmentation, HBM, reserved vs allocated over the workload), report.html, "
                  "summary.md.",
    }
    progress = "status"

    def options(self) -> list:
        return [
            option("--pattern", "pattern_text", default="all", show_default=True,
                   help="interleaved, grow-shrink, small-between-large, or all."),
            option("--allocator", "allocator_text", default="all", show_default=True,
                   help="cudaMalloc, async, vmm, or all."),
            option("--churn/--no-churn", default=True, show_default=True, help="Run the native churn probe."),
            option("--budget", default=0.9, show_default=True, type=float,
                   help="Share of free memory a pattern may allocate (near the limit fragmentation shows)."),
            option("--seed", default=20261129, show_default=True, type=int),
            option("--bandwidth", is_flag=True, help="Also measure HBM bandwidth."),
            option("--torch-allocators", "torch_text", default=None,
                   help="PyTorch allocator settings to compare: default, expandable, async, split512 or raw conf "
                        "strings."),
            option("--model", "torch_model", default="125m", show_default=True,
                   help="GPT size for --torch-allocators (its steps vary the sequence length)."),
            option("--batch-size", "torch_batch", default=8, show_default=True, type=int,
                   help="Workload batch per GPU."),
            option("--seq-lens", default="256-2048", show_default=True,
                   help="Workload sequence lengths (varied per step)."),
            option("--steps", default=20, show_default=True, type=int, help="Workload steps per setting."),
            option("--max-batch", "max_batch_model", default=None,
                   help="Find the largest batch that fits for this workload: tiny..1.3b, torchvision:NAME, hf:NAME, "
                        "hf:path/config.json, module:function."),
            option("--seq-len", default=None, type=int,
                   help="Tokens per sample for --max-batch [default: 2048, at most the model's positions (tiny: 256; hf: its own)]."),
            option("--image-size", default=None, type=int,
                   help="Pixels per side for --max-batch of a torchvision model [default: 224]."),
            option("--timeout", default=600.0, show_default=True, type=float, help="Seconds per child process."),
            option("--gpus", default=None, help=GPUS_HELP),
        ]

    def configure(self, o: dict):
        from mgpu_bench.machine import selection

        from .measure import MemoryConfig, parse_allocators, parse_patterns

        patterns = parse_patterns(o["pattern_text"])
        allocators = parse_allocators(o["allocator_text"])
        if not (0.05 <= o["budget"] <= 0.99):
            raise InputError("--budget must be between 0.05 and 0.99 (a share of the free memory)")
        within("--batch-size", o["torch_batch"], 1, 1_000_000, "samples per workload step")
        within("--steps", o["steps"], 1, 100_000, "workload steps per setting")
        if o["seq_len"] is not None:
            within("--seq-len", o["seq_len"], 16, 1_000_000, "tokens per sample")
        if not (0 < o["timeout"] <= 86400):
            raise InputError("--timeout must be a positive number of seconds (at most a day)")
        settings: tuple[str, ...] = ()
        batch_of: dict = {"max_batch_model": None, "max_batch_seq": None}  # --max-batch's workload, resolved
        if o["torch_text"] or o["max_batch_model"]:
            from mgpu_bench.workloads import gpt as models

            from . import torch_memory

            if o["torch_text"]:
                settings = tuple(torch_memory.parse_settings(o["torch_text"]))
                spec = models.get_model_spec(o["torch_model"])
                longest = max(torch_memory.parse_seq_lens(o["seq_lens"]))
                if longest > spec.max_seq:
                    raise InputError(f"--seq-lens reaches {longest} tokens; {spec.name} takes at most {spec.max_seq}")
            if o["max_batch_model"]:
                from mgpu_bench import workloads

                wl = workloads.resolve(o["max_batch_model"], seq_len=o["seq_len"], image_size=o["image_size"])
                batch_of = {"max_batch_model": wl.key, "max_batch_seq": wl.seq_len, "max_batch_image": wl.image_size,
                            "max_batch_workload": wl.text if wl.text != wl.key else None}
        if not (o["churn"] or o["bandwidth"] or settings or o["max_batch_model"]):
            raise InputError("nothing to run: drop --no-churn, or add --bandwidth, --torch-allocators or --max-batch")
        gpu_list, _devices = selection.require_gpus("memory", o["gpus"])
        return MemoryConfig(gpus=tuple(gpu_list), patterns=patterns, allocators=allocators, churn=o["churn"],
                            budget=o["budget"], seed=o["seed"], bandwidth=o["bandwidth"], torch_settings=settings,
                            torch_model=o["torch_model"], torch_batch=o["torch_batch"], torch_seq_lens=o["seq_lens"],
                            torch_steps=o["steps"], timeout_s=o["timeout"], **batch_of)

    def run(self, cfg, ctx):
        from mgpu_bench import _native
        from mgpu_bench.results.document import Document

        from .document import document
        from .measure import run_memory

        devices = [_native.device_info(g) for g in cfg.gpus]
        run = run_memory(cfg, devices, ctx.progress.say_fn)
        return Document.of(document(run, ctx.environment, ctx.command), run)

    def measured(self, doc: Mapping) -> bool:
        return any(doc.get(k) for k in ("churn", "hbm", "torch", "max_batch"))

    def failure(self, doc: Mapping) -> str | None:
        run = self.load(doc)
        failed = [k for k, d in run.torch.items() if d.get("error")] + [
            f"max batch ({'with' if m['checkpointing'] else 'without'} checkpointing)" for m in run.max_batch
            if m.get("error")]
        return f"failed: {', '.join(failed)} (see the findings)" if failed else None

    def render(self, doc: Mapping, console) -> None:
        from .render import render_terminal

        run = self.load(doc)
        render_terminal(run, console)
        console.print(f"memory: {run.wall_seconds:.1f} s wall", highlight=False)

    def suite_steps(self, plan: PlanContext) -> list[Step]:
        # suite --model: the user's workload at its default size; else the 350m GPT at seq 2048
        mine = ("--max-batch", plan.model) if plan.model else None
        if not plan.ngpu:
            return [Step(1, 20, "memory", "HBM bandwidth and fragmentation", ("memory", "--bandwidth")),
                    Step(3, 10, "max-batch", "largest batch that fits",
                         ("memory", "--no-churn", *(mine or ("--max-batch", "tiny"))))]
        q = plan.quick
        return [Step(1, 20, "memory", "HBM bandwidth and fragmentation",
                     ("memory", "--bandwidth", "--pattern", "grow-shrink" if q else "all", "--allocator",
                      "cudaMalloc,async" if q else "all", *plan.gpus_args())),
                Step(3, 10, "max-batch", "largest batch that fits",
                     ("memory", "--no-churn", *(mine or ("--max-batch", SUITE_MODEL, "--seq-len", "2048")),
                      *plan.gpus_args(first=True)))]


PROBE = MemoryProbe()
