"""Timing local work in bursts (mgpu_bench.results.torch_timing.timed_for): a stall in the one call
that sizes the bursts must not leave bursts so short that a process stopped most of the time
shows its full speed in its fastest quartile (fleet's node pass and check's CPU ranks judge a CPU
process by it: a node slowed from outside passed as healthy when that call was stopped).

The work here advances a clock of the test's own (timed_for reads time.perf_counter through the
module), so the figures are exact whatever else the host runs."""

from __future__ import annotations

import time
import types

import pytest

pytest.importorskip("torch")

from mgpu_bench.results import torch_timing
from mgpu_bench.results.torch_timing import timed_for, typical

CPU = types.SimpleNamespace(type="cpu")


@pytest.fixture
def clock(monkeypatch):
    """The clock timed_for reads; fn() moves it by the seconds its call 'takes'."""
    now = types.SimpleNamespace(t=0.0)
    monkeypatch.setattr(torch_timing, "time", types.SimpleNamespace(perf_counter=lambda: now.t,
                                                                   monotonic=time.monotonic))
    return now


def test_a_stall_in_the_sizing_call_does_not_make_the_bursts_short(clock):
    calls = []

    def fn():
        calls.append(None)
        clock.t += 0.03 if len(calls) == 2 else 0.0002  # the second call (timed to size the bursts) stalls

    out = timed_for(fn, CPU, min_s=0.3)
    # 250 calls a burst (50 ms / 0.2 ms): 0.3 s takes 6 bursts; one call a burst (sized from the stalled
    # 30 ms, as before) took 1,500
    assert 6 <= len(out) <= 7 and typical(out, False) == pytest.approx(0.0002), out


def test_a_process_stopped_three_quarters_of_the_time_is_slow_in_its_fastest_quartile(clock):
    """The throttle tests/test_fleet.py plants (SIGSTOP 30 ms, SIGCONT 10 ms): a call that would run
    in the stopped 30 ms of a 40 ms cycle waits for the cycle's end; the sizing call lands in a stop."""
    calls = []

    def fn():
        calls.append(None)
        phase = clock.t % 0.04
        if len(calls) == 2:
            clock.t += 0.03
        elif phase >= 0.01:
            clock.t += 0.04 - phase
        clock.t += 0.0002

    out = timed_for(fn, CPU, min_s=0.3)
    fastest = typical(out, False)
    assert fastest > 3.0 * 0.0002, (fastest, out)  # every burst spans stops: about 4x slower (the old code: 1x)


def test_bursts_are_sized_to_about_the_burst_length(clock):
    def fn():
        clock.t += 0.001

    out = timed_for(fn, CPU, min_s=0.2, burst_s=0.05)
    assert out == pytest.approx([0.001] * 5)  # 50 calls a burst; at least 5 bursts and 0.2 s
