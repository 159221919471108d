"""Figures of `mgpu-bench overlap` on a GPU node for RESULTS.md: a model run to set them beside,
then overlap at each size and each NCCL_MAX_CTAS (the CTAs, so SMs, NCCL may take; unset = NCCL's
choice), every run a fresh process.

    python benchmarks/overlap_check.py                        # 2 GPUs, 64M and 256M, NCCL_MAX_CTAS unset, 8, 16
    python benchmarks/overlap_check.py --sizes 256M --ctas -  # one run at NCCL's defaults
    python benchmarks/overlap_check.py --model-result m.json  # an existing model run instead of a new one

Prints one Markdown row per run: NCCL's channels, the allreduce's busbw alone and together, the
GEMM's TFLOP/s alone and together, both slowdowns with their noise, the median SM clock and mean
power of the GEMM alone and together, the share of the shorter stream that overlap hid; then each
run's line on the model step (does the interference explain its exposed communication?).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def cli(args: list[str], env: dict | None = None) -> None:
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", *args, "--no-progress", "--no-store"],
                          capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"mgpu-bench {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="2")
    ap.add_argument("--sizes", default="64M,256M")
    ap.add_argument("--shape", default="8192")
    ap.add_argument("--duration", default="5s")
    ap.add_argument("--ctas", default="-,8,16", help="NCCL_MAX_CTAS values, '-' for unset")
    ap.add_argument("--model-result", default=None, help="a model --json to set the figures beside")
    ap.add_argument("--model", default="350m")
    a = ap.parse_args()
    from mgpu_bench.probes.overlap import PROBE
    from mgpu_bench.probes.overlap import analyse as ov

    with tempfile.TemporaryDirectory() as tmp:
        model = a.model_result
        if model is None:
            model = str(Path(tmp) / "model.json")
            print(f"model {a.model} on 1 and {a.gpus} GPUs (the step to set the interference beside) ...", flush=True)
            cli(["model", "--model", a.model, "--scaling", f"1,{a.gpus}", "--steps", "15", "--json", model])
        print("| size | NCCL_MAX_CTAS | channels / SMs | busbw alone / together GB/s | allreduce slowdown | "
              "TFLOP/s alone / together | GEMM slowdown | SM MHz GEMM alone / together | W alone / together | "
              "hidden |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        steps = []
        for size in a.sizes.split(","):
            for ctas in a.ctas.split(","):
                env = {k: v for k, v in os.environ.items() if k != "NCCL_MAX_CTAS"}
                if ctas != "-":
                    env["NCCL_MAX_CTAS"] = ctas
                out = Path(tmp) / f"o-{size}-{ctas}.json"
                cli(["overlap", "--gpus", a.gpus, "--size", size, "--shape", a.shape, "--duration", a.duration,
                     "--model-result", model, "--json", str(out)], env)
                doc = json.loads(out.read_text())
                run = PROBE.load(doc)
                r = ov.analyse(run)

                def med(phase: str, key: str, scale: float, run=run) -> str:
                    vals = [t[key] for t in ov.phase_telemetry(run, phase) if t.get(key) is not None]
                    return f"{statistics.median(vals) / scale:.0f}" if vals else "-"

                print(f"| {size} | {ctas if ctas != '-' else 'unset'} | {r.channels} / {r.sm_count} | "
                      f"{r.comm_alone.rate / 1e9:.1f} / {r.comm_together.rate / 1e9:.1f} | {r.comm_slowdown.text()} | "
                      f"{r.gemm_alone.rate / 1e12:.1f} / {r.gemm_together.rate / 1e12:.1f} | {r.gemm_slowdown.text()} | "
                      f"{med('gemm_alone', 'sm_hz_median', 1e6)} / {med('together', 'sm_hz_median', 1e6)} | "
                      f"{med('gemm_alone', 'power_w_mean', 1)} / {med('together', 'power_w_mean', 1)} | "
                      f"{r.hidden:.0%} |", flush=True)
                said = ov.reference_text(run.model_ref, r, run.world, run.on_gpu) if run.model_ref else None
                steps.append(f"- {size}, NCCL_MAX_CTAS {ctas}: {said[1] if said else 'no model step'}")
        print()
        print("\n".join(steps))


if __name__ == "__main__":
    main()
