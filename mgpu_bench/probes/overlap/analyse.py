"""overlap's figures and verdicts, from the raw per-iteration seconds every rank returned.

The measurement model: per rank and phase, each side ("comm": the allreduce, or on one rank its
stand-in; "gemm") is a list of seconds per iteration, back to back on its own stream, with its
start (seconds after the phase's common start). The together phase runs both; its figures count
only the iterations that ended inside the window where both ran: from the common start to the
end of whichever side finished first.

Derived here, never stored: busbw (nccl-tests: algbw * 2(n-1)/n, through measurement.CommMeasurement),
TFLOP/s (2*M*N*K / seconds), slowdown = seconds per iteration together / alone - 1 ("takes 25%
longer"), its noise, and what it costs a training step.

Noise: the relative standard error of a side's mean, from the means of up to 10 consecutive
chunks of its samples (chunks, not single iterations: under interference consecutive iterations
are correlated); fewer than measurement.MIN_SAMPLES_FOR_NOISE chunks give none. A slowdown's
noise is r * sqrt(se_alone^2 + se_together^2) for the time ratio r; a slowdown counts when it is
above max(2%, 3 x noise).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mgpu_bench.results.measurement import MIN_SAMPLES_FOR_NOISE, CommMeasurement, CommSpec
from mgpu_bench.results.probe import OK, PROBLEM, WARNING, Finding

PHASES = ("comm_alone", "gemm_alone", "together")
PHASE_TITLES = {"comm_alone": "allreduce alone", "gemm_alone": "GEMM alone", "together": "both together"}
MIN_EFFECT = 0.02  # a slowdown below 2% is not reported as one, whatever the noise
NOTABLE = 0.10  # a slowdown from 10% up is a warning: it costs a training step real time
MAX_CHUNKS = 10
HIDDEN_LOW = 0.25  # overlap that hides less than a quarter of the shorter stream: the streams barely overlapped
CONCURRENT_ENOUGH = 0.8  # both sides ran this share of the together phase: they did run at once
EXPOSED_LIMIT = 0.10  # model's healthy limit of exposed communication
NCCL_CTA_VARIABLES = ("NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS",
                      "NCCL_NVLS_ENABLE", "NCCL_ALGO", "NCCL_PROTO", "CUDA_DEVICE_MAX_CONNECTIONS")


@dataclass(frozen=True)
class OverlapConfig:
    """What a run measures. size: bytes per rank allreduced (fp32, in place; a multiple of 4);
    m, n, k: the GEMM (bf16 on GPUs, fp32 on CPU processes); duration_s: each alone phase's
    length, which sizes the together phase too; device: cuda or cpu; progress: rank 0 prints
    its phases."""

    size: int = 4 << 20
    m: int = 512
    n: int = 512
    k: int = 512
    duration_s: float = 1.0
    device: str = "cpu"
    warmup: int = 2
    progress: bool = False
    seed: int = 1234

    @property
    def count(self) -> int:
        return self.size // 4

    @property
    def gemm_dtype(self) -> str:
        return "bf16" if self.device == "cuda" else "fp32"

    @property
    def flops(self) -> float:
        """FLOP of one GEMM: a multiply and an add per term."""
        return 2.0 * self.m * self.n * self.k

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def size_text(self) -> str:
        """The allreduced bytes as nccl-tests users read them ('256 MiB')."""
        from mgpu_bench.results.sizes import format_bytes

        return format_bytes(self.count * 4)


@dataclass
class OverlapRun:
    """A run: its config, every rank's raw result (measure.worker's dict, rank order), the CUDA
    devices chosen (() on CPU processes), the training step it is set beside (model_reference()
    or None), notes, and where it stopped early."""

    config: OverlapConfig
    ranks: list[dict] = field(default_factory=list)
    gpus: tuple[int, ...] = ()
    model_ref: dict | None = None
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None
    stop_message: str | None = None
    wall_seconds: float = 0.0

    @property
    def world(self) -> int:
        return max([int(r.get("world") or 1) for r in self.ranks] or [len(self.gpus) or 1])

    @property
    def on_gpu(self) -> bool:
        return self.config.device == "cuda"

    @property
    def unit(self) -> str:
        return "GPU" if self.on_gpu else "process"

    @property
    def ranks_text(self) -> str:
        """'2 GPUs', '1 process'."""
        return ranks_text(self.world, self.on_gpu)


def ranks_text(n: int, on_gpu: bool) -> str:
    unit = "GPU" if on_gpu else "process"
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s" if on_gpu else f"{n} processes"


# ------------------------------------------------------------------------------------ statistics

def rel_se(samples: Sequence[float]) -> float | None:
    """Relative standard error of the mean of `samples`, from chunk means (module docs); None
    with fewer than MIN_SAMPLES_FOR_NOISE chunks."""
    s = np.asarray(samples, dtype=float)
    k = min(MAX_CHUNKS, s.size)
    if k < MIN_SAMPLES_FOR_NOISE or s.mean() <= 0:
        return None
    means = [c.mean() for c in np.array_split(s, k)]
    return float(np.std(means, ddof=1) / math.sqrt(k) / s.mean())


@dataclass(frozen=True)
class Slowdown:
    """How much longer an iteration takes together than alone: value = together / alone - 1;
    noise: its standard error (None: too few samples to say)."""

    value: float
    noise: float | None

    @property
    def threshold(self) -> float:
        return max(MIN_EFFECT, 3 * self.noise) if self.noise is not None else MIN_EFFECT

    @property
    def significant(self) -> bool:
        return abs(self.value) > self.threshold

    def text(self) -> str:
        """'+25.0% (noise ±0.6%)', or with no noise estimate said so."""
        noise = f"noise ±{100 * self.noise:.1f}%" if self.noise is not None else "no noise estimate"
        return f"{100 * self.value:+.1f}% ({noise})"

    def phrase(self, subject: str) -> str:
        """'each call takes 25.0% longer (noise ±0.6%)', '... takes 3.1% less time (...)', or 'no
        change beyond noise (+0.8%, noise ±0.5%)'."""
        noise = f"noise ±{100 * self.noise:.1f}%" if self.noise is not None else "no noise estimate"
        if not self.significant:
            return f"no change beyond noise ({100 * self.value:+.1f}%, {noise})"
        if self.value > 0:
            return f"{subject} takes {100 * self.value:.1f}% longer ({noise})"
        return f"{subject} takes {100 * -self.value:.1f}% less time ({noise})"


