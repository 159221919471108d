"""Will it fit: bytes per GPU for the model states (weights, gradients, optimizer state), partitioned
by a ZeRO stage or FSDP, and the activations; the fewest GPUs that hold it and the largest batch
per GPU.

Model states, mixed-precision AdamW as the built-in GPT trains (fp32 weights under bf16 autocast,
fp32 gradients, AdamW's two fp32 moments): 4 + 4 + 8 = 16 bytes per parameter. That is the same
16 bytes per parameter as ZeRO's mixed-precision Adam (2 fp16 weights + 2 fp16 gradients + K = 12
for the fp32 copy, momentum and variance: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", SC20, section 3.1). DDP holds all 16 on every GPU (the
model probe's DDP keeps gradients as views into its buckets: no second copy). FSDP (FSDP2 as the
model probe sets it up: one unit per block, then the root) shards all 16 over N GPUs and holds
unsharded, per GPU: the root's parameters (never resharded), the current and the prefetched
block's parameters in the compute dtype, and one block's gradient before its reduce-scatter.

ZeRO's stages (Rajbhandari et al. 2020, section 5.1 and Figure 1), for Psi parameters over N
data-parallel ranks, with w bytes of weights, g of gradients (the compute dtype: 2 on GPUs) and K
of optimizer state per parameter (K = 16 - w - g: 12 on GPUs, the fp32 copy, momentum and
variance; 8 on CPU processes, whose weights are the fp32 copy):

    DDP               (w + g + K) Psi                  16 Psi
    ZeRO-1 (P_os)     (w + g) Psi + K Psi / N          4 Psi + 12 Psi / N
    ZeRO-2 (P_os+g)   w Psi + (g + K) Psi / N          2 Psi + 14 Psi / N
    ZeRO-3 (P_os+g+p) (w + g + K) Psi / N              16 Psi / N   (FSDP: plus what it holds unsharded)

(model_state_bytes; Figure 1's 7.5B parameters on 64 GPUs: 120, 31.4, 16.6 and 1.9 GB). The
buckets DeepSpeed reduces and gathers through come on top and are not counted, as in Figure 1.

Activations: from this workload's measured peak memory at two or more batch sizes (a line: peak =
fixed + batch x per-sample; what the fixed part holds beyond the 16-byte states is kept as
"other"), else one measured batch less the states, else, for a GPT-shaped model, the published
per-layer formula of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023), section 4: s b h (34 + 5 a s / h) bytes per layer with 16-bit
activations and no recomputation. The 5 a s / h term is the attention scores and softmax, which
fused attention (SDPA's flash and memory-efficient kernels, which the built-in GPT uses) never
stores, leaving their 34 s b h; the LM head's logits, outside the layers, add s V x 6 bytes per
sample here (bf16 from the matmul, fp32 for the cross-entropy).

With tensor, pipeline parallelism or recomputation (plan/layout.py) the formula gives the activations
(layer_bytes, formula_bytes), multiplied by the ratio the measured activations bear to it at tp =
pp = 1 where they were measured; the model states per GPU are those of the first pipeline stage
(its blocks and the embeddings), split by tp, sharded over the data-parallel ranks under FSDP.

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

from ..layout import Layout
from ..sources.evidence import MemPoint
from ..workload import Facts

STATE_BYTES = 16  # per parameter, DDP; see the module docs
ZERO_K = 12  # ZeRO's K: bytes of optimizer state per parameter of mixed-precision Adam (Rajbhandari et al. 2020, 3.1)
HOST_STATE_BYTES = 12  # fp32 weights + two fp32 AdamW moments, the part ZeRO-Offload keeps on the host
RECOMPUTE_INPUT_SBH = 2  # Korthikanti et al. 2022, Table 2: full recomputation keeps each layer's input
MAX_GPUS_FIT = 1_000_000  # config.MAX_GPUS: no count beyond is searched
FP32 = 4
EDGE_HEADROOM = 0.02  # of the device memory: the CUDA context and what the allocator cannot return (module docs)
CE_MAX_ELEMENTS = 2**31 - 1  # workloads/gpt.py: the logits past which its loss is summed over chunks
KORTHIKANTI_SBH = 34  # bytes per s*b*h per layer, without the attention-score term (fused attention)
LOGIT_BYTES = 6  # bf16 logits + their fp32 copy for the loss, per logit


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


def stage_params(facts: Facts, layout: Layout) -> float:
    """The parameters one GPU holds before any sharding over the data-parallel ranks: all of them
    under data parallelism; with a pipeline the first stage's blocks and the parameters outside
    them (the token table and positions; the last stage holds the LM head, the same table), all
    split by tp."""
    if layout.plain:
        return float(facts.params)
    return (math.ceil(facts.blocks / layout.pp) * facts.block_params + facts.other_params) / layout.tp


def state_split(shard: str, weight_bytes: float = 2, grad_bytes: float = 2,
                optimizer_bytes: float = ZERO_K) -> tuple[float, float]:
    """(bytes per parameter every data-parallel rank keeps, bytes per parameter partitioned over
    them) under `shard` (ddp, zero1, zero2, fsdp = ZeRO-3): ZeRO section 5.1 (module docs)."""
    w, g, k = float(weight_bytes), float(grad_bytes), float(optimizer_bytes)
    return {"ddp": (w + g + k, 0.0), "zero1": (w + g, k), "zero2": (w, g + k), "fsdp": (0.0, w + g + k)}[shard]


def model_state_bytes(params: float, shard: str, n: int, weight_bytes: float = 2, grad_bytes: float = 2,
                      optimizer_bytes: float = ZERO_K) -> float:
    """Model-state bytes per GPU of `params` parameters over `n` data-parallel ranks: ZeRO's
    formulas (Rajbhandari et al. 2020, section 5.1, Figure 1; module docs), its defaults the
    paper's mixed-precision Adam (2 B fp16 weights, 2 B fp16 gradients, K = 12)."""
    kept, partitioned = state_split(shard, weight_bytes, grad_bytes, optimizer_bytes)
    return params * (kept + partitioned / max(1, n))


