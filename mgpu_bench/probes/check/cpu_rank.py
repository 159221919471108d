"""The check's CPU ranks (cpu.py starts this once): `python -m mgpu_bench.probes.check.cpu_rank
WORLD PORT DEADLINE` (DEADLINE a time.time() value).

torch is imported once, then the process forks into WORLD ranks (as torch's DataLoader forks its
workers: one import, not one per rank, which on a 2-core host is most of the check). The ranks meet
at 127.0.0.1:PORT (rank 0 serves the store), each times an fp32 GEMM and a copy when its turn comes
(one rank at a time), then all run the allreduce, checked; rank 0 prints one JSON line: {"ranks":
[{"gemm": [s per GEMM, per burst], "copy": [...], "copy_bytes", "allreduce": {"seconds", "busbw",
"wrong"}}, ...], "import_s", "join_s"}. Every wait is bounded by the deadline.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    started = time.monotonic()
    world, port, end = int(argv[0]), int(argv[1]), float(argv[2])
    until = time.monotonic() + (end - time.time())

    import datetime

    import torch
    import torch.distributed as dist

    from mgpu_bench.results import torch_timing

    from .cpu import ALLREDUCE_BYTES, COPY_BYTES, GEMM_N

    imported = time.monotonic()
    rank, kids = 0, []
    for r in range(1, world):
        pid = os.fork()
        if pid == 0:
            rank, kids = r, []
            break
        kids.append(pid)
    torch.set_num_threads(1)  # a rank stands for one device: one core each, shared evenly
    wait = datetime.timedelta(seconds=max(1.0, until - time.monotonic()))
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, wait)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=wait)
    joined = time.monotonic()
    cpu = torch.device("cpu")
    out: dict = {"rank": rank}
    # the local work's share of what is left: GEMM and copy of every rank in turn, then the allreduce
    share = max(0.05, (until - time.monotonic()) / (3 * world + 2))
    for turn in range(world):
        dist.barrier()
        if turn == rank:
            out["gemm"] = torch_timing.gemm_seconds(GEMM_N, cpu, min(0.3, share), until=time.monotonic() + share)
            out["copy"], out["copy_bytes"] = torch_timing.copy_seconds(COPY_BYTES, cpu, min(0.1, share / 2),
                                                                       until=time.monotonic() + share / 2)
    dist.barrier()
    probe = torch_timing.allreduce(ALLREDUCE_BYTES, cpu, None, 2, 1)  # two calls: how long one takes
    each = max(1e-4, max(probe["seconds"]))
    iters = [max(3, min(20, int((until - time.monotonic()) / (4 * each))))]
    dist.broadcast_object_list(iters, src=0)  # every rank runs the same number of calls
    out["allreduce"] = torch_timing.allreduce(ALLREDUCE_BYTES, cpu, None, iters[0], 1)
    got = [None] * world if rank == 0 else None
    dist.gather_object(out, got, dst=0)
    dist.destroy_process_group()
    if rank != 0:
        os._exit(0)  # a forked rank: no interpreter clean-up of what it shares with rank 0
    for pid in kids:
        os.waitpid(pid, 0)
    print(json.dumps({"ranks": got, "import_s": imported - started, "join_s": joined - imported}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
