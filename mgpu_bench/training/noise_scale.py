"""The gradient noise scale of a data-parallel job, from its own gradients (McCandlish et al. 2018,
"An Empirical Model of Large-Batch Training", appendix A), and what more GPUs buy.

Under DDP every rank holds, before the all-reduce, the gradient of its own B_small samples, and
after it the gradient of all B_big = n x B_small. With |G_small|^2 the mean over ranks and steps of
the squared norm of the ranks' local gradients and |G_big|^2 that of the all-reduced one, the
unbiased estimators of the paper's appendix A are

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

and the simple noise scale B_simple = tr(Sigma) / |G|^2, taken as the ratio of the two averaged
over many steps, as the paper does (the ratio of single steps' estimates is biased and wild). Its
uncertainty here: the jackknife over the windows the figures were summed in.

What it means (the paper's section 2): the steps to a given loss follow S = S_min (1 + B_noise / B),
so a batch well under the noise scale trains in proportionally fewer steps when it grows, and one
well over it barely fewer: doubling the batch (the GPUs, under data parallelism) divides the steps
by (1 + B_noise / B) / (1 + B_noise / 2B). Pollux (Qiao et al., OSDI 2021) weighs throughput by the
statistical efficiency (B_noise + B_0) / (B_noise + B) of a batch B against the batch B_0 the job
was tuned at: goodput = throughput x efficiency.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# Doubling the batch buys fewer steps than this factor: more GPUs buy tokens/s, not convergence.
NOT_WORTH = 1.2
TREND_ALPHA = 0.05  # a trend over the windows is claimed only below this two-sided p-value
EXACT_UP_TO = 60  # windows: the exact null distribution of Mann-Kendall's S up to here, the normal one beyond
TREND_TEST = "Mann-Kendall trend test"


def estimate(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float] | None:
    """(|G|^2, tr(Sigma)) from the mean squared norms of the small- and large-batch gradients and
    their batch sizes (appendix A); None where the batches are equal."""
    if not (b_big > b_small > 0):
        return None
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


def from_windows(windows: Sequence[dict]) -> dict | None:
    """The noise scale over windows of {small_sq, big_sq, steps, b_small, b_big} (sums of the
    squared norms over the window's steps): B_simple of the summed figures, its jackknife standard
    error over the windows (3 windows at least), per window its own, and the windows' sums (for a
    stretch of them: from_windows(out["window_sums"][a:b])). None without a usable window."""
    usable = [w for w in windows if w.get("steps") and w["b_big"] > w["b_small"] > 0]
    if not usable:
        return None

    def of(ws) -> float | None:
        steps = sum(w["steps"] for w in ws)
        small = sum(w["small_sq"] for w in ws) / steps
        big = sum(w["big_sq"] for w in ws) / steps
        b_small = sum(w["b_small"] * w["steps"] for w in ws) / steps
        b_big = sum(w["b_big"] * w["steps"] for w in ws) / steps
        got = estimate(small, big, b_small, b_big)
        if got is None or got[0] <= 0:
            return None
        return got[1] / got[0]

    whole = of(usable)
    steps = sum(w["steps"] for w in usable)
    out = {"b_simple": whole, "stderr": None, "windows": len(usable), "steps": steps,
           "b_small": sum(w["b_small"] * w["steps"] for w in usable) / steps,
           "b_big": sum(w["b_big"] * w["steps"] for w in usable) / steps,
           "per_window": [of([w]) for w in usable], "window_sums": [dict(w) for w in usable]}
    n = len(usable)
    if whole is not None and n >= 3:
        leave = [of(usable[:i] + usable[i + 1:]) for i in range(n)]
        if all(x is not None for x in leave):
            mean = sum(leave) / n
            out["stderr"] = math.sqrt((n - 1) / n * sum((x - mean) ** 2 for x in leave))
    return out


def fewer_steps(batch: float, noise: float, factor: float = 2.0) -> float:
    """How many times fewer steps a batch `factor` times larger needs (S = S_min (1 + B_noise / B))."""
    return (1 + noise / batch) / (1 + noise / (factor * batch))


def efficiency(noise: float, b0: float, batch: float) -> float:
    """Pollux's statistical efficiency of batch `batch` against `b0`: (B_noise + B_0) / (B_noise + B)."""
    return (noise + b0) / (noise + batch)


def words(result: dict | None, source: str = "") -> str | None:
    """The finding: the global batch against the noise scale and what doubling the GPUs gives."""
    if not result:
        return None
    if not result.get("b_simple") or result["b_simple"] <= 0:
        return (f"gradient noise scale{source}: not told apart over {result.get('steps', 0)} steps: the estimate of "
                "|G|^2 came out at or below 0 (the gradient's mean is lost in its noise at this batch: the noise "
                "scale is far above it; measure more steps)")
    noise, batch = result["b_simple"], result["b_big"]
    err = f" +- {result['stderr']:,.0f}" if result.get("stderr") else " (no uncertainty: under 3 windows)"
    ratio = batch / noise
    gain = fewer_steps(batch, noise)
    head = (f"gradient noise scale B_simple = {noise:,.0f}{err} samples{source} (McCandlish et al. 2018, over "
            f"{result['steps']} steps in {result['windows']} window(s)): the global batch {batch:,.0f} is {ratio:.2g}x it")
    if gain < NOT_WORTH:
        return (f"{head}: more GPUs buy samples/s, not convergence (doubling them divides the steps to a loss by "
                f"only {gain:.2f})")
    return f"{head}: doubling the GPUs (the batch with them) gives about {gain:.2f}x fewer steps to the same loss"


