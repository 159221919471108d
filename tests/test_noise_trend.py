"""Words follow the figures (issue 40): a trend in a run's per-window noise scale is claimed only
where the Mann-Kendall test finds one (noise_scale.mann_kendall), with the test and its p said. The
exact p is checked against every order of small series counted by hand; its false-alarm rate on
series with no trend against its 5% level; a flat series gets no trend claim, a growing one
"grows", a falling one "falls"."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mgpu_bench.training import noise_scale
from mgpu_bench.training.noise_scale import mann_kendall, trend_words


def _s(xs) -> int:
    return sum((xs[j] > xs[i]) - (xs[j] < xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)))


@pytest.mark.parametrize("xs", [[3.0, 1.0, 4.0, 1.5, 5.0], [45.7, 43.8, 45.4, 49.9, 60.1, 67.2],
                                [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0], [2.0, 9.0, 4.0, 7.0, 1.0, 8.0, 3.0]])
def test_the_exact_p_is_the_share_of_orders_at_least_as_extreme(xs):
    """Under no trend every order of the values is equally likely: p = the share of the n! orders
    whose |S| is at least the series' own, counted here one order at a time."""
    s = _s(xs)
    orders = list(itertools.permutations(xs))
    p = sum(abs(_s(o)) >= abs(s) for o in orders) / len(orders)
    got = mann_kendall(xs)
    assert got["s"] == s and got["p_from"] == "exact"
    assert got["p"] == pytest.approx(p, rel=1e-12)


def test_the_normal_approximation_takes_over_smoothly():
    """Past EXACT_UP_TO windows the normal approximation (tie-corrected variance, continuity
    correction) is used; at the edge it agrees with the exact distribution."""
    rng = np.random.default_rng(5)
    n = noise_scale.EXACT_UP_TO
    xs = list(np.arange(n) * 0.02 + rng.normal(0, 1, n))
    exact = mann_kendall(xs)
    var = n * (n - 1) * (2 * n + 5) / 18
    approx = math.erfc((abs(exact["s"]) - 1) / math.sqrt(var) / math.sqrt(2))
    assert exact["p_from"] == "exact" and exact["p"] == pytest.approx(approx, abs=0.002)
    assert mann_kendall([*xs, 99.0])["p_from"] == "normal approximation"


def test_series_without_a_trend_are_called_trends_about_five_times_in_a_hundred():
    """Independent lognormal windows (a job whose weights never moved), 5 to 50 of them: the test
    claims a trend at about its 5% level, not more (the exact p is conservative with ties only)."""
    rng = np.random.default_rng(40)
    claims = total = 0
    for n in (5, 8, 12, 20, 35, 50):
        for _ in range(150):
            xs = np.exp(rng.normal(3.7, 0.6, n))
            claims += mann_kendall(list(xs))["trend"] is not None
            total += 1
    assert claims / total <= 0.07, claims / total


def test_a_flat_series_gets_no_trend_and_says_the_test():
    """The issue's job: per-window values 18 to 206, median about 42, in no order; the first window
    below the last, which read as "went from 45.9 to 57.2 (the noise scale grows ...)"."""
    rng = np.random.default_rng(7)
    xs = list(np.exp(rng.normal(math.log(42), 0.6, 20)))
    xs[0], xs[-1] = 45.9, 57.2
    words = trend_words(xs, 45.9)
    assert words.startswith("its estimate shows no significant trend (Mann-Kendall trend test over its 20 windows")
    assert "p = " in words and "grows" not in words and "falls" not in words
    assert "the plan takes the whole run's 45.9" in words


def test_a_growing_series_grows_and_a_falling_one_falls_with_the_test_named():
    rng = np.random.default_rng(11)
    up = [40 * (1 + i / 10) * math.exp(rng.normal(0, 0.2)) for i in range(15)]
    words = trend_words(up, 60.0)
    assert words.startswith("its estimate grows over the run (Mann-Kendall trend test over its 15 windows: S = ")
    got = mann_kendall(up)
    assert got["trend"] == "grows" and got["p"] < noise_scale.TREND_ALPHA and f"p = {got['p']:.2g}" in words
    assert "McCandlish et al. 2018" in words
    down = trend_words(up[::-1], 60.0)
    assert down.startswith("its estimate falls over the run (Mann-Kendall") and "McCandlish" not in down


def test_too_few_windows_are_said_to_be_too_few():
    """Under 5 windows no order is rare enough for p < 0.05 (the smallest p is 2 / n!)."""
    assert mann_kendall([1.0, 2.0, 3.0, 4.0])["p"] == pytest.approx(2 / 24)
    words = trend_words([10.0, 20.0, 30.0, 40.0], 25.0)
    assert "too few to test for a trend" in words and "grows" not in words
    assert mann_kendall([1.0, 2.0]) is None and trend_words([], 1.0) == ""
    assert trend_words([None, 5.0, None], 5.0).startswith("its 1 window estimate(s)")
