"""Headline metrics of a result document: the few figures a person compares between runs.

Every kind of result document (comm, gemm, memory, model, links and suite) reduces to a flat
list of `Metric`s, each with a stable dotted name, a value in base units, the direction that is
better, the metric's own per-iteration values where the document has them (for the noise
estimate of a comparison) and labels (for Prometheus). The names, by kind:

    comm.{op}.{dtype}.{size}.{in|out}.{n}ranks[.{scope}.{group}].busbw     B/s, sizes >= 64 MiB
    comm.{op}.{dtype}.{size}.{in|out}.{n}ranks[.{scope}.{group}].latency   s, the smallest size
    gemm.gpu{i}.{dtype}.tflops                FLOP/s, the best candidate of the fastest shape
    gemm.gpu{i}.{dtype}.sustained_tflops      FLOP/s, median of a --duration series
    memory.gpu{i}.hbm.{copy_ce|copy_sm|read|write}              B/s
    memory.gpu{i}.{allocator}.{pattern}.fragmentation           fraction, lower is better
    memory.{model}.{seq{n}|img{n}|own}.{ckpt|nockpt}.max_batch  samples per GPU
    model.{model}.{parallel}.{n}gpu.{data}.{samples_per_s|tokens_per_s|mfu|exposed_comm|peak_memory}
    model.{model}.{parallel}.{n}gpu.{data}.ledger_{cause}       fraction of the timed steps' wall clock, per
                                              window as samples (ledger.py: straggler, stalls, input,
                                              communication, host, gpu)
    model.{model}.{parallel}.{n}gpu.scaling_efficiency          fraction, n > 1
    links.gpu{a}-gpu{b}.{ce|sm}.{uni|bidir}.bandwidth           B/s per direction
    links.gpu{a}-gpu{b}.latency                                 s
    links.gpu{i}.{h2d|d2h}.host_bandwidth                       B/s

Each probe extracts its own (probes/<name>/headline.py, through Probe.headline); this module holds
the Metric type and the helpers they share.

The first segment is the kind and the last the quantity (for HBM, the kernel); everything in
between is also in the labels. A name is a key: "tflops" names the quantity, the value is in FLOP/s. A suite
document gives the union of its probes' metrics, each labelled with its probe and round; a
name that an earlier probe already gave is qualified as NAME@PROBE, so adding a probe never
renames the metrics of the probes before it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

UNITS = ("B/s", "FLOP/s", "tokens/s", "samples/s", "s", "fraction", "B", "samples")


@dataclass(frozen=True)
class Metric:
    """One headline figure of one run.

    name: stable dotted key (see the module docs); value: base units (bytes/s, FLOP/s,
    tokens/s, seconds, fraction 0..1, bytes); unit: one of UNITS; better: "higher" or "lower";
    samples: the metric's own per-iteration/step/repetition values in the same unit, () when
    the document has none; labels: the parts of the name as Prometheus labels.
    """

    name: str
    value: float
    unit: str
    better: str
    samples: tuple[float, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(
                f"metric {self.name}: better must be 'higher' or 'lower', not {self.better!r}"
            )
        if self.unit not in UNITS:
            raise ValueError(f"metric {self.name}: unknown unit {self.unit!r}")

    @property
    def kind(self) -> str:
        """The first segment of the name: comm, gemm, memory, model, links."""
        return self.name.split(".", 1)[0]

    @property
    def quantity(self) -> str:
        """The last segment of the name (before any @PROBE qualifier): busbw, tflops, ..."""
        return self.name.split("@", 1)[0].rsplit(".", 1)[-1]


def size_key(n: int) -> str:
    """1073741824 -> '1GiB'; a size no binary unit writes exactly stays in bytes ('1000B')."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def slug(text: object) -> str:
    """A name segment: no dots (they separate segments), no spaces."""
    return "-".join(str(text).replace(".", "_").split())


def finite(values) -> tuple[float, ...]:
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return tuple(out)


def rates(amount: float, seconds) -> tuple[float, ...]:
    """amount / s for each positive s: per-iteration rates from per-iteration seconds."""
    return finite(amount / s for s in seconds if isinstance(s, (int, float)) and s > 0)


def window_steps(run: Mapping) -> list[float]:
    """A model document's run entry: seconds per step over its stable window, the slowest rank
    per step (as the model probe's analyse computes its figures from them)."""
    steps = measured_steps(run)
    n = len(steps)
    start, end = (list(run.get("window") or [0, n]) + [0, n])[:2]
    return steps[int(start):int(end)]


def measured_steps(run: Mapping) -> list[float]:
    """A model document's run entry: seconds per timed step, every one after warm-up (the wall
    clock's throughput is taken over them), the slowest rank per step."""
    good = [r for r in run.get("ranks") or [] if (r.get("phases") or {}).get("step")]
    if not good:
        return []
    n = min(len(r["phases"]["step"]) for r in good)
    return [max(r["phases"]["step"][i] for r in good) for i in range(n)]
