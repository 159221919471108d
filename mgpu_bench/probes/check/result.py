"""What a check holds while it runs: its config, its parts and the run (measure.py and cpu.py fill
them; document.py writes them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

DEFAULT_KEEP = 1000  # stored checks per node: a week at slurmd's HealthCheckInterval=600, NPD's 10 m


@dataclass
class Part:
    """One part of the check. status: measured, skipped (why says why), failed (an error of the
    part: why), hung (its GPU work did not return within its slot). figures: {device, kind (gemm,
    copy, allreduce), value, unit, samples (per burst, same unit), detail}; facts: what it read."""

    part: str
    status: str = "measured"
    seconds: float = 0.0
    expected_s: float = 0.0
    why: str | None = None
    figures: list[dict] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # device -> the GPU error that ended its work

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CheckConfig:
    budget_s: float
    gpus: tuple[int, ...]  # CUDA devices; () on CPU processes
    nproc: int  # CPU ranks when there is no GPU
    drain: bool = False
    resume: bool = False
    format: str = "text"  # "text" or "npd"
    keep: int = DEFAULT_KEEP  # stored checks of the node the history keeps (0: all); the document's "keep"


@dataclass
class CheckRun:
    config: CheckConfig
    node: str
    devices: list[dict]  # {"name": "gpu0" or "rank0", "index", "model", "bus_id", "multiprocessors"}
    parts: list[Part] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None
    stop_message: str | None = None
    wall_seconds: float = 0.0

    @property
    def on_gpu(self) -> bool:
        return bool(self.config.gpus)

    def part(self, name: str) -> Part | None:
        return next((p for p in self.parts if p.part == name), None)
