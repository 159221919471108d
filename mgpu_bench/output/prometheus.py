"""Headline metrics as a Prometheus text file, for node_exporter's textfile collector.

    mgpu_bench_comm_bus_bandwidth_bytes_per_second{host="gpu07",op="allreduce",size="1GiB",...,textfile="comm.prom"} 3.61e+11

One gauge family per kind of figure, named as Prometheus' conventions ask (metric and label
naming, prometheus.io/docs/practices/naming: one base unit, spelled out, as the suffix; no
abbreviated units), and as `promtool check metrics` lints them: the kind, the quantity's words
without those that restate the unit ("tflops" of a FLOP/s figure, "samples_per_s" of a samples/s
one) and with abbreviations written out (busbw: bus_bandwidth), then the unit (_bytes_per_second,
_flops_per_second, _seconds, _ratio for fractions, _bytes; a count has none). What the metric's
dotted name says beyond that (op, size, GPU, dtype, ...) is in the labels, plus a host label and
a `textfile` label, the file's own name: two files (of two history databases, of two commands)
never give the same series, which node_exporter would drop. An info gauge, mgpu_bench_info,
carries the run id and the driver, CUDA, NCCL and torch versions: the run id is kept off the
figures so that every run does not start new series. The file is replaced atomically
(paths.write_output: a temporary file in the same folder, then a rename; a symbolic link is
written through): the collector may read it at any moment, and it reads only files ending in .prom.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping

from mgpu_bench.core.paths import write_output
from mgpu_bench.results.metrics import Metric

PREFIX = "mgpu_bench_"
UNIT_SUFFIX = {
    "B/s": "_bytes_per_second",
    "FLOP/s": "_flops_per_second",
    "tokens/s": "_tokens_per_second",
    "samples/s": "_samples_per_second",
    "s": "_seconds",
    "fraction": "_ratio",
    "B": "_bytes",
    "samples": "",  # a count (of samples in a batch, of problems, of nodes): no unit, the quantity names it
}
# Words of a quantity that restate its unit, which the suffix says once.
UNIT_WORDS = {
    "FLOP/s": {"tflops", "gflops", "flops"},
    "samples/s": {"samples", "per", "s"},
    "tokens/s": {"tokens", "per", "s"},
    "B": {"bytes"},
    "s": {"s", "seconds"},
}
# Abbreviations in quantities, written out.
WORDS = {"busbw": "bus_bandwidth", "algbw": "algorithm_bandwidth", "bw": "bandwidth"}
# (kind, quantity) -> help text. Others get "kind quantity (unit)".
FAMILIES = {
    ("comm", "busbw"): "Collective bus bandwidth (nccl-tests' formula) at sizes of 64 MiB and more",
    ("comm", "latency"): "Collective time per iteration at the smallest size measured",
    ("gemm", "tflops"): "GEMM throughput with cuBLASLt's best algorithm, FLOP per second",
    ("gemm", "sustained_tflops"): "GEMM throughput held over a sustained run (median), FLOP per second",
    ("memory", "hbm"): "HBM bandwidth, bytes read plus bytes written per second",
    ("memory", "fragmentation"): "1 - largest allocatable block / free memory after an allocation pattern",
    ("memory", "max_batch"): "Largest per-GPU batch that fits in device memory, samples",
    ("model", "samples_per_s"): "Training throughput over all GPUs, samples per second",
    ("model", "tokens_per_s"): "Training throughput over all GPUs, tokens per second",
    ("model", "mfu"): "Model FLOPs utilisation against the bf16 dense peak",
    ("model", "exposed_comm"): "Share of the step spent in communication not hidden",
    ("model", "peak_memory"): "Peak device memory reserved per GPU",
    ("model", "scaling_efficiency"): "Tokens/s at N GPUs / (N x tokens/s at 1)",
    ("links", "bandwidth"): "GPU-to-GPU copy bandwidth per direction",
    ("links", "latency"): "Dependent 4-byte read of a peer GPU's memory",
    ("links", "host_bandwidth"): "Pinned host memory <-> GPU copy bandwidth",
    ("check", "tflops"): "The check's GEMM throughput (bf16 8192^3 on a GPU, fp32 on a CPU rank), FLOP per second",
    ("check", "copy_bandwidth"): "The check's device copy, bytes read plus written per second",
    ("check", "allreduce_busbw"): "The check's allreduce within the node, bus bandwidth",
    ("check", "healthy"): "1 when the node's last check passed, 0 when it found a problem",
    ("check", "problems"): "Problems the node's last check found",
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
    """(full family name, help text) of a metric: the kind, the quantity's words (those that
    restate the unit dropped, abbreviations written out), the unit's suffix."""
    quantity = "hbm" if m.kind == "memory" and ".hbm." in m.name else m.quantity
    words = [WORDS.get(w, w) for w in sanitize_name(quantity).lower().strip("_").split("_")
             if w and w not in UNIT_WORDS.get(m.unit, ())]
    name = sanitize_name(PREFIX + "_".join([m.kind, *words]) + UNIT_SUFFIX.get(m.unit, ""))
    return re.sub(r"_+", "_", name), FAMILIES.get((m.kind, quantity), f"{m.kind} {quantity} ({m.unit})")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{escape_value(v)}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


def render(metrics: Iterable[Metric], run_id: str | None, environment: Mapping, textfile: str | None = None) -> str:
    """The text exposition: per family # HELP and # TYPE gauge once, then its samples. Series
    that the labels alone would not tell apart (two metrics, one family, equal labels) all get a
    `metric` label with their dotted name. `textfile`: the file's name, a label of every series."""
    host = str((environment or {}).get("host") or "unknown")
    own = [("textfile", textfile)] if textfile else []
    families: dict[str, tuple[str, list[tuple[Metric, list[tuple[str, str]]]]]] = {}
    for m in metrics:
        name, help_text = family(m)
        labels = [("host", host)]
        for k, v in m.labels.items():
            key = sanitize_label(k)
            if key not in ("host", "metric", "textfile"):
                labels.append((key, str(v)))
        families.setdefault(name, (help_text, []))[1].append((m, labels + own))
    lines = []
    info = [("host", host), *own, ("run", str(run_id or ""))]
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
    file is left behind. Every series carries the file's name (`textfile`)."""
    write_output(path, render(metrics, run_id, environment, os.path.basename(os.fspath(path))), mode=0o644)