def slowdown(alone_s: float, together_s: float, se_alone: float | None, se_together: float | None) -> Slowdown:
    r = together_s / alone_s
    noise = r * math.hypot(se_alone, se_together) if se_alone is not None and se_together is not None else None
    return Slowdown(r - 1.0, noise)


# ------------------------------------------------------------------------------------ the window

def ends(side: Mapping) -> np.ndarray:
    """Seconds after the phase's start at which each iteration of a side ended."""
    return float(side.get("start_s") or 0.0) + np.cumsum(np.asarray(side.get("seconds") or [], dtype=float))


@dataclass(frozen=True)
class Window:
    """One rank's together phase: both sides ran from `start_s` to `end_s` (the first side to
    finish); `span_s` is when the last finished; comm and gemm are the seconds of the iterations
    that ended inside the window."""

    start_s: float
    end_s: float
    span_s: float
    comm: tuple[float, ...]
    gemm: tuple[float, ...]

    @property
    def share(self) -> float:
        """Fraction of the phase during which both sides ran."""
        return (self.end_s - self.start_s) / self.span_s if self.span_s > 0 else 0.0


def window(phase: Mapping) -> Window | None:
    """The window of a together phase; None when a side is missing or empty."""
    c, g = phase.get("comm") or {}, phase.get("gemm") or {}
    ec, eg = ends(c), ends(g)
    if not ec.size or not eg.size:
        return None
    start = max(float(c.get("start_s") or 0.0), float(g.get("start_s") or 0.0))
    end = min(float(ec[-1]), float(eg[-1]))
    def inside(e: np.ndarray, side: Mapping) -> tuple[float, ...]:
        return tuple(float(x) for x, t in zip(side["seconds"], e, strict=True) if t <= end + 1e-12)

    return Window(start, end, max(float(ec[-1]), float(eg[-1])), inside(ec, c), inside(eg, g))


