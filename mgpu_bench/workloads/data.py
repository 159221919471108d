"""Real input pipelines for the built-in workloads (`--data loader`): samples read or made on the host
by DataLoader workers, collated, pinned and copied to the device, as a training job's are.

Token workloads read a uint16 token file written once per vocabulary, size and seed (in
--data-dir, /tmp by default); image workloads make a uint8 HWC image per index (seeded, as a
decoder would hand it over) and normalise it to a float CHW tensor with ImageNet's mean and
standard deviation, as torchvision's ToTensor + Normalize do. --preprocess-ms adds a sleep per
sample for the decoding and augmentation a real pipeline does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# torchvision's ImageNet normalisation (the mean and standard deviation of its training images).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def token_file(data_dir: str, vocab: int, tokens: int, seed: int) -> Path:
    """A file of `tokens` random token ids below `vocab` (uint16 when the vocabulary fits, else
    uint32), written once (atomically) and reused."""
    import numpy as np

    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    width = np.dtype(dtype).itemsize
    path = Path(data_dir) / f"mgpu_bench_tokens_{vocab}_{tokens}_{seed}.u{8 * width}"
    if not path.exists() or path.stat().st_size != tokens * width:
        rng = np.random.default_rng(seed)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        rng.integers(0, vocab, size=tokens, dtype=dtype).tofile(tmp)
        os.replace(tmp, path)
    return path


class TokenDataset:
    """Samples of seq_len + 1 tokens from a token file, with an optional simulated per-sample
    preprocessing cost (sleep). `form` shapes what a sample is: "pair" (tokens, next tokens) for
    the GPT, "causal" {input_ids, labels} (labels = inputs: the model shifts them), "masked"
    {input_ids, labels} with 15% of the positions predicted (BERT's masking rate; the rest -100)."""

    def __init__(self, path: Path, seq_len: int, preprocess_ms: float, length: int, form: str = "pair"):
        self.path, self.seq_len, self.preprocess_ms, self.length, self.form = path, seq_len, preprocess_ms, length, form
        self._data = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        import numpy as np
        import torch

        if self._data is None:
            dtype = np.uint16 if self.path.suffix == ".u16" else np.uint32
            self._data = np.memmap(self.path, dtype=dtype, mode="r")
        span = len(self._data) - self.seq_len - 1
        off = (i * 7919 * self.seq_len) % span
        chunk = torch.from_numpy(self._data[off:off + self.seq_len + 1].astype(np.int64))
        if self.preprocess_ms > 0:
            time.sleep(self.preprocess_ms / 1000.0)
        if self.form == "pair":
            return chunk[:-1], chunk[1:]
        ids = chunk[:-1]
        if self.form == "causal":
            return {"input_ids": ids, "labels": ids.clone()}
        keep = torch.rand(self.seq_len, generator=torch.Generator().manual_seed(i)) < 0.15
        return {"input_ids": ids, "labels": torch.where(keep, ids, torch.full_like(ids, -100))}


class ImageDataset:
    """`length` images of size x size pixels and a class label each: a seeded uint8 HWC image per
    index, normalised to float CHW (ToTensor + Normalize), plus the simulated preprocessing."""

    def __init__(self, size: int, classes: int, preprocess_ms: float, length: int, seed: int = 0):
        self.size, self.classes, self.preprocess_ms, self.length, self.seed = size, classes, preprocess_ms, length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        import numpy as np
        import torch

        rng = np.random.default_rng((self.seed, i))
        hwc = rng.integers(0, 256, size=(self.size, self.size, 3), dtype=np.uint8)
        x = torch.from_numpy(hwc).permute(2, 0, 1).float().div_(255.0)
        mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        x = (x - mean) / std
        if self.preprocess_ms > 0:
            time.sleep(self.preprocess_ms / 1000.0)
        return x, int(rng.integers(0, self.classes))


def loader(dataset, batch_size: int, num_workers: int, pin_memory: bool):
    """The DataLoader every built-in pipeline uses: workers kept between epochs, whole batches."""
    import torch

    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
                                       persistent_workers=num_workers > 0, drop_last=True)
