"""The check's time budget: one deadline for the whole command, the parts planned against it.

The budget is wall time from the command's start (the interpreter's own start-up included) to its
exit. It is split once, at the start:

    the command's start-up (already spent when the first line of the check runs)
    the measuring process: its start-up, then the parts, then storing and writing its results
    the scheduler's contract (scontrol update) and the last line: RESERVE_S of it

Each part has an expected cost (EXPECTED_S, for this kind of device) that a part must fit in the
time left, or it is skipped and the check says so ("allreduce skipped: needs about 4 s, 2.1 s
left of --budget 10s"). The expected costs are scaled as the check goes by how much slower than
expected the parts before ran (a loaded or throttled host), and each part bounds its own loops
by the slot it was given: a part never runs past the deadline; one whose GPU work does not return
by then is abandoned ("hung") and the check ends with what it has.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from dataclasses import dataclass, field

from mgpu_bench.core.errors import InputError

DEFAULT_BUDGET = "60s"
MIN_BUDGET_S = 5.0  # below this the measuring process could not start, say why, and write its results
MAX_BUDGET_S = 3600.0
CHILD_ENV = "MGPU_BENCH_CHECK_CHILD"  # set by the command for the process that measures: "<deadline> <state file>"

# Expected seconds per part, measured on the machines this was written on (CPU: the 2-core CI
# host, loaded; GPU: one and two H200). A part whose cost is unknown on a new machine costs
# what it costs: the slots below bound it.
EXPECTED_S = {
    "gpu": {"health": 0.5, "processes": 0.1, "gemm": 2.0, "hbm": 1.0, "allreduce": 5.0, "sdc": 3.0},
    "cpu": {"health": 0.1, "processes": 0.0, "ranks": 8.0},
}
# What the measuring process needs besides its parts: start-up (Python, the native module,
# the environment fingerprint) and, at the end, the history row, the files and its exit.
CHILD_START_S = 2.0
CHILD_END_S = 1.5


def parse_budget(text: str) -> float:
    """'60s', '2m', '90' (seconds) -> seconds; InputError naming the bound."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h)?\s*", str(text).lower())
    if not m:
        raise InputError(f"--budget '{text}' is not a duration: write e.g. 60s, 45s or 2m")
    value = float(m.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, None: 1}[m.group(2)]
    if value < MIN_BUDGET_S:
        raise InputError(f"--budget {text.strip()}: at least {MIN_BUDGET_S:g}s (the check's own start-up and the "
                         "writing of its result take 2-4 s)")
    if value > MAX_BUDGET_S:
        raise InputError(f"--budget {text.strip()}: at most {MAX_BUDGET_S / 60:g}m (a check is short; the probes "
                         "measure at length)")
    return value


def reserve_s(budget_s: float) -> float:
    """What the command keeps for itself after the measuring process: the scheduler's contract
    (one scontrol call, well under a second from a live controller), a measuring process stopped
    at its deadline given its grace, and its last line: a second at least."""
    return min(5.0, max(1.0, 0.1 * budget_s))


def process_age_s() -> float:
    """Seconds since this process started (its interpreter's start-up included), 0 where unknown."""
    from mgpu_bench.machine.env import process_seconds

    return process_seconds() or 0.0


def command_age_s(budget_s: float, env=None) -> float | None:
    """Seconds since the check command started (its interpreter's start-up included), as the
    measuring process knows it: the command handed down its deadline for this process (CHILD_ENV:
    the command's start + budget_s - reserve_s(budget_s)); None outside a check's measuring
    process."""
    env = os.environ if env is None else env
    raw = (env.get(CHILD_ENV) or "").split(" ", 1)[0]
    try:
        child_end = float(raw)
    except ValueError:
        return None
    return max(0.0, time.time() - (child_end + reserve_s(budget_s) - budget_s))


def expected_text(budget_s: float, kind: str, env=None) -> str:
    """The check's estimate, said before its parts run: 'about 14 s, start-up included (5 s of it
    before this line); at most 60 s (--budget)': the command's start-up so far (command_age_s(),
    measured) and the expected cost of the parts (EXPECTED_S for this kind of device) and of the
    end (storing, writing, the command's own last line)."""
    spent = command_age_s(budget_s, env)
    if spent is None:
        spent = process_age_s()
    total = spent + sum(EXPECTED_S[kind].values()) + CHILD_END_S + reserve_s(budget_s)
    return (f"about {min(total, budget_s):.0f} s, start-up included ({spent:.0f} s of it before this line); at most "
            f"{budget_s:g} s (--budget)")


@dataclass
class Budget:
    """The measuring process's plan: `deadline` (time.monotonic()) by which its parts end; each part
    asks fits(part) before it starts and gets slot(part) to bound its loops."""

    deadline: float
    kind: str  # "gpu" or "cpu": which expected costs apply
    spent: dict[str, tuple[float, float]] = field(default_factory=dict)  # part -> (expected, actual) seconds

    @classmethod
    def from_env(cls, budget_s: float, kind: str, env=None) -> Budget:
        """The deadline the command handed down (CHILD_ENV: a time.time() value), less what
        storing and writing the results take; without one, `budget_s` from now."""
        env = os.environ if env is None else env
        now = time.time()
        raw = (env.get(CHILD_ENV) or "").split(" ", 1)[0]
        try:
            end = float(raw)
        except ValueError:
            end = now + budget_s - process_age_s()
        return cls(time.monotonic() + (end - now) - CHILD_END_S, kind)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def slowness(self) -> float:
        """How much slower than expected the parts so far ran (at least 1): the median ratio."""
        ratios = [a / e for e, a in self.spent.values() if e > 0.05]
        return max(1.0, statistics.median(ratios)) if ratios else 1.0

    def expected(self, part: str) -> float:
        return EXPECTED_S[self.kind].get(part, 1.0) * self.slowness

    def fits(self, part: str) -> str | None:
        """None when `part` fits in the time left; else why it is skipped, in words."""
        need, left = self.expected(part), self.left()
        if need <= left:
            return None
        return f"needs about {need:.1f} s, {max(0.0, left):.1f} s left of the budget"

    def slot(self, part: str) -> float:
        """The monotonic time by which `part` must end: its expected cost with room to spare (3x,
        a slower host), never past the deadline."""
        return min(self.deadline, time.monotonic() + 3 * self.expected(part))

    def done(self, part: str, seconds: float) -> None:
        self.spent[part] = (EXPECTED_S[self.kind].get(part, 1.0), seconds)

    def need_s(self) -> float:
        """The whole check's expected length on this kind of device: what --budget should give."""
        return CHILD_START_S + sum(EXPECTED_S[self.kind].values()) * self.slowness + CHILD_END_S
