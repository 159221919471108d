"""`mgpu-bench memory` on CPU: parsing, fragmentation and latency arithmetic, findings, bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.core.errors import InputError
from mgpu_bench.probes.memory import analyse as memory_analyse
from mgpu_bench.probes.memory import measure as memory
from mgpu_bench.probes.memory.measure import ChurnResult, HbmResult, MemoryConfig, MemoryRun

GiB = 1 << 30


def churn(allocator: str, pattern: str, free: int, largest: int, events=()) -> ChurnResult:
    raw = {"allocator": allocator, "pattern": pattern, "free_before": 140 * GiB, "total": 141 * GiB,
           "free_after_pattern": free, "held_bytes": 100 * GiB, "allocations_done": 500, "allocations_failed": 0,
           "largest_block": largest, "search_seconds": 0.4, "pool_reserved": None, "pool_used": None,
           "events": list(events)}
    return ChurnResult(0, allocator, pattern, raw)


def test_parse_patterns_and_allocators():
    assert memory.parse_patterns("all") == memory.PATTERNS
    assert memory.parse_patterns("interleaved, grow-shrink") == ("interleaved", "grow-shrink")
    assert memory.parse_allocators("cudaMalloc,cudaMallocAsync,VMM") == ("cudaMalloc", "async", "vmm")
    assert memory.parse_allocators("all") == memory.ALLOCATORS
    for bad in ("zigzag",):
        with pytest.raises(InputError):
            memory.parse_patterns(bad)
    for bad in ("jemalloc", ","):
        with pytest.raises(InputError):
            memory.parse_allocators(bad)


def test_fragmentation_is_one_minus_largest_over_free():
    r = churn("async", "interleaved", free=40 * GiB, largest=10 * GiB)
    assert r.fragmentation == pytest.approx(0.75)
    assert r.lost_bytes == 30 * GiB
    assert churn("cudaMalloc", "interleaved", free=40 * GiB, largest=40 * GiB).fragmentation == 0.0
    assert churn("vmm", "interleaved", free=0, largest=0).fragmentation is None


def test_pool_memory_counts_as_free_for_the_async_allocator():
    r = churn("async", "interleaved", free=10 * GiB, largest=20 * GiB)
    r.raw.update(pool_reserved=50 * GiB, pool_used=30 * GiB)
    assert r.free == 30 * GiB
    assert r.fragmentation == pytest.approx(1 / 3)


def test_simulated_arena_fragments_under_interleaving():
    """The native patterns on the probe's host-side first-fit arena: interleaved frees leave
    holes no bigger than the freed class, so the largest block is the untouched tail beyond the
    budget (plus at most one hole)."""
    from mgpu_bench import _native

    raw = _native._memory_churn_simulated("interleaved", 1, 0.9, 64 * GiB)
    r = ChurnResult(0, "simulated", "interleaved", dict(raw))
    assert r.largest <= raw["free_before"] - raw["budget"] + (160 << 20)
    assert r.fragmentation > 0.5 and r.free > 20 * GiB


def test_latency_percentiles_by_size_class():
    events = [("alloc", 2 << 20, s * 1e-6) for s in range(1, 101)] + [("alloc", 2 * GiB, 5e-3), ("free", 2 << 20, 1e-5)]
    lat = churn("cudaMalloc", "grow-shrink", 10 * GiB, 10 * GiB, events).latency()
    small = lat["alloc"]["<= 4 MiB"]
    assert small["count"] == 100
    assert small["p50"] == pytest.approx(50e-6) and small["p99"] == pytest.approx(99e-6)
    assert small["max"] == pytest.approx(100e-6)
    assert lat["alloc"]["> 1 GiB"]["count"] == 1
    assert lat["free"]["<= 4 MiB"]["p50"] == pytest.approx(1e-5)


def test_size_classes_are_inclusive_upper_bounds():
    assert memory.size_class(4 << 20) == "<= 4 MiB"
    assert memory.size_class((4 << 20) + 1) == "<= 64 MiB"
    assert memory.size_class(GiB) == "<= 1 GiB"
    assert memory.size_class(GiB + 1) == "> 1 GiB"


def test_hbm_counts_bytes_as_stated():
    h = HbmResult(0, "copy_ce", 4 * GiB, 4 * GiB, [2e-3, 2.1e-3, 1.9e-3], 4.8e12)
    assert h.bandwidth == pytest.approx(8 * GiB / 2e-3)
    assert h.pct_peak == pytest.approx(100 * 8 * GiB / 2e-3 / 4.8e12)


def test_findings_name_the_fragmenting_allocator_and_the_one_that_recovers():
    run = MemoryRun(MemoryConfig(), devices=[])
    run.churn = [churn("cudaMalloc", "interleaved", 40 * GiB, 40 * GiB),
                 churn("async", "interleaved", 40 * GiB, 15 * GiB)]
    lines = [f.text for f in memory_analyse.findings(run)]
    assert any("interleaved under async" in x and "25.00 GiB of 40.00 GiB" in x for x in lines)
    assert any("cudaMalloc recovers it" in x for x in lines)
    run.churn = [churn("cudaMalloc", "interleaved", 40 * GiB, 39.9 * GiB)]
    assert any(x.startswith("no allocator fragmented") for x in [f.text for f in memory_analyse.findings(run)])
    # under 5% but more than a point apart: stated, with both figures
    run.churn = [churn("cudaMalloc", "small-between-large", 133 * GiB, 132.9 * GiB),
                 churn("async", "small-between-large", 133 * GiB, 129.5 * GiB)]
    lines = [f.text for f in memory_analyse.findings(run)]
    assert any("small-between-large: async leaves 3.50 GiB (2.6%)" in x and "cudaMalloc 0.10 GiB (0.1%)" in x
               for x in lines)


def test_findings_flag_slow_hbm():
    run = MemoryRun(MemoryConfig(), devices=[])
    run.hbm = [HbmResult(0, "copy_ce", GiB, GiB, [1e-3], 4.8e12)]  # 2.15 TB/s of 4.8
    assert any("HBM copy" in x and "below 80%" in x for x in [f.text for f in memory_analyse.findings(run)])


@pytest.mark.parametrize("args,text", [
    (["--pattern", "zigzag"], "unknown --pattern"),
    (["--allocator", "jemalloc"], "unknown --allocator"),
    (["--budget", "1.5"], "--budget"),
    (["--no-churn"], "nothing to run"),
    (["--json", "/nonexistent/m.json"], "does not exist"),
    (["--no-churn", "--max-batch", "tiny", "--seq-len", "2048"], "--seq-len 2048 does not fit tiny"),
    (["--no-churn", "--torch-allocators", "default", "--model", "tiny"], "--seq-lens reaches 2048"),
])
def test_cli_bad_input_is_one_line_exit_2(args, text):
    res = CliRunner().invoke(cli, ["memory", *args])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and text in lines[0]


def test_cli_without_gpu_says_so_exit_2():
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("this machine has GPUs")
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "memory"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2
    assert "memory needs NVIDIA GPUs" in proc.stderr and "Traceback" not in proc.stderr
