from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.sizes import format_bytes, parse_size, parse_sizes


@pytest.mark.parametrize(
    "text, value",
    [("8", 8), ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("1G", 1 << 30), ("2GiB", 2 << 30),
     ("1.5K", 1536), (" 4 M ", 4 << 20), ("1T", 1 << 40), ("512B", 512)],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "1X", "M", "-1K", "1.3", "1K2", "0x10"])
def test_parse_size_rejects(text):
    with pytest.raises(InputError):
        parse_size(text)


def test_range_factor_two_includes_both_ends():
    assert parse_sizes("1M-1G") == [1 << k for k in range(20, 31)]


def test_range_factor_and_step():
    assert parse_sizes("1K-16K", factor=4) == [1024, 4096, 16384]
    assert parse_sizes("1K-4K", step="1K") == [1024, 2048, 3072, 4096]


def test_list_keeps_order():
    assert parse_sizes("64M,8,1K") == [64 << 20, 8, 1024]


@pytest.mark.parametrize(
    "spec, kw, words",
    [("1G-1M", {}, "ends below its start"), ("1M-1G", {"factor": 0}, "greater than 1"),
     ("1M-1G", {"factor": -2}, "greater than 1"), ("1M-1G", {"factor": 1.0}, "greater than 1"),
     ("1M-1G", {"factor": float("nan")}, "greater than 1"),
     ("0-1M", {}, "above 0"), ("1M-1G", {"step": "0"}, "positive"), ("8,1K", {"factor": 2}, "range"),
     (",", {}, "empty"), ("1M-1G", {"factor": 2, "step": "1M"}, "either")],
)
def test_parse_sizes_rejects(spec, kw, words):
    with pytest.raises(InputError, match=words):
        parse_sizes(spec, **kw)


@given(st.integers(0, 36), st.integers(0, 12), st.sampled_from([1.5, 2.0, 3.0, 4.0]))
def test_range_is_increasing_and_bounded(lo_exp, span, factor):
    lo, hi = 1 << lo_exp, 1 << (lo_exp + span)
    sizes = parse_sizes(f"{lo}-{hi}", factor=factor)
    assert sizes[0] == lo
    assert all(a < b for a, b in itertools.pairwise(sizes))
    assert sizes[-1] <= hi
    assert max(sizes[-1] + 1, int(sizes[-1] * factor)) > hi  # nothing that fits was dropped


@given(st.integers(1, 1 << 45))
def test_size_text_round_trip(n):
    assert parse_size(str(n)) == n


def test_format_bytes():
    assert format_bytes(8) == "8 B"
    assert format_bytes(1 << 20) == "1 MiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(1 << 30) == "1 GiB"
    assert format_bytes(67108860) == "67108860 B"  # rounded, so not "64 MiB"
    assert format_bytes(1000) == "1000 B"


def test_large_sizes_are_exact_and_capped():
    assert parse_size("123456789123456789"[:15]) == 123456789123456
    assert parse_size("1125899906842624") == 1 << 50
    with pytest.raises(InputError, match="above 1 PiB"):
        parse_size("99999999999T")


def test_size_count_is_capped():
    with pytest.raises(InputError, match="more than 1000 sizes"):
        parse_sizes("1-1G", step="1")
    with pytest.raises(InputError, match="more than 1000 sizes"):
        parse_sizes("1K-2K", factor=1.0000001)
    with pytest.raises(InputError, match="finite"):
        parse_sizes("1K-2K", factor=float("inf"))
