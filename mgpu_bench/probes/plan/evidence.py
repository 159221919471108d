"""What the history measured that a plan uses, read from the stored result documents (a document is
data: no probe's code is imported to read it), each figure with the id of the run it came from.

    model runs    the step time per GPU count and batch (median of the stable window, the slowest
                  rank per step, as the model probe's headline reads it), its noise, the step
                  without gradient sync (the exposed communication), peak memory, device memory
    memory runs   --max-batch: the largest batch and the peak memory of the trials that fit
    comm runs     bus bandwidth per op, rank count and size; within a node, or between nodes (a
                  world communicator of a multi-node run, or one GPU per node: a rail)
    fleet runs    the world allreduce's bus bandwidth across the fleet

Only runs on the plan's device count (a GPU model, or CPU processes), and for model and memory runs
only this workload at this sample size, trained as the plan assumes: synthetic data, no activation
checkpointing, no torch.compile, one micro-batch per step."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from mgpu_bench.metrics import window_steps

from .memory import MemPoint
from .workload import Facts

CPU = "CPU processes"
RUNS_READ = 300  # of each kind, newest first: older runs rarely describe the cluster of today
MIN_NOISE_SAMPLES = 5


def noise(samples) -> float | None:
    """1.4826 x MAD / median of the samples (the history's robust spread), None with fewer than 5."""
    xs = [float(x) for x in samples if x is not None and float(x) > 0]
    if len(xs) < MIN_NOISE_SAMPLES:
        return None
    med = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - med) for x in xs) / med if med else None


@dataclass(frozen=True)
class StepPoint:
    """One configuration of a model run: `world` GPUs at `batch` samples per GPU per step."""

    run: str
    world: int
    batch: int
    parallel: str
    step_s: float
    noise: float | None
    no_sync_s: float | None
    peak_allocated: float | None
    peak_reserved: float | None
    total_memory: float | None
    flops_per_s_per_gpu: float | None

    @property
    def exposed_s(self) -> float | None:
        return None if self.no_sync_s is None else max(0.0, self.step_s - self.no_sync_s)


@dataclass(frozen=True)
class BusPoint:
    """One comm figure: `op` over `ranks` at `size` bytes (nccl-tests' size column), bus bandwidth
    B/s and its noise; scope "node" (one node's ranks), "world" (ranks on several nodes) or
    "rail" (one rank per node)."""

    run: str
    op: str
    dtype: str
    ranks: int
    scope: str
    size: int
    busbw: float
    noise: float | None


@dataclass
class Evidence:
    """Everything the history holds for one plan, newest first in every list."""

    device: str
    device_source: str
    steps: list[StepPoint] = field(default_factory=list)
    memory: list[MemPoint] = field(default_factory=list)
    max_batch: list[tuple[int, str]] = field(default_factory=list)  # (largest batch, run) of memory --max-batch
    bus: list[BusPoint] = field(default_factory=list)
    gpus_per_node: tuple[int, str] | None = None  # (count, where it was read)
    device_memory: tuple[float, str] | None = None  # (bytes, run): a stored run's fingerprint of this device
    flop_rates: list[tuple] = field(default_factory=list)  # (FLOP/s per GPU, FLOPs/sample, key, run, noise): GPT runs

    def one_gpu(self) -> list[StepPoint]:
        return [p for p in self.steps if p.world == 1]


def device_of(doc: Mapping) -> str:
    """The device a stored run ran on: its first GPU's name, or CPU processes."""
    gpus = (doc.get("environment") or {}).get("gpus") or []
    name = doc.get("gpu_name") or (gpus[0].get("name") if gpus and isinstance(gpus[0], Mapping) else None)
    return str(name) if name else CPU


