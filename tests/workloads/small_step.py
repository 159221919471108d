"""A user's own training step, as `mgpu-bench model --model tests/workloads/small_step.py:workload` takes
it (the protocol: mgpu_bench/workloads/user.py; the README's "Your model"). A small transformer
encoder over token ids with a classification head, and a DataLoader over a dataset in memory: what
a team's existing training script already has, handed over in a few lines."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, WIDTH, CLASSES = 1000, 32, 64, 10


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, batch_first=True)
                                    for _ in range(2))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


class Samples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, VOCAB, (SEQ,), generator=g), i % CLASSES


def workload(device: torch.device) -> dict:
    model = Net().to(device)
    return {
        "model": model,
        "batch": lambda n: (torch.randint(0, VOCAB, (n, SEQ), device=device),
                            torch.randint(0, CLASSES, (n,), device=device)),
        "loader": lambda n: torch.utils.data.DataLoader(Samples(), batch_size=n, num_workers=1, drop_last=True),
        "loss": lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        "tokens_per_sample": SEQ,
        "blocks": list(model.layers),
    }


def as_tuple(device: torch.device):
    """The short form: (model, a DataLoader of fixed batch size, loss)."""
    model = Net().to(device)
    loader = torch.utils.data.DataLoader(Samples(), batch_size=4, drop_last=True)
    return model, loader, lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])


def raises(device: torch.device):
    raise ValueError("no data set configured")


def wrong(device: torch.device):
    return Net().to(device)


def bad_loss(device: torch.device):
    model = Net().to(device)
    return model, lambda n: (torch.randint(0, VOCAB, (n, SEQ), device=device), None), lambda model, batch: model(batch[0])


class Gated(Net):
    """A model whose forward reads a value (a data-dependent branch): it cannot run on the meta
    device, so mgpu-bench counts its FLOPs on the ranks' own device instead."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(ids)
        return out if bool(ids.max() < VOCAB) else out * 0


def data_dependent(device: torch.device):
    model = Gated().to(device)
    return (model, lambda n: (torch.randint(0, VOCAB, (n, SEQ), device=device),
                              torch.randint(0, CLASSES, (n,), device=device)),
            lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]), SEQ)
