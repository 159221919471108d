"""How long a step takes on N GPUs: measured where the history has that configuration, else
projected from its parts, each from what was measured.

    step(N) = compute + exposed(N)
    compute    the step on one GPU at the batch (measured; interpolated through two measured
               batches, step = a + c x batch; or scaled from one), or the step without gradient sync
               of the widest measured run at this batch (it holds what several GPUs cost each other)
    t_comm(N)  the gradient collectives of one step at the bus bandwidth measured for N's scope:
               DDP all-reduces the fp32 gradients in its buckets (the model probe's: the first
               1 MiB, then 100 MiB, filled in reverse registration order as torch's reducer fills
               them); FSDP all-gathers each unit's parameters (forward, and again in backward for
               every block but the last) and reduce-scatters its fp32 gradients; ZeRO-1 and ZeRO-2
               reduce-scatter the 16-bit gradients and, after the optimizer step, all-gather the
               updated 16-bit weights, each in DeepSpeed's buckets of 5e8 elements (ZeRO-2 on every
               micro-batch: its gradients are partitioned). Per rank that is DDP's volume for
               ZeRO-1 and ZeRO-2 (a reduce-scatter and an all-gather move what one all-reduce
               moves, 2 Psi elements) and 1.5x it for ZeRO-3 / FSDP (Psi more for the second
               gather; here less the root and the last block, which FSDP2 does not gather again):
               Rajbhandari et al. 2020, section 7. Each collective:
               size x the op's bus factor / busbw at that size (nccl-tests' definitions: bus
               bandwidth is what a ring moves per rank, so it holds across rank counts)
    exposed(N) what the step does not hide of t_comm: the model probe measured, on its widest run,
               exposed = step - step without gradient sync; hidden share f = 1 - exposed / t_comm
               there, and hidden time H = t_comm - exposed. Central: f held, exposed = (1 - f) t_comm(N).
               No multi-GPU model run: nothing hidden assumed, and the range reaches to all hidden.
               ZeRO-1 and ZeRO-2 (the model probe does not train them): their reduce-scatter as
               not hidden (DeepSpeed's overlap_comm is off by default for these stages), the range
               to all hidden; their all-gather after the optimizer step is never hidden.

With tensor (t) and pipeline (p) parallelism, or recomputation, or m > 1 micro-batches a step
(plan/layout.py), over d = N / (t p) data-parallel replicas:

    step(N) = (m + p - 1) x (c / (t p) x r + tp + pp) + exposed(N)
    c          the one-GPU step at the micro-batch (as above), split evenly over the t x p GPUs of
               a replica (the smaller matmuls' lower efficiency is not modelled); r the FLOPs
               factor of recomputation (build._recompute_factor)
    m + p - 1  the slots of a 1F1B pipeline: p - 1 of them its bubble, (p - 1) / m of the work
               (Narayanan et al. 2021, SC21, section 2.2.1)
    tp         per micro-batch, for each layer of a stage, an all-gather and a reduce-scatter of the
               s b h x 2 activation bytes around attention and the MLP, forward, backward and in
               the recomputed forward (sequence parallelism, Korthikanti et al. 2022, 4.2.2), at
               the node's measured busbw of those ops: not overlapped
    pp         per micro-batch a send forward and one backward of s b h x 2 / t bytes (each
               tensor-parallel rank sends its share over its own NIC: the scatter/gather of
               Narayanan et al. section 4.1), at the point-to-point figure between nodes where a
               replica spans nodes, the node's within one
    t_comm(N)  the gradient collectives of the stage's parameters (split by t) over the d replicas,
               between nodes at the share of the node's NICs one group of replicas gets; exposed in
               full after a pipeline's flush (p > 1), else as data parallelism above

--rate or --mfu (Compute.whole_step): the step at every N is the FLOPs of one GPU's share of the
step at the rate given, the bubble and the collectives inside it (assumed, as given).

The range (low, high): the lowest and highest of f held, H held (H scaled by the compute time
where the batch differs) and f from the exposed time plus and less twice its noise (the measuring
run's step spread, in seconds), divided and multiplied by 1 + twice the measured noise (the
robust spread of the step times and of the bus-bandwidth samples, combined in quadrature by their
shares of the step).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from mgpu_bench.results.ops import busbw_factor

from ..layout import ZERO_STAGES
from ..sources.evidence import BusPoint, Evidence, StepPoint

MIB = 1 << 20
DDP_FIRST_BUCKET = 1 * MIB  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET = 100 * MIB  # the model probe's bucket_cap_mb=100 (MiB in torch's reducer)
ZERO_BUCKET = 500_000_000  # elements: DeepSpeed's reduce_bucket_size and allgather_bucket_size defaults (5e8)
NOISE_K = 2.0  # the range's half-width in noise units


@dataclass(frozen=True)
class Bandwidth:
    """Bus bandwidth against size for one op at one scope: measured points (size, B/s), or one
    figure at every size (a fleet pass, a named network)."""

    points: tuple[tuple[int, float], ...]
    source: str
    ranks: int
    noise: float | None = None

    def at(self, size: float) -> float:
        """Interpolated in log size between the measured sizes, held flat beyond them."""
        pts = self.points
        if len(pts) == 1 or size <= pts[0][0]:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1]
        for (s0, b0), (s1, b1) in itertools.pairwise(pts):
            if s0 <= size <= s1:
                t = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
                return b0 + t * (b1 - b0)
        return pts[-1][1]


def bandwidth_from(points: list[BusPoint], op: str, scope: str, ranks_at_most: int | None = None) -> Bandwidth | None:
    """The newest run's figures for `op` at `scope`, from its widest communicator (within
    `ranks_at_most` where given); None when none was stored."""
    mine = [p for p in points if p.op == op and p.scope == scope and (ranks_at_most is None or p.ranks <= ranks_at_most)]
    if not mine:
        return None
    run = mine[0].run  # newest first
    of_run = [p for p in mine if p.run == run]
    ranks = max(p.ranks for p in of_run)
    by_size: dict[int, list[BusPoint]] = {}
    for p in of_run:
        if p.ranks == ranks:
            by_size.setdefault(p.size, []).append(p)
    pts = tuple(sorted((s, max(q.busbw for q in ps)) for s, ps in by_size.items()))  # in- and out-of-place: the faster
    noises = [q.noise for ps in by_size.values() for q in ps if q.noise is not None]
    where = {"node": "within a node", "world": "across nodes", "rail": "one GPU per node"}[scope]
    return Bandwidth(pts, f"{run} ({op}, {ranks} ranks {where})", ranks, max(noises) if noises else None)


def ddp_buckets(tensors: tuple[int, ...], grad_bytes: int = 4, first: int = DDP_FIRST_BUCKET,
                limit: int = DDP_BUCKET) -> list[int]:
    """DDP's bucket sizes in bytes: parameters in reverse registration order, a bucket closed once
    it holds at least its limit (1 MiB for the first, 100 MiB after; or `first` and `limit` bytes,
    ZeRO's buckets)."""
    out, current, cap = [], 0, first
    for n in reversed(tensors):
        current += n * grad_bytes
        if current >= cap:
            out.append(current)
            current, cap = 0, limit
    if current:
        out.append(current)
    return out


Call = tuple[str, int, int]  # (op, size in bytes, calls per step)


@dataclass(frozen=True)
class Collective:
    """One step's gradient traffic: (op, size in bytes, calls) per kind of call; `after` those that
    run after the optimizer step (ZeRO-1 and 2's all-gather of the updated weights), which no
    backward pass hides."""

    calls: tuple[Call, ...]
    after: tuple[Call, ...] = ()

    @staticmethod
    def _seconds(calls, n: int, bw: dict[str, Bandwidth]) -> float:
        if n <= 1:
            return 0.0
        return sum(k * size * busbw_factor(op, n) / bw[op].at(size) for op, size, k in calls)

    def seconds(self, n: int, bw: dict[str, Bandwidth]) -> float:
        return self._seconds((*self.calls, *self.after), n, bw)

    def seconds_after(self, n: int, bw: dict[str, Bandwidth]) -> float:
        """The part of seconds() after the optimizer step: exposed whatever the backward hides."""
        return self._seconds(self.after, n, bw)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(op for op, _, _ in (*self.calls, *self.after)))

    def total_bytes(self) -> int:
        return sum(size * k for _, size, k in (*self.calls, *self.after))

    def volume(self, n: int) -> float:
        """Bytes each of `n` ranks sends per step: size x the op's bus factor (an all-reduce moves
        2 (n - 1) / n of its size, a reduce-scatter or an all-gather (n - 1) / n; nccl-tests)."""
        return sum(k * size * busbw_factor(op, n) for op, size, k in (*self.calls, *self.after))


