"""Will it fit: bytes per GPU for the model states (weights, gradients, optimizer state), sharded
under FSDP, and the activations; the fewest GPUs that hold it and the largest batch per GPU.

Model states, mixed-precision AdamW as the built-in GPT trains (fp32 weights under bf16 autocast,
fp32 gradients, AdamW's two fp32 moments): 4 + 4 + 8 = 16 bytes per parameter. That is the same
16 bytes per parameter as ZeRO's mixed-precision Adam (2 fp16 weights + 2 fp16 gradients + K = 12
for the fp32 copy, momentum and variance: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", SC20, section 3.1). DDP holds all 16 on every GPU (the
model probe's DDP keeps gradients as views into its buckets: no second copy). FSDP (FSDP2 as the
model probe sets it up: one unit per block, then the root) shards all 16 over N GPUs and holds
unsharded, per GPU: the root's parameters (never resharded), the current and the prefetched
block's parameters in the compute dtype, and one block's gradient before its reduce-scatter.

Activations: from this workload's measured peak memory at two or more batch sizes (a line: peak =
fixed + batch x per-sample; what the fixed part holds beyond the 16-byte states is kept as
"other"), else one measured batch less the states, else, for a GPT-shaped model, the published
per-layer formula of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023), section 4: s b h (34 + 5 a s / h) bytes per layer with 16-bit
activations and no recomputation. The 5 a s / h term is the attention scores and softmax, which
fused attention (SDPA's flash and memory-efficient kernels, which the built-in GPT uses) never
stores, leaving their 34 s b h; the LM head's logits, outside the layers, add s V x 6 bytes per
sample here (bf16 from the matmul, fp32 for the cross-entropy).

The built-in GPT's loss (workloads/gpt.py cross_entropy) is summed over row chunks once the logits
pass CE_MAX_ELEMENTS: from that batch on, one fp32 copy of the logits (4 B x seq x vocab per
sample) is no longer held at the peak. Measured on one H200, 350m at seq 2048 (the max-batch
search's own trials): 2.859 GB per sample from batch 2 to 16, 2.447 GB from 16 to 32, the
difference 0.412 GB = 4 x 2048 x 50304 bytes. The line is fitted to the peaks as they would be
without the chunking and the chunking taken off again where a batch reaches it.

What must fit: the allocated peak, within the device's memory less EDGE_HEADROOM. The caching
allocator's reserved-but-unallocated bytes do not count against a batch: before it raises an
out-of-memory error it returns its cached blocks to the driver and retries (PyTorch's CUDA
memory-management notes; memory_stats' num_alloc_retries counts it). Measured on one H200: 350m's
largest batch (54) peaked at 148.29 GB allocated of 150.11 GB (98.8%), where its reserved /
allocated ratio at batch 8 was 1.078. The reserved bytes at a batch are still shown (allocated x
that ratio).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .workload import Facts

STATE_BYTES = 16  # per parameter, DDP; see the module docs
FP32 = 4
EDGE_HEADROOM = 0.02  # of the device memory: the CUDA context and what the allocator cannot return (module docs)
CE_MAX_ELEMENTS = 2**31 - 1  # workloads/gpt.py: the logits past which its loss is summed over chunks
KORTHIKANTI_SBH = 34  # bytes per s*b*h per layer, without the attention-score term (fused attention)
LOGIT_BYTES = 6  # bf16 logits + their fp32 copy for the loss, per logit


@dataclass(frozen=True)
class MemPoint:
    """One measured peak: `batch` samples per GPU, `peak` allocated bytes, from run `run`."""

    batch: int
    peak: float
    run: str


@dataclass(frozen=True)
class Activations:
    """per_sample and other (fixed bytes beyond the model states) in bytes, how they were found;
    `chunked` bytes per sample that are not held past `chunk_batch` samples (the built-in GPT's
    chunked loss: module docs)."""

    per_sample: float | None
    other: float
    source: str
    chunked: float = 0.0
    chunk_batch: float | None = None

    def at(self, batch: float) -> float:
        """Activation bytes at `batch` samples per GPU (per_sample must be known)."""
        over = 0.0 if self.chunk_batch is None else max(0.0, batch - self.chunk_batch)
        return batch * float(self.per_sample) - self.chunked * over

    def largest(self, room: float) -> int:
        """The largest whole batch whose activations fit in `room` bytes (0: not one sample)."""
        per = float(self.per_sample)
        if room <= 0 or per <= 0:
            return 0
        b = room / per
        if self.chunk_batch is not None and b > self.chunk_batch and per > self.chunked:
            b = (room - self.chunked * self.chunk_batch) / (per - self.chunked)
        b = math.floor(b)
        while b > 0 and self.at(b) > room:  # rounding at the edge
            b -= 1
        return max(0, b)


def chunking(facts: Facts) -> tuple[float, float | None]:
    """(bytes per sample, batch) of the built-in GPT's chunked loss (module docs); (0, None) for
    every other workload."""
    if facts.kind != "gpt" or facts.shape is None or not facts.tokens_per_sample or not facts.shape.vocab:
        return 0.0, None
    rows = CE_MAX_ELEMENTS // facts.shape.vocab
    return float(FP32 * facts.tokens_per_sample * facts.shape.vocab), rows / facts.tokens_per_sample


def activations(facts: Facts, points: list[MemPoint], states_1gpu: float) -> Activations:
    """The activation bytes per sample from the measured peaks (see the module docs)."""
    by_batch: dict[int, MemPoint] = {}
    for p in points:  # newest first: the first point of each batch is kept
        by_batch.setdefault(p.batch, p)
    pts = sorted(by_batch.values(), key=lambda p: p.batch)
    chunked, chunk_batch = chunking(facts)

    def unchunked(p: MemPoint) -> float:  # the peak as it would be without the chunked loss
        return p.peak + (chunked * max(0.0, p.batch - chunk_batch) if chunk_batch is not None else 0.0)

    said = (f"; the chunked loss past batch {chunk_batch:.1f} holds {chunked / 2**30:.2f} GiB per sample less "
            "(workloads/gpt.py)") if chunk_batch is not None else ""
    if len(pts) >= 2:
        n = len(pts)
        mb = sum(p.batch for p in pts) / n
        mp = sum(unchunked(p) for p in pts) / n
        sxx = sum((p.batch - mb) ** 2 for p in pts)
        slope = sum((p.batch - mb) * (unchunked(p) - mp) for p in pts) / sxx
        fixed = mp - slope * mb
        runs = ", ".join(f"{p.run} (batch {p.batch})" for p in pts[:4]) + (" ..." if n > 4 else "")
        if slope > 0:
            return Activations(slope, max(0.0, fixed - states_1gpu),
                               f"measured: peak memory at {n} batch sizes, {runs}, a line through them{said}",
                               chunked, chunk_batch)
    if pts:
        p = pts[-1]
        per = (unchunked(p) - states_1gpu) / p.batch
        if per > 0:
            return Activations(per, 0.0, f"measured: {p.run} (batch {p.batch}) less 16 B x parameters, one "
                                         f"batch{said}", chunked, chunk_batch)
    if facts.shape is not None and facts.tokens_per_sample:
        s, h, L, V = facts.tokens_per_sample, facts.shape.width, facts.shape.layers, facts.shape.vocab
        per = L * s * h * KORTHIKANTI_SBH + s * V * LOGIT_BYTES
        return Activations(float(per), 0.0, "formula: L s h x 34 (Korthikanti et al. 2022, no recomputation, fused "
                                            "attention) + s V x 6 (logits)" + said, chunked, chunk_batch)
    return Activations(None, 0.0, "missing: no peak memory of this workload is stored and it has no formula")


def states(facts: Facts, parallel: str, n: int, param_bytes: int) -> float:
    """Model-state bytes per GPU: 16 per parameter under DDP; under FSDP over `n` GPUs the shard
    plus what is held unsharded (module docs). `param_bytes`: the compute dtype FSDP gathers in
    (2: bf16 on GPUs; 4 on CPU processes, where the model probe keeps fp32)."""
    p = facts.params
    if parallel != "fsdp" or n <= 1:
        return float(STATE_BYTES * p)
    block = facts.block_params
    gathered = param_bytes * (facts.other_params + 2 * block) + FP32 * block
    return STATE_BYTES * p / n + gathered


@dataclass(frozen=True)
class Fit:
    """The fit at one configuration: bytes per GPU (allocated and as reserved), whether it fits."""

    parallel: str
    gpus: int
    batch: int
    states: float
    activations: float | None
    other: float
    allocated: float | None
    reserved: float | None
    capacity: float | None
    fits: bool | None

    def to_dict(self) -> dict:
        return asdict(self)


class Memory:
    """The fit model of one workload on one GPU model."""

    def __init__(self, facts: Facts, acts: Activations, capacity: float | None, ratio: float, param_bytes: int):
        self.facts, self.acts, self.capacity, self.ratio, self.param_bytes = facts, acts, capacity, ratio, param_bytes

    @property
    def usable(self) -> float | None:
        """What an allocated peak may reach: the device memory less EDGE_HEADROOM (module docs)."""
        return None if self.capacity is None else self.capacity * (1 - EDGE_HEADROOM)

    def fit(self, parallel: str, n: int, batch: int) -> Fit:
        st = states(self.facts, parallel, n, self.param_bytes)
        acts = None if self.acts.per_sample is None else self.acts.at(batch)
        alloc = None if acts is None else st + self.acts.other + acts
        reserved = None if alloc is None else alloc * self.ratio
        fits = None if alloc is None or self.usable is None else alloc <= self.usable
        return Fit(parallel, n, batch, st, acts, self.acts.other, alloc, reserved, self.capacity, fits)

    def fewest_gpus(self, parallel: str, batch: int) -> int | None:
        """The fewest GPUs that hold the workload at `batch` per GPU: DDP 1 or none (it keeps the
        whole model on every GPU); FSDP the smallest N whose shard leaves room. None: it does not
        fit at any count, or a figure is missing."""
        f = self.fit(parallel, 1, batch)
        if f.fits is None:
            return None
        if f.fits:
            return 1
        if parallel != "fsdp":
            return None
        room = self.usable - (states(self.facts, "fsdp", 1 << 40, self.param_bytes)
                              + self.acts.other + self.acts.at(batch))
        if room <= 0:
            return None
        n = max(2, math.ceil(STATE_BYTES * self.facts.params / room))
        while not self.fit("fsdp", n, batch).fits:  # rounding at the edge
            n += 1
        return n

    def largest_batch(self, parallel: str, n: int) -> int | None:
        """The largest batch per GPU that fits on `n` GPUs (0: not even one sample); None where a
        figure is missing."""
        if self.acts.per_sample is None or self.capacity is None:
            return None
        room = self.usable - states(self.facts, parallel, n, self.param_bytes) - self.acts.other
        return self.acts.largest(room)