def _documents(history, kind: str) -> list[tuple[str, dict]]:
    """The stored documents of `kind`, newest first, then those of the same kind inside stored
    suites (a suite's model-1gpu, max-batch, comm: "r7 (suite: max-batch)")."""
    out = []
    for info in history.list(limit=RUNS_READ, kind=kind):
        try:
            out.append((info.run_id, history.get(info.run_id).document))
        except ValueError:  # InputError: a stored row that no longer reads (said by `history show`); skipped
            continue
    for info in history.list(limit=RUNS_READ, kind="suite"):
        try:
            suite = history.get(info.run_id).document
        except ValueError:
            continue
        for probe in suite.get("probes") or []:
            doc = probe.get("document")
            if isinstance(doc, dict) and doc.get("kind") == kind:
                out.append((f"{info.run_id} (suite: {probe.get('name')})", doc))
    return out


def newest(history, local_gpu: str | None, key: str) -> tuple[str, str, int | None]:
    """(the device the plan is for, why, the sample size of the newest stored run of this workload
    on it or None): this machine's GPU model where it has GPUs, else the device of the newest
    stored model run of this workload, else of any stored run, else CPU processes."""
    runs = _documents(history, "model")
    mine = [(run_id, doc) for run_id, doc in runs if (doc.get("config") or {}).get("model") == key]
    if local_gpu:
        seq = next(((doc.get("config") or {}).get("seq_len") for _, doc in mine if device_of(doc) == local_gpu), None)
        return local_gpu, "this machine's GPU", seq
    if mine:
        run_id, doc = mine[0]
        return device_of(doc), f"the device of {run_id}, the newest run of {key}", (doc.get("config") or {}).get(
            "seq_len")
    for kind in ("model", "memory", "comm"):
        for run_id, doc in runs if kind == "model" else _documents(history, kind):
            return (_comm_device(doc) if kind == "comm" else device_of(doc)), f"the device of {run_id}", None
    return CPU, "no run stored: this machine's CPU processes", None


def read(history, facts: Facts, device: str, device_source: str) -> Evidence:
    """The plan's evidence from `history` (a mgpu_bench.history.History the runner opened)."""
    ev = Evidence(device, device_source)
    for run_id, doc in _documents(history, "model"):
        if device_of(doc) == device:
            _model(ev, run_id, doc, facts)
    for run_id, doc in _documents(history, "memory"):
        if device_of(doc) == device:
            _memory(ev, run_id, doc, facts)
    for run_id, doc in _documents(history, "comm"):
        if _comm_device(doc) == device:
            _comm(ev, run_id, doc)
    for run_id, doc in _documents(history, "fleet"):
        _fleet(ev, run_id, doc, device)
    return ev


def _host_gpus(ev: Evidence, run_id: str, doc: Mapping) -> None:
    """GPUs per node: the most any stored run's host showed (a run may see only those it was given);
    the device's memory from the newest fingerprint that has it."""
    gpus = (doc.get("environment") or {}).get("gpus") or []
    if gpus and (ev.gpus_per_node is None or len(gpus) > ev.gpus_per_node[0]):
        ev.gpus_per_node = (len(gpus), f"the GPUs of {run_id}'s host, the most any stored run's host showed")
    total = gpus[0].get("total_memory") if gpus and isinstance(gpus[0], Mapping) else None
    if ev.device_memory is None and isinstance(total, (int, float)) and total > 0:
        ev.device_memory = (float(total), run_id)