# ------------------------------------------------------------------------------------ per side

def side_samples(rank: Mapping, phase: str, side: str) -> list[float]:
    """A rank's seconds per iteration of `side` in `phase` (the window's for together)."""
    p = (rank.get("phases") or {}).get(phase)
    if not p:
        return []
    if phase == "together":
        w = window(p)
        return list(getattr(w, side)) if w is not None else []
    return list((p.get(side) or {}).get("seconds") or [])


def comm_measurement(run: OverlapRun, phase: str) -> CommMeasurement | None:
    """The allreduce of `phase` as a CommMeasurement (busbw, median, CoV from measurement.py):
    per sample the slowest rank's seconds, its mean per rank as the burst time; the ranks'
    sample lists cut to the shortest (the window ends differ a little between ranks). None on
    one rank (no allreduce then) or without samples on every rank."""
    if run.world < 2 or len(run.ranks) < run.world:
        return None
    per_rank = [side_samples(r, phase, "comm") for r in run.ranks]
    n = min(len(s) for s in per_rank)
    if n == 0:
        return None
    backend = "torch-nccl" if run.on_gpu else "torch-gloo"
    spec = CommSpec("allreduce", "fp32", "sum", run.config.size, run.config.count * 4, run.config.count,
                    run.world, True, backend, tuple(str(r.get("device")) for r in run.ranks))
    return CommMeasurement(spec, n, 1, tuple(float(np.mean(s)) for s in per_rank),
                           np.asarray([s[:n] for s in per_rank], dtype=float), None)


@dataclass(frozen=True)
class Side:
    """One side of one phase over all ranks: mean seconds per iteration (for the allreduce the
    slowest rank's, as the collective's pace; for the GEMM per rank), rate (busbw in bytes/s, or
    for the one-rank stand-in buffer bytes/s; GEMM: FLOP/s per GPU, the ranks' mean) and the
    relative standard error of the mean."""

    seconds: float
    rate: float
    se: float | None
    samples: int
    per_rank: tuple[float, ...] = ()  # GEMM: FLOP/s of each rank


def comm_side(run: OverlapRun, phase: str) -> Side | None:
    m = comm_measurement(run, phase)
    if m is not None:
        return Side(m.time_s, m.busbw, rel_se(m.per_sample), m.nsamples)
    if run.world >= 2 or not run.ranks:
        return None
    s = side_samples(run.ranks[0], phase, "comm")  # one rank: the local stand-in
    if not s:
        return None
    t = float(np.mean(s))
    return Side(t, run.config.count * 4 / t, rel_se(s), len(s))


def gemm_side(run: OverlapRun, phase: str) -> Side | None:
    per = [side_samples(r, phase, "gemm") for r in run.ranks]
    per = [s for s in per if s]
    if not per:
        return None
    rates = tuple(run.config.flops / float(np.mean(s)) for s in per)
    ses = [rel_se(s) for s in per]
    se = None if any(x is None for x in ses) else math.sqrt(sum(x * x for x in ses)) / len(ses)
    rate = statistics.fmean(rates)
    return Side(run.config.flops / rate, rate, se, sum(len(s) for s in per), rates)


def side_slowdown(alone: Side | None, together: Side | None) -> Slowdown | None:
    if alone is None or together is None:
        return None
    return slowdown(alone.seconds, together.seconds, alone.se, together.se)


@dataclass(frozen=True)
class Analysis:
    comm_alone: Side | None
    comm_together: Side | None
    gemm_alone: Side | None
    gemm_together: Side | None
    comm_slowdown: Slowdown | None
    gemm_slowdown: Slowdown | None
    windows: tuple[Window | None, ...]
    channels: int | None  # NCCL collective channels (one CTA, so one SM, each while a collective runs)
    sm_count: int | None
    hidden: float | None  # share of the shorter stream that running them together hid (1: all)


