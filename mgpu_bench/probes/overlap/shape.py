"""The overlap result document's declared shape (mgpu_bench.results.schema), checked on every read.
Import-light: the history validates stored documents through it without loading a backend.

What the readers rely on (analyse.py derives every figure again from the raw seconds; render.py,
report.py and headline.py read the rest): per rank, each phase's sides as seconds per iteration
with their start (seconds after the phase's common start), the GPU's SM count and NCCL's channels
(the SMs a collective holds), the telemetry summary per phase and the series the clock plot draws;
the config, whose size, GEMM shape and device become parts of metric names; and the training step
the run is set beside (analyse.model_reference). "summary" repeats derived figures for readers of
the JSON and is never read back.
"""

from __future__ import annotations

from mgpu_bench.results.schema import (
    MAX_BYTES,
    MAX_GPU_INDEX,
    MAX_RANKS,
    NAME,
    STATUS,
    TELEMETRY_SERIES,
    TELEMETRY_SUMMARY,
    Bool,
    Int,
    List,
    Map,
    Num,
    Obj,
    Str,
)

from . import MAX_DIM

PHASES = ("comm_alone", "gemm_alone", "together")  # analyse.PHASES: the order a rank runs them in
COMM_OPS = ("allreduce", "elementwise stand-in")  # the stand-in: one rank, where NCCL's allreduce is a no-op
MAX_CHANNELS = 1 << 10  # NCCL's channels per communicator (MAXCHANNELS is 32 to 64 in NCCL 2.1x-2.2x)
MAX_SMS = 1 << 12  # multiprocessors of one GPU (132 on an H100 SXM or H200)

# One side of one phase: the seconds each iteration took, back to back on its stream, from its
# start (analyse.ends, analyse.window).
SIDE = Obj({"start_s": Num(0), "seconds": List(Num(0))}, required=("seconds",), what="a side of a phase",
           null=True)
PHASE = Obj({"comm": SIDE, "gemm": SIDE, "host_s": Num(0, null=True)}, what="a phase", null=True)


def _series_rule(series) -> tuple[str, str] | None:
    """The clock plot draws sm_hz and power_w against t: both there, as long as t."""
    t = series.get("t") or []
    for key in ("sm_hz", "power_w", "temp_c"):
        column = series.get(key)
        if t and key != "temp_c" and column is None:
            return key, f"missing (a series with times has {key}, one value per time)"
        if column is not None and len(column) != len(t):
            return key, f"has {len(column)} values for {len(t)} times (one per time)"
    return None


# A rank's NVML samples over all phases (telemetry.series) and each phase's bounds, in seconds
# since the first phase began.
SERIES = Obj({**TELEMETRY_SERIES.fields,
              "phases": Map(List(Num(), min_len=2, max_len=2), keys="|".join(PHASES),
                            keys_what="a phase: " + ", ".join(PHASES), null=True)},
             what="a telemetry series", null=True, rule=_series_rule)
NCCL = Obj({"coll_channels": Int(0, MAX_CHANNELS), "nvls_channels": Int(0, MAX_CHANNELS),
            "capture": Str(max_len=500, null=True)}, what="NCCL's channels", null=True)


def _rank_rule(rank) -> tuple[str, str] | None:
    if isinstance(rank.get("rank"), int) and isinstance(rank.get("world"), int) and rank["rank"] >= rank["world"]:
        return "rank", f"is {rank['rank']}, not below the world of {rank['world']} ranks"
    return None


