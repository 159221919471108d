"""The check result document's declared shape (mgpu_bench.results.schema), checked on every read.
Import-light: the history validates stored documents through it without loading a backend."""

from __future__ import annotations

from mgpu_bench.results.schema import STATUS, AnyValue, List, Map, Num, Obj, Str

_DEVICE = Str(pattern=r"node|gpu\d{1,5}|rank\d{1,5}", what="a device: node, gpuN or rankN")
FIGURE = Obj({
    "device": _DEVICE, "kind": Str(("gemm", "copy", "allreduce")), "value": Num(0, finite=True),
    "unit": Str(("FLOP/s", "B/s")), "samples": List(Num(0, finite=True)), "detail": Obj({}, null=True),
}, required=("device", "kind", "value", "unit"), what="a figure")
PART = Obj({
    "part": Str(("health", "processes", "gemm", "hbm", "allreduce", "sdc", "ranks")),
    "status": Str(("measured", "skipped", "failed", "hung", "error")), "seconds": Num(0), "expected_s": Num(0),
    "why": Str(null=True), "figures": List(FIGURE), "facts": Map(AnyValue()), "errors": Map(Str()),
}, required=("part", "status"), what="a part")
FINDING = Obj({"severity": Str(("problem", "warning", "ok")), "text": Str(), "short": Str(max_len=200),
               "device": Str(max_len=100), "part": Str(max_len=100)},
              required=("severity", "text", "short"), what="a finding")
VERDICT = Obj({
    "state": Str(("ok", "problem", "unknown")), "findings": List(FINDING), "floors": List(AnyValue()),
    "reason": Str(null=True), "npd": Str(max_len=80), "fix": Str(null=True), "judged": List(Str()),
}, required=("state", "findings", "npd"), what="a verdict")
DEVICE = Obj({"name": _DEVICE, "index": Num(0), "model": Str(max_len=200, null=True)}, required=("name",),
             what="a device")

SCHEMA = Obj({
    "tool_version": Str(max_len=100), "created": Str(), "command": AnyValue(), "status": STATUS,
    "node": Str(max_len=1024), "baseline_scope": Str(("host",)), "budget_s": Num(0, finite=True),
    "keep": Num(0, 10_000_000),
    "devices": List(DEVICE), "parts": List(PART), "verdict": VERDICT,
    "reference": Obj({"kind": Str(("baseline", "recent")), "runs": List(Str()), "label": Str(),
                      "metrics": Map(AnyValue())}, what="a reference", null=True),
}, required=("tool_version", "created", "status", "node", "parts", "verdict"), what="a check result")
