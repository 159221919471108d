"""Workloads: what a training step runs, built from a name in one place. `mgpu-bench model`,
`memory --max-batch` and `suite --model` take the same forms, and so do `plan` and the in-job
StepMonitor: no probe builds a model of its own.

The forms (`resolve(text)`):
    tiny, 125m, 350m, 760m, 1.3b      the built-in GPT (gpt_workload.py; sizes, formula: gpt_spec.py; modules: gpt.py)
    torchvision:NAME                  a torchvision classification model, weights=None (vision.py)
    hf:NAME | hf:path/config.json     a transformers model from a preset or config file (hf.py)
    module:function | file.py:function  the user's own step (user.py: the protocol)

torchvision and transformers are the optional extra `[models]`, imported only when a form asks for
them (extras.py: missing, or built for another torch, one line naming the release to install).

The API (stable: later commands build on it):

    resolve(text, *, seq_len=None, image_size=None, cpu_defaults=False) -> Workload
        InputError (one line: the CLI's exit 2) for a name, file, module or function that does not
        resolve, with the near names where there are some. seq_len / image_size None: the
        workload's default (cpu_defaults: the smaller CPU ones). resolve(w.text, seq_len=w.seq_len,
        image_size=w.image_size) rebuilds the same workload in another process.

    Workload
        .key                      the history name: "350m", "torchvision:resnet50", "hf:bert-large",
                                  "module:pkg.mod:fn" (schema.NAME: [A-Za-z0-9][A-Za-z0-9_+-.:]{0,63})
        .text, .kind              what resolve got; "gpt", "torchvision", "hf" or "module"
        .seq_len, .image_size     tokens per sample or None; pixels per side or None
        .tokens_per_sample        int or None: samples/s always, tokens/s where this is set
        .size_text                "seq 2048", "224 px" or ""
        .default_batch(on_gpu)    samples per micro-batch when the user gives none
        .build(device, checkpointing=False) -> nn.Module    on any device, meta included; train mode
        .batch(batch_size, device, generator=None)          one synthetic batch on the device
        .loader(batch_size, num_workers=, preprocess_ms=, data_dir=, seed=, samples=, pin_memory=)
                                  a real DataLoader on the host (InputError where there is none)
        .has_loader               whether it has one
        .prepare(batch, device)   a loader batch on the device (channels-last where the model is)
        .loss(model, batch) -> 0-d tensor      the model may be wrapped (DDP, FSDP, compile)
        .optimizer(model)         the workload's optimizer (AdamW; SGD with momentum for vision)
        .autocast_dtype(device)   bf16 on CUDA, None elsewhere (or where the module turns it off)
        .channels_last(device)    whether images and model are channels-last there
        .blocks(model)            the repeated blocks: FSDP units, checkpointing (find_blocks)
        .param_count()            parameters, shared ones once
        .count_flops(batch_size, device="meta") -> FlopCount
        .formula_flops(batch_size) -> (FLOPs, "6N + 12 L d T") for the GPT, else None
        .facts()                  a JSON dict for result documents

    FlopCount(flops, batch_size, device, dense_ops, note)    flops.py
        FLOPs of one forward + backward at batch_size, counted by FlopCounterMode on `device`;
        .per_sample; dense_ops: the matmuls and convolutions seen (op, argument shapes, count,
        FLOPs per call): what flops.ceiling(dense_ops, cuda_device, channels_last) replays alone
        for the measured matmul ceiling. .to_dict() / FlopCount.from_dict() for JSON.

    count_flops(model, batch, loss_fn, batch_size, device_label, autocast_dtype=None) -> FlopCount
        the same count over a model, batch and loss the caller already has (a live job's).

    train_step(workload, model, optimizer, batch, autocast_dtype) -> None   one optimizer step
    to_device(batch, device, channels_last=False)    every tensor of a batch moved, non-blocking
    find_blocks(model)   the repeated blocks of any nn.Module (the class with two or more
                         instances that holds the most parameters)
    last_line(exc)       an exception in one line, for the one-line errors of bad input
"""

from __future__ import annotations

import difflib

from mgpu_bench.core.errors import InputError

from .base import Workload, find_blocks, last_line, safe_key, to_device
from .flops import FlopCount
from .flops import count as count_flops

__all__ = ["FlopCount", "Workload", "count_flops", "find_blocks", "forms", "last_line", "resolve", "safe_key",
           "to_device", "train_step"]

FORMS = "tiny, 125m, 350m, 760m, 1.3b, torchvision:NAME, hf:NAME, hf:path/config.json, module:function"


def forms() -> str:
    """The forms --model takes, for help texts."""
    return FORMS


def resolve(text: str, *, seq_len: int | None = None, image_size: int | None = None,
            cpu_defaults: bool = False) -> Workload:
    """The workload `text` names (see the module's docs)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"--model is empty: give one of {FORMS}")
    text = text.strip()
    prefix, sep, rest = text.partition(":")
    if not sep:
        from .gpt_spec import MODELS
        from .gpt_workload import GptWorkload

        spec = MODELS.get(text.lower())
        if spec is None:
            near = difflib.get_close_matches(text.lower(), list(MODELS), n=3, cutoff=0.5)
            raise InputError(f"unknown model {text!r}" + (f" (near: {', '.join(near)})" if near else "")
                             + f"; choose one of {FORMS}")
        _no(image_size, "--image-size", spec.name, "it has no images")
        return GptWorkload(spec, seq_len if seq_len is not None else min(128 if cpu_defaults else 2048, spec.max_seq))
    if prefix == "torchvision":
        from .vision import VisionWorkload

        _no(seq_len, "--seq-len", text, "images have no sequence length: give --image-size")
        return VisionWorkload(rest, image_size if image_size is not None else (64 if cpu_defaults else 224))
    _no(image_size, "--image-size", text, "it has no images")
    if prefix == "hf":
        from .hf import HfWorkload

        return HfWorkload(text, seq_len, cpu_defaults)
    from .user import UserWorkload

    _no(seq_len, "--seq-len", text, "the module's batches fix the sample")
    return UserWorkload(text)


def _no(value, option: str, what: str, why: str) -> None:
    if value is not None:
        raise InputError(f"{option} does not apply to {what}: {why}")


def train_step(workload: Workload, model, optimizer, batch, autocast_dtype=None) -> None:
    """One optimizer step: the loss under torch.autocast (when `autocast_dtype` is given),
    backward, step, zero_grad(set_to_none=True). No synchronisation."""
    import contextlib

    import torch

    device_type = next(model.parameters()).device.type
    amp = torch.autocast(device_type=device_type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with amp:
        loss = workload.loss(model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
