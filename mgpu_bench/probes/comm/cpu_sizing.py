"""How a sweep on CPU processes (gloo) fits the machine: its first estimate, each size's share of
it, the rule that leaves out a size the measured rate says cannot fit, and the revised estimate.

One gloo collective over a large buffer takes seconds on a small machine, and another job on the
same cores can halve the rate at any moment, so no fixed iteration count or guessed rate keeps a
sweep to a promised time. The rule (pure; torch_backend.py applies it in every rank, measure.py
says the revisions):

- Every request gets an allotment, guessed from its size (the GUESS_* rates): its fixed part
  (buffers, the data pattern written and checked), its warm-up, its timed iterations and the
  check. The first estimate is their sum plus the processes' start-up, slowed by what else the
  host runs when it is made (host_slowdown: a busy host's ranks get a share of its CPUs).
- A size's timed iterations, burst and samples together, fit in TIMED_S (or twice --min-time
  when that is longer), with at least MIN_ITERS in each pass.
- Before a size, its least work (fixed part, 2 warm-up iterations, MIN_ITERS twice, the check)
  is projected from the last size measured in its series (op, dtype, reduction, placement) at
  the measured rate. It starts only when that fits its share: its own allotment (and SLACK of
  it) plus what the sizes of its series before it left unused of theirs (less what they
  overran), or what the whole sweep before it left unused where that is more (a series that
  overran uses the time other series left, and one on time is never cut by another's
  overrun), never less than MIN_SHARE_S and never more than half of --timeout. A size that
  does not fit ends its series
  (the larger sizes of the series are left out with it) with one note; the sweep goes on with
  the next series and exits 0. The sweep's first request also warms the processes up (gloo's
  connections, the allocator): its time counts as start-up, and its fixed part is taken as no
  more than the guess's when the sizes after it are projected.

So the whole sweep keeps within about its first estimate (at most about twice it) on a machine
slower than the guess, which measures fewer sizes, and ends sooner on a faster one; the first size of a series has no rate
to be projected from and always runs. Every rank decides from the same agreed figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mgpu_bench.results.measurement import TimingOptions
from mgpu_bench.results.sizes import format_bytes

TIMED_S = 2.0  # a size's timed iterations, both passes, at most this (or 2 x --min-time)
MIN_ITERS = 3  # timed iterations per pass, at least
SKIP_SHARE = 0.5  # no size whose least work would pass this share of --timeout is started
# A small size's time is mostly fixed cost, so scaling it linearly projects a far larger size far
# too slow (1 KiB to 64 MiB: minutes per iteration). From a size more than FAR times smaller, a
# projection is no slower than the estimate's guess (GUESS_*) where that is faster.
FAR = 8
# A size may pass its share by this much of its own allotment (it may take twice its guess): the
# guess is a guess. The whole sweep then keeps within its first estimate plus its largest
# allotment, so within twice the estimate.
SLACK = 1.0
# A size whose least work is under this always fits: leaving it out saves nothing that matters,
# while a loaded host makes every small request cost about this much.
MIN_SHARE_S = 2.0
# Below this many bytes a request's fixed part is its barriers and gathers, not its data (the
# pattern and check of 4 MiB take about 20 ms): it is projected as it was, not scaled.
SMALL_BYTES = 4 << 20

# The guess behind the first estimate, from a 2-core VM (torch 2.13, 2 gloo ranks, fp32, idle):
# allreduce moved 1.0-1.5 GB/s algbw and allgather 0.5-0.9 at 16-256 MiB; a call costs about
# 0.3-0.5 ms at 1 KiB; writing the pattern and checking the result ran at about 0.2 GB/s of the
# size per rank; a request's barriers, gathers and bookkeeping add about 0.3 s.
GUESS_RATE = 0.5e9  # bytes/s of the size, per call
GUESS_LATENCY_S = 0.5e-3
GUESS_CHECK_RATE = 0.2e9  # bytes/s of the size: the pattern written and the result checked
GUESS_FIXED_S = 0.3  # 16 requests of 1-64 KiB: 7.6 s of sweep, about 3 s of it the processes' set-up
GUESS_STARTUP_S = 5.0  # Python, torch and the processes' start-up and rendezvous

# The guess is an idle host's. Beside other running processes the ranks get a share of the CPUs:
# the first estimate is slowed by what the host runs when it is made (see host_slowdown), read from
# /proc/loadavg's count of runnable tasks (proc(5)), sampled over about 0.1 s by startup.others(). Under
# SLOWDOWN_SAY the estimate says nothing of it.
SLOWDOWN_SAY = 1.2
_slowdown: dict[int, tuple[float, int, int]] = {}


def host_slowdown(nranks: int) -> tuple[float, int, int]:
    """(factor, other processes running, CPUs): how many times slower than on an idle host
    `nranks` CPU ranks run beside the processes running now, each runnable task taking an equal
    share of the CPUs this process may use: max(1, (others + nranks) / cpus) / max(1, nranks / cpus).
    Read once per process, so that the estimate said and the allotments the sweep keeps to agree;
    (1.0, 0, cpus) where /proc/loadavg cannot be read."""
    if nranks in _slowdown:
        return _slowdown[nranks]
    from mgpu_bench.core import startup

    cpus, others = startup.cpus(), startup.others()  # /proc/loadavg's runnable count, read once per process
    _slowdown[nranks] = (slowdown_factor(others, nranks, cpus), others, cpus)
    return _slowdown[nranks]


def slowdown_factor(others: int, nranks: int, cpus: int) -> float:
    """How many times slower `nranks` ranks run beside `others` running processes than alone, each
    runnable task taking an equal share of `cpus` CPUs."""
    return max(1.0, (others + nranks) / cpus) / max(1.0, nranks / cpus)


def slowdown_text(nranks: int) -> str:
    """', slowed 5.5x by the 9 other processes running on 2 CPUs' where the host is busy, else ''."""
    factor, others, cpus = host_slowdown(nranks)
    if factor < SLOWDOWN_SAY:
        return ""
    return f", {factor:.1f}x slower for the {others} other process(es) running on {cpus} CPU(s)"


def startup_seconds(nranks: int) -> float:
    """The processes' start-up as the first estimate counts it, on this host now."""
    return GUESS_STARTUP_S * host_slowdown(nranks)[0]


