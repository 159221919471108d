"""`mgpu-bench fleet`: which node, GPU, rail or link of a cluster is the bad one.

Started by the cluster's launcher (srun, torchrun across nodes, mpirun), one process per GPU, rank
0 gathering everything through the process group. A node pass (GEMM, copy bandwidth and health on
every GPU at once, each node's own allreduce), a link pass (rounds of disjoint node pairs: per
rail sendrecv and the pair's allreduce), the world allreduce, and isolation of a slow world by
halves; each figure judged against the fleet's median, per GPU model.

    schedule.py    the pairing rounds and the isolation splits (pure; why this schedule)
    measure.py     the phases on torch.distributed (NCCL on GPUs, gloo on CPU processes)
    analyse.py     suspects: node, GPU, rail, link, health, no answer; the ranked node table
    render.py      terminal tables
    report.py      heatmap, HTML page, Markdown
    document.py    the fleet document and one per node for the history
    shape.py       its declared shape, checked on every read (no backend imported)
    headline.py    the metrics history compares, per node
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.probe import OK, Finding, Probe, option, within

HELP = """Finds the bad node, GPU, rail or link of a cluster: started by its launcher, one process per
GPU, all nodes at once.

\b
  srun --nodes 64 --ntasks-per-node 8 --gpus-per-node 8 mgpu-bench fleet --exclude-file drain.txt
  torchrun --nnodes 4 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m mgpu_bench.cli fleet

\b
Node pass: on every GPU at once a bf16 matmul (--gemm-n), a device copy (--copy-size) and the
GPU's health (ECC, retired or remapped memory, PCIe against its maximum, NVLinks, power limit,
other processes); each node's allreduce among its own ranks. (CPU processes, gloo, take turns:
they share the host's cores.) Link pass: rounds of disjoint node
pairs, every pair at once; per rail (local rank r of node A with local rank r of node B) a
sendrecv of --size, and the pair's allreduce; max(4, log2 N) rounds by default, each node meeting
a different partner each round. Then the world allreduce; when it is slow and no node explains
it, halves of the world are measured until the slow group is found.

