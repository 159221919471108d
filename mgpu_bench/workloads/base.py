"""What every workload shares: the Workload class, the repeated blocks FSDP shards and checkpointing
recomputes, batches moved to a device, the metric-safe key. Import-light: torch is imported inside
the methods that need it."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from mgpu_bench.core.errors import InputError

from .flops import FlopCount

# A key is part of metric names and the result documents' `model` field (schema.NAME).
_KEY_CHARS = re.compile(r"[^A-Za-z0-9_+\-.:]+")
KEY_MAX = 64


def last_line(exc: BaseException) -> str:
    """An exception in one line: its type and the last line of its message (where tracebacks of
    nested errors put the cause)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__


def safe_key(text: str) -> str:
    """`text` as a history key: characters outside [A-Za-z0-9_+-.:] become '-', and a key longer
    than 64 characters keeps its first 57 and a 6-digit hash of the whole."""
    key = _KEY_CHARS.sub("-", text).strip("-") or "workload"
    if not key[0].isalnum():
        key = "w" + key
    if len(key) > KEY_MAX:
        key = key[:KEY_MAX - 7] + "-" + hashlib.sha256(text.encode()).hexdigest()[:6]
    return key


class Workload:
    """One training step's workload: the model, its batches, its loss. Subclasses fill in
    _build, batch and loss; the rest has defaults that fit most models.

    text: what resolve() was given (resolve(text, seq_len=..., image_size=...) rebuilds the same
    workload in another process); key: its name in history metric names; kind: gpt, torchvision,
    hf or module; seq_len: tokens per sample (None: a workload without tokens); image_size:
    pixels per side (vision only).
    """

    kind = "workload"

    def __init__(self, text: str, key: str, *, seq_len: int | None = None, image_size: int | None = None) -> None:
        self.text, self.key, self.seq_len, self.image_size = text, safe_key(key), seq_len, image_size
        self._params: int | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r})"

    # -- what it is

    @property
    def tokens_per_sample(self) -> int | None:
        """Tokens per sample where the workload has tokens (then tokens/s is reported), else None."""
        return self.seq_len

    @property
    def size_text(self) -> str:
        """The per-sample size in words: "seq 2048", "224 px", or "" where the workload fixes it."""
        if self.image_size:
            return f"{self.image_size} px"
        return f"seq {self.seq_len}" if self.seq_len else ""

    def default_batch(self, on_gpu: bool) -> int:
        return 8 if on_gpu else 4

    @property
    def has_loader(self) -> bool:
        """Whether loader() gives a real DataLoader (--data loader / both)."""
        return type(self).loader is not Workload.loader

    def channels_last(self, device) -> bool:
        """Whether the model and its images use the channels-last memory format on `device`."""
        return False

    def autocast_dtype(self, device):
        """torch.autocast's dtype for the forward pass on `device`: bf16 on CUDA, None elsewhere."""
        import torch

        return torch.bfloat16 if as_device(device).type == "cuda" else None

    def facts(self) -> dict:
        """What a result document records of the workload (JSON)."""
        out = {"key": self.key, "text": self.text, "kind": self.kind, "params": self.param_count(),
               "tokens_per_sample": self.tokens_per_sample, "seq_len": self.seq_len, "image_size": self.image_size}
        formula = self.formula_flops(1)
        if formula is not None:
            out["formula_per_sample"], out["formula"] = formula
        return out

    def check_checkpointing(self) -> None:
        """InputError where the model has no repeated blocks for --checkpointing to wrap (the model
        built on meta to look)."""
        self.build("meta", checkpointing=True)

    # -- building and running

    def build(self, device, *, checkpointing: bool = False):
        """The model on `device` (meta included), in training mode, randomly initialised; with
        `checkpointing`, each repeated block recomputes its activations in backward."""
        model, done = self._build(as_device(device), checkpointing)
        model.train()
        if checkpointing and not done:
            blocks = self.blocks(model)
            if not blocks:
                raise InputError(f"{self.key}: no repeated blocks found to checkpoint (name them: 'blocks')")
            checkpoint_blocks(blocks)
        return model

    def _build(self, device, checkpointing: bool):
        """(model on device, whether it checkpoints by itself)."""
        raise NotImplementedError

    def batch(self, batch_size: int, device, generator=None) -> Any:
        """One batch of `batch_size` samples made on `device` (synthetic, random)."""
        raise NotImplementedError

    def loader(self, batch_size: int, *, num_workers: int = 2, preprocess_ms: float = 0.0, data_dir: str | None = None,
               seed: int = 0, samples: int = 4096, pin_memory: bool = False) -> Iterable:
        """A torch DataLoader of `samples` samples in batches of `batch_size` on the host, through
        `num_workers` worker processes, each sample costing `preprocess_ms` more (a sleep standing
        for decoding and augmentation). Batches go to the device with to_device()."""
        raise InputError(f"{self.key} has no DataLoader: use --data synthetic")

    def loss(self, model, batch):
        """The loss of `batch` (a 0-d tensor); autocast is the caller's."""
        raise NotImplementedError

    def optimizer(self, model):
        """AdamW at lr 1e-4, weight decay 0.01; the fused CUDA kernel where every parameter is on CUDA."""
        return adamw(model, lr=1e-4, weight_decay=0.01)

    def blocks(self, model) -> list:
        """The repeated blocks FSDP shards one by one and checkpointing wraps (find_blocks)."""
        return find_blocks(model)

    def prepare(self, batch, device):
        """A batch from the loader on `device` (non-blocking copies)."""
        return to_device(batch, device, self.channels_last(device))

    # -- counting

    def param_count(self) -> int:
        """Parameters of the model, each shared tensor once (counted on the meta device)."""
        if self._params is None:
            model = self.build("meta")
            self._params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        return self._params

    def count_flops(self, batch_size: int, device="meta") -> FlopCount:
        """FLOPs of one forward and backward at `batch_size`, counted on `device` (meta: no memory)
        with the dense ops the ceiling replays (flops.count)."""
        from . import flops

        dev = as_device(device)
        model = self.build(dev)
        return flops.count(model, self.batch(batch_size, dev), self.loss, batch_size, str(dev),
                           None if dev.type == "meta" else self.autocast_dtype(dev))

    def formula_flops(self, batch_size: int) -> tuple[float, str] | None:
        """FLOPs of one forward and backward from a published formula, and the formula; None
        where the workload has none (only the built-in GPT does)."""
        return None


