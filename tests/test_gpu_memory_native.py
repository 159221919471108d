"""The native half of `mgpu-bench memory`: churn patterns under each allocator, the largest-block
search, HBM bandwidth. The `gpu` tests need one NVIDIA GPU (`pytest -m gpu`); the others run
anywhere: names, argument checks, and the patterns and search on a simulated arena (no CUDA)."""

from __future__ import annotations

import statistics

import pytest

from mgpu_bench import _native
from mgpu_bench.core.errors import CudaError, OutOfMemoryError

MiB = 1 << 20
GiB = 1 << 30
ALLOCATORS = ["cudaMalloc", "async", "vmm"]
PATTERNS = ["interleaved", "grow-shrink", "small-between-large"]
HBM_KINDS = ["copy_ce", "copy_sm", "read", "write"]


def _replay(result: dict) -> int:
    """Checks the event list against the result; returns the most bytes held at once."""
    held = peak = 0
    allocs = 0
    for kind, nbytes, seconds in result["events"]:
        assert kind in ("alloc", "free")
        assert nbytes > 0 and nbytes % (2 * MiB) == 0
        assert seconds >= 0.0
        if kind == "alloc":
            held += nbytes
            allocs += 1
        else:
            held -= nbytes
        assert held >= 0
        peak = max(peak, held)
    assert held == result["held_bytes"]
    assert allocs == result["allocations_done"]
    return peak


# ---- without a GPU ---------------------------------------------------------------------------


def test_functions_exist_and_list_their_names():
    for name in ("memory_churn", "memory_patterns", "memory_allocators", "hbm_bandwidth", "hbm_kinds",
                 "_memory_churn_simulated"):
        assert callable(getattr(_native, name)), name
    assert _native.memory_patterns() == PATTERNS
    assert _native.memory_allocators() == ALLOCATORS
    assert _native.hbm_kinds() == HBM_KINDS


@pytest.mark.parametrize("call, words", [
    (lambda: _native.memory_churn(0, "caching", "interleaved"), "cudaMalloc, async, vmm"),
    (lambda: _native.memory_churn(0, "vmm", "zigzag"), "interleaved, grow-shrink, small-between-large"),
    (lambda: _native.memory_churn(0, "vmm", "interleaved", 0, 0.0), "budget_fraction"),
    (lambda: _native.memory_churn(0, "vmm", "interleaved", 0, 1.5), "budget_fraction"),
    (lambda: _native._memory_churn_simulated("zigzag", 0, 0.9, GiB), "interleaved"),
    (lambda: _native.hbm_bandwidth(0, "triad"), "copy_ce, copy_sm, read, write"),
])
def test_unknown_names_and_bad_arguments_raise_value_error_before_any_cuda_call(call, words):
    with pytest.raises(ValueError, match=words):
        call()


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_without_a_driver_the_error_names_it(allocator):
    if _native.driver_version() != 0:
        pytest.skip("a driver is present")
    with pytest.raises(CudaError, match="^no NVIDIA driver found"):
        _native.memory_churn(0, allocator, "interleaved")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_simulated_patterns_keep_the_budget_and_account_for_every_call(pattern):
    capacity = 141 * 10**9  # an H200's memory
    r = _native._memory_churn_simulated(pattern, 7, 0.9, capacity)
    assert r["allocator"] == "simulated" and r["pattern"] == pattern
    assert r["pool_reserved"] is None and r["pool_used"] is None
    assert r["budget"] <= 0.9 * r["free_before"] and r["budget"] % (2 * MiB) == 0
    assert r["held_bytes"] > 0 and r["events"]
    assert _replay(r) <= r["budget"]
    assert r["allocations_failed"] in (0, 1)
    assert r["free_after_pattern"] == capacity // (2 * MiB) * (2 * MiB) - r["held_bytes"]
    assert 0 < r["largest_block"] <= r["free_after_pattern"]
    # down from the top in doubling steps (about log2(1000)), then a bisection to 0.25%
    assert r["search_probes"] <= 24


@pytest.mark.parametrize("pattern", PATTERNS)
def test_simulated_patterns_are_deterministic_from_the_seed(pattern):
    def calls(seed):
        r = _native._memory_churn_simulated(pattern, seed, 0.9, 80 * GiB)
        return [(kind, nbytes) for kind, nbytes, _s in r["events"]], r["largest_block"]

    assert calls(3) == calls(3)
    if pattern != "interleaved":  # interleaved does not draw
        assert calls(3) != calls(4)


