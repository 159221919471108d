"""The links result document's declared shape (mgpu_bench.results.schema), checked on every read, and the
copy engines it names (result.py imports them from here). Import-light: the history validates
stored documents through it without loading a backend."""

from __future__ import annotations

from mgpu_bench.results.schema import MAX_BYTES, MAX_GPU_INDEX, AnyValue, Bool, Int, List, Num, Obj, Str, Tagged

ENGINES = ("ce", "sm")  # a copy by the copy engine (cudaMemcpyPeerAsync) or by an SM kernel

# What run_from_document, the headline and the heatmaps read. A spec is unpacked into LinkSpec
# (closed); its engine names a PNG; every GPU a copy names is one of the run's (a heatmap's row
# and column).
_GPU = Int(0, MAX_GPU_INDEX)
SPEC = Obj({
    "kind": Str(("copy", "latency", "host")), "src": _GPU, "dst": Int(0, MAX_GPU_INDEX, null=True),
    "engine": Str(ENGINES, null=True), "bidirectional": Bool(), "direction": Str(("h2d", "d2h"), null=True),
    "bytes": Int(0, MAX_BYTES),
}, required=("kind", "src", "dst"), what="a link spec", closed=True)
MEASUREMENT = Obj({"kind": Str(), "spec": SPEC, "seconds": List(Num(positive=True), min_len=1)},
                  required=("spec", "seconds"), what="a link measurement")
_PAIR = {"src": _GPU, "dst": _GPU}


def _gpus_rule(doc) -> tuple[str, str] | None:
    gpus = set(doc.get("gpus") or [])
    for i, m in enumerate(doc.get("measurements") or []):
        spec = m.get("spec") if m.get("kind") == "link" else None
        if spec and spec.get("kind") != "host":
            for end in ("src", "dst"):
                if spec.get(end) not in gpus:
                    return (f"measurements[{i}].spec.{end}",
                            f"is GPU {spec.get(end)}, not one of the run's gpus ({sorted(gpus)})")
    return None


SCHEMA = Obj({
    "gpus": List(_GPU), "measurements": List(Tagged("kind", {"link": MEASUREMENT})),
    "peer_access": List(Obj({**_PAIR, "ok": Bool()}, required=("src", "dst", "ok"), what="a peer access entry"),
                        null=True),
    "theory": List(Obj({**_PAIR, "bandwidth": Num(0, null=True), "detail": Str(null=True)},
                       required=("src", "dst"), what="a theory entry"), null=True),
    "per_pair_seconds": Num(0, null=True), "host_seconds": Num(0, null=True),
    "estimated_seconds_8_gpus": Num(0, null=True), "outliers": List(AnyValue(), null=True),
    "topology": Obj({}, what="a topology", null=True),
}, required=("gpus", "measurements"), what="a links result", rule=_gpus_rule)