def analyse(run: OverlapRun) -> Analysis:
    ca, ct = comm_side(run, "comm_alone"), comm_side(run, "together")
    ga, gt = gemm_side(run, "gemm_alone"), gemm_side(run, "together")
    wins = tuple(window((r.get("phases") or {}).get("together") or {}) for r in run.ranks)
    chans = [c for r in run.ranks if (c := (r.get("nccl") or {}).get("coll_channels"))]
    sms = [int(r["sm_count"]) for r in run.ranks if r.get("sm_count")]
    return Analysis(ca, ct, ga, gt, side_slowdown(ca, ct), side_slowdown(ga, gt), wins,
                    max(chans) if chans else None, min(sms) if sms else None, hidden_share(run))


def hidden_share(run: OverlapRun) -> float | None:
    """How much of the shorter stream running both together hid, from rank 0's together phase:
    (the two alone, one after the other - together) / the shorter alone; the alone lengths are
    the together phase's iteration counts at the alone phases' mean seconds. 1: fully hidden,
    0: no faster than one after the other."""
    if not run.ranks:
        return None
    r = run.ranks[0]
    p = (r.get("phases") or {}).get("together") or {}
    w = window(p)
    ca, ga = side_samples(r, "comm_alone", "comm"), side_samples(r, "gemm_alone", "gemm")
    if w is None or not ca or not ga:
        return None
    a = len(p["comm"]["seconds"]) * float(np.mean(ca))
    b = len(p["gemm"]["seconds"]) * float(np.mean(ga))
    if min(a, b) <= 0:
        return None
    return min(1.0, (a + b - w.span_s) / min(a, b))  # above 1: a side ran faster together than alone (noise)


# ------------------------------------------------------------------------------------ NCCL's SMs

_COLL_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels, (\d+) collnet channels, (\d+) nvls channels")
_RING_CHANNEL = re.compile(r"NCCL INFO Channel \d+/(\d+) :\s+\d")


def nccl_channels(log: str) -> dict:
    """What NCCL's INFO log says about the CTAs a collective takes: coll_channels (each channel is
    one CTA, which holds one SM while a ring or tree collective runs), nvls_channels. From the
    "N coll channels, M collnet channels, K nvls channels" line of NCCL 2.1x-2.28 at
    initialisation, else the count in the ring lines "Channel 00/24 : 0 1"; {} when neither."""
    for line in log.splitlines():
        m = _COLL_CHANNELS.search(line)
        if m:
            return {"coll_channels": int(m.group(1)), "nvls_channels": int(m.group(3))}
    for line in log.splitlines():
        m = _RING_CHANNEL.search(line)
        if m:
            return {"coll_channels": int(m.group(1))}
    return {}


# ------------------------------------------------------------------------------------ a training step

def model_reference(doc: Mapping, source: str) -> dict | None:
    """The training step to set the interference beside, from a model result document (or a suite
    document holding model steps): its widest run on 2+ ranks that measured exposed
    communication, synthetic data first. None when it has none."""
    if doc.get("kind") == "suite":
        for p in reversed(doc.get("probes") or []):
            sub = p.get("document") if isinstance(p, Mapping) else None
            if isinstance(sub, Mapping) and sub.get("kind") == "model":
                ref = model_reference(sub, f"{source}, step {p.get('name')}")
                if ref:
                    return ref
        return None
    if doc.get("kind") != "model":
        return None
    cfg = doc.get("config") or {}
    runs = [r for r in doc.get("runs") or [] if int(r.get("world") or 0) >= 2
            and (r.get("derived") or {}).get("exposed_comm_share") is not None
            and (r.get("derived") or {}).get("step_s")]
    if not runs:
        return None
    run = max(runs, key=lambda r: (int(r["world"]), r.get("data") == "synthetic"))
    d = run["derived"]
    return {"source": source, "model": cfg.get("model"), "parallel": cfg.get("parallel"),
            "device": cfg.get("device"), "world": int(run["world"]), "gpu_name": doc.get("gpu_name"),
            "host": (doc.get("environment") or {}).get("host"), "created": doc.get("created"),
            "step_s": float(d["step_s"]), "no_sync_step_s": d.get("no_sync_step_s"),
            "exposed_comm_share": float(d["exposed_comm_share"]),
            "comm_kernel_share": d.get("comm_kernel_share"),
            "comm_exposed_kernel_share": d.get("comm_exposed_kernel_share")}