def _counted(op: str, buckets: list[int], times: int = 1) -> tuple[Call, ...]:
    sizes: dict[int, int] = {}
    for b in buckets:
        sizes[b] = sizes.get(b, 0) + times
    return tuple((op, s, k) for s, k in sizes.items())


def collectives(facts, layout, param_bytes: int, micro_batches: int = 1) -> Collective:
    """The gradient collectives of one step over the data-parallel ranks (module docs), for the
    parameters one GPU holds (a pipeline stage's, split by tp); param_bytes: the compute dtype
    (FSDP's gathers; ZeRO-1 and 2's gradients and weights). FSDP gathers each unit again for every
    micro-batch, ZeRO-2 reduce-scatters every micro-batch's gradients."""
    plain = layout.plain
    if layout.shard != "fsdp":
        tensors = facts.tensors if plain else tuple(
            max(1, x // layout.tp) for x in (*facts.block_tensors * math.ceil(facts.blocks / layout.pp),
                                             facts.other_params) if x)
        if layout.shard in ZERO_STAGES:
            buckets = ddp_buckets(tensors, param_bytes, ZERO_BUCKET * param_bytes, ZERO_BUCKET * param_bytes)
            times = micro_batches if layout.shard == "zero2" else 1
            return Collective(_counted("reducescatter", buckets, times), _counted("allgather", buckets))
        return Collective(_counted("allreduce", ddp_buckets(tensors)))
    blocks = facts.blocks if plain else math.ceil(facts.blocks / layout.pp)
    block, root = facts.block_params // layout.tp, facts.other_params // layout.tp
    calls = [("allgather", block * param_bytes, max(0, 2 * blocks - 1) * micro_batches),
             ("reducescatter", block * 4, blocks)]
    if root:
        calls += [("allgather", root * param_bytes, 1), ("reducescatter", root * 4, 1)]
    return Collective(tuple(c for c in calls if c[1] > 0 and c[2] > 0))


