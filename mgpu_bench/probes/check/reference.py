"""This node's reference figures, read from the history the check stores in (the runner hands an
opener: Context.history; a probe imports no history module).

The reference is, in this order:
- the node's baseline: a stored check of this node made its baseline (`mgpu-bench baseline set
  RUN`; check documents are compared per node, "baseline_scope": "host"), or
- the median of the node's last RECENT passing checks, where none is set: a node's own history,
  with no step by a person; a failing check never joins it, and fewer than RECENT judge nothing
  (one earlier run cannot tell how much a figure moves between runs on a loaded host);
- none: the check judges by the floors alone (and says so).
Each figure keeps its noise (analyse.figure_noise: how much a figure made of those samples moves;
across the recent runs, their own spread too), so that a figure is judged against how much it
moves.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from .analyse import figure_noise, noise

RECENT = 5  # passing checks of the node whose median is the reference when no baseline is set: the
# fewest whose spread between runs analyse.noise() can tell (it needs 5); fewer judge nothing


def load(open_history: Callable | None, node: str) -> tuple[dict | None, list[str]]:
    """(the reference or None, notes: why there is none, and where the history is when it is not
    in its default place: the opened history's own note)."""
    if open_history is None:
        return None, ["no history to read a reference from (--no-store): judged by the floors alone"]
    try:
        h = open_history()
    except Exception as exc:  # noqa: BLE001 - an unreadable history costs the reference, not the check
        return None, [f"the history could not be read ({exc}): judged by the floors alone"]
    notes = [h.note] if getattr(h, "note", None) else []
    try:
        ref, why = _from(h, node)
    except Exception as exc:  # noqa: BLE001 - as above: a stored run that no longer reads, say
        ref, why = None, f"the history could not be read ({type(exc).__name__}: {exc}): judged by the floors alone"
    finally:
        h.close()
    return ref, notes + ([why] if why else [])


def _from(h, node: str) -> tuple[dict | None, str | None]:
    base = h.baseline("check", node)
    if base:
        metrics = {m.name: {"value": m.value, "unit": m.unit, "noise": figure_noise(m.samples)} for m in h.metrics(base)}
        return {"kind": "baseline", "runs": [base], "label": f"this node's baseline {base}", "metrics": metrics}, None
    # the node's newest passing checks, by their stored check.healthy (an index read: as cheap with a
    # year of checks stored as with five)
    passing = h.runs_with("check.healthy", 1.0, kind="check", host=node, limit=RECENT)
    if len(passing) < RECENT:
        have = f"{len(passing)} stored passing check(s) of {node}" if passing else f"no stored check of {node} passed yet"
        return None, (f"{have}, and no baseline is set: {RECENT} are needed to tell how much its figures move, so "
                      f"judged by the floors alone (or `mgpu-bench baseline set RUN` on one of its checks)")
    values: dict[str, list] = {}
    for run_id in passing:
        for m in h.metrics(run_id):
            values.setdefault(m.name, []).append(m)
    metrics = {}
    for name, ms in values.items():
        med = statistics.median(m.value for m in ms)
        spread = [x for x in [noise([m.value for m in ms]), *(figure_noise(m.samples) for m in ms)] if x is not None]
        metrics[name] = {"value": med, "unit": ms[0].unit, "noise": max(spread) if spread else None}
    runs = ", ".join(reversed(passing))
    label = f"the median of this node's last {len(passing)} passing check(s) ({runs})"
    return {"kind": "recent", "runs": list(reversed(passing)), "label": label, "metrics": metrics}, None