def combine(noises: Sequence[dict | None], step_s: float | None) -> dict | None:
    """The noise scale of a job from every rank's Noise figures ({windows, host_s, steps (timed
    steps), device_s_per_step (averaged over them)}, gradsync.Noise.figures): per window the mean
    over ranks of the local
    squared norm, the all-reduced one (the same on every rank: rank 0's), the ranks' batches
    (B_big their sum); from_windows of those, with its cost per step (the slowest rank's host time
    and the device norms' time) and its share of the step. None unless every rank has windows."""
    if not noises or any(not n or not n.get("windows") for n in noises):
        return None
    k = min(len(n["windows"]) for n in noises)
    windows = []
    for i in range(k):
        ws = [n["windows"][i] for n in noises]
        windows.append({"small_sq": sum(w["small_sq"] for w in ws) / len(ws), "big_sq": ws[0]["big_sq"],
                        "steps": ws[0]["steps"], "b_small": sum(w["b_small"] for w in ws) / len(ws),
                        "b_big": sum(w["b_small"] for w in ws)})
    out = from_windows(windows)
    if out is None:
        return None
    steps = max(1, noises[0]["steps"])
    cost = max(n["host_s"] for n in noises) / steps + max(n.get("device_s_per_step") or 0.0 for n in noises)
    out["cost_s_per_step"] = cost
    out["cost_share"] = cost / step_s if step_s else None
    out["source"] = ("McCandlish et al. 2018, appendix A: each rank's gradient (B_small) against the all-reduced one "
                     "(B_big), squared norms taken in DDP's communication hook")
    return out


def _kendall_null(n: int):
    """P(D = k) for k = 0 .. n(n-1)/2: the number of inversions D of a random order of n distinct
    values (each order equally likely when there is no trend). Built one value at a time: the i-th
    adds 0 .. i - 1 inversions, uniformly (the Mahonian numbers, normalised)."""
    import numpy as np

    dist = np.ones(1)
    for i in range(2, n + 1):
        dist = np.convolve(dist, np.full(i, 1.0 / i))
    return dist


def mann_kendall(values: Sequence[float]) -> dict | None:
    """The Mann-Kendall test for a monotonic trend in a series taken in order (Mann 1945,
    Econometrica 13; Kendall 1975, "Rank Correlation Methods"): S = the sum over pairs i < j of
    sign(x_j - x_i); no trend, and every order of the values is equally likely. The two-sided p is
    P(|S| >= |s|) from S's exact distribution up to EXACT_UP_TO values (S = n(n-1)/2 - 2 D, D the
    inversions: _kendall_null), else from the normal one with its variance corrected for ties and
    a continuity correction. It ranks, so one wild window moves S by at most n - 1: a trend must
    stand out of the windows' spread. Ties count 0 in S; the exact p then takes the tie-free
    distribution, whose wider spread makes it conservative. None under 3 values (no order to test);
    below 5 no p reaches 0.05 (the smallest is 2 / n!)."""
    import numpy as np

    x = np.asarray([float(v) for v in values], dtype=float)
    n = len(x)
    if n < 3 or not np.all(np.isfinite(x)):
        return None
    i, j = np.triu_indices(n, 1)
    s = int(np.sign(x[j] - x[i]).sum())
    pairs = n * (n - 1) // 2
    if n <= EXACT_UP_TO:
        dist = _kendall_null(n)
        stat = np.abs(pairs - 2 * np.arange(pairs + 1))
        p = float(dist[stat >= abs(s)].sum())
        how = "exact"
    else:
        _, counts = np.unique(x, return_counts=True)
        var = (n * (n - 1) * (2 * n + 5) - float(np.sum(counts * (counts - 1) * (2 * counts + 5)))) / 18.0
        z = 0.0 if s == 0 or var <= 0 else (abs(s) - 1) / math.sqrt(var)
        p = math.erfc(z / math.sqrt(2.0))
        how = "normal approximation"
    p = min(1.0, p)
    return {"test": TREND_TEST, "n": n, "s": s, "tau": s / pairs, "p": p, "p_from": how, "alpha": TREND_ALPHA,
            "trend": ("grows" if s > 0 else "falls") if p < TREND_ALPHA and s else None}


def trend_words(per_window: Sequence[float | None], whole: float, unit: str = "samples") -> str:
    """What a run's per-window noise scales say over time, in words: a trend ("grows", "falls")
    only where mann_kendall finds one at TREND_ALPHA, with the test and its p; otherwise "no
    significant trend", with the test and p as well, beside the windows' spread."""
    xs = [float(v) for v in per_window if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if not xs:
        return ""

    def num(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

    spread = f"per window {num(min(xs))} to {num(max(xs))} {unit}, median {num(statistics.median(xs))}"
    took = f"the plan takes the whole run's {num(whole)}"
    mk = mann_kendall(xs)
    if mk is None or len(xs) < 5:
        return (f"its {len(xs)} window estimate(s) ({spread}) are too few to test for a trend (the "
                f"{TREND_TEST} needs 5 to reach p < {TREND_ALPHA:g}): {took}")
    said = f"{TREND_TEST} over its {mk['n']} windows: S = {mk['s']}, p = {mk['p']:.2g}"
    if mk["trend"] is None:
        return f"its estimate shows no significant trend ({said}; {spread}): {took}"
    third = max(1, len(xs) // 3)
    ends = (f"the median of its first {third} windows {num(statistics.median(xs[:third]))} {unit}, of its last "
            f"{third} {num(statistics.median(xs[-third:]))}")
    why = ", as the noise scale does while the loss falls (McCandlish et al. 2018)" if mk["trend"] == "grows" else ""
    return f"its estimate {mk['trend']} over the run ({said}; {ends}){why}: {took}"
