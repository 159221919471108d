"""The straggler rule (mgpu_bench.probes.model.straggler) on step walls built by hand: a rank late in
every 5th step only, a rank behind in every step, and both at once (a loaded host holds one rank
back throughout while it is also late every 5th step): each cause said, with its period."""

from __future__ import annotations

import random

from mgpu_bench.probes.model.straggler import cause_text, straggler, straggler_text

STEP, LATE, BEHIND, N = 0.020, 0.080, 0.008, 40


def _walls(behind: float, late: float) -> list[list[float]]:
    rnd = random.Random(0)
    fast = [STEP + rnd.uniform(0, 0.0005) for _ in range(N)]
    slow = [STEP + behind + (late if i % 5 == 4 else 0.0) + rnd.uniform(0, 0.0005) for i in range(N)]
    return [fast, slow]


def test_a_rank_late_every_5th_step_only_is_the_intermittent_straggler():
    s = straggler(_walls(0.0, LATE), None)
    assert s["named"] and s["by"] == "intermittent" and s["rank"] == 1, s
    assert s["intermittent"]["period"] == 5 and s["intermittent"]["steps"] == N // 5
    assert "every 5th step" in straggler_text(s, "") and "in its other steps it keeps pace" in straggler_text(s, "")


def test_a_rank_behind_in_every_step_is_named_without_late_steps():
    s = straggler(_walls(BEHIND, 0.0), None)
    assert s["named"] and s["by"] == "wall" and s["rank"] == 1, s
    assert not (s.get("intermittent") or {}).get("named")
    assert "on top of that" not in straggler_text(s, "") and "on top of that" not in cause_text(s)


def test_a_rank_behind_in_every_step_and_late_every_5th_has_both_said():
    s = straggler(_walls(BEHIND, LATE), None)
    assert s["named"] and s["by"] == "wall" and s["rank"] == 1, s
    assert abs(s["lag_s"] - BEHIND) < 0.001
    x = s["intermittent"]
    assert x["named"] and x["rank"] == 1 and x["period"] == 5 and abs(x["lag_s"] - BEHIND - LATE) < 0.002, x
    for text in (straggler_text(s, " (node2)"), cause_text(s)):
        assert "8.0 ms per step" in text and "on top of that, rank 1" in text and "every 5th step" in text, text
    assert "rank 1 (node2) is late in 8 of 40 steps" in straggler_text(s, " (node2)")
