"""A plain, hand-written torch.distributed loop: the reference mgpu-bench's native figures are
compared with. One process per GPU (run under torchrun), fp32, out-of-place, CUDA events around
20 back-to-back iterations after 5 warm-up ones. Prints one JSON line per (op, size) on rank 0.

    torchrun --nproc-per-node 2 benchmarks/torch_reference.py 64M,1G
"""

# Each op's closure is called only within its own loop iteration, so binding the loop's
# variables late is what is meant here.
# ruff: noqa: B023

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
          "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
          "broadcast": lambda n: 1.0, "sendrecv": lambda n: 1.0}


def main() -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sizes = [int(s) for s in sys.argv[1].split(",")]
    ops = sys.argv[2].split(",") if len(sys.argv) > 2 else list(FACTOR)
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    for op in ops:
        for size in sizes:
            elems = size // 4 // n * n
            if op == "allreduce" or op == "broadcast" or op == "sendrecv":
                x, y = torch.randn(size // 4, device="cuda"), torch.empty(size // 4, device="cuda")
                nbytes = x.numel() * 4
            else:
                nbytes = elems * 4
            if op == "allreduce":
                fn = lambda: dist.all_reduce(x)
            elif op == "broadcast":
                fn = lambda: dist.broadcast(x, 0)
            elif op == "sendrecv":
                nxt, prv = (rank + 1) % n, (rank - 1) % n

                def fn():
                    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, y, prv)]):
                        w.wait()
            elif op == "allgather":
                x, y = torch.randn(elems // n, device="cuda"), torch.empty(elems, device="cuda")
                fn = lambda: dist.all_gather_into_tensor(y, x)
            elif op == "reducescatter":
                x, y = torch.randn(elems, device="cuda"), torch.empty(elems // n, device="cuda")
                fn = lambda: dist.reduce_scatter_tensor(y, x)
            else:  # alltoall
                x, y = torch.randn(elems, device="cuda"), torch.empty(elems, device="cuda")
                fn = lambda: dist.all_to_all_single(y, x)
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                fn()
            end.record()
            torch.cuda.synchronize()
            t = start.elapsed_time(end) / 1e3 / 20
            tt = torch.tensor([t], device="cuda")
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            if rank == 0:
                t = float(tt.item())
                print(json.dumps({"op": op, "bytes": nbytes, "time_s": t,
                                  "busbw": nbytes / t * FACTOR[op](n)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