def as_device(device):
    import torch

    return device if isinstance(device, torch.device) else torch.device(device)


def adamw(model, lr: float, weight_decay: float):
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if params and all(p.device.type == "cuda" for p in params):
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
        except (RuntimeError, TypeError, ValueError):  # a dtype or torch without the fused kernel
            pass
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def find_blocks(model) -> list:
    """The model's repeated blocks, in module order: of the module classes with two or more
    instances that hold children (not containers: ModuleList, Sequential, ModuleDict; not leaf
    layers), the one whose instances hold the most parameters together (fewer instances on a
    tie). A transformer's layers, a ResNet's bottlenecks. [] when nothing repeats."""
    from torch import nn

    containers = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
    by_class: dict[type, list[tuple[str, Any]]] = {}
    for name, m in model.named_modules():
        if m is model or isinstance(m, containers) or next(m.children(), None) is None:
            continue
        by_class.setdefault(type(m), []).append((name, m))
    best, best_rank = [], (0, 0)
    for found in by_class.values():
        names = [n for n, _ in found]
        outer = [(n, m) for n, m in found if not any(n.startswith(o + ".") for o in names if o != n)]
        if len(outer) < 2:
            continue
        params = sum(p.numel() for _, m in outer for p in m.parameters())
        rank = (params, -len(outer))
        if rank > best_rank:
            best, best_rank = [m for _, m in outer], rank
    return best


def checkpoint_blocks(blocks: list) -> None:
    """Each block's forward recomputed in backward (torch.utils.checkpoint, use_reentrant=False);
    the module keeps its hooks (FSDP's included), the checkpoint runs inside them."""
    import functools

    import torch.utils.checkpoint

    for block in blocks:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)


def to_device(batch, device, channels_last: bool = False):
    """Every tensor in `batch` (tensors, tuples, lists, dicts) on `device`, non-blocking; 4-D
    floating tensors channels-last when asked."""
    import torch

    if isinstance(batch, torch.Tensor):
        x = batch.to(device, non_blocking=True)
        if channels_last and x.dim() == 4 and x.is_floating_point():
            x = x.contiguous(memory_format=torch.channels_last)
        return x
    if isinstance(batch, dict):
        return {k: to_device(v, device, channels_last) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device, channels_last) for v in batch]
        return type(batch)(moved) if isinstance(batch, list) or type(batch) is tuple else type(batch)(*moved)
    return batch
