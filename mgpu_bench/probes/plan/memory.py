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

What must fit: the caching allocator's reserved bytes, the allocated peak times the
reserved/allocated ratio measured at this workload's peak (1 where none was measured), within the
device's total memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .workload import Facts

STATE_BYTES = 16  # per parameter, DDP; see the module docs
FP32 = 4
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
    """per_sample and other (fixed bytes beyond the model states) in bytes, how they were found."""

    per_sample: float | None
    other: float
    source: str


def activations(facts: Facts, points: list[MemPoint], states_1gpu: float) -> Activations:
    """The activation bytes per sample from the measured peaks (see the module docs)."""
    by_batch: dict[int, MemPoint] = {}
    for p in points:  # newest first: the first point of each batch is kept
        by_batch.setdefault(p.batch, p)
    pts = sorted(by_batch.values(), key=lambda p: p.batch)
    if len(pts) >= 2:
        n = len(pts)
        mb = sum(p.batch for p in pts) / n
        mp = sum(p.peak for p in pts) / n
        sxx = sum((p.batch - mb) ** 2 for p in pts)
        slope = sum((p.batch - mb) * (p.peak - mp) for p in pts) / sxx
        fixed = mp - slope * mb
        runs = ", ".join(f"{p.run} (batch {p.batch})" for p in pts[:4]) + (" ..." if n > 4 else "")
        if slope > 0:
            return Activations(slope, max(0.0, fixed - states_1gpu),
                               f"measured: peak memory at {n} batch sizes, {runs}, a line through them")
    if pts:
        p = pts[-1]
        per = (p.peak - states_1gpu) / p.batch
        if per > 0:
            return Activations(per, 0.0, f"measured: {p.run} (batch {p.batch}) less 16 B x parameters, one batch")
    if facts.shape is not None and facts.tokens_per_sample:
        s, h, L, V = facts.tokens_per_sample, facts.shape.width, facts.shape.layers, facts.shape.vocab
        per = L * s * h * KORTHIKANTI_SBH + s * V * LOGIT_BYTES
        return Activations(float(per), 0.0, "formula: L s h x 34 (Korthikanti et al. 2022, no recomputation, fused "
                                            "attention) + s V x 6 (logits)")
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

    def fit(self, parallel: str, n: int, batch: int) -> Fit:
        st = states(self.facts, parallel, n, self.param_bytes)
        per = self.acts.per_sample
        alloc = None if per is None else st + self.acts.other + batch * per
        reserved = None if alloc is None else alloc * self.ratio
        fits = None if reserved is None or self.capacity is None else reserved <= self.capacity
        return Fit(parallel, n, batch, st, None if per is None else batch * per, self.acts.other, alloc, reserved,
                   self.capacity, fits)

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
        room = self.capacity / self.ratio - (states(self.facts, "fsdp", 1 << 40, self.param_bytes)
                                             + self.acts.other + batch * (self.acts.per_sample or 0.0))
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
        room = self.capacity / self.ratio - states(self.facts, parallel, n, self.param_bytes) - self.acts.other
        return max(0, math.floor(room / self.acts.per_sample))