def _model(ev: Evidence, run_id: str, doc: Mapping, facts: Facts) -> None:
    cfg = doc.get("config") or {}
    same = (cfg.get("model") == facts.key and cfg.get("seq_len") == facts.seq_len
            and cfg.get("image_size") == facts.image_size)
    plain = not cfg.get("checkpointing") and not cfg.get("compile") and int(cfg.get("grad_accum") or 1) == 1
    _host_gpus(ev, run_id, doc)
    for r in doc.get("runs") or []:
        d = r.get("derived") or {}
        if r.get("error") or r.get("data") != "synthetic" or not d.get("step_s") or not plain:
            continue
        world = int(r["world"])
        batch = int(r.get("samples_per_step") or 0) // max(1, world)
        gpt = (doc.get("workload") or {}).get("kind", "gpt") == "gpt"  # before workloads every model run was the GPT
        if gpt and world == 1 and d.get("flops_per_s_per_gpu") and (r.get("flops_per_token") or r.get("flops_per_sample")):
            per_sample = r.get("flops_per_sample") or float(r["flops_per_token"]) * int(cfg.get("seq_len") or 0)
            if per_sample:
                ev.flop_rates.append((float(d["flops_per_s_per_gpu"]), float(per_sample), str(cfg.get("model")),
                                      run_id, noise(window_steps(r))))
        if not same or batch < 1:
            continue
        ev.steps.append(StepPoint(
            run=run_id, world=world, batch=batch, parallel=str(cfg.get("parallel") or "ddp"), step_s=float(d["step_s"]),
            noise=noise(window_steps(r)), no_sync_s=d.get("no_sync_step_s"),
            peak_allocated=d.get("peak_allocated"), peak_reserved=d.get("peak_reserved"),
            total_memory=d.get("total_memory"), flops_per_s_per_gpu=d.get("flops_per_s_per_gpu")))
        if world == 1 and d.get("peak_allocated"):
            ev.memory.append(MemPoint(batch, float(d["peak_allocated"]), run_id))


def _memory(ev: Evidence, run_id: str, doc: Mapping, facts: Facts) -> None:
    _host_gpus(ev, run_id, doc)
    for mb in doc.get("max_batch") or []:
        if (mb.get("model") != facts.key or mb.get("seq_len") != facts.seq_len
                or mb.get("image_size") != facts.image_size or mb.get("checkpointing") or mb.get("error")
                or not mb.get("max_batch")):
            continue
        ev.max_batch.append((int(mb["max_batch"]), run_id))
        trials = [t for t in mb.get("trials") or [] if t.get("ok") and t.get("peak_allocated_bytes")]
        for t in sorted(trials, key=lambda t: -int(t["batch"])):
            ev.memory.append(MemPoint(int(t["batch"]), float(t["peak_allocated_bytes"]), run_id))
        if not trials and mb.get("peak_allocated_bytes"):
            ev.memory.append(MemPoint(int(mb["max_batch"]), float(mb["peak_allocated_bytes"]), run_id))


def _comm_device(doc: Mapping) -> str:
    return CPU if "gloo" in str(doc.get("backend") or "") else device_of(doc)


def _comm(ev: Evidence, run_id: str, doc: Mapping) -> None:
    from mgpu_bench.measurement import CommMeasurement
    from mgpu_bench.ops import busbw_factor

    measurements = [m for m in doc.get("measurements") or [] if m.get("kind", "comm") == "comm"]
    several_nodes = any((m.get("spec") or {}).get("scope", "world") != "world" for m in measurements)
    if not several_nodes:
        _host_gpus(ev, run_id, doc)
    for d in measurements:
        if any(d.get("wrong") or []):
            continue  # a figure with wrong elements measures nothing to plan with
        m = CommMeasurement.from_dict(d)
        s = m.spec
        if not m.time_s > 0:
            continue
        scope = {"world": "world" if several_nodes else "node", "intra-node": "node", "inter-node": "rail"}[s.scope]
        moved = s.bytes * busbw_factor(s.op, s.nranks)
        samples = [moved / x for x in m.per_sample.tolist() if x > 0]
        ev.bus.append(BusPoint(run_id, s.op, s.dtype, s.nranks, scope, int(s.bytes), float(m.busbw), noise(samples)))


def _fleet(ev: Evidence, run_id: str, doc: Mapping, device: str) -> None:
    if doc.get("scope") == "node":
        return
    nodes = doc.get("nodes") or []
    models = {n.get("model") for n in nodes if n.get("model")}
    w = doc.get("world") or {}
    if len(nodes) < 2 or not w.get("busbw") or (models and device not in models):
        return
    size = int((doc.get("config") or {}).get("size") or 0)
    ev.bus.append(BusPoint(run_id, "allreduce", "fp32", int(w.get("ranks") or 0), "world", size, float(w["busbw"]),
                           noise(w.get("samples") or ())))
