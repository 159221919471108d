"""Determinism of `mgpu-bench sdc` on real GPUs: the GEMM hash of every repetition on every GPU,
whether they are all one, and the time each check takes.

    python benchmarks/sdc_determinism.py --repetitions 100 [--gpus 2] [--shape 8192] [--gemms 8]

Per GPU it prints the hash of its first GEMM, the distinct hashes seen over all repetitions (each
repetition runs --gemms GEMMs, every output hashed on the GPU and compared with the first), the
GEMM rate (TFLOP/s = 2 M N K per GEMM / GPU seconds of the matmuls, median over repetitions), the
HBM check rate (GB/s = bytes written + bytes read back / GPU seconds of the two kernels, median)
and the allreduce check's seconds; then one line saying whether every hash on every GPU is the
same. --every prints each repetition's hash per GPU. Exit code 1 when any two hashes differ or a
check found a wrong element.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from mgpu_bench.core.errors import InputError
from mgpu_bench.machine.selection import require_gpus
from mgpu_bench.probes.sdc import analyse
from mgpu_bench.probes.sdc import measure as sdc
from mgpu_bench.results.sizes import parse_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--gpus", default=None, help="as mgpu-bench's --gpus [default: all visible]")
    ap.add_argument("--repetitions", type=int, default=100)
    ap.add_argument("--gemms", type=int, default=8, help="GEMMs per GPU and repetition")
    ap.add_argument("--shape", default="8192")
    ap.add_argument("--dtype", default="bf16", choices=sdc.DTYPES)
    ap.add_argument("--memory-fraction", type=float, default=0.9)
    ap.add_argument("--comm-size", default="256M", help="0: no allreduce")
    ap.add_argument("--every", action="store_true", help="print each repetition's hash per GPU")
    args = ap.parse_args()
    try:
        gpus, devices = require_gpus("sdc", args.gpus)
    except InputError as exc:
        print(f"sdc_determinism: {exc}", file=sys.stderr)
        return 2
    cfg = sdc.SdcConfig(gpus=tuple(gpus), dtype=args.dtype, shape=sdc.parse_shape(args.shape), gemms=args.gemms,
                        repetitions=args.repetitions, memory_fraction=args.memory_fraction,
                        comm_bytes=parse_size(args.comm_size))
    run = sdc.run_sdc(cfg, devices, lambda text: print(f"  {text}", file=sys.stderr, flush=True))
    if run.stopped:
        print(f"stopped: {run.stop_message}")
    a = run.algo or {}
    print(f"{cfg.dtype} GEMM {sdc.shape_text(cfg.shape)}, seed {cfg.seed}; pinned cuBLASLt algo {a.get('algo_id')} "
          f"tile {a.get('tile')} stages {a.get('stages')} splitK {a.get('split_k')} reduction {a.get('reduction')} "
          f"cluster {a.get('cluster')} workspace {a.get('workspace')} B; {run.repetitions} repetition(s), "
          f"{run.check_seconds:.1f} s of checks, {run.wall_seconds:.1f} s wall")
    seen: set[str] = set()
    for d in devices:
        g = d["index"]
        gemm, hbm, coll = (run.checks_of(g, w) for w in ("gemm", "hbm", "collective"))
        hashes = {c.hash for c in gemm if c.hash}
        seen |= hashes
        tflops = [c.count * cfg.gemm_flops / c.seconds / 1e12 for c in gemm if c.seconds > 0]
        gbs = [2 * c.bytes / c.seconds / 1e9 for c in hbm if c.seconds > 0]
        print(f"GPU {g} ({d['name']}, {d['multiprocessors']} SMs): first hash {run.references.get(g)}; "
              f"{sum(c.count for c in gemm)} GEMMs in {len(gemm)} repetitions, {len(hashes)} distinct hash(es)"
              f"{'' if len(hashes) == 1 else ': ' + ', '.join(sorted(hashes))}")
        if tflops:
            print(f"  GEMM {statistics.median(tflops):.1f} TFLOP/s median (min {min(tflops):.1f}, "
                  f"max {max(tflops):.1f}); {1e3 * cfg.gemm_flops / statistics.median(tflops) / 1e12:.3f} ms per GEMM")
        if gbs:
            print(f"  HBM check {hbm[0].bytes / 2**30:.1f} GiB: {statistics.median(gbs):.0f} GB/s median written+read "
                  f"(min {min(gbs):.0f}, max {max(gbs):.0f}); {1e3 * statistics.median(c.seconds for c in hbm):.1f} "
                  f"ms per pass; {sum(c.wrong for c in hbm)} wrong word(s)")
        if coll:
            print(f"  allreduce check {coll[0].bytes / 2**20:g} MiB: "
                  f"{1e3 * statistics.median(c.seconds for c in coll):.2f} ms median; "
                  f"{sum(c.wrong for c in coll)} wrong element(s)")
        if args.every:
            for c in gemm:
                print(f"  repetition {c.repetition}: {c.count} GEMMs, hash {c.hash}{' DIFFERS' if c.wrong else ''}")
    for f in analyse.findings(run):
        print(f"{f.severity}: {f.text}")
    same = len(seen) == 1 and not any(c.wrong for c in run.checks)
    print(f"identical: {'yes' if same else 'NO'}: {len(seen)} distinct GEMM hash(es) over {len(devices)} GPU(s) x "
          f"{run.repetitions} repetition(s) x {cfg.gemms} GEMMs")
    return 0 if same and not run.stopped else 1


if __name__ == "__main__":
    sys.exit(main())