def _resolution(r) -> int:
    granules = r["free_after_pattern"] // (2 * MiB)
    return max(1, granules // 400) * 2 * MiB


def test_simulated_interleaved_leaves_holes_smaller_than_the_big_class():
    # 64 GiB, all of it: 256 pairs of 96 + 160 MiB fill it exactly; freeing the 96 MiB blocks
    # leaves 24 GiB free in 96 MiB holes.
    r = _native._memory_churn_simulated("interleaved", 0, 1.0, 64 * GiB)
    sizes = {nbytes for kind, nbytes, _s in r["events"] if kind == "alloc"}
    assert sizes == {96 * MiB, 160 * MiB}
    assert r["allocations_done"] == 512 and r["allocations_failed"] == 0
    assert r["held_bytes"] == 256 * 160 * MiB
    assert r["free_after_pattern"] == 24 * GiB
    # the search resolves to 0.25% of the free memory (never finer than one 2 MiB granule)
    assert 96 * MiB - _resolution(r) <= r["largest_block"] <= 96 * MiB


def test_simulated_small_between_large_strands_free_memory_in_large_holes():
    r = _native._memory_churn_simulated("small-between-large", 0, 1.0, 64 * GiB)
    sizes = {nbytes for kind, nbytes, _s in r["events"] if kind == "alloc"}
    assert GiB in sizes and sizes - {GiB} <= {2 * MiB, 4 * MiB, 6 * MiB, 8 * MiB}
    assert r["held_bytes"] < 0.1 * 64 * GiB  # only the small blocks stay
    assert GiB - _resolution(r) <= r["largest_block"] < r["free_after_pattern"] / 4


def test_simulated_grow_shrink_keeps_long_lived_blocks_only():
    r = _native._memory_churn_simulated("grow-shrink", 1, 0.9, 64 * GiB)
    assert r["allocations_failed"] == 0
    # between steps only the kept blocks (budget/64 each, at most half the budget) are held
    kept = r["budget"] // 64 // (2 * MiB) * (2 * MiB)
    assert r["held_bytes"] % kept == 0 and r["budget"] // 4 < r["held_bytes"] <= r["budget"] // 2
    assert sum(1 for kind, _b, _s in r["events"] if kind == "free") > 500
    # kept blocks sit amid freed activations: one contiguous arena cannot give all its free memory
    assert r["largest_block"] < r["free_after_pattern"]


# ---- on a GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_churn_returns_sane_numbers_and_gives_the_memory_back(allocator, pattern):
    r = _native.memory_churn(0, allocator, pattern, 1, 0.9)
    assert r["allocator"] == allocator and r["pattern"] == pattern
    assert 0 < r["free_before"] <= r["total"]
    assert 0 < r["budget"] <= 0.9 * r["free_before"]
    assert r["held_bytes"] > 0 and r["events"]
    assert _replay(r) <= r["budget"]
    assert r["allocations_failed"] in (0, 1)
    cached = 0
    if allocator == "async":
        assert r["pool_reserved"] >= r["pool_used"] >= r["held_bytes"]
        cached = r["pool_reserved"] - r["pool_used"]
    else:
        assert r["pool_reserved"] is None and r["pool_used"] is None
    slack = 64 * MiB
    assert 0 < r["largest_block"] <= r["free_after_pattern"] + cached + slack
    # The 2 s target holds for cudaMalloc and VMM (one probe; 0.16-0.45 s on an H200). The pool
    # needs several probes, each trimming and regrowing ~130 GB: 3.4 s was measured for
    # small-between-large (benchmarks/RESULTS.md), so its bound is looser.
    bound = 5.0 if allocator == "async" else 2.0
    assert r["search_seconds"] < bound, r["search_seconds"]
    assert r["search_probes"] <= 24
    free_now, _total = _native.mem_get_info(0)
    assert free_now >= r["free_before"] - 256 * MiB  # everything freed, the pool destroyed


@pytest.mark.gpu
@pytest.mark.parametrize("kind", HBM_KINDS)
def test_hbm_reports_bytes_and_positive_seconds(kind):
    nbytes = GiB + 8  # rounded down to 16
    r = _native.hbm_bandwidth(0, kind, nbytes, 1, 5)
    assert len(r["seconds"]) == 5 and all(s > 0 for s in r["seconds"])
    moved = {"copy_ce": (GiB, GiB), "copy_sm": (GiB, GiB), "read": (GiB, None), "write": (0, GiB)}[kind]
    assert r["bytes_read"] == moved[0]
    if moved[1] is None:
        assert 0 < r["bytes_written"] < MiB  # one 4-byte result per block
    else:
        assert r["bytes_written"] == moved[1]
    rate = (r["bytes_read"] + r["bytes_written"]) / statistics.median(r["seconds"])
    assert 50e9 < rate < 10e12, rate  # above 10 TB/s a kernel's memory traffic was dropped


@pytest.mark.gpu
def test_hbm_buffers_too_large_raise_out_of_memory():
    _free, total = _native.mem_get_info(0)
    with pytest.raises(OutOfMemoryError, match="out of memory"):
        _native.hbm_bandwidth(0, "copy_ce", total, 0, 1)
