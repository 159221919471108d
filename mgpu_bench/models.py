"""The built-in GPT, now in mgpu_bench.workloads.gpt (workloads live in one place); this module keeps
the names for the code that imports them from here."""

from __future__ import annotations

from mgpu_bench.workloads.gpt import (
    GPT,
    MODELS,
    Block,
    CausalSelfAttention,
    ModelSpec,
    cross_entropy,
    flops_per_token,
    get_model_spec,
    make_optimizer,
    param_count,
    synthetic_batch,
    train_step,
)

__all__ = ["GPT", "MODELS", "Block", "CausalSelfAttention", "ModelSpec", "cross_entropy", "flops_per_token",
           "get_model_spec", "make_optimizer", "param_count", "synthetic_batch", "train_step"]
