"""Whether a stored run's figures are the GPU's own: a plan takes no figure from a run whose own
document says they are not. One rule for every kind of run the plan reads (model, memory, comm,
fleet, gemm, and the probes of a suite), from what the document recorded:

    interrupted      its status says it stopped early (Ctrl-C, SIGTERM, a fault mid-run)
    shared           another process ran on its GPUs (the occupancy the runner stored: a foreign
                     process not known to be idle; mgpu_bench.machine.occupancy.competing)
    throttled        a clock-event reason that slows a GPU set up right, or a lowered power limit,
                     in any telemetry summary it holds (mgpu_bench.machine.telemetry.concerns; running into
                     the power cap at the default limit is not one)
    below a floor    a finding of its own that a figure is below its floor (`check`)

A run left out is named with the reason; the plan says which."""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.machine import occupancy, telemetry

FLOOR_WORDS = "below its floor"
_MAX_DEPTH = 12


def taint(doc: Mapping, beside: Mapping | None = None) -> str | None:
    """Why `doc`'s figures are not its GPUs' alone, in a few words; None when nothing says so.
    `beside`: what was recorded next to it (a suite's entry for one of its probes: the telemetry
    the suite sampled while that probe ran)."""
    status = doc.get("status") if isinstance(doc.get("status"), Mapping) else {}
    if status.get("stopped"):
        return f"interrupted ({status['stopped']}" + (f": {status['message']}" if status.get("message") else "") + ")"
    shared = occupancy.competing(occupancy.from_document(doc))
    if shared:
        gpus = sorted({p.gpu for p in shared})
        return "shared with another process: " + "; ".join(occupancy.cause(g, shared) or f"GPU {g}" for g in gpus)
    below = [str(f) for f in doc.get("findings") or [] if FLOOR_WORDS in str(f)]
    if below:
        return f"below a check floor: {below[0]}"
    slow = sorted(set(_throttles(doc, 0) + _throttles(beside or {}, 0)))
    if slow:
        return "throttled: " + ", ".join(slow)
    return None


def _throttles(node, depth: int) -> list[str]:
    """The concerns of every telemetry summary (a mapping with "limiting") inside `node`."""
    if depth > _MAX_DEPTH:
        return []
    out: list[str] = []
    if isinstance(node, Mapping):
        if isinstance(node.get("limiting"), list):
            out += telemetry.concerns(node)
        for key, value in node.items():
            if isinstance(value, (Mapping, list)) and key not in ("ranks", "runs_samples"):
                out += _throttles(value, depth + 1)
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, (Mapping, list)):
                out += _throttles(value, depth + 1)
    return out
