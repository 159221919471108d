"""`torchvision:NAME`: a torchvision classification model (weights=None: random initialisation, no
download) trained on batches of `image_size` x `image_size` images and class labels with
cross-entropy; channels-last, cuDNN autotuning and bf16 autocast on GPUs; SGD with momentum.
"""

from __future__ import annotations

import difflib

from mgpu_bench.core.errors import InputError

from .base import Workload, as_device

CLASSES = 1000  # ImageNet-1k heads, torchvision's default num_classes
# torchvision's classification reference recipe (references/classification/train.py defaults):
# SGD, lr 0.1, momentum 0.9, weight decay 1e-4.
SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}


def _torchvision():
    """torchvision, or one line naming the release of this torch to install (extras.py)."""
    from .extras import torchvision

    return torchvision()


def names() -> list[str]:
    """The classification models torchvision lists (resnet50, vit_b_16, ...)."""
    tv = _torchvision()
    return sorted(tv.models.list_models(module=tv.models))


class VisionWorkload(Workload):
    kind = "torchvision"

    def __init__(self, name: str, image_size: int) -> None:
        known = names()
        if name not in known:
            near = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
            raise InputError(f"unknown torchvision model {name!r}"
                             + (f"; near: {', '.join(near)}" if near else f"; it has {len(known)}, e.g. resnet50, "
                                                                          "vit_b_16, convnext_tiny"))
        if not 16 <= image_size <= 4096:
            raise InputError(f"--image-size {image_size}: give 16..4096 pixels per side")
        super().__init__(f"torchvision:{name}", f"torchvision:{name}", image_size=image_size)
        self.name = name

    @property
    def tokens_per_sample(self) -> int | None:
        return None

    def default_batch(self, on_gpu: bool) -> int:
        return 128 if on_gpu else 4

    def channels_last(self, device) -> bool:
        return as_device(device).type == "cuda"

    def _build(self, device, checkpointing: bool):
        import torch

        tv = _torchvision()
        # Vision transformers fix their input size at construction (positional embeddings).
        extra = {"image_size": self.image_size} if self.name.startswith("vit_") else {}
        with torch.device(device):
            model = tv.models.get_model(self.name, weights=None, num_classes=CLASSES, **extra)
        if self.channels_last(device):
            model = model.to(memory_format=torch.channels_last)
            # cuDNN picks its fastest convolution algorithm per shape, as torchvision's reference
            # training script has it (references/classification/train.py: cudnn.benchmark = True)
            torch.backends.cudnn.benchmark = True
        return model, False

    def batch(self, batch_size: int, device, generator=None):
        import torch

        s = self.image_size
        x = torch.randn((batch_size, 3, s, s), device=device, generator=generator)
        if self.channels_last(device):
            x = x.contiguous(memory_format=torch.channels_last)
        return x, torch.randint(0, CLASSES, (batch_size,), device=device, generator=generator)

    def loader(self, batch_size: int, *, num_workers: int = 2, preprocess_ms: float = 0.0, data_dir: str | None = None,
               seed: int = 0, samples: int = 4096, pin_memory: bool = False):
        from . import data

        return data.loader(data.ImageDataset(self.image_size, CLASSES, preprocess_ms, samples, seed), batch_size,
                           num_workers, pin_memory)

    def loss(self, model, batch):
        import torch.nn.functional as F

        images, labels = batch
        out = model(images)
        if not hasattr(out, "shape"):  # GoogLeNet and Inception in training mode: (logits, aux logits)
            out = out[0]
        return F.cross_entropy(out, labels)

    def optimizer(self, model):
        import torch

        return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], **SGD)
