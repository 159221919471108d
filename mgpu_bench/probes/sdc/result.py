"""What an sdc run is and keeps: its config (with the defaults and bounds the command line
offers), one check per work, GPU and repetition, the run; the shape as text and parsed. Shared by
measure.py (which fills a run) and analyse.py (which judges one); imports neither."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from mgpu_bench.core.errors import InputError

from .shape import MAX_DIM

DEFAULT_SHAPE = (8192, 8192, 8192)
DEFAULT_GEMMS = 64
DEFAULT_REPETITIONS = 20
DEFAULT_MEMORY_FRACTION = 0.9
MEMORY_FRACTION_RANGE = (0.05, 0.95)
DEFAULT_COMM_BYTES = 256 << 20
MAX_COMM_BYTES = 16 << 30
COMM_DTYPE = "bf16"  # what training reduces gradients in; comm's data are exact integers in it
DEFAULT_SEED = 20261129


def parse_shape(text: str) -> tuple[int, int, int]:
    """'8192' (square) or 'MxNxK'; '8k' = 8192."""
    parts = re.split(r"[x*]", text.strip().lower())
    if len(parts) not in (1, 3):
        raise InputError(f"--shape '{text}' is neither N (square) nor MxNxK: write e.g. 8192 or 4096x8192x1024")
    dims = []
    for p in parts:
        t, mult = p.strip(), 1
        if t.endswith("k"):
            t, mult = t[:-1], 1024
        try:
            v = int(t) * mult
        except ValueError:
            raise InputError(f"--shape '{text}': '{p.strip()}' is not a whole number: write e.g. 8192 or 8k") from None
        if not 1 <= v <= MAX_DIM:
            raise InputError(f"--shape '{text}': each dimension must be from 1 to {MAX_DIM}")
        dims.append(v)
    m, n, k = dims * 3 if len(dims) == 1 else dims
    return m, n, k


def shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


@dataclass(frozen=True)
class SdcConfig:
    """What a run checks. duration_s > 0: repeat until that much time has passed (at least one
    repetition), else `repetitions` times. comm_bytes 0: no collective."""

    gpus: tuple[int, ...] = (0,)
    dtype: str = "bf16"
    shape: tuple[int, int, int] = DEFAULT_SHAPE
    gemms: int = DEFAULT_GEMMS
    repetitions: int = DEFAULT_REPETITIONS
    duration_s: float = 0.0
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    comm_bytes: int = DEFAULT_COMM_BYTES
    seed: int = DEFAULT_SEED
    timeout_s: float = 300.0

    @property
    def gemm_flops(self) -> int:
        m, n, k = self.shape
        return 2 * m * n * k

    @property
    def output_elements(self) -> int:
        return self.shape[0] * self.shape[1]


@dataclass
class Check:
    """One work on one GPU in one repetition (from 1). count: GEMMs run, 8-byte words or elements
    checked; bytes: of output hashed, HBM written and read back, or the collective's buffer;
    seconds: GPU time (CUDA events) of the work; wrong: GEMMs whose hash differs from the GPU's
    own first result (the run of GEMMs stops at the first), words that read back other than
    written, elements that differ from the exact sum; hash: the GEMM output's (hex), the
    differing one where wrong; first: where the first wrong item is (analyse.locate_* records)."""

    gpu: int
    repetition: int
    work: str
    count: int
    bytes: int
    seconds: float
    wrong: int = 0
    hash: str | None = None
    first: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SdcRun:
    config: SdcConfig
    devices: list[dict]
    algo: dict | None = None  # the pinned algorithm: blob (hex) and its config attributes
    references: dict[int, str] = field(default_factory=dict)  # GPU -> hash of its first GEMM
    hbm_bytes: dict[int, int] = field(default_factory=dict)  # GPU -> bytes of its HBM buffer
    checks: list[Check] = field(default_factory=list)
    # A GPU whose first GEMM differs from a peer's: {gpu, against, work, first}
    peer_differences: list[dict] = field(default_factory=list)
    repetitions: int = 0  # completed
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None  # "interrupted", "failed"
    stop_message: str | None = None
    wall_seconds: float = 0.0
    check_seconds: float = 0.0  # wall time of the repetitions, set-up excluded

    def device(self, gpu: int) -> dict:
        return next((d for d in self.devices if d.get("index") == gpu), {"index": gpu})

    def checks_of(self, gpu: int | None = None, work: str | None = None) -> list[Check]:
        return [c for c in self.checks if (gpu is None or c.gpu == gpu) and (work is None or c.work == work)]
