"""--gpus: the three forms, and messages that say what is visible and why (CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import pytest

from mgpu_bench.core.errors import InputError
from mgpu_bench.machine.selection import parse_gpus


def test_the_three_forms():
    assert parse_gpus(None, 4) == [0, 1, 2, 3] and parse_gpus("all", 2) == [0, 1]
    assert parse_gpus("2", 4) == [0, 1]  # a count: the first two
    assert parse_gpus("1,3", 4) == [1, 3]  # indices
    assert parse_gpus("3,", 4) == [3]  # one GPU by its index


def test_a_count_beyond_what_is_visible_names_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(InputError) as e:
        parse_gpus("2", 1)
    assert str(e.value) == "--gpus 2 asks for 2 GPUs, 1 visible: CUDA_VISIBLE_DEVICES=1 numbers them 0 = 1"


def test_gpu_zero_alone_has_a_form_and_the_message_names_it(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(InputError) as e:
        parse_gpus("0", 2)
    assert "for GPU 0 alone write --gpus 0," in str(e.value) and "2 visible (indices 0..1)" in str(e.value)
    assert parse_gpus("0,", 2) == [0]


def test_an_index_that_does_not_exist_says_what_does(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(InputError) as e:
        parse_gpus("0,5", 2)
    assert str(e.value) == "--gpus: GPU 5 does not exist here, 2 visible: CUDA_VISIBLE_DEVICES=2,3 numbers them 0 = 2, 1 = 3"
    with pytest.raises(InputError, match="write a count"):
        parse_gpus("x", 2)
    with pytest.raises(InputError, match="names a GPU twice"):
        parse_gpus("1,1", 2)
