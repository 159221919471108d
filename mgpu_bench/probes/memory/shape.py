"""The memory result document's declared shape (mgpu_bench.results.schema), checked on every read, and the
names it shares with the backend (measure.py imports them from here). Import-light: the history
validates stored documents through it without loading a backend."""

from __future__ import annotations

from mgpu_bench.results.schema import (
    MAX_BYTES,
    MAX_GPU_INDEX,
    NAME,
    STATUS,
    AnyValue,
    Bool,
    Int,
    List,
    Map,
    Num,
    Obj,
    Str,
)

PATTERNS = ("interleaved", "grow-shrink", "small-between-large")
ALLOCATORS = ("cudaMalloc", "async", "vmm")
HBM_KINDS = ("copy_ce", "copy_sm", "read", "write")

# What run_from_document, the headline and the report read. Allocator, pattern, HBM kind and model
# name become parts of metric names.
_GPU = Int(0, MAX_GPU_INDEX)
_BYTES = Int(0, MAX_BYTES)
# Allocation and free latency of the pattern's own calls (measure.ChurnResult.latency): per kind of
# call ("alloc", "free"), per size class ("<= 4 MiB" ... "> 1 GiB"), the calls counted and their
# seconds; the terminal prints the worst class's p50 and p99, so every figure is a number.
LATENCY_FIGURES = Obj({"count": Int(0), "p50": Num(0), "p99": Num(0), "max": Num(0)},
                      required=("count", "p50", "p99", "max"), what="a size class's latency")
LATENCY = Map(Map(LATENCY_FIGURES, keys_what="a size class",
                  what="a map of size classes, each {count, p50, p99, max} in seconds"),
              keys_what="a kind of call (alloc, free)", null=True,
              what="a map of kinds of call (alloc, free), each a map of size classes, each {count, p50, p99, max}")
CHURN = Obj({
    "gpu": _GPU, "allocator": Str(ALLOCATORS), "pattern": Str(PATTERNS), "fragmentation": Num(0, 1, null=True),
    "lost_bytes": Num(null=True), "largest_block": Num(0, null=True), "free_before": Num(null=True),
    "free_after_pattern": Num(0, null=True), "total": Num(0, null=True), "held_bytes": Num(null=True),
    "allocations_done": Int(0, null=True), "allocations_failed": Int(0, null=True),
    "search_seconds": Num(0, null=True), "pool_reserved": Num(null=True), "pool_used": Num(null=True),
    "latency": LATENCY,
}, required=("gpu", "allocator", "pattern"), what="a churn result")
HBM = Obj({
    "gpu": _GPU, "kind": Str(HBM_KINDS), "bytes_read": _BYTES, "bytes_written": _BYTES,
    "seconds": List(Num(positive=True), min_len=1), "bandwidth": Num(0), "peak": Num(0, null=True), "pct_peak": Num(null=True),
}, required=("gpu", "kind", "bytes_read", "bytes_written", "seconds", "bandwidth"), what="an HBM result")
MAX_BATCH = Obj({
    "model": Str(pattern=NAME), "seq_len": Int(1, 1 << 24, null=True), "image_size": Int(1, 1 << 16, null=True),
    "checkpointing": Bool(),
    "max_batch": Int(0, null=True), "first_oom_batch": Int(0, null=True), "complete": Bool(null=True),
    "error": Str(null=True), "setting": Str(null=True), "seconds": Num(0),
    "peak_allocated_bytes": Num(0, null=True), "tokens_per_step": Num(0, null=True),
    "trials": List(Obj({"batch": Int(0), "ok": Bool()}, what="a trial"), null=True), "conf": AnyValue(),
}, required=("model", "seq_len", "checkpointing"), what="a max-batch result")
# One torch_memory setting's result (torch_memory.run_setting): bytes, counts, per-step series.
TORCH_SETTING = Obj({
    "error": Str(null=True),
    **{k: Num(null=True) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "reserved_unallocated_at_peak_bytes",
                                   "inactive_split_peak_bytes", "largest_free_block_bytes", "free_in_segments_bytes",
                                   "num_alloc_retries", "num_ooms", "caught_ooms")},
    "step_reserved_bytes": List(Num(null=True), null=True), "step_allocated_bytes": List(Num(null=True), null=True),
}, what="a torch allocator result")
CONFIG = Obj({
    "patterns": List(Str(PATTERNS), null=True), "allocators": List(Str(ALLOCATORS), null=True),
    "budget": Num(0, 1), "seed": Int(), "bandwidth": Bool(), "hbm_bytes": _BYTES, "hbm_iters": Int(0),
    "torch_settings": List(Str(max_len=200), null=True), "torch_model": Str(pattern=NAME, null=True),
    "torch_batch": Int(0, null=True), "torch_seq_lens": Str(max_len=200, null=True), "torch_steps": Int(0, null=True),
    "max_batch_model": Str(pattern=NAME, null=True), "max_batch_seq": Int(1, 1 << 24, null=True),
    "max_batch_image": Int(1, 1 << 16, null=True), "max_batch_workload": Str(max_len=4096, null=True),
    "timeout_s": Num(0, null=True),
}, what="a memory config", null=True)
SCHEMA = Obj({
    "config": CONFIG, "status": STATUS, "devices": List(Obj({"index": _GPU}, what="a device"), null=True),
    "churn": List(CHURN, null=True), "hbm": List(HBM, null=True), "torch": Map(TORCH_SETTING, null=True),
    "max_batch": List(MAX_BATCH, null=True), "findings": List(Str(), null=True),
}, required=("config", "status", "devices", "churn", "hbm", "torch", "max_batch"), what="a memory result")
