"""Where profiled GPU time went, from the CUDA kernels' own intervals: compute, NCCL, NCCL with
nothing beside it, idle (the model probe's profile and the in-job monitor's alike). Base units:
seconds."""

from __future__ import annotations

from collections.abc import Sequence

# Kernel names, lower case, by what they do (cuBLAS/cuBLASLt on Hopper: sm90_xmma_gemm_*,
# nvjet_*; CUTLASS; flash and memory-efficient attention behind SDPA).
NCCL_WORDS = ("nccl",)
MATMUL_WORDS = ("gemm", "xmma", "nvjet", "cutlass", "cublas", "matmul", "wgmma")
ATTENTION_WORDS = ("flash", "fmha", "attention", "attn", "sdpa")  # cudnn_generated_fort_native_sdpa_sm90_flash_*


def kernel_split(kernels: Sequence[tuple[float, float, str]]) -> dict:
    """Where profiled GPU time went, from kernel intervals (start and end in microseconds, name):
    a sweep over the interval boundaries, so that kernels on several streams at once are counted
    once. Seconds: window_s (first start to last end), busy_s (any kernel), idle_s, nccl_s (any
    NCCL kernel), nccl_exposed_s (NCCL with no other kernel beside it), matmul_s, attention_s (no
    matmul beside it), other_s (neither beside it)."""
    edges = []
    for start, end, name in kernels:
        if end <= start:
            continue
        low = name.lower()
        # attention first: cuDNN's fused SDPA kernels carry "wgmma" in their names too
        kind = ("nccl" if any(w in low for w in NCCL_WORDS) else "attention" if any(w in low for w in ATTENTION_WORDS)
                else "matmul" if any(w in low for w in MATMUL_WORDS) else "other")
        edges += [(start, 1, kind), (end, -1, kind)]
    out = dict.fromkeys(("window_s", "busy_s", "idle_s", "nccl_s", "nccl_exposed_s", "matmul_s", "attention_s",
                         "other_s"), 0.0)
    if not edges:
        return out
    edges.sort()
    active = dict.fromkeys(("nccl", "matmul", "attention", "other"), 0)
    last = edges[0][0]
    for t, step, kind in edges:
        span = (t - last) / 1e6
        if span > 0:
            compute = active["matmul"] or active["attention"] or active["other"]
            if compute or active["nccl"]:
                out["busy_s"] += span
            if active["nccl"]:
                out["nccl_s"] += span
                if not compute:
                    out["nccl_exposed_s"] += span
            if active["matmul"]:
                out["matmul_s"] += span
            elif active["attention"]:
                out["attention_s"] += span
            elif active["other"]:
                out["other_s"] += span
        active[kind] += step
        last = t
    out["window_s"] = (edges[-1][0] - edges[0][0]) / 1e6
    out["idle_s"] = max(0.0, out["window_s"] - out["busy_s"])
    return out