def _split(layout: Layout, param_bytes: int) -> tuple[float, float]:
    """state_split for this plan: the compute dtype's weights and gradients (`param_bytes`), the
    rest of the 16 bytes the optimizer's (module docs)."""
    return state_split(layout.shard, param_bytes, param_bytes, STATE_BYTES - 2 * param_bytes)


def partitioned_bytes(facts: Facts, layout: Layout, param_bytes: int) -> float:
    """The model-state bytes a GPU would hold on one rank that `layout`'s sharding divides by the
    data-parallel ranks (0 under DDP)."""
    return _split(layout, param_bytes)[1] * stage_params(facts, layout)


def states(facts: Facts, layout: Layout, dp: int, param_bytes: int) -> float:
    """Model-state bytes per GPU: 16 per parameter it holds, replicated over the data-parallel
    ranks (DDP), partitioned over `dp` of them as a ZeRO stage partitions them (model_state_bytes),
    under FSDP plus what it holds unsharded (module docs); split by tp. `param_bytes`: the compute
    dtype (2: bf16 on GPUs; 4 on CPU processes, where the model probe keeps fp32) of ZeRO's weights
    and gradients and of FSDP's gathers."""
    held = stage_params(facts, layout)
    if layout.shard == "ddp" or dp <= 1:
        return STATE_BYTES * held
    w_g = float(param_bytes)
    sharded = model_state_bytes(held, layout.shard, dp, w_g, w_g, STATE_BYTES - 2 * w_g)
    if layout.shard != "fsdp":
        return sharded
    block = facts.block_params / layout.tp
    gathered = param_bytes * (facts.other_params / layout.tp + 2 * block) + FP32 * block
    return sharded + gathered