# One rank's result (measure.measure): what it measured, on which device, and what stopped it.
RANK = Obj({
    "rank": Int(0, MAX_RANKS), "world": Int(1, MAX_RANKS), "device": Str(max_len=100, null=True),
    "host": Str(max_len=1024, null=True), "error": Str(null=True),
    "phases": Obj({p: PHASE for p in PHASES}, what="a rank's phases"),
    "calibration": Obj({"comm_s": Num(0), "gemm_s": Num(0)}, required=("comm_s", "gemm_s"),
                       what="a calibration", null=True),
    "comm_op": Str(COMM_OPS, null=True), "nccl": NCCL, "nccl_env": Map(Str(max_len=1000), null=True),
    "gpu_name": Str(max_len=200, null=True), "sm_count": Int(1, MAX_SMS, null=True),
    "bus_id": Str(max_len=100, null=True), "telemetry_error": Str(null=True),
    "telemetry": Map(TELEMETRY_SUMMARY, keys="|".join(PHASES), keys_what="a phase: " + ", ".join(PHASES),
                     null=True),
    "telemetry_series": SERIES,
}, required=("rank", "world", "phases"), what="an overlap rank", rule=_rank_rule)
# The run's settings (analyse.OverlapConfig): size in bytes per rank (fp32, whole elements), the
# GEMM's M, N and K, each phase's length in seconds; size, shape and device name metrics.
CONFIG = Obj({
    "size": Int(4, MAX_BYTES), "m": Int(1, MAX_DIM), "n": Int(1, MAX_DIM), "k": Int(1, MAX_DIM),
    "duration_s": Num(positive=True), "device": Str(("cuda", "cpu")), "warmup": Int(0, 1 << 20),
    "progress": Bool(), "seed": Int(),
}, what="an overlap config", null=True)
# The training step the interference is set beside (analyse.model_reference, or the suite's
# --model-figures): seconds per step and shares of it (0 to 1) that analyse.step_cost computes with.
MODEL_REF = Obj({
    "source": Str(max_len=4096), "model": Str(pattern=NAME, null=True), "parallel": Str(("ddp", "fsdp"), null=True),
    "device": Str(("cuda", "cpu"), null=True), "world": Int(2, MAX_RANKS), "gpu_name": Str(max_len=200, null=True),
    "host": Str(max_len=1024, null=True), "created": Str(max_len=100, null=True), "step_s": Num(positive=True),
    "no_sync_step_s": Num(0, null=True), "exposed_comm_share": Num(0, 1),
    "comm_kernel_share": Num(0, null=True), "comm_exposed_kernel_share": Num(0, null=True),
}, required=("source", "model", "parallel", "world", "step_s", "exposed_comm_share"), what="a model reference",
    null=True)
_SUMMARY_SIDE = Obj({"seconds": Num(0), "rate": Num(0), "se": Num(0, null=True), "samples": Int(0)},
                    what="a side's figures", null=True)
_SUMMARY_SLOWDOWN = Obj({"value": Num(), "noise": Num(0, null=True), "significant": Bool()}, what="a slowdown",
                        null=True)
SUMMARY = Obj({
    **{k: _SUMMARY_SIDE for k in ("comm_alone", "comm_together", "gemm_alone", "gemm_together")},
    "comm_slowdown": _SUMMARY_SLOWDOWN, "gemm_slowdown": _SUMMARY_SLOWDOWN,
    "nccl_channels": Int(0, MAX_CHANNELS, null=True), "sm_count": Int(1, MAX_SMS, null=True),
    "hidden": Num(hi=1, null=True), "window_share": List(Num(0, 1, null=True), null=True),
    "step_cost": Obj({}, what="a step cost", null=True),
}, what="an overlap summary", null=True)


def _ranks_rule(doc) -> tuple[str, str] | None:
    """The ranks of one job: each rank once, all of one world (its size the document's)."""
    ranks = doc.get("ranks") or []
    seen: set[int] = set()
    for i, r in enumerate(ranks):
        if r["rank"] in seen:
            return f"ranks[{i}].rank", f"is {r['rank']} again (each rank's result is there once)"
        seen.add(r["rank"])
        if r["world"] != ranks[0]["world"]:
            return f"ranks[{i}].world", f"is {r['world']}, not {ranks[0]['world']} as rank {ranks[0]['rank']}'s"
    if ranks and isinstance(doc.get("world"), int) and doc["world"] != ranks[0]["world"]:
        return "world", f"is {doc['world']}, not the ranks' world of {ranks[0]['world']}"
    return None


SCHEMA = Obj({
    "config": CONFIG, "status": STATUS, "gpus": List(Int(0, MAX_GPU_INDEX), max_len=MAX_RANKS, null=True),
    "world": Int(1, MAX_RANKS), "ranks": List(RANK, max_len=MAX_RANKS), "model_ref": MODEL_REF,
    "summary": SUMMARY, "findings": List(Str(), null=True),
}, required=("config", "status", "ranks"), what="an overlap result", rule=_ranks_rule)