@dataclass(frozen=True)
class Estimate:
    """A step time with its range and where each part came from: compute_s the compute of the
    whole step (every micro-batch, the bubble's idle slots included), comm_s the gradient
    collectives over the data-parallel ranks, exposed_s the part of them not hidden; tp_s, pp_s
    the tensor-parallel collectives and pipeline sends inside compute_s, bubble_s its idle slots."""

    gpus: int
    step_s: float
    low_s: float
    high_s: float
    measured: str | None  # the run id where this configuration was measured, else None (projected)
    compute_s: float
    comm_s: float
    exposed_s: float
    noise: float | None
    samples: int = 1  # samples per optimizer step over all GPUs
    dp: int = 1
    micro_batches: int = 1
    tp_s: float = 0.0
    pp_s: float = 0.0
    bubble_s: float = 0.0
    assumed: bool = False  # the step is a given rate's (--rate, --mfu), not measured or projected from measurements


@dataclass(frozen=True)
class Compute:
    """The compute part of a step at the plan's micro-batch: seconds on one GPU holding the whole
    model, noise, source. `whole_step`: seconds per micro-batch at a given rate over the whole step
    (--rate, --mfu): the step is that at every GPU count, the collectives and bubble inside it;
    `counts_recompute`: that rate counts the recomputation's FLOPs (Megatron-LM's X), else model
    FLOPs only (MFU)."""

    seconds: float
    noise: float | None
    source: str
    whole_step: bool = False
    counts_recompute: bool = True
