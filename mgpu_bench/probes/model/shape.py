"""The model result document's declared shape (mgpu_bench.results.schema), checked on every read.
Import-light: the history validates stored documents through it without loading a backend."""

from __future__ import annotations

from mgpu_bench.results.schema import MAX_RANKS, NAME, STATUS, AnyValue, Bool, Int, List, Map, Num, Obj, OneOf, Str

# What run_from_document, the headline, the tables and the report read. Model, parallelism and
# data mode become parts of metric names.
_SECONDS = List(Num(0))


def _phases_rule(rank) -> tuple[str, str] | None:
    if rank.get("phases") and "step" not in rank["phases"]:
        return "phases.step", "missing (a rank's phases hold its per-step seconds under step)"
    return None


RANK = Obj({
    "rank": Int(0, MAX_RANKS), "world": Int(1, MAX_RANKS), "device": Str(max_len=100, null=True),
    "error": Str(null=True), "gpu_name": Str(null=True), "torch": Str(null=True),
    "phases": Map(_SECONDS), "no_sync_phases": Map(_SECONDS, null=True),
    "profile": Map(Num(null=True), null=True),
    "matmul_ceiling": Obj({"flops_per_s": Num(0, null=True), "shapes": List(AnyValue(), null=True)},
                          what="a matmul ceiling", null=True),
    "peak_allocated": Num(0, null=True), "peak_reserved": Num(0, null=True), "total_memory": Num(0, null=True),
    "wall_s": Num(0, null=True), "no_sync_wall_s": Num(0, null=True), "compile_s": Num(0, null=True),
    "flop_count": Obj({"flops": Num(0), "batch_size": Int(1), "device": Str(max_len=100), "note": Str(null=True),
                       "dense_ops": Int(0, null=True)},
                      what="a FLOP count", null=True),
    # the GPU's lag behind the host at each step's compute end; the gradient all-reduce's marks (gradsync)
    "queue": List(Num(0, null=True), null=True),
    "sync": Map(List(Num(0, null=True)), null=True), "sync_hooked": Map(List(Num(0, null=True)), null=True),
    # the in-job monitor's sums over every timed step (its windows'), and the long steps it found
    "totals": Obj({"steps": Int(0), "samples": Int(0), "tokens": Int(0, null=True), "elapsed_s": Num(0),
                   "compute_s": Num(0, null=True)}, required=("steps", "samples", "elapsed_s"), what="a rank's totals",
                  null=True),
    "stall_events": List(List(AnyValue(), min_len=3, max_len=3), null=True),
    "steps_index": List(Int(0), null=True), "samples_per_s": Num(0, null=True),
}, what="a rank", rule=_phases_rule)
_SHARES = ("matmul_share", "attention_share", "other_kernel_share", "comm_kernel_share", "comm_exposed_kernel_share")
# What figures.analyse always derives from a run with steps (mfu may be null: no peak figure).
_BASE = ("step_s", "samples_per_s", "flops_per_s_per_gpu", "data_share")  # tokens/s: where there are tokens
_TOGETHER = (("gpu_idle_share", _SHARES), ("matmul_ceiling", ("of_ceiling",)), ("of_ceiling", ("matmul_ceiling",)),
             ("no_sync_step_s", ("exposed_comm_share",)), ("sync_busbw", ("sync_bytes", "sync_busy_s")))


def _derived_rule(d) -> tuple[str, str] | None:
    """Every derived figure is a number or null, and the figures printed together are there
    together."""
    for k, v in d.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return str(k), "is not a number"
    if d:
        missing = [k for k in _BASE if d.get(k) is None]
        if missing:
            return missing[0], f"missing (a run's derived figures include {', '.join(_BASE)})"
        if not d["step_s"] > 0:
            return "step_s", "is not a positive number of seconds"
    for key, needs in _TOGETHER:
        if d.get(key) is not None:
            missing = [n for n in needs if d.get(n) is None]
            if missing:
                return missing[0], f"missing (a run with {key} also has {', '.join(needs)})"
    return None


def _run_rule(r) -> tuple[str, str] | None:
    if r.get("derived") and not r.get("ranks"):
        return "ranks", "is empty, but the run has derived figures (they come from its ranks)"
    return None


# stalls.describe of the run's long steps
STALLS = Obj({"count": Int(0), "steps": Int(0), "share": Num(0), "excess_s": Num(0), "median_excess_s": Num(0, null=True),
              "max_excess_s": Num(0, null=True), "period": Int(1, null=True), "every": Num(0, null=True),
              "where": Map(Int(0)), "main": Str(("outside", "host", "gpu", "compute"), null=True),
              "indices": List(Int(0)), "rank": Int(0, MAX_RANKS, null=True)},
             required=("count", "steps", "share"), what="a run's stalls", null=True)
