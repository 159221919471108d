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
               every block but the last) and reduce-scatters its fp32 gradients. Each collective:
               size x the op's bus factor / busbw at that size (nccl-tests' definitions: bus
               bandwidth is what a ring moves per rank, so it holds across rank counts)
    exposed(N) what the step does not hide of t_comm: the model probe measured, on its widest run,
               exposed = step - step without gradient sync; hidden share f = 1 - exposed / t_comm
               there, and hidden time H = t_comm - exposed. Central: f held, exposed = (1 - f) t_comm(N).
               No multi-GPU model run: nothing hidden assumed, and the range reaches to all hidden.

The range (low, high): the lowest and highest of f held, H held (H scaled by the compute time
where the batch differs) and f from the exposed time plus and less twice its noise (the measuring
run's step spread, in seconds), divided and multiplied by 1 + twice the measured noise (the
robust spread of the step times and of the bus-bandwidth samples, combined in quadrature by their
shares of the step).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from mgpu_bench.ops import busbw_factor

from .evidence import BusPoint, Evidence, StepPoint

MIB = 1 << 20
DDP_FIRST_BUCKET = 1 * MIB  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET = 100 * MIB  # the model probe's bucket_cap_mb=100 (MiB in torch's reducer)
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


def ddp_buckets(tensors: tuple[int, ...], grad_bytes: int = 4) -> list[int]:
    """DDP's bucket sizes in bytes: parameters in reverse registration order, a bucket closed once
    it holds at least its limit (1 MiB for the first, 100 MiB after)."""
    out, current, limit = [], 0, DDP_FIRST_BUCKET
    for n in reversed(tensors):
        current += n * grad_bytes
        if current >= limit:
            out.append(current)
            current, limit = 0, DDP_BUCKET
    if current:
        out.append(current)
    return out


@dataclass(frozen=True)
class Collective:
    """One step's gradient traffic: (op, size in bytes, calls) per kind of call."""

    calls: tuple[tuple[str, int, int], ...]

    def seconds(self, n: int, bw: dict[str, Bandwidth]) -> float:
        if n <= 1:
            return 0.0
        return sum(k * size * busbw_factor(op, n) / bw[op].at(size) for op, size, k in self.calls)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(op for op, _, _ in self.calls))

    def total_bytes(self) -> int:
        return sum(size * k for _, size, k in self.calls)


def collectives(facts, parallel: str, param_bytes: int) -> Collective:
    """The gradient collectives of one step (module docs); param_bytes: FSDP's gather dtype."""
    if parallel != "fsdp":
        sizes: dict[int, int] = {}
        for b in ddp_buckets(facts.tensors):
            sizes[b] = sizes.get(b, 0) + 1
        return Collective(tuple(("allreduce", s, k) for s, k in sizes.items()))
    blocks, block, root = facts.blocks, facts.block_params, facts.other_params
    calls = [("allgather", block * param_bytes, max(0, 2 * blocks - 1)), ("reducescatter", block * 4, blocks)]
    if root:
        calls += [("allgather", root * param_bytes, 1), ("reducescatter", root * 4, 1)]
    return Collective(tuple(c for c in calls if c[1] > 0 and c[2] > 0))


@dataclass(frozen=True)
class Estimate:
    """A step time with its range and where each part came from."""

    gpus: int
    step_s: float
    low_s: float
    high_s: float
    measured: str | None  # the run id where this configuration was measured, else None (projected)
    compute_s: float
    comm_s: float
    exposed_s: float
    noise: float | None


@dataclass(frozen=True)
class Compute:
    """The compute part of a step at the plan's batch: seconds, noise, source."""

    seconds: float
    noise: float | None
    source: str


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


class Projection:
    """step(N) for one workload, batch and parallelism from the evidence."""

    def __init__(self, ev: Evidence, facts, parallel: str, batch: int, compute: Compute, coll: Collective,
                 node_bw: dict[str, Bandwidth], world_bw: dict[str, Bandwidth] | None, gpus_per_node: int):
        self.ev, self.facts, self.parallel, self.batch = ev, facts, parallel, batch
        self.compute, self.coll, self.node_bw, self.world_bw, self.gpn = compute, coll, node_bw, world_bw, gpus_per_node
        self.measured = {p.world: p for p in reversed(ev.steps)
                         if p.world > 1 and p.batch == batch and p.parallel == parallel}  # newest kept
        self.reference = self._reference()

    def bandwidths(self, n: int) -> dict[str, Bandwidth] | None:
        """The busbw figures for a communicator of `n` GPUs: the node's, or between nodes."""
        return self.node_bw if n <= self.gpn else self.world_bw

    def comm_s(self, n: int) -> float | None:
        bw = self.bandwidths(n)
        return None if not bw else self.coll.seconds(n, bw)

    def _reference(self) -> tuple[StepPoint, float] | None:
        """The widest multi-GPU run of this workload with a step without gradient sync, at this
        batch if there is one, and t_comm there: the measured overlap."""
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
        if self.reference is None:
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

    def estimate(self, n: int) -> Estimate | None:
        """step(N) with its range; None where a figure for N's scope is missing."""
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
        compute = self.compute.seconds
        wider = [p for w, p in self.measured.items() if w < n and p.no_sync_s]
        if wider:
            compute = max(wider, key=lambda p: p.world).no_sync_s
        f, (f_lo, f_hi), hidden, _ = self._overlap(NOISE_K)
        central = compute + (1.0 - f) * t
        ends = (central, compute + max(0.0, t - hidden), compute + (1.0 - f_lo) * t, compute + (1.0 - f_hi) * t)
        lo, hi = min(ends), max(ends)  # no overlap measured: f from 0 to 1, all hidden to nothing hidden
        bw = self.bandwidths(n) or {}
        bw_noise = max((b.noise for b in bw.values() if b.noise is not None), default=0.0)
        comp_noise = self.compute.noise or 0.0
        share = (1.0 - f) * t / central
        sigma = math.hypot((1.0 - share) * comp_noise, share * bw_noise)
        low, high = self._widen(lo, hi, sigma)
        return Estimate(n, central, low, high, None, compute, t, (1.0 - f) * t, sigma or None)

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
