"""The built-in GPT's sizes, without torch: what `model` needs before its ranks start (the shape,
the parameter count, the FLOPs formula) is arithmetic, so the command says its estimate before
torch is imported. The modules themselves: gpt.py; the workload that names them: gpt_workload.py."""

from __future__ import annotations

from dataclasses import dataclass

from mgpu_bench.core.errors import InputError

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
