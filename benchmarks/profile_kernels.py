"""Records the CUDA kernels of a few training steps of the built-in GPT (torch.profiler's trace):
name, start and end in microseconds, for the CPU tests of the model verdict's kernel split.

    python3 benchmarks/profile_kernels.py OUT.json.gz [--model 350m] [--batch 8] [--seq 2048]

One GPU, bf16 autocast, fused AdamW, synthetic tokens: the loop `mgpu-bench model` times."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from mgpu_bench.probes.model.analyse import kernel_split
from mgpu_bench.workloads import gpt as models


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="350m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    a = ap.parse_args()
    dev = torch.device("cuda", 0)
    spec = models.get_model_spec(a.model)
    net = models.GPT(spec, device=dev)
    opt = models.make_optimizer(net)
    gen = torch.Generator(device=dev).manual_seed(0)

    def step():
        x, y = models.synthetic_batch(spec, a.batch, a.seq, dev, gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents") or []
    kernels = [[float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0), e.get("name")]
               for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    t0 = min(k[0] for k in kernels)
    kernels = [[round(s - t0, 3), round(e - t0, 3), n] for s, e, n in kernels]
    doc = {"model": a.model, "batch": a.batch, "seq": a.seq, "steps": 3, "gpu": torch.cuda.get_device_name(dev),
           "torch": torch.__version__, "kernels": kernels}
    with gzip.open(a.out, "wt") as f:
        json.dump(doc, f)
    split = kernel_split([tuple(k) for k in kernels])
    print(json.dumps({k: round(v, 6) for k, v in split.items()}), len(kernels), "kernels")


if __name__ == "__main__":
    main()