def layer_bytes(facts: Facts, micro_batch: float, layout: Layout) -> float:
    """Activation bytes one layer keeps for one micro-batch (Korthikanti et al. 2022, section 4 and
    Table 2): s b h x 34 with fused attention, split by t under tensor with sequence parallelism
    (s b h x 34 / t); with full recomputation only the layer's input, 2 s b h (/ t with sequence
    parallelism)."""
    s, h = float(facts.tokens_per_sample or 0), float(facts.shape.width)
    per = RECOMPUTE_INPUT_SBH if layout.checkpointing else KORTHIKANTI_SBH
    return s * micro_batch * h * per / layout.tp


def formula_bytes(facts: Facts, micro_batch: float, layout: Layout, in_flight: int) -> float:
    """Activation bytes per GPU from the formula: the first pipeline stage keeps `in_flight`
    micro-batches (1F1B: min(pp, m), Narayanan et al. 2021, section 2.2.1) of its L / pp layers;
    with recomputation one layer's full activations are rebuilt at a time on top; the logits
    (s V x 6 per sample, split by tp) sit on the last stage, which keeps one micro-batch."""
    s, V = float(facts.tokens_per_sample or 0), float(facts.shape.vocab)
    layers = math.ceil(facts.blocks / layout.pp)
    one = layer_bytes(facts, micro_batch, layout)
    rebuilt = layer_bytes(facts, micro_batch, layout.but(checkpointing=False)) if layout.checkpointing else 0.0
    logits = s * V * LOGIT_BYTES * micro_batch / layout.tp
    first = in_flight * layers * one + rebuilt
    last = layers * one + rebuilt + logits
    return max(first, last) if layout.pp > 1 else first + logits


