"""Timing local work in bursts (mgpu_bench.results.torch_timing.timed_for): a stall in the one call
that sizes the bursts must not leave bursts so short that a process stopped most of the time
shows its full speed in its fastest quartile (fleet's node pass and check's CPU ranks judge a CPU
process by it: a node slowed from outside passed as healthy when that call was stopped)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from mgpu_bench.results.torch_timing import timed_for, typical


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_stall_in_the_sizing_call_does_not_make_the_bursts_short():
    calls = []

    def fn():
        calls.append(None)
        _spin(0.03 if len(calls) == 2 else 0.0002)  # the second call (the one timed to size the bursts) stalls

    out = timed_for(fn, torch.device("cpu"), min_s=0.3)
    # about 250 calls a burst (50 ms / 0.2 ms), so 0.3 s takes 6 or 7 of them; one call a burst
    # (sized from the stalled 30 ms) would take 1,500 bursts
    assert 5 <= len(out) <= 20, len(out)
    assert len(calls) > 1000
    assert typical(out, False) == pytest.approx(0.0002, rel=0.5)


def test_a_process_stopped_three_quarters_of_the_time_is_slow_in_its_fastest_quartile():
    """The throttle tests/test_fleet.py plants (SIGSTOP 30 ms, SIGCONT 10 ms) cannot come from a
    thread of the process it stops: here the work itself waits out 30 ms of every 40 ms of wall
    clock, and the sizing call lands in such a wait."""
    t_start = time.perf_counter()
    calls = []

    def fn():
        calls.append(None)
        phase = (time.perf_counter() - t_start) % 0.04
        if len(calls) == 2 or phase >= 0.01:  # the sizing call, and every call in the 30 ms "stopped" part
            time.sleep(0.04 - phase if phase >= 0.01 else 0.03)
        _spin(0.0002)

    out = timed_for(fn, torch.device("cpu"), min_s=0.3)
    fastest = typical(out, False)
    assert fastest > 2.0 * 0.0002, (fastest, len(out))  # every burst spans a stall: about 4x slower


def test_bursts_are_sized_to_about_the_burst_length():
    stamp = []

    def fn():
        _spin(0.001)
        stamp.append(time.perf_counter())

    out = timed_for(fn, torch.device("cpu"), min_s=0.2, burst_s=0.05)
    assert 4 <= len(out) <= 8 and all(0.0009 < s < 0.003 for s in out), out
