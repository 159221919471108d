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
    memory.{model}.seq{n}.{ckpt|nockpt}.max_batch               samples per GPU
    model.{model}.{parallel}.{n}gpu.{data}.{tokens_per_s|mfu|exposed_comm|peak_memory}
    model.{model}.{parallel}.{n}gpu.scaling_efficiency          fraction, n > 1
    links.gpu{a}-gpu{b}.{ce|sm}.{uni|bidir}.bandwidth           B/s per direction
    links.gpu{a}-gpu{b}.latency                                 s
    links.gpu{i}.{h2d|d2h}.host_bandwidth                       B/s

The first segment is the kind and the last the quantity (for HBM, the kernel); everything in
between is also in the labels. A name is a key: "tflops" names the quantity, the value is in FLOP/s. A suite
document gives the union of its probes' metrics, each labelled with its probe and round; a
name that an earlier probe already gave is qualified as NAME@PROBE, so adding a probe never
renames the metrics of the probes before it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

UNITS = ("B/s", "FLOP/s", "tokens/s", "samples/s", "s", "fraction", "B", "samples")
LARGE = (
    64 << 20
)  # comm: busbw is a headline from this size on (report.LARGE: where it has settled)


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


def document_kind(doc: Mapping) -> str | None:
    """The kind of a result document: its "kind" field, or for the comm and links documents,
    which predate that field, what their measurements are; None when it is not a result."""
    if not isinstance(doc, Mapping):
        return None
    kind = doc.get("kind")
    if isinstance(kind, str) and kind:
        return kind
    measurements = doc.get("measurements")
    if (
        isinstance(measurements, list)
        and measurements
        and isinstance(measurements[0], Mapping)
    ):
        first = measurements[0].get("kind")
        if first == "comm":
            return "comm"
        if first == "link":
            return "links"
    if isinstance(measurements, list) and "backend" in doc:
        return "comm"  # a comm sweep that measured nothing
    if isinstance(measurements, list) and "peer_access" in doc:
        return "links"
    return None


def metrics_from_document(doc: Mapping) -> list[Metric]:
    """The headline metrics of any result document, in document order; [] for a kind this
    module does not know (not an error). Non-finite values are left out."""
    extract = _EXTRACTORS.get(document_kind(doc) or "")
    if extract is None:
        return []
    return [m for m in extract(doc) if math.isfinite(m.value)]


# -- helpers ----------------------------------------------------------------------------------