@dataclass(frozen=True)
class Fit:
    """The fit at one configuration: bytes per GPU (allocated and as reserved), whether it fits.
    `parallel` is the layout's name (ddp, fsdp, tp8-pp16-ddp, ...); `batch` the micro-batch."""

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
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batches: int = 1
    checkpointing: bool = False
    source: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class Memory:
    """The fit model of one workload on one GPU model."""

    def __init__(self, facts: Facts, acts: Activations, capacity: float | None, ratio: float, param_bytes: int):
        self.facts, self.acts, self.capacity, self.ratio, self.param_bytes = facts, acts, capacity, ratio, param_bytes
        self.scale, self.scale_source = self._calibration()

    @property
    def usable(self) -> float | None:
        """What an allocated peak may reach: the device memory less EDGE_HEADROOM (module docs)."""
        return None if self.capacity is None else self.capacity * (1 - EDGE_HEADROOM)

    def _calibration(self) -> tuple[float, str]:
        """The ratio of the measured activations to the formula's at tp = pp = 1 without
        recomputation, which the formula is multiplied by for every other layout (1 where nothing
        was measured or the model has no formula)."""
        f = self.facts
        if f.shape is None or not f.tokens_per_sample or self.acts.per_sample is None or \
                not self.acts.source.startswith("measured"):
            return 1.0, "formula: Korthikanti et al. 2022 (module docs)"
        plain = formula_bytes(f, 1, Layout(), 1)
        k = self.acts.per_sample / plain if plain else 1.0
        return k, (f"formula: Korthikanti et al. 2022 x {k:.3f}, the ratio the measured activations bear to it at "
                   "tp = pp = 1")

    def by_formula(self, layout: Layout) -> bool:
        return not (layout.plain and not layout.checkpointing)

    def activations(self, layout: Layout, batch: int, in_flight: int = 1) -> float | None:
        """Activation bytes per GPU: as measured (or the plain formula) for data parallelism
        without recomputation, else the layout's formula, calibrated."""
        if not self.by_formula(layout):
            return None if self.acts.per_sample is None else self.acts.at(batch)
        if self.facts.shape is None or not self.facts.tokens_per_sample:
            return None  # no formula: layout.check refuses tp, pp and --checkpointing for such a model
        return self.scale * formula_bytes(self.facts, batch, layout, in_flight)

    def fit(self, layout: Layout, n: int, batch: int, micro_batches: int = 1) -> Fit:
        dp = layout.ranks(n) or 1
        st = states(self.facts, layout, dp, self.param_bytes)
        acts = self.activations(layout, batch, min(layout.pp, micro_batches))
        alloc = None if acts is None else st + self.acts.other + acts
        reserved = None if alloc is None else alloc * self.ratio
        fits = None if alloc is None or self.usable is None else alloc <= self.usable
        source = self.scale_source if self.by_formula(layout) else self.acts.source
        return Fit(layout.name, n, batch, st, acts, self.acts.other, alloc, reserved, self.capacity, fits, layout.tp,
                   layout.pp, dp, micro_batches, layout.checkpointing, source)

    def fewest_gpus(self, layout: Layout, batch: int, micro_batches=lambda dp: 1) -> int | None:
        """The fewest GPUs that hold the workload at `batch` per micro-batch: tp x pp or none where
        every replica keeps its states whole (DDP); under a ZeRO stage or FSDP the smallest
        data-parallel count whose shard leaves room. `micro_batches(dp)`: the micro-batches per step
        at dp replicas (0: none fits the global batch). None: it does not fit at any count, or a
        figure is missing."""
        base = layout.model_gpus
        m1 = micro_batches(1) or 1
        f = self.fit(layout, base, batch, m1)
        if f.fits is None:
            return None
        if f.fits:
            return base
        if not layout.sharded:
            return None
        acts = self.activations(layout, batch, min(layout.pp, m1)) or 0.0
        # what no count of ranks takes away: the unpartitioned states (and FSDP's gathered units)
        room = self.usable - (states(self.facts, layout, 1 << 40, self.param_bytes) + self.acts.other + acts)
        if room <= 0:
            return None
        dp = max(2, math.ceil(partitioned_bytes(self.facts, layout, self.param_bytes) / room))
        if dp * base > MAX_GPUS_FIT:
            return None
        while not self.fit(layout, dp * base, batch, micro_batches(dp) or 1).fits:  # rounding at the edge
            dp += 1
        while dp > 2 and self.fit(layout, (dp - 1) * base, batch, micro_batches(dp - 1) or 1).fits:
            dp -= 1
        return dp * base

    def largest_batch(self, layout: Layout, n: int, micro_batches: int = 1) -> int | None:
        """The largest micro-batch that fits on `n` GPUs (0: not even one sample); None where a
        figure is missing."""
        if self.capacity is None:
            return None
        room = self.usable - states(self.facts, layout, layout.ranks(n) or 1, self.param_bytes) - self.acts.other
        if not self.by_formula(layout):
            return None if self.acts.per_sample is None else self.acts.largest(room)
        one = self.activations(layout, 1, min(layout.pp, micro_batches))
        if not one or room <= 0:
            return 0 if one else None
        b = math.floor(room / one)
        while b > 0 and (self.activations(layout, b, min(layout.pp, micro_batches)) or 0) > room:
            b -= 1
        return max(0, b)


def offload(facts: Facts, gpus: int, gpus_per_node: int, param_bytes: int) -> dict:
    """Optimizer states in host memory (ZeRO-Offload, Ren et al. 2021, "ZeRO-Offload:
    Democratizing Billion-Scale Model Training", USENIX ATC 21): the fp32 weights and AdamW's two
    moments (12 B/param) on the hosts, the 16-bit weights and gradients (2 x param_bytes) sharded
    over the GPUs. Bytes per GPU and per node; not timed (the host's optimizer step is not
    measured)."""
    host = HOST_STATE_BYTES * facts.params
    nodes = max(1, -(-gpus // gpus_per_node))
    return {"host_bytes": host, "host_bytes_per_node": host / nodes, "gpu_state_bytes": 2 * param_bytes * facts.params
            / gpus, "nodes": nodes}
