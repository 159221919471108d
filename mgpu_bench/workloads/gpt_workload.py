"""The built-in GPT as a workload (tiny, 125m, 350m, 760m, 1.3b at a sequence length): made
without torch (its sizes and formula: gpt_spec.py), which it imports only to build the model, its
batches and its optimizer (gpt.py)."""

from __future__ import annotations

from mgpu_bench.core.errors import InputError

from .base import Workload
from .gpt_spec import ModelSpec, flops_per_token, param_count


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
        from .gpt import GPT

        return GPT(self.spec, checkpointing=checkpointing, device=device), True

    def batch(self, batch_size: int, device, generator=None):
        from .gpt import synthetic_batch

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
        from .gpt import make_optimizer

        return make_optimizer(model)

    def blocks(self, model) -> list:
        return list(model.blocks)

    def check_checkpointing(self) -> None:  # the GPT checkpoints its own blocks: nothing to build to look
        return None

    def param_count(self) -> int:
        return param_count(self.spec)

    def formula_flops(self, batch_size: int) -> tuple[float, str]:
        return flops_per_token(self.spec, self.seq_len) * batch_size * self.seq_len, "6N + 12 L d T"
