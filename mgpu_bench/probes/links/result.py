"""What links measures and keeps: a pair's spec, its raw seconds, the run; base units, figures
derived (bandwidth = bytes / median seconds, per direction)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from .shape import ENGINES  # the document's engine names, defined once there

# A pair is an outlier when it is this many robust standard deviations below the median and
# at least OUTLIER_DROP below it in relative terms (so that a very tight node with a MAD of
# ~0 does not flag 1% differences).
OUTLIER_Z = 3.0


OUTLIER_DROP = 0.10


@dataclass(frozen=True)
class LinkSpec:
    kind: str  # "copy", "latency" (dst reads src's memory) or "host"
    src: int  # GPU index
    dst: int | None  # GPU index; None for host copies
    engine: str | None = None  # "ce" or "sm" for copies
    bidirectional: bool = False
    direction: str | None = None  # "h2d" or "d2h" for host copies
    bytes: int = 0


@dataclass(frozen=True)
class LinkMeasurement:
    spec: LinkSpec
    seconds: tuple[float, ...]  # per copy, or per dependent load for latency

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def bandwidth(self) -> float:
        """bytes/s per direction: bytes / median copy time (a bidirectional copy moves `bytes`
        each way in that time)."""
        return self.spec.bytes / self.median_s

    @property
    def total_bandwidth(self) -> float:
        """bytes/s over both directions for a bidirectional copy, else the bandwidth."""
        return self.bandwidth * (2 if self.spec.bidirectional else 1)

    def to_dict(self) -> dict:
        return {"kind": "link", "spec": asdict(self.spec), "seconds": list(self.seconds)}


@dataclass(frozen=True)
class LinksConfig:
    gpus: tuple[int, ...]
    size: int = 256 << 20
    iters: int = 10
    warmup: int = 3
    engines: tuple[str, ...] = ENGINES
    latency: bool = True
    host: bool = True


@dataclass
class LinksRun:
    gpus: list[int]
    measurements: list[LinkMeasurement] = field(default_factory=list)
    peer_access: dict[tuple[int, int], bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    per_pair_seconds: float = 0.0  # wall time of one ordered pair's measurements (median)
    host_seconds: float = 0.0  # wall time of all host copies
    hops: dict = field(default_factory=dict)  # (src, dst) -> theory.Hop, the link theory per pair
    topology: dict | None = None  # the topo snapshot behind the hops

    def estimate_seconds(self, ngpus: int) -> float:
        """Wall time of the same run on `ngpus` GPUs: ordered pairs x the measured time of one
        pair, plus host copies per GPU (pairs are measured one at a time)."""
        per_gpu_host = self.host_seconds / len(self.gpus) if self.gpus else 0.0
        return ngpus * (ngpus - 1) * self.per_pair_seconds + ngpus * per_gpu_host

    def copies(self, engine: str, bidirectional: bool) -> dict[tuple[int, int], LinkMeasurement]:
        return {(m.spec.src, m.spec.dst): m for m in self.measurements
                if m.spec.kind == "copy" and m.spec.engine == engine and m.spec.bidirectional == bidirectional}

    def latencies(self) -> dict[tuple[int, int], LinkMeasurement]:
        return {(m.spec.src, m.spec.dst): m for m in self.measurements if m.spec.kind == "latency"}

    def host(self, direction: str) -> dict[int, LinkMeasurement]:
        return {m.spec.src: m for m in self.measurements if m.spec.kind == "host" and m.spec.direction == direction}
