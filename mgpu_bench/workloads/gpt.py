"""The built-in GPT workload: a plain GPT in eager PyTorch, named tiny, 125m, 350m, 760m, 1.3b.

Nothing here is tuned beyond what a hand-written training loop would do: scaled-dot-product
attention (flash/cuDNN kernels where torch picks them), bf16 autocast on CUDA, fused AdamW, an
LM head tied to the token embedding. The named sizes follow GPT-2/GPT-3 shapes with the vocabulary
padded to 50304 (a multiple of 128), so "350m" is the 356M-parameter model of the anchors
(24 layers, d=1024) and "1.3b" the 1.3B one (24 layers, d=2048). The sizes, their parameter count and
FLOPs formula live in gpt_spec.py (no torch), re-exported here; the workload in gpt_workload.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from mgpu_bench.core.errors import InputError

from .gpt_spec import (  # noqa: F401 - the spec and the workload: their home without torch, re-exported
    CE_MAX_ELEMENTS,
    INIT_STD,
    MODELS,
    ModelSpec,
    flops_per_token,
    get_model_spec,
    param_count,
)


class CausalSelfAttention(nn.Module):
    def __init__(self, spec: ModelSpec, device=None) -> None:
        super().__init__()
        self.heads = spec.heads
        self.qkv = nn.Linear(spec.d_model, 3 * spec.d_model, device=device)
        self.proj = nn.Linear(spec.d_model, spec.d_model, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, spec: ModelSpec, device=None) -> None:
        super().__init__()
        d, hidden = spec.d_model, spec.mlp_ratio * spec.d_model
        self.ln1 = nn.LayerNorm(d, device=device)
        self.attn = CausalSelfAttention(spec, device=device)
        self.ln2 = nn.LayerNorm(d, device=device)
        self.fc = nn.Linear(d, hidden, device=device)
        self.fc_proj = nn.Linear(hidden, d, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Decoder-only transformer. forward(tokens) -> logits (batch, seq, vocab);
    forward(tokens, targets) -> mean cross-entropy loss (a 0-d tensor).

    `checkpointing` recomputes each block's activations in the backward pass
    (torch.utils.checkpoint, use_reentrant=False): less memory, about a third more compute.
    Build on device="meta" to get shapes without memory.
    """

    def __init__(self, spec: ModelSpec, checkpointing: bool = False, device=None) -> None:
        super().__init__()
        self.spec = spec
        self.checkpointing = checkpointing
        self.tok_emb = nn.Embedding(spec.vocab, spec.d_model, device=device)
        self.pos_emb = nn.Embedding(spec.max_seq, spec.d_model, device=device)
        self.blocks = nn.ModuleList(Block(spec, device=device) for _ in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.d_model, device=device)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.spec.max_seq:
            raise InputError(f"sequence length {t} exceeds the model's max_seq {self.spec.max_seq}")
        pos = torch.arange(t, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = F.linear(self.ln_f(x), self.tok_emb.weight)  # LM head tied to the embedding
        if targets is None:
            return logits
        return cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                  max_elements: int = CE_MAX_ELEMENTS) -> torch.Tensor:
    """Mean cross-entropy of (rows, vocab) logits: F.cross_entropy itself when the logits have at
    most `max_elements` elements, else the sum over row chunks below that size divided by the
    rows (the same value and gradient; autocast still computes each chunk in fp32)."""
    rows = max(1, max_elements // logits.shape[-1])
    if logits.shape[0] <= rows:
        return F.cross_entropy(logits, targets)
    total = sum(F.cross_entropy(x, t, reduction="sum")
                for x, t in zip(logits.split(rows), targets.split(rows)))
    return total / logits.shape[0]


def make_optimizer(model: nn.Module, lr: float = 3e-4) -> torch.optim.Optimizer:
    """AdamW (betas 0.9/0.95, weight decay 0.1 on matrices only, as GPT training recipes do);
    the fused CUDA kernel when every parameter is on CUDA, the default implementation otherwise."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kwargs = {"lr": lr, "betas": (0.9, 0.95)}
    if params and all(p.device.type == "cuda" for p in params):
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):  # a torch or dtype without the fused kernel
            pass
    return torch.optim.AdamW(groups, **kwargs)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor,
               targets: torch.Tensor, autocast_dtype: torch.dtype | None = None,
               return_loss: bool = False) -> float | None:
    """One optimizer step: forward (under torch.autocast on the tokens' device type when
    `autocast_dtype` is given: bf16 on CUDA, None on CPU), cross-entropy, backward, step, and
    zero_grad(set_to_none=True). Returns the loss as a float only when `return_loss` (that is a
    device synchronisation); None otherwise, so a timed loop stays asynchronous."""
    if autocast_dtype is not None:
        with torch.autocast(device_type=tokens.device.type, dtype=autocast_dtype):
            loss = model(tokens, targets)
    else:
        loss = model(tokens, targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach()) if return_loss else None


def synthetic_batch(spec: ModelSpec, batch: int, seq_len: int, device: torch.device | str,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids drawn on `device` (the generator must live there too): (tokens, targets),
    each (batch, seq_len) int64, targets being the tokens shifted by one."""
    if batch < 1 or seq_len < 1:
        raise InputError(f"batch and sequence length must be positive (got {batch}, {seq_len})")
    ids = torch.randint(0, spec.vocab, (batch, seq_len + 1), device=device, generator=generator)
    return ids[:, :-1], ids[:, 1:]