def compute_time(ev: Evidence, facts, batch: int) -> Compute | None:
    """The one-GPU step at `batch` (module docs), or from the FLOP rate measured for the nearest
    GPT where this workload has no step of its own (GPT-shaped workloads only); None: missing."""
    pts: dict[int, StepPoint] = {}
    for p in ev.one_gpu():
        pts.setdefault(p.batch, p)  # newest per batch
    if batch in pts:
        p = pts[batch]
        return Compute(p.step_s, p.noise, p.run)
    if len(pts) >= 2:
        below = [b for b in pts if b < batch]
        above = [b for b in pts if b > batch]
        if below and above:
            b0, b1 = max(below), min(above)
            how = "interpolated"
        else:
            near = sorted(pts, key=lambda b: abs(math.log(b / batch)))[:2]
            b0, b1 = sorted(near)
            how = "extrapolated"
        p0, p1 = pts[b0], pts[b1]
        slope = (p1.step_s - p0.step_s) / (b1 - b0)
        seconds = p0.step_s + slope * (batch - b0)
        noises = [x for x in (p0.noise, p1.noise) if x is not None]
        if seconds > 0:
            return Compute(seconds, max(noises) if noises else None,
                           f"{how} through batch {b0} ({p0.run}) and {b1} ({p1.run}): a + c x batch")
    if pts:
        b0 = min(pts, key=lambda b: abs(math.log(b / batch)))
        p = pts[b0]
        return Compute(p.step_s * batch / b0, p.noise, f"{p.run} at batch {b0}, scaled by {batch}/{b0}")
    if facts.kind in ("gpt", "bare") and facts.flops_per_sample and ev.flop_rates:
        rate, _, key, run, spread = min(ev.flop_rates, key=lambda r: abs(math.log(r[1] / facts.flops_per_sample)))
        return Compute(batch * facts.flops_per_sample / rate, spread,
                       f"FLOPs per step / the {rate / 1e12:.3g} TFLOP/s per GPU {key} reached ({run}): scaled by FLOPs")
    return None


@dataclass(frozen=True)
class Parts:
    """What a layout adds to data parallelism's step (tp or pp > 1, or recomputation): `recompute`
    the FLOPs factor of recomputation (1 + the layers' forward / the step's), `tp_bw` the node's
    all-gather and reduce-scatter figures (sequence parallelism), `pp_bw` the point-to-point figure
    the pipeline's sends get (between nodes where a replica spans nodes), `micro_batches(dp)` per
    step (0: the global batch does not divide), `layer_bytes` of one layer's activation for one
    micro-batch (s b h x 2 in bf16)."""

    recompute: float = 1.0
    tp_bw: dict | None = None
    pp_bw: Bandwidth | None = None
    micro_batches: Callable[[int], int] = lambda dp: 1
    layer_bytes: float = 0.0


