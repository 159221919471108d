"""One measurement model for every backend: a frozen spec, raw samples, derived figures.

Stored: what was measured (CommSpec), the raw seconds (per-rank burst means and per-sample
seconds), the wrong-element counts. Derived, never stored twice: time, algbw, busbw, median,
p99, coefficient of variation. Units are base units (seconds, bytes, bytes/s) everywhere;
renderers choose display units.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .ops import busbw_factor

# Fewer samples than this give no noise estimate (a CoV from 3 points is not a number to trust).
MIN_SAMPLES_FOR_NOISE = 5
# Above this coefficient of variation a result carries a warning: the figure moved while measured.
HIGH_COV = 0.05


@dataclass(frozen=True)
class CommSpec:
    """What was measured. `size` is what the user asked for, `bytes` what was run (nccl-tests'
    size column, after the op's rounding)."""

    op: str
    dtype: str
    redop: str | None  # None for ops that do not reduce
    size: int
    bytes: int
    count: int  # elements per call
    nranks: int
    inplace: bool
    backend: str  # "native", "torch-nccl" or "torch-gloo"
    devices: tuple[str, ...]  # one entry per rank: "cuda:0", "cpu", ...
    graph: bool = False
    root: int = 0
    # Which communicator: "world" (every rank), or across more than one node also "intra-node"
    # (the ranks of one node) and "inter-node" (one rank per node, same local rank); `group`
    # names the communicator within its scope ("node gpu07", "local rank 3"), "" for world.
    scope: str = "world"
    group: str = ""

    @property
    def placement(self) -> str:
        return "in-place" if self.inplace else "out-of-place"

    @property
    def rounded(self) -> bool:
        return self.bytes != self.size


@dataclass(frozen=True, eq=False)
class CommMeasurement:
    spec: CommSpec
    iters: int  # iterations of the timed burst
    batch: int  # iterations behind each sample
    burst_seconds: tuple[float, ...]  # per rank: burst time / iters
    samples: np.ndarray  # [ranks, nsamples]: seconds per iteration, each over `batch` iterations
    wrong: tuple[int, ...] | None  # per rank; None when the check was off
    kind: str = field(default="comm", init=False)

    # -- derived ------------------------------------------------------------------------------
    @property
    def time_s(self) -> float:
        """Mean seconds per iteration of the back-to-back burst, slowest rank (as nccl-tests'
        time column, which averages a burst)."""
        return float(max(self.burst_seconds))

    @property
    def algbw(self) -> float:
        """bytes/s: size / time."""
        return self.spec.bytes / self.time_s if self.time_s > 0 else float("nan")

    @property
    def busbw(self) -> float:
        """bytes/s: algbw times the op's bus factor (see mgpu_bench.results.ops)."""
        return self.algbw * busbw_factor(self.spec.op, self.spec.nranks)

    @property
    def per_sample(self) -> np.ndarray:
        """Seconds per iteration for each sample, the slowest rank's (it sets the pace)."""
        return np.asarray(self.samples).max(axis=0) if np.size(self.samples) else np.zeros(0)

    @property
    def nsamples(self) -> int:
        return int(self.per_sample.size)

    @property
    def median_s(self) -> float:
        s = self.per_sample
        return float(np.median(s)) if s.size else float("nan")

    @property
    def p99_s(self) -> float:
        s = self.per_sample
        return float(np.percentile(s, 99)) if s.size else float("nan")

    @property
    def cov(self) -> float | None:
        """Coefficient of variation of the samples; None with too few samples to say."""
        s = self.per_sample
        if s.size < MIN_SAMPLES_FOR_NOISE:
            return None
        mean = float(s.mean())
        return float(s.std(ddof=1) / mean) if mean > 0 else None

    @property
    def total_wrong(self) -> int:
        return int(sum(self.wrong)) if self.wrong is not None else 0

    @property
    def warnings(self) -> list[str]:
        out = []
        cov = self.cov
        if cov is None:
            out.append(f"only {self.nsamples} samples: no noise estimate")
        elif cov > HIGH_COV:
            out.append(f"samples vary by {cov:.0%} (coefficient of variation): the figure moved while measured")
        if self.total_wrong:
            out.append(f"{self.total_wrong} wrong elements")
        return out

    # -- storage ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        spec = asdict(self.spec)
        spec["devices"] = list(self.spec.devices)
        return {
            "kind": self.kind,
            "spec": spec,
            "iters": self.iters,
            "batch": self.batch,
            "burst_seconds": [float(x) for x in self.burst_seconds],
            "samples": np.asarray(self.samples, dtype=float).tolist(),
            "wrong": None if self.wrong is None else [int(x) for x in self.wrong],
        }

    @classmethod
    def from_dict(cls, d: dict) -> CommMeasurement:
        spec = dict(d["spec"])
        spec["devices"] = tuple(spec["devices"])
        return cls(
            spec=CommSpec(**spec),
            iters=int(d["iters"]),
            batch=int(d["batch"]),
            burst_seconds=tuple(float(x) for x in d["burst_seconds"]),
            samples=np.asarray(d["samples"], dtype=float).reshape(len(d["samples"]), -1),
            wrong=None if d["wrong"] is None else tuple(int(x) for x in d["wrong"]),
        )

    @classmethod
    def from_raw(cls, spec: CommSpec, raw: dict, checked: bool) -> CommMeasurement:
        """From a backend's raw result dict (the shape CommSession.measure returns)."""
        return cls(
            spec=spec,
            iters=int(raw["iters"]),
            batch=int(raw.get("batch", 1)),
            burst_seconds=tuple(float(x) for x in raw["burst_seconds"]),
            samples=np.asarray(raw["samples"], dtype=float),
            wrong=tuple(int(x) for x in raw["wrong"]) if checked else None,
        )


@dataclass(frozen=True)
class CommRequest:
    """One point of a sweep as the user asked for it (before the op's rounding)."""

    op: str
    dtype: str
    redop: str | None
    size: int
    inplace: bool
    root: int = 0


@dataclass(frozen=True)
class TimingOptions:
    """The stopping rules, shared by every backend (see `mgpu-bench comm --help`)."""

    warmup_iters: int = 5
    iters: int = 0  # 0: enough iterations to fill min_time_s, within [min_iters, max_iters]
    min_time_s: float = 0.03
    min_iters: int = 20
    max_iters: int = 10000
    sample_target_s: float = 0.5e-3  # each sample spans >= this much (see CommSession docs)
    check: bool = True
    graph: bool = False
