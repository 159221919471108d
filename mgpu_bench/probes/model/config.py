"""What `mgpu-bench model` runs: the training configuration (as the result document records it) and
the plan the runner hands over. Plain data: the backend (measure.py) and the analysis
(analyse.py) both read it, neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    model: str = "tiny"  # the workload's key (workloads.Workload.key): the name in metric names
    seq_len: int | None = 128  # tokens per sample given to the workload; None: images or the module's own
    batch_size: int = 4  # per GPU (per rank) and micro-batch
    grad_accum: int = 1
    steps: int = 30
    warmup_steps: int = 5
    parallel: str = "ddp"  # ddp | fsdp
    data: str = "synthetic"  # synthetic | loader
    num_workers: int = 2
    preprocess_ms: float = 0.0
    data_dir: str | None = None
    checkpointing: bool = False
    compile: bool = False  # torch.compile the model; its compile time is the first warm-up step's
    exposed_comm: bool = True
    profile: bool = True
    device: str = "cuda"  # cuda | cpu
    seed: int = 1234
    progress: bool = False
    workload: str | None = None  # what workloads.resolve() takes, where it is not the key (a path, a module)
    image_size: int | None = None  # pixels per side, vision workloads
    noise_scale: bool = False  # the gradient noise scale from the DDP hook's norms (noise_scale.py)
    deadline: float | None = None  # CPU processes: the wall-clock time (time.time()) the timed steps keep to (sizing)

    @property
    def workload_text(self) -> str:
        return self.workload or self.model


@dataclass(frozen=True)
class ModelPlan:
    """What `mgpu-bench model` runs: the training config, the GPU counts (ascending), the data
    sources, the peak MFU is measured against (None: no MFU), the CUDA devices chosen (() on CPU
    processes), the workload's facts (Workload.facts()) and its FLOP count (workloads.FlopCount;
    None: counted on the device by the ranks, `count_note` says why)."""

    config: ModelConfig
    counts: tuple[int, ...]
    modes: tuple[str, ...]
    peak: Any
    gpus: tuple[int, ...]
    workload: dict | None = None
    count: Any = None
    count_note: str | None = None
    budgets: tuple[float, ...] = ()  # CPU processes: each configuration's guessed seconds, kept to (sizing)
    notes: tuple[str, ...] = ()