class Projection:
    """step(N) for one workload, micro-batch and layout from the evidence."""

    def __init__(self, ev: Evidence, facts, layout, batch: int, compute: Compute, coll, node_bw: dict[str, Bandwidth],
                 world_bw: dict[str, Bandwidth] | None, gpus_per_node: int, parts: Parts | None = None):
        """coll(micro_batches) -> Collective: the gradient collectives over the data-parallel ranks."""
        self.ev, self.facts, self.layout, self.batch = ev, facts, layout, batch
        self.parallel = layout.shard
        self.compute, self.node_bw, self.world_bw, self.gpn = compute, node_bw, world_bw, gpus_per_node
        self.parts = parts or Parts()
        self._coll = coll
        simple = layout.plain and not layout.checkpointing
        self.measured = {p.world: p for p in reversed(ev.steps)
                         if simple and p.world > 1 and p.batch == batch and p.parallel == self.parallel}  # newest kept
        self.coll = coll(1)
        self.reference = self._reference()

    def micro_batches(self, dp: int) -> int:
        return self.parts.micro_batches(dp)

    def bandwidths(self, n: int) -> dict[str, Bandwidth] | None:
        """The busbw figures for the gradient collectives of `n` GPUs: the node's, or between nodes,
        there the share of the node's NICs one data-parallel group gets (one NIC per GPU: a group
        with k ranks in a node of g GPUs gets k / g of what all of them reach together)."""
        if n <= self.gpn:
            return self.node_bw
        if not self.world_bw:
            return None
        k = max(1, self.gpn // self.layout.model_gpus) if self.layout.model_gpus <= self.gpn else 1
        if k >= self.gpn:
            return self.world_bw
        share = k / self.gpn
        return {op: Bandwidth(tuple((size, b * share) for size, b in bw.points),
                              f"{bw.source} x {k}/{self.gpn} (a data-parallel group's share of the node's NICs)",
                              bw.ranks, bw.noise) for op, bw in self.world_bw.items()}

    def comm_s(self, n: int, micro_batches: int = 1) -> float | None:
        return self._comm(n, micro_batches, after=False)

    def after_s(self, n: int, micro_batches: int = 1) -> float:
        """The part of comm_s after the optimizer step (ZeRO-1 and 2's all-gather): never hidden."""
        return self._comm(n, micro_batches, after=True) or 0.0

    def _comm(self, n: int, micro_batches: int, after: bool) -> float | None:
        dp = self.layout.ranks(n) or 1
        bw = self.bandwidths(n)
        coll = self.coll if micro_batches == 1 else self._coll(micro_batches)
        if dp <= 1:
            return 0.0
        if not bw or any(op not in bw for op in coll.ops):
            return None
        return coll.seconds_after(dp, bw) if after else coll.seconds(dp, bw)

    def exposed(self, t: float, after: float, f: float) -> float:
        """The collectives' seconds a step does not hide when the backward hides the share `f`
        of what it can: all of `after` (what runs after the optimizer step), (1 - f) of the rest."""
        return (1.0 - f) * max(0.0, t - after) + after

    def _reference(self) -> tuple[StepPoint, float] | None:
        """The widest multi-GPU run of this workload with a step without gradient sync, at this
        batch if there is one, and t_comm there: the measured overlap (data parallelism only)."""
        if not self.layout.plain:
            return None
        pts = [p for p in self.ev.steps if p.world > 1 and p.parallel == self.parallel and p.exposed_s is not None
               and p.world <= self.gpn]
        if not pts:
            return None
        best = max(pts, key=lambda p: (p.batch == self.batch, p.world, -abs(math.log(p.batch / self.batch))))
        t = self.comm_s(best.world)
        return (best, t) if t else None

    def overlap(self) -> tuple[float, float, str]:
        """(hidden share f, hidden seconds H at this batch, where they come from)."""
        f, _, hidden, source = self._overlap(0.0)
        return f, hidden, source

    def _overlap(self, k: float) -> tuple[float, tuple[float, float], float, str]:
        """f, (f's lower and upper end: the exposed time plus and less k times its noise, the
        reference step's spread as seconds), H, the source."""
        if self.layout.pp > 1:
            return 0.0, (0.0, 0.0), 0.0, ("a pipeline reduces its gradients after the flush (Narayanan et al. 2021): "
                                          "nothing hidden")
        if self.reference is None:
            if self.layout.shard in ZERO_STAGES:
                return 0.0, (0.0, 1.0), 0.0, (
                    f"{self.layout.shard_words}: no run of it measured (the model probe trains DDP and FSDP): its "
                    "gradient reduce-scatter taken as not hidden (DeepSpeed's overlap_comm is off by default for "
                    "stages 1 and 2), the range reaching to all hidden; its all-gather of the updated weights after "
                    "the optimizer step is never hidden")
            return 0.0, (0.0, 1.0), 0.0, "no multi-GPU model run with exposed communication: nothing hidden assumed"
        p, t = self.reference
        exposed = p.exposed_s or 0.0
        spread = k * (p.noise or 0.0) * p.step_s

        def share(e: float) -> float:
            return min(1.0, max(0.0, 1.0 - e / t))

        hidden = max(0.0, t - exposed)
        one = next((q for q in self.ev.one_gpu() if q.batch == p.batch), None)
        if p.batch != self.batch and one is not None:
            hidden *= self.compute.seconds / one.step_s  # backward time scales with the batch
        return share(exposed), (share(exposed + spread), share(exposed - spread)), hidden, (
            f"{p.run}: {p.world} GPUs at batch {p.batch}, exposed {1e3 * exposed:.3g} ms of a {1e3 * t:.3g} ms "
            "collective")

    def tp_seconds(self) -> float | None:
        """One micro-batch's tensor-parallel collectives on one GPU: per layer of its stage an
        all-gather and a reduce-scatter of s b h x 2 bytes (sequence parallelism, Korthikanti et
        al. 2022, section 4.2.2) before and after attention and the MLP, in the forward and the
        backward pass, and in the recomputed forward: 4 pairs, 6 with recomputation."""
        t = self.layout.tp
        if t <= 1:
            return 0.0
        bw, size = self.parts.tp_bw, self.parts.layer_bytes
        if not bw or "allgather" not in bw or "reducescatter" not in bw:
            return None
        pairs = 6 if self.layout.checkpointing else 4
        one = size * busbw_factor("allgather", t) / bw["allgather"].at(size) + \
            size * busbw_factor("reducescatter", t) / bw["reducescatter"].at(size)
        return math.ceil(self.facts.blocks / self.layout.pp) * pairs * one

    def pp_seconds(self) -> float | None:
        """One micro-batch's pipeline sends on one GPU: its activation forward and its gradient
        backward, s b h x 2 / tp bytes each (the scatter/gather of Narayanan et al. 2021, section
        4.1: each tensor-parallel rank sends its 1/tp over its own NIC)."""
        if self.layout.pp <= 1:
            return 0.0
        bw = self.parts.pp_bw
        if bw is None:
            return None
        size = self.parts.layer_bytes / self.layout.tp
        return 2 * size / bw.at(size)

    def estimate(self, n: int) -> Estimate | None:
        """step(N) with its range; None where N does not take the layout, the global batch does
        not divide, or a figure for N's scope is missing."""
        lay, c = self.layout, self.compute
        dp = lay.ranks(n)
        m = self.micro_batches(dp) if dp else 0
        if not dp or not m:
            return None
        samples = m * self.batch * dp
        if c.whole_step:
            factor = self.parts.recompute if (lay.checkpointing and c.counts_recompute) else 1.0
            s = m * c.seconds * factor / lay.model_gpus
            return Estimate(n, s, s, s, None, s, 0.0, 0.0, None, samples, dp, m, assumed=True)
        if lay.plain and not lay.checkpointing and m == 1:
            e = self._data_parallel(n)
            return None if e is None else replace(e, samples=samples, dp=dp)
        return self._layout(n, dp, m, samples)

    def _layout(self, n: int, dp: int, m: int, samples: int) -> Estimate | None:
        lay, c = self.layout, self.compute
        tp_s, pp_s = self.tp_seconds(), self.pp_seconds()
        t = self.comm_s(n, m)
        if tp_s is None or pp_s is None or t is None:
            return None
        ta = self.after_s(n, m)
        work = c.seconds * (self.parts.recompute if lay.checkpointing else 1.0) / lay.model_gpus
        slots = m + lay.pp - 1  # (m + p - 1) slots of one micro-batch each: p - 1 of them the bubble
        compute = slots * (work + tp_s + pp_s)
        f, (f_lo, f_hi), hidden, _ = self._overlap(NOISE_K)  # the last micro-batch's backward hides it
        exposed = self.exposed(t, ta, f)
        central = compute + exposed
        ends = (central, compute + max(ta, t - hidden), compute + self.exposed(t, ta, f_lo),
                compute + self.exposed(t, ta, f_hi))
        lo, hi = min(ends), max(ends)
        bw = self.bandwidths(n) or {}
        bw_noise = max((b.noise for b in bw.values() if b.noise is not None), default=0.0)
        share = (exposed + slots * (tp_s + pp_s)) / central if central else 0.0
        sigma = math.hypot((1.0 - share) * (c.noise or 0.0), share * bw_noise)
        low, high = self._widen(lo, hi, sigma)
        return Estimate(n, central, low, high, None, compute, t, exposed, sigma or None, samples, dp, m,
                        slots * tp_s, slots * pp_s, (lay.pp - 1) * (work + tp_s + pp_s))

    def _data_parallel(self, n: int) -> Estimate | None:
        """step(N) of data parallelism at one micro-batch per step: measured where it was, else the
        compute and the exposed collectives."""
        if n == 1:
            c = self.compute
            return Estimate(1, c.seconds, *self._widen(c.seconds, c.seconds, c.noise), c.source if _is_run(c.source)
                            else None, c.seconds, 0.0, 0.0, c.noise)
        if n in self.measured:
            p = self.measured[n]
            return Estimate(n, p.step_s, *self._widen(p.step_s, p.step_s, p.noise), p.run, p.no_sync_s or p.step_s,
                            self.comm_s(n) or 0.0, p.exposed_s or 0.0, p.noise)
        t = self.comm_s(n)
        if t is None:
            return None
        ta = self.after_s(n)
        compute = self.compute.seconds
        wider = [p for w, p in self.measured.items() if w < n and p.no_sync_s]
        if wider:
            compute = max(wider, key=lambda p: p.world).no_sync_s
        f, (f_lo, f_hi), hidden, _ = self._overlap(NOISE_K)
        exposed = self.exposed(t, ta, f)
        central = compute + exposed
        ends = (central, compute + max(ta, t - hidden), compute + self.exposed(t, ta, f_lo),
                compute + self.exposed(t, ta, f_hi))
        lo, hi = min(ends), max(ends)  # no overlap measured: f from 0 to 1, all hidden to nothing hidden
        bw = self.bandwidths(n) or {}
        bw_noise = max((b.noise for b in bw.values() if b.noise is not None), default=0.0)
        comp_noise = self.compute.noise or 0.0
        share = exposed / central
        sigma = math.hypot((1.0 - share) * comp_noise, share * bw_noise)
        low, high = self._widen(lo, hi, sigma)
        return Estimate(n, central, low, high, None, compute, t, exposed, sigma or None)

    @staticmethod
    def _widen(lo: float, hi: float, sigma: float | None) -> tuple[float, float]:
        """lo / (1 + k sigma), hi x (1 + k sigma): symmetric in ratio, never below zero."""
        s = 1.0 + NOISE_K * (sigma or 0.0)
        return lo / s, hi * s


def _is_run(source: str) -> bool:
    """A run id ("r12") or a suite's probe ("r12 (suite: model-1gpu)"), not a formula or a range."""
    head = source.split(" (suite: ", 1)[0]
    return head.startswith("r") and head[1:].isdigit()


def counts(gpn: int, limit: int) -> list[int]:
    """The GPU counts a plan considers: 1 .. one node, then whole nodes, up to `limit`."""
    out = list(range(1, min(gpn, limit) + 1))
    k = 2
    while k * gpn <= limit:
        out.append(k * gpn)
        k += 1 if k < 16 else max(1, k // 8)
    return out


def curve_counts(gpn: int, top: int) -> list[int]:
    """Powers of two up to `top`, with one node's count and `top` itself: the curve's points."""
    out, k = [], 1
    while k < top:
        out.append(k)
        k *= 2
    return sorted({*out, min(gpn, top), top})