REFERENCE_KEYS = ("source", "model", "parallel", "world", "step_s", "exposed_comm_share")


def check_reference(ref: Any) -> str | None:
    """Why `ref` (a model_reference() dict from the command line) is unusable, or None."""
    if not isinstance(ref, Mapping):
        return "not a JSON object"
    missing = [k for k in REFERENCE_KEYS if k not in ref]
    if missing:
        return f"lacks {', '.join(missing)}"
    if not all(isinstance(ref[k], (int, float)) and not isinstance(ref[k], bool)
               for k in ("step_s", "exposed_comm_share", "world")):
        return "holds a figure that is not a number"
    try:
        if not (float(ref["step_s"]) > 0 and 0 <= float(ref["exposed_comm_share"]) < 1 and int(ref["world"]) >= 2):
            return "needs step_s > 0, exposed_comm_share in [0, 1) and world >= 2"
    except (TypeError, ValueError):
        return "holds a figure that is not a number"
    return None


def step_cost(ref: Mapping, a: Analysis) -> dict | None:
    """What the interference measured here costs the referenced training step, in seconds:

    exposed_s     = exposed_comm_share x step: what the model measured (step with gradient sync
                    minus without); it contains the interference, as no_sync() runs no NCCL
    overlapped_s  = NCCL time per step with compute beside it: from the model's profile (NCCL
                    kernel share minus NCCL-alone share, x step), else for DDP gradients the fp32
                    gradient bytes (4 per parameter) through the allreduce at the busbw measured
                    here together, all assumed to overlap (an upper bound)
    compute_s     = overlapped_s x g / (1 + g): while NCCL runs beside it the GEMM runs at
                    1 / (1 + g) of its speed (g: GEMM slowdown), so that overlap leaves this much
                    compute to do afterwards
    stretch_s     = overlapped_s x c / (1 + c): how much longer the collectives took for running
                    beside compute (c: allreduce slowdown); it costs step time only where it pushes
                    the last collective past the end of the backward pass
    explained     = compute_s / exposed_s (None when nothing is exposed)."""
    g = a.gemm_slowdown
    if g is None:
        return None
    step = float(ref["step_s"])
    exposed = float(ref["exposed_comm_share"]) * step
    overlapped, how = None, None
    share, alone = ref.get("comm_kernel_share"), ref.get("comm_exposed_kernel_share")
    if share is not None and alone is not None:
        overlapped, how = max(0.0, float(share) - float(alone)) * step, "profile"
    elif ref.get("parallel") == "ddp" and a.comm_together is not None and (params := _params(ref)):
        n = int(ref["world"])
        overlapped = 4.0 * params * 2 * (n - 1) / n / a.comm_together.rate
        how = "estimate"
    if overlapped is None:
        return {"exposed_s": exposed, "step_s": step, "overlapped_s": None, "how": None}
    gv = max(g.value, 0.0)
    cv = max(a.comm_slowdown.value, 0.0) if a.comm_slowdown is not None else None
    compute = overlapped * gv / (1 + gv)
    return {"exposed_s": exposed, "step_s": step, "overlapped_s": overlapped, "how": how, "compute_s": compute,
            "stretch_s": overlapped * cv / (1 + cv) if cv is not None else None,
            "explained": compute / exposed if exposed > 0 else None}


def _params(ref: Mapping) -> int | None:
    """The referenced model's parameter count (models.param_count; imported only here, as it
    brings torch, and only for a model run without a profile)."""
    try:
        from mgpu_bench.workloads import gpt as models

        return models.param_count(models.get_model_spec(str(ref.get("model"))))
    except (ImportError, ValueError):
        return None


