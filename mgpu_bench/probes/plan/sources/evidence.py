"""What the history measured that a plan uses, read from the stored result documents (a document is
data: no probe's code is imported to read it), each figure with the id of the run it came from.
The runs are found through the history's index (index.py): only the documents of runs that
measured this workload, the collectives, a fleet or a GEMM ceiling are read, and of those only
the ones whose figures are their GPUs' own (clean.py); the others are named as left out.

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

from mgpu_bench.machine import hardware
from mgpu_bench.results.metrics import slug, window_steps

from ..workload import Facts
from . import clean
from .index import Index

CPU = "CPU processes"
# How many runs the index offers per kind, and how many clean documents of them are read (newest
# first): older runs rarely describe the cluster of today, and the cost stays bounded.
MODEL_RUNS, MODEL_DOCS = 48, 12
GPT_RUNS = 8  # per other GPT size, its newest clean one-GPU run
MEMORY_RUNS, MEMORY_DOCS = 24, 6
COMM_OPS = ("allreduce", "allgather", "reducescatter", "sendrecv")
COMM_RUNS, COMM_DOCS = 24, 8
FLEET_RUNS, FLEET_DOCS = 8, 3
GEMM_RUNS, GEMM_DOCS = 48, 12
NEWEST_ANY = 20
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


@dataclass(frozen=True)
class MemPoint:
    """One measured peak: `batch` samples per GPU, `peak` allocated bytes, from run `run`."""

    batch: int
    peak: float
    run: str


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


def _fingerprint_device(fp: Mapping) -> str:
    gpus = fp.get("gpus") or []
    name = gpus[0].get("name") if gpus and isinstance(gpus[0], Mapping) else None
    return str(name) if name else CPU


def same_device(a: str | None, b: str | None) -> bool:
    """Two device names for one GPU model: equal, or the same model of the hardware database
    (the NVML name of a run and the database's name of --gpu)."""
    if a is None or b is None:
        return False
    if a == b:
        return True
    ga, gb = hardware.find_gpu(a) or _by_name(a), hardware.find_gpu(b) or _by_name(b)
    return ga is not None and gb is not None and ga.key == gb.key


def _by_name(name: str):
    return next((g for g in hardware.load().gpus.values() if g.name == name), None)


class Reader:
    """The documents a plan reads, found through the history's index (index.py), each read once;
    a run whose own document says its figures are not its GPUs' alone (clean.py) is left out and
    named in `left_out` (label -> why)."""

    def __init__(self, history):
        self.history = history
        self.index = Index(history.path)
        self._docs: dict[int, dict | None] = {}
        self.left_out: dict[str, str] = {}
        self.reads = 0

    def close(self) -> None:
        self.index.close()

    def document(self, run: int) -> dict | None:
        if run not in self._docs:
            self.reads += 1
            try:
                self._docs[run] = dict(self.history.get(f"r{run}").document)
            except ValueError:  # InputError: a stored row that no longer reads (said by `history show`); skipped
                self._docs[run] = None
        return self._docs[run]

    def runs(self, prefix: str, limit: int, suffix: str = "") -> list[int]:
        """The newest runs that stored a metric named `prefix`...`suffix`."""
        return self.index.runs([n for n in self.index.names(prefix) if n.endswith(suffix)], limit)

    def documents(self, runs: list[int], kind: str, device: str | None, limit: int) -> list[tuple[str, dict]]:
        """Up to `limit` clean documents of `kind` from `runs` (newest first), on `device` (None:
        any), each labelled with its run ("r7", or "r7 (suite: max-batch)" for a suite's probe)."""
        out: list[tuple[str, dict]] = []
        for run in runs:
            if len(out) >= limit:
                break
            row_kind, fp = self.index.about(run)
            if device is not None and not (kind == "comm" and device == CPU) \
                    and not same_device(_fingerprint_device(fp), device):
                continue  # told by the run's row: its document is not read
            doc = self.document(run)
            if doc is None:
                continue
            for label, sub, beside in _of_kind(run, row_kind, doc, kind):
                if device is not None and not same_device(_comm_device(sub) if kind == "comm" else device_of(sub),
                                                          device):
                    continue
                why = clean.taint(sub, beside) or (_wrong_elements(sub) if kind == "comm" else None)
                if why:
                    self.left_out.setdefault(label, f"{kind}: {why}")
                    continue
                out.append((label, sub))
        return out[:limit]


def _wrong_elements(doc: Mapping) -> str | None:
    """Why a comm run is no evidence: its own figures report wrong elements (the data did not
    arrive intact, so its other figures are not trusted either); None when none do."""
    wrong = 0
    for m in doc.get("measurements") or []:
        counts = m.get("wrong") if isinstance(m, Mapping) else None
        wrong += sum(c for c in counts or [] if isinstance(c, int) and not isinstance(c, bool) and c > 0)
    return f"{wrong:,} wrong element(s) in its figures: the data did not arrive intact" if wrong else None


def _of_kind(run: int, row_kind: str, doc: dict, kind: str) -> list[tuple[str, Mapping, Mapping | None]]:
    """The documents of `kind` in a stored run: the run itself, or the probes of a stored suite."""
    if row_kind == kind:
        return [(f"r{run}", doc, None)]
    if row_kind != "suite":
        return []
    return [(f"r{run} (suite: {p.get('name')})", p["document"], p) for p in doc.get("probes") or []
            if isinstance(p, Mapping) and isinstance(p.get("document"), Mapping) and p["document"].get("kind") == kind]


def newest(reader: Reader, local_gpu: str | None, key: str) -> tuple[str, str, int | None]:
    """(the device the plan is for, why, the sample size of the newest stored run of this workload
    on it or None): this machine's GPU model where it has GPUs, else the device of the newest
    stored model run of this workload, else of the newest stored run, else CPU processes."""
    mine = reader.runs(f"model.{slug(key)}.", MODEL_RUNS)
    if local_gpu:
        found = reader.documents(mine, "model", local_gpu, 1)
        return local_gpu, "this machine's GPU", (found[0][1].get("config") or {}).get("seq_len") if found else None
    found = reader.documents(mine, "model", None, 1)
    if found:
        label, doc = found[0]
        return device_of(doc), f"the device of {label}, the newest run of {key}", (doc.get("config") or {}).get(
            "seq_len")
    for run in reader.index.newest(NEWEST_ANY):
        kind = reader.index.about(run)[0]
        for label, doc in reader.documents([run], kind, None, 1) if kind in ("model", "memory", "comm") else []:
            return (_comm_device(doc) if kind == "comm" else device_of(doc)), f"the device of {label}", None
    return CPU, "no run stored: this machine's CPU processes", None


def read(reader: Reader, facts: Facts, device: str, device_source: str) -> Evidence:
    """The plan's evidence on `device` from the history `reader` reads."""
    ev = Evidence(device, device_source)
    for label, doc in reader.documents(reader.runs(f"model.{slug(facts.key)}.", MODEL_RUNS), "model", device,
                                       MODEL_DOCS):
        _model(ev, label, doc, facts)
    if facts.kind in ("gpt", "bare"):  # the FLOP rate of the nearest GPT, where this one has no step
        for key in _gpt_keys(reader) - {slug(facts.key)}:
            runs = reader.runs(f"model.{key}.", GPT_RUNS, ".1gpu.synthetic.tokens_per_s")
            for label, doc in reader.documents(runs, "model", device, 1):
                _model(ev, label, doc, facts)
    for label, doc in reader.documents(reader.runs(f"memory.{slug(facts.key)}.", MEMORY_RUNS, ".max_batch"), "memory",
                                       device, MEMORY_DOCS):
        _memory(ev, label, doc, facts)
    comm = sorted({r for op in COMM_OPS for r in reader.runs(f"comm.{op}.", COMM_RUNS)}, reverse=True)
    for label, doc in reader.documents(comm, "comm", device, COMM_DOCS):
        _comm(ev, label, doc)
    for label, doc in reader.documents(reader.runs("fleet.world.allreduce_busbw", FLEET_RUNS), "fleet", None,
                                       FLEET_DOCS):
        _fleet(ev, label, doc, device)
    ev.flop_rates.sort(key=lambda r: -_run_number(r[3]))
    return ev


def _gpt_keys(reader: Reader) -> set[str]:
    """The built-in GPTs the history has one-GPU runs of (a workload key without a ':' prefix)."""
    out = set()
    for name in reader.index.names("model."):
        key, _, rest = name[len("model."):].partition(".")
        if ":" not in key and rest.endswith(".1gpu.synthetic.tokens_per_s"):
            out.add(key)
    return out


def ceilings(reader: Reader) -> dict[str, tuple[float, str, str]]:
    """The matmul ceiling measured per GPU model: device name -> (bf16 FLOP/s, the run, the
    device's name as stored), the newest clean `gemm` run's best GPU (headline gemm.gpu{i}.bf16.tflops)."""
    from mgpu_bench.results.probe import headline

    out: dict[str, tuple[float, str, str]] = {}
    runs = reader.runs("gemm.gpu", GEMM_RUNS, ".bf16.tflops")
    for label, doc in reader.documents(runs, "gemm", None, GEMM_DOCS):
        values = [m.value for m in headline(doc) if m.name.startswith("gemm.gpu") and m.name.endswith(".bf16.tflops")]
        device = device_of(doc)
        if values and not any(same_device(device, d) for d in out):
            out[device] = (max(values), label, device)
    return out


def _run_number(label: str) -> int:
    head = label.split(" ", 1)[0]
    return int(head[1:]) if head[1:].isdigit() else 0


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
    from mgpu_bench.results.measurement import CommMeasurement
    from mgpu_bench.results.ops import busbw_factor

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
