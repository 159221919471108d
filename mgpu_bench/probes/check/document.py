"""The check result document: the node, its devices, every part (what it measured or why it was
skipped, raw samples inside), the reference it was judged against and the verdict (analyse.verdict_of:
derived, kept beside the data as the other probes keep their findings). "baseline_scope": "host"
makes each node's baseline its own (History.baseline_of); "keep" the number of this node's newest
checks the history keeps (History.save applies it). Its declared shape is shape.py's."""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.document import envelope, status


def document(run, reference: Mapping | None, verdict: Mapping, environment: Mapping, command: list[str] | None
             ) -> dict:
    c = run.config
    env = dict(environment)
    env["host"] = run.node  # the node's Slurm name where slurmd gave one: each node's history is its own
    return {
        **envelope("check", env, command),
        "status": status(run.stopped, run.stop_message),
        "node": run.node,
        "baseline_scope": "host",
        "budget_s": c.budget_s,
        "keep": c.keep,  # the history keeps this node's newest `keep` checks (History.save)
        "config": {"gpus": list(c.gpus), "nproc": c.nproc},
        "devices": run.devices,
        "parts": [p.to_dict() for p in run.parts],
        "reference": reference,
        "verdict": dict(verdict),
        "notes": list(run.notes),
        "wall_seconds": run.wall_seconds,
        "findings": [f["text"] for f in verdict["findings"]],
    }
