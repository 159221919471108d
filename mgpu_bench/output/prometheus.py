"""Headline metrics as a Prometheus text file, for node_exporter's textfile collector.

    mgpu_bench_comm_busbw_bytes_per_second{host="gpu07",op="allreduce",size="1GiB",...} 3.61e+11

One gauge family per kind of figure, named with its base unit as Prometheus' conventions ask
(_bytes_per_second, _seconds, _ratio for fractions, _bytes); what the metric's dotted name says
beyond that (op, size, GPU, dtype, ...) is in the labels, plus a host label. An info gauge,
mgpu_bench_info, carries the run id and the driver, CUDA, NCCL and torch versions: the run id
is kept off the figures so that every run does not start new series. The file is replaced
atomically (paths.write_output: a temporary file in the same folder, then a rename; a symbolic
link is written through): the collector may read it at any moment, and it reads only files
ending in .prom.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping

from mgpu_bench.metrics import Metric
from mgpu_bench.paths import write_output

PREFIX = "mgpu_bench_"
UNIT_SUFFIX = {
    "B/s": "_bytes_per_second",
    "FLOP/s": "_flops_per_second",
    "tokens/s": "_tokens_per_second",
    "samples/s": "_samples_per_second",
    "s": "_seconds",
    "fraction": "_ratio",
    "B": "_bytes",
    "samples": "_samples",
}
# (kind, quantity) -> (family without the prefix, help text). Others get kind_quantity + unit.
FAMILIES = {
    ("comm", "busbw"): (
        "comm_busbw_bytes_per_second",
        "Collective bus bandwidth (nccl-tests' formula) at sizes of 64 MiB and more",
    ),
    ("comm", "latency"): (
        "comm_latency_seconds",
        "Collective time per iteration at the smallest size measured",
    ),
    ("gemm", "tflops"): (
        "gemm_flops_per_second",
        "GEMM throughput with cuBLASLt's best algorithm, FLOP per second",
    ),
    ("gemm", "sustained_tflops"): (
        "gemm_sustained_flops_per_second",
        "GEMM throughput held over a sustained run (median), FLOP per second",
    ),
    ("memory", "hbm"): (
        "memory_hbm_bytes_per_second",
        "HBM bandwidth, bytes read plus bytes written per second",
    ),
    ("memory", "fragmentation"): (
        "memory_fragmentation_ratio",
        "1 - largest allocatable block / free memory after an allocation pattern",
    ),
    ("memory", "max_batch"): (
        "memory_max_batch_samples",
        "Largest per-GPU batch that fits in device memory",
    ),
    ("model", "tokens_per_s"): (
        "model_tokens_per_second",
        "Training throughput over all GPUs, tokens per second",
    ),
    ("model", "mfu"): (
        "model_mfu_ratio",
        "Model FLOPs utilisation against the bf16 dense peak",
    ),
    ("model", "exposed_comm"): (
        "model_exposed_comm_ratio",
        "Share of the step spent in communication not hidden",
    ),
    ("model", "peak_memory"): (
        "model_peak_memory_bytes",
        "Peak device memory reserved per GPU",
    ),
    ("model", "scaling_efficiency"): (
        "model_scaling_efficiency_ratio",
        "Tokens/s at N GPUs / (N x tokens/s at 1)",
    ),
    ("links", "bandwidth"): (
        "links_bandwidth_bytes_per_second",
        "GPU-to-GPU copy bandwidth per direction",
    ),
    ("links", "latency"): (
        "links_latency_seconds",
        "Dependent 4-byte read of a peer GPU's memory",
    ),
    ("links", "host_bandwidth"): (
        "links_host_bandwidth_bytes_per_second",
        "Pinned host memory <-> GPU copy bandwidth",
    ),
}
INFO_KEYS = (
    ("nvidia_driver", "driver"),
    ("cuda_runtime", "cuda_runtime"),
    ("cuda_driver", "cuda_driver"),
    ("nccl", "nccl"),
    ("torch", "torch"),
    ("mgpu_bench", "mgpu_bench"),
)


def sanitize_name(text: str) -> str:
    """A valid metric name: [a-zA-Z_:][a-zA-Z0-9_:]*, other characters as '_'."""
    out = re.sub(r"[^a-zA-Z0-9_:]", "_", text)
    return out if out and not out[0].isdigit() else "_" + out


def sanitize_label(text: str) -> str:
    """A valid label name: [a-zA-Z_][a-zA-Z0-9_]*, not starting with '__' (reserved)."""
    out = re.sub(r"[^a-zA-Z0-9_]", "_", text).lstrip("_")
    return out if out and not out[0].isdigit() else "_" + out


def escape_value(text: str) -> str:
    """A label value (a host, a model, a stored name) as the text format writes it: control
    characters shown as their escapes (console.safe_text: `cat x.prom` obeys none), then backslash,
    double quote and newline escaped as the format asks."""
    from .console import safe_text

    return safe_text(text, lines=True).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    """A # HELP text: one line, control characters shown as their escapes, backslashes doubled."""
    from .console import safe_text

    return safe_text(text).replace("\\", "\\\\")


