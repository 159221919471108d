"""The comm result document's declared shape (mgpu_bench.results.schema), checked on every read; what
run_from_document, the headline and the report rely on. Import-light: the history validates
stored documents through it without loading a backend."""

from __future__ import annotations

from mgpu_bench.results.ops import DTYPES, OP_ORDER, REDOPS
from mgpu_bench.results.schema import (
    MAX_BYTES,
    MAX_RANKS,
    STATUS,
    AnyValue,
    Bool,
    Int,
    List,
    Map,
    Num,
    Obj,
    Str,
    Tagged,
    rectangular,
)

# A measurement's spec is unpacked into CommSpec, so it is closed; op and dtype become parts of
# file and metric names, so they are the known ones.
SPEC = Obj({
    "op": Str(OP_ORDER), "dtype": Str(DTYPES), "redop": Str(REDOPS, null=True),
    "size": Int(0, MAX_BYTES), "bytes": Int(0, MAX_BYTES), "count": Int(0, MAX_BYTES), "nranks": Int(1, MAX_RANKS),
    "inplace": Bool(), "backend": Str(max_len=100), "devices": List(Str(max_len=100), max_len=MAX_RANKS),
    "graph": Bool(), "root": Int(0, MAX_RANKS), "scope": Str(("world", "intra-node", "inter-node")),
    "group": Str(max_len=200),
}, required=("op", "dtype", "redop", "size", "bytes", "count", "nranks", "inplace", "backend", "devices"),
    what="a comm spec", closed=True)
MEASUREMENT = Obj({
    "kind": Str(), "spec": SPEC, "iters": Int(0, 1 << 40), "batch": Int(1, 1 << 40),
    "burst_seconds": List(Num(0), min_len=1, max_len=MAX_RANKS),
    "samples": List(List(Num(0), min_len=1), min_len=1, max_len=MAX_RANKS, rule=rectangular),
    "wrong": List(Int(0), max_len=MAX_RANKS, null=True),
}, required=("spec", "iters", "batch", "burst_seconds", "samples", "wrong"), what="a comm measurement")
THEORY = Obj({"bandwidth": Num(0, null=True), "practical": Num(0, null=True), "summary": Str(),
              "hops": List(AnyValue(), null=True)}, required=("bandwidth", "practical", "summary"), what="a theory",
             null=True, rule=lambda t: ("practical", "is null, but the theory has a bandwidth (practical is 80% of it)")
             if t["bandwidth"] and t["practical"] is None else None)
SCHEMA = Obj({
    "backend": Str(max_len=100), "devices": List(Str(max_len=100)),
    "status": Obj(STATUS.fields, required=("stopped", "message"), what="a comm status"),
    "measurements": List(Tagged("kind", {"comm": MEASUREMENT})),
    "theory": THEORY, "scope_theory": Map(THEORY, null=True), "process_seconds": Num(0, null=True),
    "transports": Map(Map(AnyValue()), null=True), "algorithms_modelled": Map(AnyValue(), null=True),
    "topology": Obj({"gpus": List(Obj({"nvlinks": List(Obj({}), null=True)}, what="a GPU"), null=True)},
                    what="a topology", null=True),
    "findings": List(Str(), null=True),
    # Where an imported run came from (imported.py): a nccl-tests or rccl-tests log; absent in the probe's own.
    "source": Obj({"tool": Str(max_len=100), "version": Str(max_len=200, null=True),
                   "logs": List(Obj({"file": Str(max_len=4096, null=True)}, what="a log"), null=True)},
                  required=("tool",), what="a log's source", null=True),
}, required=("backend", "devices", "status", "measurements"), what="a comm result")
