"""The gemm result document's declared shape (mgpu_bench.results.schema), checked on every read, and the
names and bounds it shares with the backend (measure.py imports them from here). Import-light:
the history validates stored documents through it without loading a backend."""

from __future__ import annotations

from mgpu_bench.results.schema import (
    MAX_BYTES,
    MAX_GPU_INDEX,
    STATUS,
    TELEMETRY_SERIES,
    TELEMETRY_SUMMARY,
    Bool,
    Int,
    List,
    Num,
    Obj,
    OneOf,
    Str,
)

GEMM_DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")
LAYOUTS = ("NN", "NT", "TN", "TT")
# Input distributions (the probe's init codes). They change the power a GEMM draws and so, on a
# power-capped GPU, its TFLOP/s: say which one a figure used when comparing with other tools.
INITS = {"uniform": 0, "normal": 1, "positive": 2}
MAX_DIM = 1 << 20

# What run_from_document and the headline read. dtype becomes part of PNG and metric names, so it
# is one gemm measures; dimensions are within MAX_DIM.
_DIM = Int(1, MAX_DIM)
_SHAPE = Str(pattern=r"\d{1,7}(?:[x*]\d{1,7}[x*]\d{1,7})?",
             rule=lambda t: all(1 <= int(d) <= MAX_DIM for d in t.replace("*", "x").split("x")),
             what=f"a shape: N or MxNxK, each from 1 to {MAX_DIM} (8192, 4096x8192x1024)")
_FIGURE = Obj({"value": Num(0, null=True), "unit": Str(null=True), "source": Str(null=True),
               "note": Str(null=True)}, what="a figure", null=True)
_LABEL = OneOf(Int(), Str(max_len=100))  # cuBLASLt's tile and stages: an enum value or its name
# A config attribute of the algorithm as cuBLASLt gives it (cublasLtMatmulAlgoConfigGetAttribute,
# csrc/cublaslt_algo.hpp: 32-bit, the unsigned ones cast to int): it names the algorithm and is
# not computed with. cuBLASLt 13.1 gives split-K -1 for some of an H200's candidates (issue 23).
_ATTR = Int(-(1 << 31), (1 << 31) - 1, null=True)
CANDIDATE = Obj({
    "index": Int(0), "algo_id": Int(), "tile": _LABEL, "stages": _LABEL, "split_k": _ATTR,
    "cluster": OneOf(Int(), Str(max_len=100), null=True), "reduction": _ATTR, "swizzle": _ATTR,
    "custom": _ATTR, "workspace": Int(0, null=True), "waves": Num(null=True),
    # a candidate cuBLASLt failed to run has no bursts: no seconds, 0 GEMMs per burst (gemm.cu)
    "seconds": List(Num(0, finite=True), null=True), "iters_per_sample": Int(0, null=True), "max_error": Num(null=True),
    "error": Str(null=True),
}, required=("index", "algo_id", "tile", "stages", "split_k", "cluster"), what="a candidate")
RESULT = Obj({
    "gpu": Int(0, MAX_GPU_INDEX), "gpu_name": Str(null=True), "dtype": Str(GEMM_DTYPES),
    "phase": Str(("shape", "search", "search-best")), "m": _DIM, "n": _DIM, "k": _DIM,
    "layout": Str(max_len=20, null=True), "flops": Num(0), "flops_per_s": Num(0, null=True),
    "pct_peak": Num(null=True), "peak": _FIGURE, "best": Int(0, null=True), "best_name": Str(null=True),
    "noise": Num(null=True), "tolerance": Num(0, null=True), "buffer_sets": Int(0, null=True),
    "checked_elements": Int(0, null=True), "seconds_wall": Num(0, null=True), "telemetry": TELEMETRY_SUMMARY,
    "candidates": List(CANDIDATE, null=True),
    "series": List(Obj({"t": Num(), "seconds": Num(0)}, required=("t", "seconds"), what="a series point"),
                   null=True),
    "series_telemetry": TELEMETRY_SERIES,
}, required=("gpu", "dtype", "m", "n", "k", "flops"), what="a gemm result")
CONFIG = Obj({
    "dtypes": List(Str(GEMM_DTYPES), null=True), "shapes": List(_SHAPE, null=True),
    "layout": Str(("auto", *LAYOUTS)), "candidates": Int(1, 1 << 16), "samples": Int(1, 1 << 20),
    "sample_s": Num(0), "one_at_a_time": Bool(null=True), "search": List(_DIM, null=True),
    "duration_s": Num(0, null=True), "workspace": Int(0, MAX_BYTES), "fp8_fast_accum": Bool(null=True),
    "init": Str(tuple(INITS)),
}, what="a gemm config", null=True)
SCHEMA = Obj({
    "config": CONFIG, "status": STATUS, "results": List(RESULT),
    "devices": List(Obj({"index": Int(0, MAX_GPU_INDEX)}, what="a device"), null=True),
    "telemetry_error": Str(null=True), "findings": List(Str(), null=True),
}, required=("config", "status", "devices", "results"), what="a gemm result document")