def format_number(v: float) -> str:
    """A sample value: repr of the float, +Inf / -Inf / NaN as the format spells them."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def family(m: Metric) -> tuple[str, str]:
    """(full family name, help text) of a metric."""
    quantity = "hbm" if m.kind == "memory" and ".hbm." in m.name else m.quantity
    known = FAMILIES.get((m.kind, quantity))
    if known:
        return PREFIX + known[0], known[1]
    return sanitize_name(
        PREFIX + f"{m.kind}_{quantity}" + UNIT_SUFFIX.get(m.unit, "")
    ), f"{m.kind} {quantity} ({m.unit})"


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{escape_value(v)}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


def render(metrics: Iterable[Metric], run_id: str | None, environment: Mapping) -> str:
    """The text exposition: per family # HELP and # TYPE gauge once, then its samples. Series
    that the labels alone would not tell apart (two metrics, one family, equal labels) all get a
    `metric` label with their dotted name."""
    host = str((environment or {}).get("host") or "unknown")
    families: dict[str, tuple[str, list[tuple[Metric, list[tuple[str, str]]]]]] = {}
    for m in metrics:
        name, help_text = family(m)
        labels = [("host", host)]
        for k, v in m.labels.items():
            key = sanitize_label(k)
            if key not in ("host", "metric"):
                labels.append((key, str(v)))
        families.setdefault(name, (help_text, []))[1].append((m, labels))
    lines = []
    info = [("host", host), ("run", str(run_id or ""))]
    info += [
        (label, str(environment.get(key) or ""))
        for key, label in INFO_KEYS
        if environment
    ]
    lines += [
        f"# HELP {PREFIX}info The run these figures come from, and its software versions",
        f"# TYPE {PREFIX}info gauge",
        f"{PREFIX}info{_labels(info)} 1",
    ]
    for name, (help_text, series) in families.items():
        keys = [tuple(sorted(labels)) for _, labels in series]
        clash = len(set(keys)) != len(keys)
        lines.append(f"# HELP {name} {_help(help_text)}")
        lines.append(f"# TYPE {name} gauge")
        for m, labels in series:
            if clash:
                labels = [*labels, ("metric", m.name)]
            lines.append(f"{name}{_labels(labels)} {format_number(m.value)}")
    return "\n".join(lines) + "\n"


def write_textfile(
    path: str | os.PathLike,
    metrics: Iterable[Metric],
    run_id: str | None,
    environment: Mapping,
) -> None:
    """Writes `render(...)` to `path` atomically by paths.write_output: a temporary file in the
    same folder, fsynced, made world-readable (node_exporter often runs as another user), then
    renamed over the file (through a symbolic link to its target). Raises OSError when the folder
    is missing or not writable, or the path is a directory, FIFO, device or socket; no temporary
    file is left behind."""
    write_output(path, render(metrics, run_id, environment), mode=0o644)