def _size_key(n: int) -> str:
    """1073741824 -> '1GiB'; a size no binary unit writes exactly stays in bytes ('1000B')."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _slug(text: object) -> str:
    """A name segment: no dots (they separate segments), no spaces."""
    return "-".join(str(text).replace(".", "_").split())


def _finite(values) -> tuple[float, ...]:
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return tuple(out)


def _rates(amount: float, seconds) -> tuple[float, ...]:
    """amount / s for each positive s: per-iteration rates from per-iteration seconds."""
    return _finite(amount / s for s in seconds if isinstance(s, (int, float)) and s > 0)


# -- comm -------------------------------------------------------------------------------------


def _comm_metric(
    m, quantity: str, value: float, unit: str, better: str, samples
) -> Metric:
    """One comm figure of measurement `m` (a CommMeasurement), named and labelled by its spec."""
    s = m.spec
    scope, group = getattr(s, "scope", "world"), getattr(s, "group", "")
    place, size = ("in" if s.inplace else "out"), _size_key(s.size)
    where = "" if scope == "world" else f".{_slug(scope)}.{_slug(group) or 'all'}"
    labels = {"op": s.op, "dtype": s.dtype, "placement": place, "ranks": str(s.nranks)}
    labels.update(backend=s.backend, size=size)
    if scope != "world":
        labels.update(scope=scope, group=group)
    name = f"comm.{s.op}.{s.dtype}.{size}.{place}.{s.nranks}ranks{where}.{quantity}"
    return Metric(name, value, unit, better, samples, labels)


def _comm(doc: Mapping) -> list[Metric]:
    from .measurement import CommMeasurement
    from .ops import busbw_factor

    out: list[Metric] = []
    series: dict[
        tuple, list
    ] = {}  # one op on one communicator, one dtype and placement
    for d in doc.get("measurements") or []:
        if d.get("kind") == "comm":
            m = CommMeasurement.from_dict(d)
            s = m.spec
            key = (
                s.op,
                s.dtype,
                s.inplace,
                s.nranks,
                getattr(s, "scope", ""),
                getattr(s, "group", ""),
            )
            series.setdefault(key, []).append(m)
    for ms in series.values():
        for m in ms:
            if m.spec.size >= LARGE:
                moved = m.spec.bytes * busbw_factor(m.spec.op, m.spec.nranks)
                samples = _rates(moved, m.per_sample.tolist())
                out.append(_comm_metric(m, "busbw", m.busbw, "B/s", "higher", samples))
        small = min(ms, key=lambda m: m.spec.size)
        if small.spec.size < LARGE:
            samples = _finite(small.per_sample.tolist())
            out.append(
                _comm_metric(small, "latency", small.time_s, "s", "lower", samples)
            )
    return out


# -- gemm -------------------------------------------------------------------------------------


def _gemm(doc: Mapping) -> list[Metric]:
    best: dict[tuple[int, str], Mapping] = {}
    for r in doc.get("results") or []:
        if r.get("phase") == "search" or not r.get("flops_per_s"):
            continue
        key = (int(r["gpu"]), str(r["dtype"]))
        if key not in best or r["flops_per_s"] > best[key]["flops_per_s"]:
            best[key] = r
    out: list[Metric] = []
    for (gpu, dtype), r in best.items():
        labels = {
            "gpu": str(gpu),
            "dtype": dtype,
            "shape": f"{r['m']}x{r['n']}x{r['k']}",
            "gpu_name": str(r.get("gpu_name") or ""),
        }
        cand = next(
            (c for c in r.get("candidates") or [] if c.get("index") == r.get("best")),
            None,
        )
        samples = _rates(r["flops"], cand.get("seconds") or []) if cand else ()
        out.append(
            Metric(
                f"gemm.gpu{gpu}.{_slug(dtype)}.tflops",
                float(r["flops_per_s"]),
                "FLOP/s",
                "higher",
                samples,
                labels,
            )
        )
        series = r.get("series") or []
        rates = _rates(r["flops"], [p.get("seconds") for p in series])
        if rates:
            out.append(
                Metric(
                    f"gemm.gpu{gpu}.{_slug(dtype)}.sustained_tflops",
                    statistics.median(rates),
                    "FLOP/s",
                    "higher",
                    rates,
                    labels,
                )
            )
    return out


# -- memory -----------------------------------------------------------------------------------


def _memory(doc: Mapping) -> list[Metric]:
    out: list[Metric] = []
    for h in doc.get("hbm") or []:
        moved = int(h.get("bytes_read") or 0) + int(h.get("bytes_written") or 0)
        gpu, kind = int(h["gpu"]), str(h["kind"])
        out.append(
            Metric(
                f"memory.gpu{gpu}.hbm.{_slug(kind)}",
                float(h["bandwidth"]),
                "B/s",
                "higher",
                _rates(moved, h.get("seconds") or []),
                {"gpu": str(gpu), "kernel": kind},
            )
        )
    for c in doc.get("churn") or []:
        frag = c.get("fragmentation")
        if frag is None:
            continue
        gpu = int(c["gpu"])
        out.append(
            Metric(
                f"memory.gpu{gpu}.{_slug(c['allocator'])}.{_slug(c['pattern'])}.fragmentation",
                float(frag),
                "fraction",
                "lower",
                (),
                {
                    "gpu": str(gpu),
                    "allocator": str(c["allocator"]),
                    "pattern": str(c["pattern"]),
                },
            )
        )
    for mb in doc.get("max_batch") or []:
        if mb.get("error") or mb.get("max_batch") is None:
            continue
        ckpt = "ckpt" if mb.get("checkpointing") else "nockpt"
        out.append(
            Metric(
                f"memory.{_slug(mb['model'])}.seq{int(mb['seq_len'])}.{ckpt}.max_batch",
                float(mb["max_batch"]),
                "samples",
                "higher",
                (),
                {
                    "model": str(mb["model"]),
                    "seq_len": str(mb["seq_len"]),
                    "checkpointing": ckpt,
                },
            )
        )
    return out


# -- model ------------------------------------------------------------------------------------


def _window_steps(run: Mapping) -> list[float]:
    """Per-step seconds of the stable window, the slowest rank per step (as model_bench.analyse)."""
    good = [r for r in run.get("ranks") or [] if r.get("phases")]
    if not good:
        return []
    n = min(len(r["phases"]["step"]) for r in good)
    steps = [max(r["phases"]["step"][i] for r in good) for i in range(n)]
    start, end = (list(run.get("window") or [0, n]) + [0, n])[:2]
    return steps[int(start) : int(end)]


def _model(doc: Mapping) -> list[Metric]:
    cfg = doc.get("config") or {}
    model, parallel = (
        _slug(cfg.get("model", "model")),
        _slug(cfg.get("parallel", "ddp")),
    )
    out: list[Metric] = []
    for run in doc.get("runs") or []:
        d = run.get("derived") or {}
        if not d.get("tokens_per_s"):
            continue
        world, data = int(run["world"]), str(run["data"])
        prefix = f"model.{model}.{parallel}.{world}gpu.{_slug(data)}"
        labels = {
            "model": str(cfg.get("model")),
            "parallel": str(cfg.get("parallel")),
            "world": str(world),
            "data": data,
        }
        steps = _window_steps(run)
        step_s = d.get("step_s")
        out.append(
            Metric(
                f"{prefix}.tokens_per_s",
                float(d["tokens_per_s"]),
                "tokens/s",
                "higher",
                _rates(run.get("tokens_per_step") or 0, steps),
                labels,
            )
        )
        if d.get("mfu") is not None:
            # MFU is tokens/s times a constant: per step, mfu x median step / that step's seconds.
            mfu_samples = (
                _finite(d["mfu"] * step_s / s for s in steps if s > 0) if step_s else ()
            )
            out.append(
                Metric(
                    f"{prefix}.mfu",
                    float(d["mfu"]),
                    "fraction",
                    "higher",
                    mfu_samples,
                    labels,
                )
            )
        if d.get("exposed_comm_share") is not None:
            out.append(
                Metric(
                    f"{prefix}.exposed_comm",
                    float(d["exposed_comm_share"]),
                    "fraction",
                    "lower",
                    (),
                    labels,
                )
            )
        if d.get("peak_reserved"):
            out.append(
                Metric(
                    f"{prefix}.peak_memory",
                    float(d["peak_reserved"]),
                    "B",
                    "lower",
                    (),
                    labels,
                )
            )
    for n, eff in (doc.get("scaling") or {}).items():
        if int(n) > 1 and eff is not None:
            labels = {
                "model": str(cfg.get("model")),
                "parallel": str(cfg.get("parallel")),
                "world": str(n),
            }
            out.append(
                Metric(
                    f"model.{model}.{parallel}.{int(n)}gpu.scaling_efficiency",
                    float(eff),
                    "fraction",
                    "higher",
                    (),
                    labels,
                )
            )
    return out


# -- links ------------------------------------------------------------------------------------


def _links(doc: Mapping) -> list[Metric]:
    from mgpu_bench.probes.links.measure import LinkMeasurement, LinkSpec

    out: list[Metric] = []
    for d in doc.get("measurements") or []:
        if d.get("kind") != "link":
            continue
        m = LinkMeasurement(LinkSpec(**d["spec"]), tuple(d["seconds"]))
        s = m.spec
        if s.kind == "copy":
            mode = "bidir" if s.bidirectional else "uni"
            out.append(
                Metric(
                    f"links.gpu{s.src}-gpu{s.dst}.{s.engine}.{mode}.bandwidth",
                    m.bandwidth,
                    "B/s",
                    "higher",
                    _rates(s.bytes, m.seconds),
                    {
                        "src": str(s.src),
                        "dst": str(s.dst),
                        "engine": str(s.engine),
                        "mode": mode,
                    },
                )
            )
        elif s.kind == "latency":
            out.append(
                Metric(
                    f"links.gpu{s.src}-gpu{s.dst}.latency",
                    m.median_s,
                    "s",
                    "lower",
                    _finite(m.seconds),
                    {"src": str(s.src), "dst": str(s.dst)},
                )
            )
        elif s.kind == "host":
            out.append(
                Metric(
                    f"links.gpu{s.src}.{s.direction}.host_bandwidth",
                    m.bandwidth,
                    "B/s",
                    "higher",
                    _rates(s.bytes, m.seconds),
                    {"gpu": str(s.src), "direction": str(s.direction)},
                )
            )
    return out


# -- suite ------------------------------------------------------------------------------------


def _suite(doc: Mapping) -> list[Metric]:
    out: list[Metric] = []
    seen: set[str] = set()
    for probe in doc.get("probes") or []:
        sub = probe.get("document")
        if not isinstance(sub, Mapping):
            continue  # a skipped probe, or one that failed before writing anything
        name = str(probe.get("name") or document_kind(sub) or "probe")
        extra = {"probe": name, "round": str(probe.get("round", ""))}
        for m in metrics_from_document(sub):
            key = m.name if m.name not in seen else f"{m.name}@{_slug(name)}"
            n = 2
            while key in seen:  # the same probe name twice: number the repeats
                key = f"{m.name}@{_slug(name)}-{n}"
                n += 1
            seen.add(key)
            out.append(
                Metric(key, m.value, m.unit, m.better, m.samples, {**m.labels, **extra})
            )
    return out


_EXTRACTORS = {
    "comm": _comm,
    "gemm": _gemm,
    "memory": _memory,
    "model": _model,
    "links": _links,
    "suite": _suite,
}
