"""A plain hand-written training loop of a torchvision model, for `mgpu-bench model --model
torchvision:NAME`'s overhead target: the same model (weights=None), batch, image size,
channels-last memory format, cuDNN autotuning, bf16 autocast and SGD with momentum (torchvision's
reference recipe: lr 0.1, momentum 0.9, weight decay 1e-4), random images and labels made on the
device each step; no events, no phases: host clock around the timed steps with one synchronize
at each end.

    python benchmarks/plain_vision_loop.py --model resnet50 --batch-size 256 --image-size 224 --steps 30

Set beside it: mgpu-bench model --model torchvision:resnet50 --batch-size 256 --gpus 1
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
import torchvision


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(1234)
    model = torchvision.models.get_model(args.model, weights=None).to(dev, memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    gen = torch.Generator(device=dev).manual_seed(1234)
    b, s = args.batch_size, args.image_size

    def step() -> None:
        x = torch.randn((b, 3, s, s), device=dev, generator=gen).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), device=dev, generator=gen)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup_steps):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    print(f"plain loop torchvision {args.model} {s} px batch {b}: {dt * 1e3:.1f} ms/step, {b / dt:.0f} samples/s, "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB allocated (torch {torch.__version__}, "
          f"torchvision {torchvision.__version__})", flush=True)


if __name__ == "__main__":
    main()
