"""Another job on a GPU, for the tests that must name it: bf16 matmuls in a loop on one GPU for a
while, holding some memory. `python3 benchmarks/gpu_hog.py GPU SECONDS [GIB_HELD]`"""

from __future__ import annotations

import sys
import time

import torch

gpu, seconds = int(sys.argv[1]), float(sys.argv[2])
held = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
dev = torch.device("cuda", gpu)
keep = torch.empty(int(held * 2**30), dtype=torch.uint8, device=dev)
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
print(f"hog pid on GPU {gpu}: holding {held:g} GiB", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        a = a @ a.T
        a = a / a.norm()
    torch.cuda.synchronize(dev)
