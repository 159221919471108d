"""Fit first: the answer to --gpus N (the days) or --days D (the fewest GPUs) for the layout asked,
given only where that layout fits; where it does not, what does instead, each with its days:

    ZeRO-2                      for DDP or ZeRO-1: the optimizer states and gradients partitioned
    full sharding               the same layout with FSDP over the replicas, at the fewest GPUs it needs
    activation checkpointing    the same layout recomputing each layer's activations in the backward
    both                        full sharding and checkpointing
    a smaller micro-batch       the largest that fits
    tensor/pipeline parallelism the fastest tp x pp layout that fits (layout.candidates)
    optimizer states on the host  where nothing fits on the GPUs asked: ZeRO-Offload's memory, not timed

`--parallel search` asks the same search for the layout itself. Days = the budget / (samples per
step x tokens per sample) x step / 86400; samples per step = micro-batch x micro-batches x
data-parallel ranks."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..config import MAX_GPUS
from ..layout import Layout, candidates
from .memory import Memory, offload
from .project import Estimate, Projection

SECONDS_PER_DAY = 86400.0
DEFAULT_MICRO_PER_STAGE = 8  # micro-batches per step per pipeline stage when --global-batch is not given
MAX_INSTEAD = 5


def replica_counts(layout: Layout, gpn: int, limit: int = MAX_GPUS, global_micro: int | None = None) -> list[int]:
    """The GPU counts a plan considers for `layout`: data parallelism alone 1 .. one node, then
    whole nodes (project.counts); with tp x pp > 1 whole replicas, counted the same way; with a
    global batch only replica counts that divide it into whole micro-batches."""
    from .project import counts

    per = layout.model_gpus
    if global_micro is not None:
        ds = [d for d in range(1, min(global_micro, limit // per) + 1) if not global_micro % d]
        return [d * per for d in ds]
    if per == 1:
        return counts(gpn, limit)
    return [d * per for d in counts(max(1, gpn // per) if per < gpn else 1, limit // per)]


class Planner:
    """Fits, steps and days of any layout for one workload, from one Memory and a projection
    factory `make(layout, micro-batch) -> Projection | None` (None: no step time)."""

    def __init__(self, cfg, facts, mem: Memory, make: Callable[[Layout, int], Projection | None], gpn: int,
                 batch: int, host_memory: bool = False):
        """`host_memory`: CPU processes, which have no device memory to fit in (the fit does not
        limit the GPU count; the fit lines say so)."""
        self.cfg, self.facts, self.mem, self._make, self.gpn, self.batch = cfg, facts, mem, make, gpn, batch
        self.host_memory = host_memory
        self._projections: dict[tuple[Layout, int], Projection | None] = {}
        self._fewest: dict[tuple[Layout, int], int | None] = {}

    # -- the parts --------------------------------------------------------------------------------

    def micro_batches(self, layout: Layout, batch: int) -> Callable[[int], int]:
        """Micro-batches per step at dp replicas: --global-batch / (dp x micro-batch) where it
        divides (0 where not), else 1 under data parallelism and 8 x pp with a pipeline."""
        gb = self.cfg.global_batch
        if gb is not None:
            return lambda dp: gb // (dp * batch) if dp and not gb % (dp * batch) else 0
        m = 1 if layout.pp == 1 else DEFAULT_MICRO_PER_STAGE * layout.pp
        return lambda dp: m

    def projection(self, layout: Layout, batch: int) -> Projection | None:
        key = (layout, batch)
        if key not in self._projections:
            self._projections[key] = self._make(layout, batch)
        return self._projections[key]

    def counts(self, layout: Layout, batch: int) -> list[int]:
        gb = self.cfg.global_batch
        if gb is None:
            return replica_counts(layout, self.gpn)
        return [] if gb % batch else replica_counts(layout, self.gpn, MAX_GPUS, gb // batch)

    def fit(self, layout: Layout, n: int, batch: int):
        dp = layout.ranks(n) or 1
        return self.mem.fit(layout, n, batch, self.micro_batches(layout, batch)(dp) or 1)

    def estimate(self, layout: Layout, n: int, batch: int) -> Estimate | None:
        p = self.projection(layout, batch)
        return None if p is None else p.estimate(n)

    def days(self, e: Estimate | None, attr: str = "step_s") -> float | None:
        """The days `e`'s step (or its range's end `attr`) takes over the budget; None where there
        is no budget or the figure is not a finite number."""
        if e is None or not self.cfg.budget:
            return None
        per_sample = (self.facts.tokens_per_sample or 1) if self.cfg.tokens is not None else 1
        d = self.cfg.budget / (e.samples * per_sample) * getattr(e, attr) / SECONDS_PER_DAY
        return d if math.isfinite(d) else None

    def fewest(self, layout: Layout, batch: int) -> int | None:
        """The fewest GPUs where `layout` fits at `batch`, among the counts it takes. Replicated
        states (DDP) fit at every count or none, unless a global batch gives fewer micro-batches in
        flight on more replicas."""
        key = (layout, batch)
        if key not in self._fewest:
            self._fewest[key] = self._find_fewest(layout, batch)
        return self._fewest[key]

    def _find_fewest(self, layout: Layout, batch: int) -> int | None:
        for n in self.counts(layout, batch):
            f = self.fit(layout, n, batch)
            if f.fits is None:
                return n if self.host_memory else None
            if f.fits:
                return n
            if not layout.sharded and self.cfg.global_batch is None:
                return None
        return None

    # -- one layout, one question -----------------------------------------------------------------

    def reach(self, layout: Layout, batch: int, days: float, attr: str = "step_s") -> tuple[int, Estimate] | None:
        """The fewest GPUs (and their estimate) where `layout` fits and trains within `days`."""
        start = self.fewest(layout, batch)
        if start is None:
            return None
        for n in self.counts(layout, batch):
            if n < start:
                continue
            e = self.estimate(layout, n, batch)
            if e is None:
                if self.fit(layout, n, batch).fits and self.projection(layout, batch) is None:
                    return None
                continue
            d = self.days(e, attr)
            if d is not None and d <= days:
                return n, e
        return None

    def option(self, layout: Layout, batch: int) -> dict | None:
        """The question asked of `layout` at `batch`: at --gpus N where it fits there, else at the
        fewest GPUs that hold it; for --days D the fewest GPUs that make it. None: it fits nowhere."""
        cfg = self.cfg
        if cfg.days:
            found = self.reach(layout, batch, cfg.days)
            if found is None:
                return None
            n, e = found
        else:
            n = cfg.gpus if cfg.gpus and layout.ranks(cfg.gpus) and self.fit(layout, cfg.gpus, batch).fits else \
                self.fewest(layout, batch)
            if n is None:
                return None
            e = self.estimate(layout, n, batch)
        f = self.fit(layout, n, batch)
        return {"layout": layout.to_dict(n), "batch": batch, "gpus": n, "days": self.days(e),
                "micro_batches": f.micro_batches, "global_batch": f.micro_batches * batch * (layout.ranks(n) or 1),
                "memory": f.allocated, "step_s": None if e is None else e.step_s,
                "at_asked": bool(cfg.gpus) and n == cfg.gpus}

    def best(self, layouts: list[Layout], batch: int) -> dict | None:
        """The option of `layouts` with the fewest days on the --gpus asked, else with the fewest GPUs
        (--days, or where none fits on the GPUs asked), ties to fewer days and fewer GPUs per
        replica."""
        found = [o for o in (self.option(lay, batch) for lay in layouts) if o is not None]
        if not found:
            return None

        def rank(o: dict) -> tuple:
            days = o["days"] if o["days"] is not None else math.inf
            lay = o["layout"]
            if self.cfg.days or (self.cfg.gpus and not o["at_asked"]):  # the fewest GPUs it takes
                return (not o["at_asked"], o["gpus"], days, lay["tp"] * lay["pp"])
            return (False, days, o["gpus"], lay["tp"] * lay["pp"], lay["checkpointing"])

        return min(found, key=rank)

    # -- what does instead ------------------------------------------------------------------------

    def instead(self, layout: Layout, batch: int) -> list[dict]:
        """What fits where `layout` at `batch` does not (module docs), each with its days."""
        gpt = self.facts.shape is not None and bool(self.facts.tokens_per_sample)
        out: list[dict] = []

        def add(what: str, o: dict | None) -> None:
            if o is not None and not any(x["layout"] == o["layout"] and x["batch"] == o["batch"] for x in out):
                out.append({"what": what, **o})

        if layout.shard in ("ddp", "zero1"):
            add("optimizer states and gradients partitioned (ZeRO-2)", self.option(layout.but(shard="zero2"), batch))
        if layout.shard != "fsdp":
            add("full sharding (FSDP)", self.option(layout.but(shard="fsdp"), batch))
        if gpt and not layout.checkpointing:
            add("activation checkpointing", self.option(layout.but(checkpointing=True), batch))
            if layout.shard != "fsdp":
                add("full sharding and checkpointing", self.option(layout.but(shard="fsdp", checkpointing=True),
                                                                   batch))
        for lay in dict.fromkeys((layout, layout.but(shard="fsdp"))):  # the asked layout first, then sharded
            # the largest micro-batch on the GPUs asked, or where sharding leaves the least of the states
            n = self.cfg.gpus if self.cfg.gpus and not lay.sharded else \
                lay.model_gpus * max(1, MAX_GPUS // lay.model_gpus) if lay.sharded else lay.model_gpus
            smaller = self.mem.largest_batch(lay, n, self.micro_batches(lay, 1)(lay.ranks(n) or 1) or 1)
            if smaller and smaller < batch:
                what = "a smaller micro-batch" + (" with full sharding" if lay.shard != layout.shard else "")
                o = self.option(lay, smaller)
                add(f"{what} ({smaller})", o)
                if o is not None:
                    break
        if gpt:
            model = [c for c in candidates(self.facts, self.gpn) if not c.plain]
            add("tensor and pipeline parallelism", self.best(model, batch))
        out.sort(key=lambda o: (not o["at_asked"], o["days"] if o["days"] is not None else math.inf, o["gpus"])
                 if o["at_asked"] or self.cfg.days else (True, o["gpus"], o["days"] if o["days"] is not None else
                                                         math.inf))
        return out[:MAX_INSTEAD]

    def host_offload(self, n: int, batch: int) -> dict:
        """Optimizer states on the hosts of `n` GPUs (memory.offload) with the activations of data
        parallelism at `batch`, recomputed where they would not fit otherwise."""
        o = offload(self.facts, n, self.gpn, self.mem.param_bytes)
        for ckpt in (False, True):
            lay = Layout(checkpointing=ckpt)
            if ckpt and (self.facts.shape is None or not self.facts.tokens_per_sample):
                break
            acts = self.mem.activations(lay, batch)
            if acts is None or self.mem.usable is None:
                break
            total = o["gpu_state_bytes"] + self.mem.acts.other + acts
            o.update(gpu_bytes=total, checkpointing=ckpt, fits=total <= self.mem.usable, capacity=self.mem.capacity)
            if o["fits"]:
                break
        return {"what": "optimizer states in host memory (ZeRO-Offload)", "gpus": n, "batch": batch, "days": None,
                "layout": Layout(shard="fsdp", checkpointing=bool(o.get("checkpointing"))).to_dict(n), **o,
                "why": "not timed: the host's optimizer step and the PCIe traffic are not measured"}
