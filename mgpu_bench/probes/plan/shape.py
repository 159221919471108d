"""The plan result document's declared shape (mgpu_bench.results.schema), checked on every read.
Import-light: the history validates stored documents through it without loading a backend.

What the readers rely on (the findings, the tables, the curve plot, the headline): the question
(config), the workload's key (part of metric names), each figure with its source, the fit per
parallelism, the curve of step times with their ranges and days, the measured points, the answer
and what is missing; with --noise-scale, the noise scale with its source and per point its
statistical efficiency, goodput and days to the same progress; the layout planned (tensor, pipeline, data parallel degrees) and, where the
layout asked does not fit, what fits instead; the runs left out of the evidence and why. The run
is the document itself: nothing is derived again from raw samples."""

from __future__ import annotations

from mgpu_bench.results.schema import MAX_RANKS, NAME, STATUS, AnyValue, Bool, Int, List, Num, Obj, Str

from .layout import SHARDS

_GPUS = Int(1, MAX_RANKS)
_SECONDS = Num(0, null=True)
# --noise-scale (estimate/goodput.py): a configuration's global batch (samples), its statistical efficiency E and
# E's range, the goodput of all its GPUs (samples/s or tokens/s) and the days to the same progress (days / E)
GOODPUT = {"global_batch": Num(0), "stat_efficiency": Num(0), "stat_efficiency_low": Num(0),
           "stat_efficiency_high": Num(0), "doubling_fewer_steps": Num(0), "goodput": Num(0, null=True),
           "days_progress": _SECONDS, "days_progress_low": _SECONDS, "days_progress_high": _SECONDS}
NOISE = Obj({"b_noise": Num(positive=True), "stderr": Num(0, null=True), "b0": Num(positive=True),
             "b0_source": Str(), "source": Str(), "run": Str(max_len=40, null=True), "workload": Str(null=True),
             "whose": Str(("job", "synthetic"), null=True), "unit": Str(("samples",)), "formula": Str(),
             "same_workload": Bool(null=True), "per_window": List(Num(null=True), null=True)},
            required=("b_noise", "b0", "source", "b0_source"), what="a gradient noise scale")
FIGURE = Obj({"name": Str(max_len=200), "value": Num(null=True), "unit": Str(max_len=20), "source": Str()},
             required=("name", "value", "unit", "source"), what="a figure")
POINT = Obj({
    "gpus": _GPUS, "step_s": Num(positive=True), "low_s": Num(0), "high_s": Num(0), "measured": Str(null=True),
    "compute_s": _SECONDS, "comm_s": _SECONDS, "exposed_s": _SECONDS, "noise": Num(0, null=True),
    "rate_per_gpu": Num(0), "efficiency": Num(0), "days": _SECONDS, "days_low": _SECONDS, "days_high": _SECONDS,
    **GOODPUT,
}, required=("gpus", "step_s", "low_s", "high_s", "measured", "rate_per_gpu", "efficiency"), what="a curve point")
FIT = Obj({
    "parallel": Str(max_len=100), "gpus": _GPUS, "batch": Int(1), "states": Num(0),
    "activations": Num(0, null=True), "other": Num(0), "allocated": Num(0, null=True), "reserved": Num(0, null=True),
    "capacity": Num(0, null=True), "fits": Bool(null=True), "tp": Int(1, null=True), "pp": Int(1, null=True),
    "dp": Int(1, null=True), "micro_batches": Int(0, null=True), "checkpointing": Bool(null=True),
}, required=("parallel", "gpus", "batch", "states", "allocated", "reserved", "capacity", "fits"), what="a fit")
LAYOUT = Obj({"tp": Int(1), "pp": Int(1), "dp": Int(1, null=True), "shard": Str(SHARDS), "sp": Bool(),
              "checkpointing": Bool(), "name": Str(max_len=100), "text": Str(max_len=400)},
             required=("tp", "pp", "shard", "name"), what="a layout")
INSTEAD = Obj({"what": Str(max_len=200), "layout": LAYOUT, "gpus": Int(1, null=True), "days": Num(0, null=True),
               "batch": Int(1, null=True), "memory": Num(0, null=True), **GOODPUT},
              required=("what", "layout", "gpus", "days"),
              what="an alternative that fits")
MISSING = Obj({"what": Str(), "command": Str(null=True), "args": List(Str(), null=True), "why": Str(null=True)},
              required=("what", "command"), what="a missing figure")
SCHEMA = Obj({
    "status": STATUS,
    "config": Obj({"model": Str(max_len=4096), "parallel": Str(max_len=200), "gpus": Int(1, null=True),
                   "days": Num(0, null=True)}, required=("model", "parallel"), what="a plan config"),
    "workload": Obj({"key": Str(pattern=NAME), "params": Int(0), "tokens_per_sample": Int(1, null=True)},
                    required=("key", "params"), what="a workload"),
    "budget": Obj({"value": Num(0), "unit": Str(("tokens", "samples"))}, what="a budget"),
    "device": Obj({"name": Str(max_len=200), "gpus_per_node": Int(1, 1 << 16)}, required=("name", "gpus_per_node"),
                  what="a device"),
    "batch": Int(1), "figures": List(FIGURE),
    "layout": LAYOUT,
    "fit": Obj({"ddp": FIT, "fsdp": FIT, "zero1": FIT, "zero2": FIT, "asked": FIT, "fewest_gpus_asked": Int(1, null=True),
                "largest_batch_asked": Int(0, null=True), "fewest_gpus_ddp": Int(1, null=True), "fewest_gpus_fsdp": Int(1, null=True),
                "largest_batch_ddp": Int(0, null=True), "largest_batch_fsdp": Int(0, null=True),
                "max_batch_measured": List(AnyValue(), null=True)}, required=("ddp", "fsdp"), what="the fit"),
    "curve": List(POINT), "measured_points": List(POINT, null=True),
    # days: the projection at the answer's GPU count (never the budget asked: budget_days)
    "answer": Obj({"question": Str(("gpus", "days")), "gpus": Int(1, null=True), "days": Num(0, null=True),
                   "days_low": Num(0, null=True), "days_high": Num(0, null=True), "budget_days": Num(0, null=True),
                   "unreachable": Bool(null=True), "fits": Bool(null=True), "layout": LAYOUT, "instead": List(INSTEAD),
                   **GOODPUT},
                  required=("question",), what="an answer", null=True),
    "left_out": List(Obj({"run": Str(max_len=200), "why": Str()}, required=("run", "why"), what="a run left out")),
    "documents_read": Int(0),
    "missing": List(MISSING), "measured_now": List(AnyValue(), null=True), "findings": List(Str(), null=True),
    "noise_scale": NOISE,
}, required=("status", "config", "workload", "device", "batch", "figures", "fit", "curve", "missing"),
    what="a plan result")
