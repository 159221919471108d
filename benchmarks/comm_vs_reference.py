"""Measures mgpu-bench's native comm sweeps against the reference figures (shared ANCHORS.md,
nccl-tests on the same 2x H200 machine) and against a plain torch.distributed loop run in the same
session. Prints a Markdown table for benchmarks/RESULTS.md; the raw result files go to OUTDIR.

    python benchmarks/comm_vs_reference.py OUTDIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mgpu_bench.machine.env import fingerprint
from mgpu_bench.probes.comm import document as comm_document
from mgpu_bench.probes.comm import measure as comm
from mgpu_bench.probes.comm import plan as comm_plan
from mgpu_bench.results import document
from mgpu_bench.results.measurement import TimingOptions

# nccl-tests busbw, GB/s, 2x H200 NV18, fp32 out-of-place, NCCL 2.28.9, NVLS off (ANCHORS.md).
ANCHORS = {
    "allreduce": {1 << 20: 35.7, 64 << 20: 266.9, 1 << 30: 328.2, 8 << 30: 346.8},
    "allgather": {1 << 20: 21.3, 64 << 20: 212.6, 1 << 30: 270.1},
    "reducescatter": {1 << 20: 20.0, 64 << 20: 208.1, 1 << 30: 277.8},
    "alltoall": {1 << 20: 20.0, 64 << 20: 244.0, 1 << 30: 331.5},
    "broadcast": {1 << 20: 38.1, 64 << 20: 327.6, 1 << 30: 364.8},
    "sendrecv": {1 << 20: 53.0, 64 << 20: 271.7, 1 << 30: 360.3},
}


def sweep(ops, sizes, **timing):
    cfg = comm_plan.CommConfig(ops=tuple(ops), dtype="fp32", redop="sum", sizes=tuple(sizes), inplace=(False,),
                          timing=TimingOptions(**timing))
    return comm.run_comm(cfg)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    env = fingerprint()
    gpus = env["gpus"]
    print(f"# {time.strftime('%Y-%m-%d')} {len(gpus)}x {gpus[0]['name'] if gpus else '?'}, driver "
          f"{env['nvidia_driver']}, CUDA {env['cuda_driver']}, NCCL {env['nccl']}, torch {env['torch']}, "
          f"NCCL_NVLS_ENABLE={env['env'].get('NCCL_NVLS_ENABLE')}")

    # 1. Native busbw at the anchor sizes (>= 64 MiB is the 2% target).
    sizes = [1 << 20, 64 << 20, 1 << 30]
    run = sweep(list(ANCHORS), sizes)
    document.write_json(out / "native.json", comm_document.result_document(run, env))
    big = sweep(["allreduce"], [8 << 30])
    native = {(m.spec.op, m.spec.bytes): m for m in run.measurements + big.measurements}

    # 2. The plain torch.distributed loop, same session, same sizes.
    ref = subprocess.run(
        ["torchrun", "--nproc-per-node", str(len(gpus)), str(Path(__file__).with_name("torch_reference.py")),
         ",".join(str(s) for s in sizes)], capture_output=True, text=True, timeout=300, check=False)
    torch_ref = {}
    for line in ref.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            torch_ref[(d["op"], d["bytes"])] = d["busbw"] / 1e9
    if ref.returncode != 0:
        print("torch reference failed:", ref.stderr[-2000:])

    print("\n| op | size | mgpu-bench busbw GB/s | reference (nccl-tests) | diff | plain torch loop | diff | #wrong |")
    print("|---|---|---|---|---|---|---|---|")
    for op, ref_sizes in ANCHORS.items():
        for size, anchor in ref_sizes.items():
            key = next((k for k in native if k[0] == op and abs(k[1] - size) <= 64), None)
            if key is None:
                continue
            m = native[key]
            bw = m.busbw / 1e9
            tr = next((v for (o, b), v in torch_ref.items() if o == op and abs(b - size) <= 64), None)
            tr_txt = f"{tr:.1f} | {100 * (bw - tr) / tr:+.1f}%" if tr else "n/a | "
            print(f"| {op} | {size >> 20} MiB | {bw:.1f} | {anchor:.1f} | {100 * (bw - anchor) / anchor:+.1f}% | "
                  f"{tr_txt} | {m.total_wrong} |")

    # 2b. The tool's own torch backend (torch.distributed + NCCL, one process per GPU): the
    # framework's overhead beside the native figures.
    tb = comm.run_comm(comm_plan.CommConfig(ops=("allreduce", "allgather"), dtype="fp32", redop="sum",
                                       sizes=(64 << 20, 1 << 30), inplace=(False,), backend="torch"))
    print("\n| op | size | native busbw GB/s | --backend torch busbw GB/s | diff |")
    print("|---|---|---|---|---|")
    for m in tb.measurements:
        nat = native.get((m.spec.op, m.spec.bytes))
        if nat is not None:
            print(f"| {m.spec.op} | {m.spec.bytes >> 20} MiB | {nat.busbw / 1e9:.1f} | {m.busbw / 1e9:.1f} | "
                  f"{100 * (m.busbw - nat.busbw) / nat.busbw:+.1f}% |")
    if tb.stopped:
        print("torch backend stopped:", tb.stop_message)

    # 3. Small-message latency, 8 bytes, with and without CUDA graphs.
    lat = sweep(["allreduce"], [8])
    lat_graph = sweep(["allreduce"], [8], graph=True)
    print(f"\n8-byte allreduce: {lat.measurements[0].time_s * 1e6:.2f} us (stream), "
          f"{lat_graph.measurements[0].time_s * 1e6:.2f} us (--graph); median of samples "
          f"{lat.measurements[0].median_s * 1e6:.2f} / {lat_graph.measurements[0].median_s * 1e6:.2f} us")

    # 4. Wall time of the whole command: 1M-1G allreduce, in- and out-of-place, checked.
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "comm", "--ops", "allreduce", "--sizes", "1M-1G",
                           "--json", str(out / "sweep.json")], capture_output=True, text=True, timeout=300,
                          check=False)
    wall = time.perf_counter() - t0
    doc = json.loads((out / "sweep.json").read_text())
    print(f"\n`mgpu-bench comm --ops allreduce --sizes 1M-1G` (22 measurements, checked): {wall:.2f} s process wall "
          f"(Python start and imports included), {doc['wall_seconds']:.2f} s from communicator set-up to the "
          f"last result; exit {proc.returncode}")
    print("\n```\n" + proc.stdout[-3000:] + "```")


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
