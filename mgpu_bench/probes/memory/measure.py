"""`mgpu-bench memory`: how much device memory a job can really use, what fragmentation costs
under which allocator, and whether HBM delivers its bandwidth.

Three parts, each optional:
- the native churn probe (``_native.memory_churn``): a seeded allocation pattern under one
  allocator (cudaMalloc, the stream-ordered pool, virtual-memory mapping), then the largest
  block that can really be allocated, found by allocation; fragmentation = 1 - largest / free;
- HBM bandwidth (``_native.hbm_bandwidth``): copy-engine and SM copies, read-only and write-only
  kernels, bytes counted as each kernel states them (a copy reads N and writes N);
- PyTorch's caching allocator (``torch_memory``): a real training workload under allocator
  settings, and the largest batch that fits, each in a fresh process.

Base units in data (bytes, seconds, bytes/s); units are chosen when rendering.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgpu_bench.core.errors import InputError, MgpuError, defer_sigterm, interruption

from .shape import ALLOCATORS, HBM_KINDS, PATTERNS  # the document's names, defined once there

_ALLOCATOR_ALIASES = {"cudamalloc": "cudaMalloc", "malloc": "cudaMalloc", "async": "async",
                      "cudamallocasync": "async", "pool": "async", "vmm": "vmm", "cumemmap": "vmm",
                      "expandable": "vmm"}
HBM_LABELS = {"copy_ce": "copy, copy engine", "copy_sm": "copy, SM kernel (16 B accesses)",
              "read": "read-only kernel", "write": "write-only kernel"}
# Size classes for allocation latency, by the allocation's bytes (upper bounds, inclusive).
SIZE_CLASSES = ((4 << 20, "<= 4 MiB"), (64 << 20, "<= 64 MiB"), (1 << 30, "<= 1 GiB"), (None, "> 1 GiB"))
FRAGMENTED = 0.05  # a pattern leaving more than 5% of free memory unusable as one block is a finding
HBM_FLOOR = 0.80  # copy bandwidth under 80% of the datasheet figure is a finding


def parse_patterns(text: str) -> tuple[str, ...]:
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not names or names == ["all"]:
        return PATTERNS
    for n in names:
        if n not in PATTERNS:
            raise InputError(f"unknown --pattern '{n}': choose from {', '.join(PATTERNS)} or all")
    return tuple(dict.fromkeys(names))


def parse_allocators(text: str) -> tuple[str, ...]:
    out = []
    for part in text.split(","):
        key = part.strip().lower()
        if not key:
            continue
        if key == "all":
            return ALLOCATORS
        name = _ALLOCATOR_ALIASES.get(key)
        if name is None:
            raise InputError(f"unknown --allocator '{part.strip()}': choose from {', '.join(ALLOCATORS)} or all")
        out.append(name)
    if not out:
        raise InputError(f"--allocator is empty: choose from {', '.join(ALLOCATORS)}")
    return tuple(dict.fromkeys(out))


def size_class(nbytes: int) -> str:
    for bound, label in SIZE_CLASSES:
        if bound is None or nbytes <= bound:
            return label
    raise AssertionError("unreachable")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


# ------------------------------------------------------------------------------------ results

@dataclass
class ChurnResult:
    gpu: int
    allocator: str
    pattern: str
    raw: dict[str, Any]

    @property
    def free(self) -> int:
        """Memory a job could still get: the device's free bytes, plus for the pool allocator
        the bytes its pool keeps reserved but unused (cudaMemGetInfo does not count those)."""
        pool = 0
        if self.raw.get("pool_reserved") is not None:
            pool = max(0, int(self.raw["pool_reserved"]) - int(self.raw.get("pool_used") or 0))
        return int(self.raw["free_after_pattern"]) + pool

    @property
    def largest(self) -> int:
        return int(self.raw["largest_block"])

    @property
    def fragmentation(self) -> float | None:
        """1 - largest allocatable block / free memory after the pattern; None without free memory."""
        if self.free <= 0:
            return None
        return max(0.0, 1.0 - self.largest / self.free)

    @property
    def lost_bytes(self) -> int:
        return max(0, self.free - self.largest)

    def latency(self) -> dict[str, dict[str, dict[str, float]]]:
        """{kind: {size class: {count, p50, p99, max}}} in seconds, from the pattern's own calls (a
        result read back from its document has no calls: the figures it stored)."""
        if "events" not in self.raw:
            return dict(self.raw.get("latency") or {})
        groups: dict[tuple[str, str], list[float]] = {}
        for kind, nbytes, seconds in self.raw.get("events") or []:
            groups.setdefault((kind, size_class(int(nbytes))), []).append(float(seconds))
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (kind, cls), xs in sorted(groups.items()):
            out.setdefault(kind, {})[cls] = {"count": len(xs), "p50": percentile(xs, 50), "p99": percentile(xs, 99),
                                             "max": max(xs)}
        return out

    def to_dict(self) -> dict:
        raw = {k: v for k, v in self.raw.items() if k != "events"}
        return {"gpu": self.gpu, "allocator": self.allocator, "pattern": self.pattern, **raw,
                "fragmentation": self.fragmentation, "lost_bytes": self.lost_bytes, "latency": self.latency()}


@dataclass
class HbmResult:
    gpu: int
    kind: str
    bytes_read: int
    bytes_written: int
    seconds: list[float]
    peak: float | None  # datasheet B/s, or None for an unknown GPU

    @property
    def bandwidth(self) -> float:
        """(bytes read + bytes written) / median seconds."""
        return (self.bytes_read + self.bytes_written) / statistics.median(self.seconds)

    @property
    def pct_peak(self) -> float | None:
        return 100.0 * self.bandwidth / self.peak if self.peak else None

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "kind": self.kind, "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "seconds": self.seconds, "bandwidth": self.bandwidth, "peak": self.peak, "pct_peak": self.pct_peak}


@dataclass(frozen=True)
class MemoryConfig:
    gpus: tuple[int, ...] = (0,)
    patterns: tuple[str, ...] = PATTERNS
    allocators: tuple[str, ...] = ALLOCATORS
    churn: bool = True
    budget: float = 0.9
    seed: int = 20261129
    bandwidth: bool = False
    hbm_bytes: int = 4 << 30
    hbm_iters: int = 10
    torch_settings: tuple[str, ...] = ()
    torch_model: str = "125m"
    torch_batch: int = 8
    torch_seq_lens: str = "256-2048"
    torch_steps: int = 20
    max_batch_model: str | None = None  # the workload's key (workloads.Workload.key)
    max_batch_seq: int | None = 2048  # None: a workload without tokens, or its module's own
    timeout_s: float = 600.0
    max_batch_image: int | None = None  # pixels per side, torchvision workloads
    max_batch_workload: str | None = None  # what workloads.resolve() takes, where it is not the key


@dataclass
class MemoryRun:
    config: MemoryConfig
    devices: list[dict]
    churn: list[ChurnResult] = field(default_factory=list)
    hbm: list[HbmResult] = field(default_factory=list)
    torch: dict[str, dict] = field(default_factory=dict)  # setting -> the child's JSON (or error)
    max_batch: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None
    stop_message: str | None = None
    wall_seconds: float = 0.0


# ------------------------------------------------------------------------------------ running

def run_memory(cfg: MemoryConfig, devices: list[dict], progress: Callable[[str], None] | None = None) -> MemoryRun:
    """Each part in turn, GPU after GPU; Ctrl-C or a failing probe stops the run and keeps what
    was measured (run.stopped says why)."""
    from mgpu_bench import _native
    from mgpu_bench.machine import hardware

    run = MemoryRun(cfg, list(devices))
    t0 = time.monotonic()
    say = progress or (lambda _text: None)
    try:
        for dev in devices:
            g = dev["index"]
            # HBM bandwidth first: after the churn patterns the same copies ran about 10% slower on
            # H200 (3.83 against 4.29 TB/s, benchmarks/RESULTS.md), so the churn would colour it.
            if cfg.bandwidth:
                model = hardware.find_gpu(dev["name"])
                peak = model.memory_bandwidth.value if model else None
                if model is None:
                    run.notes.append(f"GPU {g} ({dev['name']}) is not in the hardware database: no HBM % of peak")
                for kind in HBM_KINDS:
                    say(f"GPU {g} HBM {kind}")
                    raw = _native.hbm_bandwidth(g, kind, cfg.hbm_bytes, 3, cfg.hbm_iters)
                    run.hbm.append(HbmResult(g, kind, int(raw["bytes_read"]), int(raw["bytes_written"]),
                                             list(raw["seconds"]), peak))
            if cfg.churn:
                for allocator in cfg.allocators:
                    for pattern in cfg.patterns:
                        say(f"GPU {g} {allocator} {pattern}")
                        raw = _native.memory_churn(g, allocator, pattern, cfg.seed, cfg.budget)
                        run.churn.append(ChurnResult(g, allocator, pattern, dict(raw)))
        if cfg.torch_settings or cfg.max_batch_model:
            from mgpu_bench.probes.memory import torch_memory

            first = devices[0]["index"]
            for setting in cfg.torch_settings:
                say(f"torch allocator {setting}")
                run.torch[setting] = torch_memory.run_setting(
                    setting, cfg.torch_model, cfg.torch_batch, cfg.torch_seq_lens, cfg.torch_steps, cfg.seed,
                    first, cfg.timeout_s)
            if cfg.max_batch_model:
                for ckpt in (False, True):
                    say(f"max batch {cfg.max_batch_model} checkpointing={ckpt}")
                    res = torch_memory.max_batch(cfg.max_batch_workload or cfg.max_batch_model, cfg.max_batch_seq,
                                                 ckpt, "default", first, cfg.timeout_s, image_size=cfg.max_batch_image)
                    run.max_batch.append({"model": cfg.max_batch_model, "seq_len": cfg.max_batch_seq,
                                          "image_size": cfg.max_batch_image, "checkpointing": ckpt, **res})
        defer_sigterm()  # measured: a stop signal now waits while the run is written
    except KeyboardInterrupt as exc:
        run.stopped = "interrupted"
        run.stop_message = f"{interruption(exc)}: the results gathered so far are kept"
    except MgpuError as exc:
        run.stopped = "failed"
        run.stop_message = str(exc).split(" [", 1)[0]
    run.wall_seconds = time.monotonic() - t0
    return run