def _ms(s: float) -> str:
    return f"{1e3 * s:.1f} ms" if s >= 0.01 else f"{1e3 * s:.2f} ms"


def reference_text(ref: Mapping, a: Analysis, world: int, on_gpu: bool = True) -> tuple[str, str] | None:
    """(severity, the line) that sets the measured interference beside the referenced step."""
    cost = step_cost(ref, a)
    if cost is None:
        return None
    what = (f"model {ref.get('model')} {str(ref.get('parallel') or '').upper()} on {ref['world']} "
            f"{'GPUs' if ref.get('device') != 'cpu' else 'processes'} ({ref['source']})")
    if (ref.get("device") != "cpu") != on_gpu:
        return WARNING, (f"{what} ran on {'GPUs' if ref.get('device') != 'cpu' else 'CPU processes'}, this on "
                         f"{'GPUs' if on_gpu else 'CPU processes'}: the two are not set beside each other")
    if int(ref["world"]) != world:
        what += f", measured at {ref['world']} ranks where this ran {world}"
    head = (f"{what}: exposed communication {100 * ref['exposed_comm_share']:.1f}% of a "
            f"{_ms(cost['step_s'])} step = {_ms(cost['exposed_s'])}")
    if cost["overlapped_s"] is None:
        return OK, head + "; no NCCL time per step to weigh (no profile; FSDP has no gradient-size estimate)"
    src = "NCCL beside compute in its profile" if cost["how"] == "profile" else \
        "NCCL time of its fp32 gradients at the busbw measured together, all assumed to overlap"
    line = (f"{head}; {src}: {_ms(cost['overlapped_s'])} per step, which at the GEMM slowdown measured here "
            f"costs ~{_ms(cost['compute_s'])} of compute")
    ex = cost["explained"]
    severity = WARNING if ref["exposed_comm_share"] > EXPOSED_LIMIT else OK
    if ex is None or cost["exposed_s"] < 0.005 * cost["step_s"]:
        if cost["compute_s"] < 0.005 * cost["step_s"]:
            return severity, line + ": nothing exposed, and no interference to explain"
        return severity, line + ": the model exposes (next to) nothing, so its kernels suffer less than this GEMM"
    if ex >= 0.8:
        verdict = (f"the interference explains it (~{min(ex, 1.0):.0%} of the exposed time)" if ex <= 1.2 else
                   f"interference alone would cost {ex:.1f}x the exposed time: the model's kernels suffer less "
                   "than a square GEMM")
    elif ex >= 0.3:
        verdict = (f"the interference explains about {ex:.0%}; the rest is communication that no compute hides "
                   "(the last gradient buckets after the backward pass)")
    else:
        verdict = (f"the interference explains little ({ex:.0%}): the exposed time is communication that does not "
                   "overlap (the last buckets after the backward pass, or a slow link: see comm, links)")
    return severity, f"{line}: {verdict}"


def translation_text(a: Analysis) -> str | None:
    """How the interference would translate into a training step, without a step to set it beside."""
    g, c = a.gemm_slowdown, a.comm_slowdown
    if g is None:
        return None
    gv = max(g.value, 0.0)
    text = (f"in a training step, every 10 ms of communication that overlaps compute costs ~{10 * gv / (1 + gv):.1f} "
            f"ms of compute (GEMM {100 * g.value:+.1f}% beside it)")
    if c is not None:
        text += f", and a collective needs {100 * c.value:+.1f}% time to stay hidden behind compute"
    return text + ("; give --model-result (a model --json with 2+ GPUs) to set it beside a measured step")


# ------------------------------------------------------------------------------------ findings

def phase_telemetry(run: OverlapRun, phase: str) -> list[Mapping]:
    return [t for r in run.ranks if (t := (r.get("telemetry") or {}).get(phase))]


