"""The check's CPU share: --nproc gloo processes stand in for a node's GPUs (as fleet's CPU ranks
do), so that a machine without GPUs runs the whole check end to end.

Each rank (cpu_rank.py: torch imported once, then forked into the ranks) times an fp32 GEMM and a copy in turn, one rank at
a time (ranks that share the host's cores would otherwise measure the scheduler), then all ranks
run an allreduce, checked. The ranks meet at a TCPStore on 127.0.0.1 that rank 0 serves; each
bounds its work by the part's slot, and rank 0 prints every rank's figures as one JSON line;
ranks still running when the slot ends are killed and the part is "hung".
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

from mgpu_bench.results.torch_timing import typical

from .budget import Budget
from .result import CheckRun, Part

GEMM_N = 256  # fp32 256^3: 34 MFLOP, a few milliseconds on one core
COPY_BYTES = 32 << 20
ALLREDUCE_BYTES = 1 << 20


def ranks(run: CheckRun, budget: Budget, part: Part) -> None:
    import signal

    from mgpu_bench.core import children, launch

    until = budget.slot("ranks")
    n = run.config.nproc
    end = time.time() + (until - time.monotonic())
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    # a session of its own: the ranks it forks are stopped with it, as one process group
    proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.probes.check.cpu_rank", str(n), str(launch.free_port()),
                             repr(end)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=children.child_env(env, mode="ignore"),  # the check stops them; Ctrl-C is its
                            start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=max(0.1, until - time.monotonic()))
    except subprocess.TimeoutExpired:
        out, err, timed_out = "", "", True
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # a forked rank left behind
    line = next((x for x in reversed(out.splitlines()) if x.startswith("{")), None)
    if line is None:  # hung only when its slot ran out; a process that died measured nothing (unknown)
        if timed_out:
            part.status, part.why = "hung", f"the {n} CPU ranks did not finish within the part's slot"
        else:
            said = " ".join(err.strip().splitlines()[-1:]) or _ended(proc.returncode)
            part.status, part.why = "error", f"the CPU ranks failed before giving their figures: {said[:300]}"
        return
    got = json.loads(line)
    results = {r: res for r, res in enumerate(got["ranks"])}
    flops = 2.0 * GEMM_N**3
    for r, res in sorted(results.items()):
        gemm, copy = res.get("gemm") or [], res.get("copy") or []
        if gemm:
            part.figures.append({"device": f"rank{r}", "kind": "gemm", "value": flops / typical(gemm, False),
                                 "unit": "FLOP/s", "samples": [flops / s for s in gemm],
                                 "detail": {"shape": f"{GEMM_N}x{GEMM_N}x{GEMM_N}", "dtype": "fp32"}})
        if copy:
            moved = res["copy_bytes"]
            part.figures.append({"device": f"rank{r}", "kind": "copy", "value": moved / typical(copy, False),
                                 "unit": "B/s", "samples": [moved / s for s in copy], "detail": {"bytes": COPY_BYTES}})
    reduced = [res["allreduce"] for res in results.values() if res.get("allreduce")]
    if reduced and len(reduced) == n:
        slowest = min(reduced, key=lambda x: x["busbw"])
        factor = 2 * (n - 1) / n
        part.figures.append({"device": "node", "kind": "allreduce", "value": slowest["busbw"], "unit": "B/s",
                             "samples": [ALLREDUCE_BYTES * factor / s for s in slowest["seconds"] if s > 0],
                             "detail": {"bytes": ALLREDUCE_BYTES, "ranks": n, "backend": "gloo",
                                        "wrong": sum(x["wrong"] for x in reduced), "iters": len(slowest["seconds"])}})
    part.facts["ranks"] = {"import_s": got.get("import_s"), "join_s": got.get("join_s")}


def _ended(code: int | None) -> str:
    """How a process ended, in words: "killed by SIGKILL", "exit code 3"."""
    import signal

    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