STRAGGLER = Obj({"rank": Int(0, MAX_RANKS), "lag_s": Num(0), "lag_share": Num(0), "named": Bool(),
                 "by": Str(("arrival", "compute", "wall", "kernels", "intermittent"))}, what="a straggler", null=True)
# ledger.build: the timed steps' wall clock split by cause (shares of it), per window and rank
_SHARES_MAP = Map(Num(0, 1.0001))
LEDGER = Obj({"seconds": Map(Num(0)), "shares": _SHARES_MAP, "wall_s": Num(0), "steps": Int(0),
              "method": Str(("no_sync", "reference", "hook", "marks", "profile"), null=True),
              "told_host": Bool(), "cuda": Bool(),
              "windows": List(Obj({"first": Int(0), "last": Int(0), "shares": _SHARES_MAP}, what="a ledger window")),
              "ranks": List(Obj({"rank": Int(0, MAX_RANKS), "shares": _SHARES_MAP}, what="a rank's ledger"))},
             required=("seconds", "shares", "wall_s", "steps"), what="a step ledger", null=True)
RUN = Obj({
    "world": Int(1, MAX_RANKS), "data": Str(("synthetic", "loader")), "ranks": List(RANK),
    "stalls": STALLS, "straggler": STRAGGLER, "ledger": LEDGER,
    "comm_method": Str(("no_sync", "reference", "hook", "marks", "profile"), null=True),
    "window": List(OneOf(Int(0), Bool()), min_len=3, max_len=3, null=True),
    "samples_per_step": Int(0), "tokens_per_step": Int(0, null=True), "flops_per_token": Num(0, null=True),
    "flops_per_sample": Num(0, null=True),
    "error": Str(null=True), "derived": Obj({}, what="derived figures", null=True, rule=_derived_rule),
}, required=("world", "data"), what="a model run", rule=_run_rule)
CONFIG = Obj({
    "model": Str(pattern=NAME), "seq_len": Int(1, 1 << 24, null=True), "batch_size": Int(1, 1 << 24),
    "grad_accum": Int(1, 1 << 20), "steps": Int(0, 1 << 24), "warmup_steps": Int(0, 1 << 24),
    "parallel": Str(("ddp", "fsdp", "job")), "data": Str(("synthetic", "loader", "both")), "num_workers": Int(0, 1 << 12),
    "preprocess_ms": Num(0), "data_dir": Str(null=True), "checkpointing": Bool(), "exposed_comm": Bool(),
    "profile": Bool(), "device": Str(("cuda", "cpu")), "seed": Int(), "progress": Bool(), "compile": Bool(null=True),
    "workload": Str(max_len=4096, null=True), "image_size": Int(1, 1 << 16, null=True),
}, what="a model config", null=True)
# The workload trained (workloads.Workload.facts()) and its FLOPs as counted (measure.flop_facts).
WORKLOAD = Obj({
    "key": Str(pattern=NAME), "text": Str(max_len=4096), "kind": Str(("gpt", "torchvision", "hf", "module", "job")),
    "params": Int(0), "tokens_per_sample": Int(1, null=True), "seq_len": Int(1, null=True),
    "image_size": Int(1, null=True), "formula_per_sample": Num(0, null=True), "formula": Str(null=True),
    "flops": Obj({"per_sample": Num(0), "batch_size": Int(1), "device": Str(max_len=100), "note": Str(null=True),
                  "dense_ops": Int(0, null=True)}, what="a FLOP count", null=True),
}, required=("key", "kind"), what="a workload", null=True)
# What the in-job StepMonitor adds (mgpu_bench.monitor.result): per-rank figures, the straggler, windows.
JOB = Obj({
    "name": Str(max_len=4096), "key": Str(pattern=NAME), "ranks": List(AnyValue()), "windows": List(AnyValue()),
    "straggler": STRAGGLER,
}, required=("name", "key"), what="a job's monitor figures", null=True)
SCHEMA = Obj({
    "config": CONFIG, "status": STATUS, "gpu_counts": List(Int(1, MAX_RANKS), null=True),
    "data_modes": List(Str(("synthetic", "loader")), null=True), "gpu_name": Str(null=True),
    "peak": Obj({"value": Num(0, null=True), "unit": Str(null=True), "source": Str(null=True)}, what="a peak",
                null=True),
    "scaling": Map(Num(null=True), keys=r"\d{1,7}", null=True, keys_what="a GPU count"),
    "runs": List(RUN), "findings": List(Str(), null=True), "workload": WORKLOAD,
    "job": JOB,
}, required=("config", "status", "gpu_counts", "data_modes", "runs"), what="a model result")
