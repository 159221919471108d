"""The built-in GPT workload: a plain GPT in eager PyTorch, named tiny, 125m, 350m, 760m, 1.3b.

Nothing here is tuned beyond what a hand-written training loop would do: scaled-dot-product
attention (flash/cuDNN kernels where torch picks them), bf16 autocast on CUDA, fused AdamW, an
LM head tied to the token embedding. The named sizes follow GPT-2/GPT-3 shapes with the vocabulary
padded to 50304 (a multiple of 128), so "350m" is the 356M-parameter model of the anchors
(24 layers, d=1024) and "1.3b" the 1.3B one (24 layers, d=2048).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from mgpu_bench.core.errors import InputError

from .base import Workload

INIT_STD = 0.02

# CUDA cross-entropy kernels have overflowed 32-bit indices on inputs past 2^31 elements
# (pytorch/pytorch#85786: illegal memory access, which ends the CUDA context), which a large
# batch at vocab 50304 reaches (batch 21 at seq 2048). Larger losses are summed over row chunks.
CE_MAX_ELEMENTS = 2**31 - 1


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a GPT: `layers` pre-LayerNorm blocks of width `d_model` with `heads` heads, an MLP
    of `mlp_ratio * d_model` hidden units, learned positions up to `max_seq` tokens."""

    name: str
    layers: int
    d_model: int
    heads: int
    vocab: int = 50304
    max_seq: int = 2048
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        if min(self.layers, self.d_model, self.heads, self.vocab, self.max_seq, self.mlp_ratio) < 1:
            raise InputError(f"model {self.name!r}: every dimension must be positive")
        if self.d_model % self.heads:
            raise InputError(f"model {self.name!r}: d_model {self.d_model} is not a multiple of "
                             f"heads {self.heads}")


MODELS: dict[str, ModelSpec] = {
    # CI on CPU. A vocabulary of 4096, not GPT-2's 50304: with that one the LM head made the step at
    # batch 4, seq 128 take 268.7 ms on a 2-core CPU, 31.0 ms with this one (every CPU test trains it)
    "tiny": ModelSpec("tiny", layers=2, d_model=64, heads=2, vocab=4096, max_seq=256),
    "125m": ModelSpec("125m", layers=12, d_model=768, heads=12),
    "350m": ModelSpec("350m", layers=24, d_model=1024, heads=16),
    "760m": ModelSpec("760m", layers=24, d_model=1536, heads=16),
    "1.3b": ModelSpec("1.3b", layers=24, d_model=2048, heads=16),
}


def get_model_spec(name: str) -> ModelSpec:
    """The named size (case-insensitive); InputError listing the names otherwise."""
    spec = MODELS.get(name.strip().lower()) if isinstance(name, str) else None
    if spec is None:
        raise InputError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return spec


def param_count(spec: ModelSpec) -> int:
    """Parameters of GPT(spec), the tied LM head counted once (equals sum(p.numel()))."""
    d, hidden = spec.d_model, spec.mlp_ratio * spec.d_model
    attn = d * 3 * d + 3 * d + d * d + d  # qkv and output projections, with biases
    mlp = d * hidden + hidden + hidden * d + d
    norms = 2 * 2 * d  # two LayerNorms (weight + bias)
    embeddings = spec.vocab * d + spec.max_seq * d  # token table (also the LM head) + positions
    return embeddings + spec.layers * (attn + mlp + norms) + 2 * d  # + final LayerNorm


def flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token at sequence length `seq_len`: 6*N + 12*L*d*T.

    6N is the forward (2N) plus backward (4N) matmul FLOPs of N parameters (Kaplan et al. 2020,
    "Scaling Laws for Neural Language Models", section 2.1; N here is every parameter, embeddings
    included, as in the anchors' 356M figure). 12*L*d*T adds the attention scores QK^T and the
    weighted sum with V, 2*2*d*T forward per layer per token, times 3 for forward plus backward
    (the PaLM paper's appendix B and nanoGPT's estimate_mfu use the same formula). Causal masking
    is not discounted: this is the convention MFU figures are quoted in.
    """
    return 6.0 * param_count(spec) + 12.0 * spec.layers * spec.d_model * seq_len


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


class GptWorkload(Workload):
    """The built-in GPT at `seq_len` tokens per sample: batches of random token ids on the
    device, the token-file DataLoader, the GPT's own checkpointing and AdamW recipe."""

    kind = "gpt"

    def __init__(self, spec: ModelSpec, seq_len: int) -> None:
        if not 1 <= seq_len <= spec.max_seq:
            raise InputError(f"--seq-len {seq_len} does not fit {spec.name}: it takes 1..{spec.max_seq} tokens")
        super().__init__(spec.name, spec.name, seq_len=seq_len)
        self.spec = spec

    def _build(self, device, checkpointing: bool):
        return GPT(self.spec, checkpointing=checkpointing, device=device), True

    def batch(self, batch_size: int, device, generator=None):
        return synthetic_batch(self.spec, batch_size, self.seq_len, device, generator)

    def loader(self, batch_size: int, *, num_workers: int = 2, preprocess_ms: float = 0.0, data_dir: str | None = None,
               seed: int = 0, samples: int = 4096, pin_memory: bool = False):
        from . import data

        tokens = max(1 << 20, 4 * batch_size * (self.seq_len + 1) * 64)
        path = data.token_file(data_dir or "/tmp", self.spec.vocab, tokens, seed)
        return data.loader(data.TokenDataset(path, self.seq_len, preprocess_ms, samples), batch_size, num_workers,
                           pin_memory)

    def loss(self, model, batch):
        tokens, targets = batch
        return model(tokens, targets)

    def optimizer(self, model):
        return make_optimizer(model)

    def blocks(self, model) -> list:
        return list(model.blocks)

    def param_count(self) -> int:
        return param_count(self.spec)

    def formula_flops(self, batch_size: int) -> tuple[float, str]:
        return flops_per_token(self.spec, self.seq_len) * batch_size * self.seq_len, "6N + 12 L d T"