def _median(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def clock_text(run: OverlapRun) -> str:
    """'; SM clock 1980 -> 1830 MHz (-7.6%), power 690 -> 700 W' between the GEMM alone and
    together, the GPUs' medians; '' without telemetry."""
    alone, together = phase_telemetry(run, "gemm_alone"), phase_telemetry(run, "together")
    if not alone or not together:
        return ""
    out = ""
    a, t = _median([x.get("sm_hz_median") for x in alone]), _median([x.get("sm_hz_median") for x in together])
    if a and t:
        out += f"; SM clock {a / 1e6:.0f} -> {t / 1e6:.0f} MHz ({100 * (t / a - 1):+.1f}%)"
    a, t = _median([x.get("power_w_mean") for x in alone]), _median([x.get("power_w_mean") for x in together])
    if a and t:
        out += f", power {a:.0f} -> {t:.0f} W"
    before = {n for x in alone for n in x.get("limiting") or []}
    new = sorted({n for x in together for n in x.get("limiting") or []} - before)
    if new:
        out += f", together only: {', '.join(new)}"
    return out


def sm_text(a: Analysis) -> str:
    if a.channels is None or not a.sm_count:
        return ""
    return (f"; NCCL's {a.channels} channels hold {a.channels} of {a.sm_count} SMs "
            f"({a.channels / a.sm_count:.0%}) while an allreduce runs")


def _rate(value: float, unit: str) -> str:
    if unit == "FLOP/s":
        return f"{value / 1e12:.1f} TFLOP/s" if value >= 1e11 else f"{value / 1e9:.1f} GFLOP/s"
    return f"{value / 1e9:.1f} GB/s" if value >= 1e10 else f"{value / 1e9:.2f} GB/s"


def findings(run: OverlapRun, shared: Sequence = ()) -> list[Finding]:
    """What the command prints on top: the one-rank caveat, each side's slowdown, how well the
    two overlapped, the training step beside it, clock and power concerns."""
    from mgpu_bench.machine import telemetry

    a = analyse(run)
    out: list[Finding] = []
    c = run.config
    gemm = f"{c.gemm_dtype} {c.shape} GEMM"
    if run.world < 2 and a.gemm_slowdown is not None:
        out.append(Finding(WARNING, f"one {run.unit}: needs 2 GPUs to measure interference (NCCL's allreduce on one "
                                    "rank is a no-op in place); here the GEMM ran beside an elementwise kernel "
                                    f"over the same {c.size_text} (SMs and memory, no link): "
                                    f"{a.gemm_slowdown.phrase('each GEMM')}"))
    if a.comm_slowdown is not None and run.world >= 2:
        s = a.comm_slowdown
        sev = WARNING if s.significant and s.value >= NOTABLE else OK
        out.append(Finding(sev, f"allreduce {c.size_text}: busbw {_rate(a.comm_alone.rate, 'B/s')} alone, "
                                f"{_rate(a.comm_together.rate, 'B/s')} beside the {gemm} stream: "
                                f"{s.phrase('each call')}"))
    if a.gemm_slowdown is not None and run.world >= 2:
        s = a.gemm_slowdown
        sev = WARNING if s.significant and s.value >= NOTABLE else OK
        rates = (f"{gemm}: {_rate(a.gemm_alone.rate, 'FLOP/s')} per {run.unit} alone, "
                 f"{_rate(a.gemm_together.rate, 'FLOP/s')} beside the allreduce stream")
        out.append(Finding(sev, f"{rates}: {s.phrase('each GEMM')}{sm_text(a)}{clock_text(run)}"))
    for i, w in enumerate(a.windows):
        empty = [name for name, got in (("allreduce" if run.world >= 2 else "stand-in", w.comm), ("GEMM", w.gemm))
                 if not got] if w is not None else []
        if empty:
            out.append(Finding(WARNING, f"rank {i}: no {' or '.join(empty)} ended while both sides ran, so the "
                                        "together figures leave it out: the other side finished first (sizes too "
                                        "small to overlap here; raise --size or --shape)"))
    if a.hidden is not None and a.hidden < HIDDEN_LOW:
        sev = PROBLEM if a.hidden < 0.05 and run.on_gpu else WARNING
        why = "" if run.on_gpu else " (CPU processes: both sides share the host's cores)"
        if any((r.get("nccl_env") or {}).get("CUDA_DEVICE_MAX_CONNECTIONS") == "1" for r in run.ranks):
            why = "; CUDA_DEVICE_MAX_CONNECTIONS=1 is set, which queues both streams in one hardware queue"
        hid = f"hid only {a.hidden:.0%} of" if a.hidden >= 0 else "took longer than running one after the other, for"
        w0 = a.windows[0] if a.windows else None
        if w0 is not None and w0.share >= CONCURRENT_ENOUGH:
            # They did run at once: what was not hidden went to the slowdown of each side.
            slow = ", ".join(f"{name} {100 * sd.value:+.1f}%" for name, sd in (
                ("allreduce" if run.world >= 2 else "stand-in", a.comm_slowdown), ("GEMM", a.gemm_slowdown))
                if sd is not None)
            out.append(Finding(sev, f"running both together {hid} the shorter stream (100%: as long as the longer "
                                    f"one alone): they ran at once {w0.share:.0%} of the phase but slowed each other "
                                    f"({slow}), so together saves little over one after the other{why}"))
        else:
            ran = f" (both ran {w0.share:.0%} of the phase)" if w0 is not None else ""
            out.append(Finding(sev, f"running both together {hid} the shorter stream (100%: as long as the longer "
                                    f"one alone): the two barely ran at once{ran}{why}"))
    if run.model_ref and run.world >= 2:
        said = reference_text(run.model_ref, a, run.world, run.on_gpu)
        if said:
            out.append(Finding(*said))
    elif run.world >= 2:
        t = translation_text(a)
        if t:
            out.append(Finding(OK, t))
    for r in run.ranks:
        seen = dict.fromkeys(c for t in (r.get("telemetry") or {}).values() for c in telemetry.concerns(t))
        if seen:
            out.append(Finding(WARNING, f"rank {r.get('rank')} ({r.get('device')}): {', '.join(seen)}"))
    for r in run.ranks:
        if r.get("error"):
            out.append(Finding(PROBLEM, f"rank {r.get('rank')}: {r['error']}"))
    seen: set[str] = set()
    return [f for f in out if not (f.text in seen or seen.add(f.text))]


def key_figure(run: OverlapRun) -> tuple[str, str]:
    a = analyse(run)
    if a.gemm_slowdown is None:
        return "-", "-"
    if run.world < 2:
        return f"GEMM {100 * a.gemm_slowdown.value:+.1f}% beside a local copy", "needs 2 GPUs to measure interference"
    comm = f"allreduce {100 * a.comm_slowdown.value:+.1f}%, " if a.comm_slowdown else ""
    alone = f"{_rate(a.comm_alone.rate, 'B/s')} busbw, " if a.comm_alone else ""
    return (f"{comm}GEMM {100 * a.gemm_slowdown.value:+.1f}% time when overlapped",
            f"alone: {alone}{_rate(a.gemm_alone.rate, 'FLOP/s')}")


def summary(run: OverlapRun) -> dict:
    """The derived figures in base units, written into the document for readers (jq); the code
    always derives them again from the raw seconds."""
    a = analyse(run)

    def side(s: Side | None) -> dict | None:
        return None if s is None else {"seconds": s.seconds, "rate": s.rate, "se": s.se, "samples": s.samples}

    def slow(s: Slowdown | None) -> dict | None:
        return None if s is None else {"value": s.value, "noise": s.noise, "significant": s.significant}

    return {"comm_alone": side(a.comm_alone), "comm_together": side(a.comm_together),
            "gemm_alone": side(a.gemm_alone), "gemm_together": side(a.gemm_together),
            "comm_slowdown": slow(a.comm_slowdown), "gemm_slowdown": slow(a.gemm_slowdown),
            "nccl_channels": a.channels, "sm_count": a.sm_count, "hidden": a.hidden,
            "window_share": [w.share if w else None for w in a.windows],
            "step_cost": step_cost(run.model_ref, a) if run.model_ref else None}