\b
Each figure is judged against the fleet's median among nodes of the same GPU model: slow is
below it by more than max(floor, 3 x the fleet's noise) (floors: 5% for GEMM and copies, 15%
for links). A node slow in most of its pairings is the suspect node; one rail slow in most of
them is its NIC; a pairing slow while both nodes are fine elsewhere is the link between them.
The nodes to drain go to --exclude-file in Slurm's hostlist syntax (sbatch --exclude=$(cat
FILE)); with --drain rank 0 drains them in Slurm itself (scontrol update NodeName=NODE
State=DRAIN Reason="mgpu-bench: fleet: <the deciding figure>"; root or SlurmUser; `mgpu-bench
check --resume` on the node resumes it once it passes). Each node's figures are stored in the
history under its own host, and with --prometheus each node writes its own textfile. Exit code
1 when a node is to be drained.
"""


class FleetProbe(Probe):
    name = "fleet"
    cpu = "under torchrun"
    summary = "the bad node, GPU, rail or link of a cluster, under its launcher"
    help = HELP
    payload = "nodes"
    outputs = ("json", "report")
    output_help: ClassVar[Mapping[str, str]] = {
        "json": "Write the fleet document (every node's and pairing's raw seconds, the verdicts).",
        "report": "Write the node table, the pairings' heatmap, report.html and summary.md.",
        "progress": "A line per phase and round on stderr (rank 0) [default: on].",
    }
    progress = "lines"
    per_node_prometheus = True

    def options(self) -> list:
        return [
            option("--size", "size_text", default=None,
                   help="Bytes per sendrecv and allreduce (K/M/G = 1024^n) [default: 256M on GPUs, 1M on CPU]."),
            option("--iters", default=None, type=int,
                   help="Timed iterations of each collective [default: 20 on GPUs, 10 on CPU]."),
            option("--warmup", default=2, show_default=True, type=int, help="Untimed iterations first."),
            option("--rounds", default=0, show_default=True, type=int,
                   help="Link-pass rounds [0: max(4, ceil(log2 nodes)), at most nodes - 1]."),
            option("--seed", default=0, show_default=True, type=int, help="The pairing schedule's seed."),
            option("--concurrency", default=0, show_default=True, type=int,
                   help="Pairs measured at once in a round [0: all of them; fewer where nodes share a host, a "
                        "switch uplink or, emulated, the same CPU cores]."),
            option("--phases", "phases_text", default="node,links,world", show_default=True,
                   help="Which of node, links and world to run."),
            option("--gemm-n", default=None, type=int, help="N of the N^3 matmul [default: 8192 on GPUs, 256 on CPU]."),
            option("--copy-size", "copy_text", default=None, help="Bytes per device copy [default: 1G on GPUs, 32M on CPU]."),
            option("--timeout", default=300.0, show_default=True, type=float,
                   help="Seconds any phase may take (and ranks have to arrive); a node past it is no answer."),
            option("--expect", "expect_text", default=None,
                   help="The nodes that should answer, in Slurm's hostlist syntax (gpu[01-64]): one that never "
                        "starts is named and drained."),
            option("--exclude-file", default=None,
                   help="Write the nodes to drain here, in Slurm's hostlist syntax (an empty file when none)."),
            option("--drain", is_flag=True,
                   help="Drain the nodes to drain in Slurm: rank 0 runs scontrol update NodeName=NODE State=DRAIN "
                        "Reason=\"mgpu-bench: fleet: ...\" for each (root or SlurmUser)."),
        ]

    def configure(self, o: dict):
        from mgpu_bench.core import launch
        from mgpu_bench.core.paths import check_writable
        from mgpu_bench.machine import selection
        from mgpu_bench.results.sizes import parse_size

        from .measure import FleetConfig

        if not (0 < o["timeout"] <= 1e5):
            raise InputError("--timeout must be a positive number of seconds (at most 1e5)")
        phases = tuple(p.strip() for p in o["phases_text"].split(",") if p.strip())
        if not phases or set(phases) - {"node", "links", "world"}:
            raise InputError(f"--phases '{o['phases_text']}': name node, links and/or world")
        expect = launch.parse_hostlist(o["expect_text"]) if o["expect_text"] else []
        on_gpu = selection.visible_gpu_count() > 0
        size = parse_size(o["size_text"] or ("256M" if on_gpu else "1M"))
        copy = parse_size(o["copy_text"] or ("1G" if on_gpu else "32M"))
        iters = o["iters"] if o["iters"] is not None else (20 if on_gpu else 10)
        gemm_n = o["gemm_n"] or (8192 if on_gpu else 256)
        if not (4 <= size <= 1 << 34 and 4 <= copy <= 1 << 36):
            raise InputError("--size and --copy-size must be between 4 bytes and 16G (64G for copies)")
        within("--iters", iters, 1, 100_000)
        within("--warmup", o["warmup"], 0, 1000)
        within("--rounds", o["rounds"], 0, 10_000)
        within("--concurrency", o["concurrency"], 0, 100_000)
        if not (16 <= gemm_n <= 65536):
            raise InputError("--gemm-n must be between 16 and 65536")
        le = launch.detect()
        if le is None:
            raise InputError("fleet runs under the cluster's launcher, one process per GPU: srun ... mgpu-bench fleet, "
                             "or torchrun --nnodes N --nproc-per-node G -m mgpu_bench.cli fleet (README: Finding the bad node)")
        nodes = max(le.nnodes, len(expect))
        if nodes < 2:
            raise InputError(f"fleet compares nodes and this {le.launcher} job has one: start it on two or more "
                             "(for one node, mgpu-bench suite)")
        if le.rank == 0:
            check_writable(o["exclude_file"], "--exclude-file")
        return FleetConfig(size=size, iters=iters, warmup=o["warmup"], rounds=o["rounds"], seed=o["seed"],
                           timeout_s=o["timeout"], gemm_n=gemm_n, copy_bytes=copy, phases=phases,
                           device="cuda" if on_gpu else "cpu", exclude_file=o["exclude_file"], expect=tuple(expect),
                           concurrency=o["concurrency"], drain=o["drain"])

    def run(self, cfg, ctx):
        from dataclasses import replace

        from mgpu_bench.core import launch
        from mgpu_bench.results.document import Document

        from .analyse import judge
        from .document import as_doc, document
        from .measure import run_fleet

        cfg = replace(cfg, prometheus=ctx.prometheus)

        def decide(r):
            _expected(cfg, r)
            return judge(as_doc(r))

        run = run_fleet(cfg, launch.detect(), ctx.progress.say_fn, decide)
        if run.rank != 0:  # rank 0 holds the pass; the others say only how theirs ended
            run.verdicts = {"suspects": [], "drain": [], "stats": {"gpu": {}}, "world": {}}
        else:
            _expected(cfg, run)
        doc = document(run, ctx.environment, ctx.command)
        if run.rank == 0 and cfg.exclude_file:
            names = {n["index"]: n["host"] if "#" not in n["node"] else n["node"] for n in run.nodes}
            hosts = launch.compress_hostlist([names[i] for i in doc["verdicts"]["drain"]])
            try:
                from mgpu_bench.core.paths import write_output

                write_output(cfg.exclude_file, hosts + ("\n" if hosts else ""))
            except OSError as exc:
                doc["notes"].append(f"could not write {cfg.exclude_file}: {exc.strerror or exc}")
        if run.rank == 0 and cfg.drain and run.stopped != "interrupted":
            from .contract import drain

            doc["drained"] = drain(doc)
            doc["notes"] += [f"could not drain {d['node']}: {d['error']}" for d in doc["drained"] if d["error"]]
        return Document.of(doc, run)

    def measured(self, doc: Mapping) -> bool:
        return bool(doc.get("nodes")) and bool((doc.get("verdicts") or {}).get("stats"))

    def records(self, doc: Mapping) -> list[Mapping]:
        from .document import node_documents

        return [doc, *node_documents(doc)] if doc.get("scope") != "node" else [doc]

    def findings(self, doc: Mapping) -> list[Finding]:
        suspects = (doc.get("verdicts") or {}).get("suspects") or []
        out = [Finding(s["severity"], s["text"]) for s in suspects]
        if not out and doc.get("scope") != "node" and doc.get("nodes"):
            out.append(Finding(OK, f"{len(doc['nodes'])} nodes, no suspect: every figure within its threshold of the "
                                   "fleet's median"))
        return out

    def failure(self, doc: Mapping) -> str | None:
        from mgpu_bench.core.launch import compress_hostlist

        drain = (doc.get("verdicts") or {}).get("drain") or []
        if not drain or doc.get("scope") == "node":
            return None
        names = {n["index"]: n["node"] for n in doc.get("nodes") or []}
        return f"{len(drain)} node(s) to drain: {compress_hostlist([names[i] for i in drain])}"

    def render(self, doc: Mapping, console) -> None:
        from .render import render_terminal

        render_terminal(doc, console)
        for d in doc.get("drained") or []:
            if not d.get("error"):
                console.print(f"drained {d['node']} in Slurm: {d['reason']}", highlight=False, soft_wrap=True)
        secs = ", ".join(f"{k} {v:.1f} s" for k, v in (doc.get("phase_seconds") or {}).items())
        console.print(f"fleet: {doc.get('wall_seconds', 0.0):.1f} s wall ({secs})", highlight=False)


def _expected(cfg, run) -> None:
    """Nodes --expect names that no rank came from: listed as no answer (once)."""
    seen = {n["node"] for n in run.nodes} | {n["host"] for n in run.nodes}
    for host in cfg.expect:
        if host not in seen:
            run.nodes.append({"index": len(run.nodes), "node": host, "host": host, "node_rank": None, "ranks": [],
                              "locals": [], "model": None, "gpus": [], "answered": False,
                              "lost": "never started; --expect names it"})
            seen.add(host)


PROBE = FleetProbe()
