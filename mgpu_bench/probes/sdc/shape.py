"""The sdc result document's declared shape (mgpu_bench.results.schema), checked on every read, and the
names and bounds it shares with the backend (result.py and measure.py import them from here).
Import-light: the history validates stored documents through it without loading a backend."""

from __future__ import annotations

from mgpu_bench.results.schema import MAX_BYTES, MAX_GPU_INDEX, STATUS, Int, List, Num, Obj, Str

DTYPES = ("bf16", "fp16")
WORKS = ("gemm", "collective", "hbm")  # the order a repetition runs them in
MAX_DIM = 65536

# What run_from_document, the headline and the report read.
_GPU = Int(0, MAX_GPU_INDEX)
_HASH = Str(pattern=r"0x[0-9a-f]{16}", what="a 64-bit hash as 0x and 16 hex digits", null=True)
_SHAPE = Str(pattern=r"\d{1,5}x\d{1,5}x\d{1,5}", rule=lambda t: all(1 <= int(d) <= MAX_DIM for d in t.split("x")),
             what=f"a shape MxNxK, each from 1 to {MAX_DIM}")
FIRST = Obj({
    "index": Int(0, null=True), "where": Str(max_len=200), "got": Str(max_len=100, null=True),
    "want": Str(max_len=100, null=True), "against": Str(max_len=200), "differing": Int(0, null=True),
    "elements": Int(0, null=True), "bits": Int(0, 64, null=True), "gemm": Int(1, null=True),
}, required=("where", "against"), what="a located difference", null=True)
CHECK = Obj({
    "gpu": _GPU, "repetition": Int(1), "work": Str(WORKS), "count": Int(0), "bytes": Int(0, MAX_BYTES),
    "seconds": Num(0), "wrong": Int(0), "hash": _HASH, "first": FIRST,
}, required=("gpu", "repetition", "work", "count", "bytes", "seconds"), what="an sdc check")
GPU = Obj({"gpu": _GPU, "name": Str(max_len=200, null=True), "multiprocessors": Int(0, null=True),
           "reference_hash": _HASH, "hbm_bytes": Int(0, MAX_BYTES, null=True)}, required=("gpu",), what="an sdc GPU")
PEER = Obj({"gpu": _GPU, "against": _GPU, "work": Str(WORKS), "first": FIRST}, required=("gpu", "against"),
           what="a peer difference")
CONFIG = Obj({
    "dtype": Str(DTYPES), "shape": _SHAPE, "gemms": Int(1), "repetitions": Int(1), "duration_s": Num(0),
    "memory_fraction": Num(0, 1), "comm_bytes": Int(0, MAX_BYTES), "seed": Int(), "timeout_s": Num(0),
}, what="an sdc config", null=True)
ALGO = Obj({"blob": Str(pattern=r"[0-9a-f]{0,1024}", what="hex digits"), "algo_id": Int(null=True),
            "chosen_on": Int(null=True)}, what="the pinned algorithm", null=True)
SCHEMA = Obj({
    "config": CONFIG, "status": STATUS, "devices": List(Obj({"index": _GPU}, what="a device"), null=True),
    "gpus": List(GPU, null=True), "checks": List(CHECK), "peer_differences": List(PEER, null=True),
    "algo": ALGO, "findings": List(Str(), null=True), "repetitions_done": Int(0, null=True),
}, required=("checks",), what="an sdc result document")