def timed_cap(timing: TimingOptions) -> float:
    """Seconds a size's timed iterations (burst and samples) may take on CPU processes."""
    return max(TIMED_S, 2.0 * timing.min_time_s)


def warmup_count(timing: TimingOptions, projected_s: float | None, budget_s: float | None) -> int:
    """Warm-up iterations: max(2, --warmup-iters), cut to 2 when a projected iteration would make
    them longer than a quarter of the timed budget."""
    warm = max(2, timing.warmup_iters)
    if budget_s is not None and projected_s is not None and warm * projected_s > budget_s / 4:
        warm = 2
    return warm


def timed_counts(seconds_per_iter: float, timing: TimingOptions, budget_s: float | None) -> tuple[int, int, int]:
    """(iterations per pass, iterations per sample, samples) at an agreed per-iteration estimate:
    --iters, or enough to fill --min-time within [min_iters, max_iters]; with a budget (CPU), at
    most what fits it in two passes and at least MIN_ITERS."""
    t = seconds_per_iter
    iters = timing.iters
    if iters <= 0:
        want = math.ceil(timing.min_time_s / t) if t > 0 else timing.max_iters
        iters = int(min(max(want, timing.min_iters), timing.max_iters))
        if budget_s is not None and t > 0:
            iters = max(MIN_ITERS, min(iters, int(budget_s / (2 * t))))
    want_batch = math.ceil(timing.sample_target_s / t) if t > 0 else 1
    batch = min(max(want_batch, 1), max(1, iters // 20))
    return iters, batch, iters // batch


def least_work(seconds_per_iter: float, fixed_s: float, timing: TimingOptions) -> float:
    """Seconds the least work of one size takes: its fixed part, 2 warm-up iterations, the timed
    iterations twice (MIN_ITERS, or --iters), the check."""
    timed = timing.iters if timing.iters > 0 else MIN_ITERS
    return fixed_s + (2 + 2 * timed + (1 if timing.check else 0)) * seconds_per_iter


def guess_seconds(nbytes: int, timing: TimingOptions, slowdown: float = 1.0) -> tuple[float, float]:
    """(the guessed seconds of one request of `nbytes`, its guessed least work), on a host
    `slowdown` times slower than an idle one."""
    t = (GUESS_LATENCY_S + nbytes / GUESS_RATE) * slowdown
    fixed = (GUESS_FIXED_S + (nbytes / GUESS_CHECK_RATE if timing.check else 0.0)) * slowdown
    budget = timed_cap(timing)
    warm = warmup_count(timing, t, budget)
    iters, batch, nsamples = timed_counts(t, timing, budget)
    calls = warm + iters + nsamples * batch + (1 if timing.check else 0)
    return fixed + calls * t, least_work(t, fixed, timing)


def allotments(nbytes: list[int], timing: TimingOptions, timeout_s: float, slowdown: float = 1.0) -> list[float]:
    """Each request's share of the first estimate: its guessed seconds (on a host `slowdown`
    times slower than an idle one), or 0 where even its guessed least work would pass half of
    --timeout (the estimate expects it left out; it runs only if the sizes before it leave it room)."""
    out = []
    for n in nbytes:
        seconds, least = guess_seconds(n, timing, slowdown)
        out.append(seconds if least <= SKIP_SHARE * timeout_s else 0.0)
    return out


@dataclass(frozen=True)
class Measured:
    """The last size measured in a series, as every rank agreed it."""

    nbytes: int
    seconds_per_iter: float  # the slowest rank's warm-up estimate
    fixed_s: float  # the size's wall less its collectives: buffers, pattern, check, barriers


def measured(nbytes: int, seconds_per_iter: float, fixed_s: float, first: bool) -> Measured:
    """A size as measured, for projecting the next of its series; the sweep's first request's
    fixed part holds the processes' warm-up too, so it counts at most the guess's."""
    if first:
        fixed_s = min(fixed_s, GUESS_FIXED_S + nbytes / GUESS_CHECK_RATE)
    return Measured(nbytes, seconds_per_iter, fixed_s)


def project(last: Measured, nbytes: int) -> tuple[float, float]:
    """(seconds per iteration, fixed seconds) of `nbytes` at the rate measured at `last`: linear
    in the size (a size's time is never less per byte than a smaller one's), the fixed part from
    SMALL_BYTES up; from a size more than FAR times smaller, no slower than the guess where that
    is faster (see FAR)."""
    scale = max(1.0, nbytes / max(1, last.nbytes))
    t = last.seconds_per_iter * scale
    base = max(last.nbytes, SMALL_BYTES)  # the fixed part scales with the data above SMALL_BYTES only
    fixed = last.fixed_s * max(1.0, nbytes / base)
    if scale > FAR:
        t = min(t, max(last.seconds_per_iter, GUESS_LATENCY_S + nbytes / GUESS_RATE))
        fixed = min(fixed, max(last.fixed_s, GUESS_FIXED_S + nbytes / GUESS_CHECK_RATE))
    return t, fixed


@dataclass(frozen=True)
class Decision:
    run: bool
    budget_s: float | None = None  # the timed iterations' budget when it runs
    projected_s: float | None = None  # the projected seconds per iteration, when there is one
    why: str = ""  # when it does not run: the reason and what would run it


class Plan:
    """The sweep's allotments and the rule, in every rank: decide(index, nbytes, used, last)
    before each request, `used` being the seconds its series' requests have taken so far (agreed).
    Each series (one op and placement: `series[i]` names request i's) keeps to its own share, so
    that one series' overrun never ends another."""

    def __init__(self, allot: list[float], timing: TimingOptions, timeout_s: float,
                 series: list | None = None) -> None:
        self.allot, self.timing, self.timeout_s = list(allot), timing, timeout_s
        keys = list(series) if series is not None else [None] * len(self.allot)
        totals: dict = {}
        self.cumulative, self.overall = [], []
        for key, a in zip(keys, self.allot, strict=True):
            totals[key] = totals.get(key, 0.0) + a
            self.cumulative.append(totals[key])
            self.overall.append(a + (self.overall[-1] if self.overall else 0.0))

    def share(self, index: int, used: float, used_all: float | None = None) -> float:
        """Seconds request `index` may take: its allotment (with SLACK) and what the requests of
        its series before it left unused, or what all the requests before it left unused (of
        the whole sweep: `used_all` seconds so far) where that is more; at least MIN_SHARE_S, at
        most half of --timeout."""
        own = self.cumulative[index] + SLACK * self.allot[index] - used
        if used_all is not None:
            own = max(own, self.overall[index] + SLACK * self.allot[index] - used_all)
        return min(SKIP_SHARE * self.timeout_s, max(MIN_SHARE_S, own))

    def decide(self, index: int, nbytes: int, used: float, last: Measured | None,
               used_all: float | None = None) -> Decision:
        cap = timed_cap(self.timing)
        if last is None:
            return Decision(True, cap)
        t, fixed = project(last, nbytes)
        least = least_work(t, fixed, self.timing)
        share = self.share(index, used, used_all)
        if least <= share:
            check = 1 if self.timing.check else 0
            return Decision(True, max(2 * MIN_ITERS * t, min(cap, share - fixed - (2 + check) * t)), t)
        far = f" (or the estimate's {GUESS_RATE / 1e9:g} GB/s, whichever is faster)" if nbytes > FAR * last.nbytes else ""
        at = (f"at the rate measured at {format_bytes(last.nbytes)}{far}, {format_bytes(nbytes)} would take "
              f"{least:.0f} s at the least ({t:.2f} s per iteration)")
        if least > SKIP_SHARE * self.timeout_s:
            return Decision(False, why=f"{at}, past half of --timeout {self.timeout_s:g} s; a longer --timeout runs them")
        return Decision(False, why=f"{at}, more than is left of the first estimate for it ({max(0.0, share):.0f} s): "
                                   f"this machine runs below the estimate's guess; --sizes {size_arg(nbytes)} "
                                   "measures it alone")


def size_arg(nbytes: int) -> str:
    """A size as --sizes takes it: 256M, 1G, 4K, or bytes."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def revised_seconds(allot: list[float], done: int, used: float, startup_s: float) -> float | None:
    """The whole command's seconds as the measured rate says after requests 0..done: what has
    run, plus the rest of the allotments at the rate measured so far when that is faster than the
    guess; when slower, the rest of the first estimate (sizes that do not fit are left out).
    None before a request with an allotment has run."""
    so_far = sum(allot[: done + 1])
    if so_far <= 0:
        return None
    rest = sum(allot[done + 1:])
    ratio = used / so_far
    return startup_s + used + (rest * ratio if ratio < 1 else max(0.0, so_far + rest - used))


def format_seconds(seconds: float) -> str:
    """'about 40 s' below two minutes, else 'about 4 min'."""
    return f"about {seconds:.0f} s" if seconds < 120 else f"about {seconds / 60:.0f} min"
