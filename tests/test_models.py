from __future__ import annotations

import math

import pytest
import torch

from mgpu_bench.core.errors import InputError
from mgpu_bench.workloads.gpt import (
    GPT,
    MODELS,
    ModelSpec,
    cross_entropy,
    flops_per_token,
    get_model_spec,
    make_optimizer,
    param_count,
    synthetic_batch,
    train_step,
)


@pytest.mark.parametrize("name", ["tiny", "350m"])
def test_param_count_matches_module(name):
    spec = MODELS[name]
    with torch.device("meta"):  # shapes only: 350m costs no memory
        model = GPT(spec)
    assert param_count(spec) == sum(p.numel() for p in model.parameters())  # tied weight once
    assert model.tok_emb.weight.device.type == "meta"


def test_anchor_sizes():
    # ANCHORS.md: 356M params for 24 layers d=1024, 1.3B for 24 layers d=2048 (vocab 50304).
    assert round(param_count(MODELS["350m"]) / 1e6) == 356
    assert round(param_count(MODELS["1.3b"]) / 1e8) == 13


def test_flops_per_token_by_hand():
    spec = ModelSpec("hand", layers=2, d_model=8, heads=2, vocab=10, max_seq=4, mlp_ratio=4)
    # embeddings 10*8 + 4*8 = 112; per layer 12*64 + 13*8 = 872; final LayerNorm 16.
    n = 112 + 2 * 872 + 16
    assert param_count(spec) == n == 1872
    assert flops_per_token(spec, 4) == 6 * 1872 + 12 * 2 * 8 * 4 == 12000
    # The anchors' MFU: 350m at batch 8, seq 2048, 112.8 ms/step on a 989 TFLOP/s H200 -> 40.2%.
    mfu = flops_per_token(MODELS["350m"], 2048) * 8 * 2048 / 0.1128 / 989e12
    assert mfu == pytest.approx(0.402, abs=0.002)


def test_tiny_train_step_reduces_loss():
    torch.manual_seed(0)
    spec = MODELS["tiny"]
    model = GPT(spec)
    opt = make_optimizer(model, lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    tokens, targets = synthetic_batch(spec, 4, 32, "cpu", gen)
    assert tokens.shape == targets.shape == (4, 32) and tokens.dtype == torch.int64
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    assert train_step(model, opt, tokens, targets, None) is None  # no loss unless asked
    losses = [train_step(model, opt, tokens, targets, None, return_loss=True) for _ in range(30)]
    assert all(isinstance(x, float) for x in losses)
    assert losses[0] > 0.9 * math.log(spec.vocab)  # about ln(vocab) at init
    assert losses[-1] < 0.5 * losses[0]


def test_checkpointing_gives_the_same_loss():
    spec = MODELS["tiny"]
    tokens, targets = synthetic_batch(spec, 2, 48, "cpu", torch.Generator().manual_seed(1))
    losses = {}
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = GPT(spec, checkpointing=ckpt)
        opt = make_optimizer(model)
        losses[ckpt] = [train_step(model, opt, tokens, targets, None, return_loss=True)
                        for _ in range(3)]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_chunked_cross_entropy_matches_plain():
    torch.manual_seed(0)
    logits = torch.randn(37, 11, requires_grad=True)
    targets = torch.randint(0, 11, (37,))
    plain = torch.nn.functional.cross_entropy(logits, targets)
    (g_plain,) = torch.autograd.grad(plain, logits)
    chunked = cross_entropy(logits, targets, max_elements=11 * 5)  # 8 chunks of <= 5 rows
    (g_chunked,) = torch.autograd.grad(chunked, logits)
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-6)
    assert torch.allclose(g_chunked, g_plain, atol=1e-7)


def test_forward_logits_shape_and_max_seq():
    spec = MODELS["tiny"]
    model = GPT(spec)
    tokens, _ = synthetic_batch(spec, 1, 16, "cpu")
    with torch.no_grad():
        assert model(tokens).shape == (1, 16, spec.vocab)
    too_long, _ = synthetic_batch(spec, 1, spec.max_seq + 1, "cpu")
    with pytest.raises(InputError, match="max_seq"):
        model(too_long)


def test_optimizer_on_cpu_is_not_fused():
    opt = make_optimizer(GPT(MODELS["tiny"]))
    assert not opt.defaults.get("fused")
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_model_names():
    assert get_model_spec("350M") is MODELS["350m"]
    with pytest.raises(InputError) as info:
        get_model_spec("7b")
    message = str(info.value)
    assert "\n" not in message and all(name in message for name in MODELS)
    with pytest.raises(InputError):
        ModelSpec("odd", layers=2, d_model=10, heads=3)


@pytest.mark.gpu
def test_gpu_train_step_bf16_fused():
    spec = MODELS["tiny"]
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = GPT(spec, device=dev)
    opt = make_optimizer(model, lr=3e-3)
    assert opt.defaults.get("fused")
    tokens, targets = synthetic_batch(spec, 4, 64, dev, torch.Generator(device=dev).manual_seed(0))
    assert tokens.device == dev
    losses = [train_step(model, opt, tokens, targets, torch.bfloat16, return_loss=True)
              for _ in range(20)]
    assert losses[-1] < losses[0]
