"""The GEMM compute probe: achievable TFLOP/s per GPU and dtype with cuBLASLt's best algorithm.

The native probe (``_native.GemmProbe``) times every candidate algorithm of cuBLASLt's heuristic
and checks each one's output on a sample against an fp64 reference; this module plans the runs,
drives all GPUs at once (one thread per GPU, the GIL released while a GPU works) or one at a
time, samples clocks, power, temperature and throttle reasons through NVML beside them, and turns
raw seconds into TFLOP/s, % of the datasheet peak, outliers and findings.

FLOPs of one GEMM: 2 * M * N * K (a multiply and an add per term), whatever the dtype.
"""

from __future__ import annotations

import gc
import itertools
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgpu_bench.core.errors import InputError, defer_sigterm
from mgpu_bench.machine import hardware
from mgpu_bench.machine.per_gpu import Stopped, faults_end_the_run, on_gpus

from .shape import GEMM_DTYPES, INITS, LAYOUTS, MAX_DIM  # the document's names and bounds, defined once there

_ALIASES = {"float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32",
            "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "fp8_e4m3": "fp8", "e4m3": "fp8",
            "float8": "fp8"}
# The datasheet figure each dtype is measured against: DGEMM runs on the fp64 tensor cores.
PEAK_KEY = {"fp64": "fp64_tensor", "fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16",
            "fp8": "fp8"}
# Largest error accepted on the checked sample, relative to max(|ref|, sqrt(sum (A B)^2)) (see the
# probe's check kernel): a few times the output type's half ulp (D is stored in the input type;
# bf16 for fp8) plus accumulation error; a wrong element scores about 1.
TOLERANCE = {"fp64": 1e-11, "fp32": 1e-4, "tf32": 5e-3, "fp16": 2e-3, "bf16": 1e-2, "fp8": 1e-2}
FP8_FAST_ACCUM_TOLERANCE = 5e-2
ELEMENT_BYTES = {"fp64": (8, 8), "fp32": (4, 4), "tf32": (4, 4), "fp16": (2, 2), "bf16": (2, 2),
                 "fp8": (1, 2)}  # (inputs, output)
FP8_MIN_CC = (8, 9)  # Ada and Hopper: the first with fp8 tensor cores
DEFAULT_WORKSPACE = 32 << 20  # cuBLAS's recommendation for Hopper


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


# ------------------------------------------------------------------------------------ parsing

def parse_dtypes(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for part in text.split(","):
        name = part.strip().lower().replace("-", "_")
        if not name:
            continue
        name = _ALIASES.get(name, name)
        if name not in GEMM_DTYPES:
            hint = " (fp8 means e4m3 inputs; e5m2 is not offered)" if "e5m2" in name else ""
            raise InputError(f"unknown --dtype '{part.strip()}'{hint}: choose from {', '.join(GEMM_DTYPES)}")
        if name not in out:
            out.append(name)
    if not out:
        raise InputError(f"--dtype is empty: choose from {', '.join(GEMM_DTYPES)}")
    return tuple(out)


def _dim(text: str, what: str) -> int:
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1024, t[:-1]
    try:
        v = int(t) * mult
    except ValueError:
        raise InputError(f"{what} '{text.strip()}' is not a whole number: write e.g. 8192 or 8k") from None
    if v <= 0:
        raise InputError(f"{what} '{text.strip()}' must be positive: every GEMM dimension is at least 1")
    if v > MAX_DIM:
        raise InputError(f"{what} '{text.strip()}' is larger than {MAX_DIM}: choose a smaller dimension")
    return v


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """'8192' (square) or 'MxNxK', comma-separated; '8k' = 8192."""
    out: list[Shape] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        dims = re.split(r"[x*]", part.lower())
        if len(dims) == 1:
            d = _dim(dims[0], "--shape")
            shape = Shape(d, d, d)
        elif len(dims) == 3:
            shape = Shape(*(_dim(x, "--shape dimension") for x in dims))
        else:
            raise InputError(f"--shape '{part}' is neither N (square) nor MxNxK: write e.g. 8192 or 4096x8192x1024")
        if shape not in out:
            out.append(shape)
    if not out:
        raise InputError("--shape is empty: write e.g. 8192 or 4096x8192x1024")
    return tuple(out)


def parse_range(text: str) -> tuple[int, ...]:
    """'START:STOP:STEP' (STOP included when on the grid) -> the dimensions of a --search grid."""
    parts = text.split(":")
    if len(parts) != 3:
        raise InputError(f"--search-range '{text}' must be START:STOP:STEP, e.g. 2048:16384:2048")
    start, stop, step = (_dim(p, "--search-range value") for p in parts)
    if stop < start:
        raise InputError(f"--search-range '{text}': STOP is below START")
    values = tuple(range(start, stop + 1, step))
    if len(values) > 64:
        raise InputError(f"--search-range '{text}' gives {len(values)} values per dimension "
                         f"({len(values) ** 3} shapes): use a larger STEP (at most 64 values)")
    return values


def parse_layout(text: str) -> str:
    t = text.strip().upper()
    if t != "AUTO" and t not in LAYOUTS:
        raise InputError(f"unknown --layout '{text}': choose auto, {', '.join(LAYOUTS)}")
    return t.lower() if t == "AUTO" else t


def layout_for(dtype: str, layout: str) -> str:
    """'auto': NN (what torch.matmul runs on row-major tensors) and TN for fp8, which cuBLASLt
    supports only with A transposed and B not (in its column-major terms)."""
    if layout == "auto":
        return "TN" if dtype == "fp8" else "NN"
    if dtype == "fp8" and layout != "TN":
        raise InputError(f"fp8 GEMMs run only as --layout TN in cuBLASLt, not {layout}: use --layout TN or auto")
    return layout


def operand_bytes(dtype: str, shape: Shape) -> int:
    """Bytes of A, B and D for one GEMM (the probe keeps at least one set of each)."""
    ins, outs = ELEMENT_BYTES[dtype]
    return (shape.m * shape.k + shape.k * shape.n) * ins + shape.m * shape.n * outs


# ------------------------------------------------------------------------------------ results

@dataclass
class Candidate:
    """One algorithm the heuristic proposed, as the native probe measured it."""

    index: int
    identity: dict[str, Any]
    seconds: list[float]
    iters_per_sample: int
    max_error: float | None
    error: str | None

    @classmethod
    def from_native(cls, d: Mapping[str, Any]) -> Candidate:
        ident = {k: d[k] for k in ("algo_id", "tile", "stages", "split_k", "reduction", "swizzle",
                                   "custom", "cluster", "workspace", "waves")}
        return cls(d["index"], ident, list(d["seconds"]), d["iters_per_sample"], d["max_error"], d["error"])

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def name(self) -> str:
        i = self.identity
        text = f"#{self.index} algo {i['algo_id']} tile {i['tile']} stages {i['stages']}"
        if i["split_k"] and i["split_k"] > 1:
            text += f" splitK {i['split_k']}"
        if i["cluster"]:
            text += f" cluster {i['cluster']}"
        return text

    def to_dict(self) -> dict:
        return {"index": self.index, **self.identity, "seconds": self.seconds,
                "iters_per_sample": self.iters_per_sample, "max_error": self.max_error, "error": self.error}


@dataclass
class GemmResult:
    """One GPU, one dtype, one shape: every candidate, the best one, the telemetry beside it."""

    gpu: int
    gpu_name: str
    dtype: str
    shape: Shape
    layout: str
    candidates: list[Candidate]
    buffer_sets: int
    checked_elements: int
    seconds_wall: float  # the whole measurement, algorithm selection included
    peak: hardware.Figure | None
    telemetry: dict | None = None
    series: list[tuple[float, float]] | None = None  # sustained: (t from start, seconds per GEMM)
    series_telemetry: dict | None = None
    phase: str = "shape"  # "shape", "search" (coarse pass) or "search-best"
    fast_accum: bool = False  # fp8 with cuBLASLt's fast accumulation (no periodic fp32 promotion)

    @property
    def tolerance(self) -> float:
        # Fast accumulation keeps partial sums at tensor-core precision: its error grows like
        # sqrt(K) against the result's size, so it gets a wider bound than the promoted default.
        return FP8_FAST_ACCUM_TOLERANCE if self.fast_accum else TOLERANCE[self.dtype]

    @property
    def wrong(self) -> list[Candidate]:
        return [c for c in self.candidates if c.max_error is not None and not c.max_error <= self.tolerance]

    @property
    def best(self) -> Candidate | None:
        ok = [c for c in self.candidates if c.seconds and c not in self.wrong]
        return min(ok, key=lambda c: c.median_s) if ok else None  # type: ignore[arg-type,return-value]

    @property
    def heuristic_first(self) -> Candidate | None:
        """The heuristic's own pick (index 0), when it ran and its results were right."""
        return next((c for c in self.candidates if c.index == 0 and c.seconds and c not in self.wrong), None)

    @property
    def tflops(self) -> float | None:
        b = self.best
        return self.shape.flops / b.median_s / 1e12 if b and b.median_s else None

    @property
    def flops_per_s(self) -> float | None:
        b = self.best
        return self.shape.flops / b.median_s if b and b.median_s else None

    @property
    def pct_peak(self) -> float | None:
        f = self.flops_per_s
        return 100.0 * f / self.peak.value if f and self.peak and self.peak.value else None

    @property
    def noise(self) -> float | None:
        """Relative standard deviation of the best candidate's bursts; None under 5 bursts."""
        b = self.best
        if not b or len(b.seconds) < 5:
            return None
        return statistics.stdev(b.seconds) / statistics.mean(b.seconds)

    def to_dict(self) -> dict:
        b = self.best
        return {
            "gpu": self.gpu, "gpu_name": self.gpu_name, "dtype": self.dtype, "phase": self.phase,
            "m": self.shape.m, "n": self.shape.n, "k": self.shape.k, "layout": self.layout,
            "flops": self.shape.flops, "flops_per_s": self.flops_per_s, "pct_peak": self.pct_peak,
            "peak": _figure(self.peak), "best": b.index if b else None, "best_name": b.name() if b else None,
            "noise": self.noise, "tolerance": self.tolerance, "buffer_sets": self.buffer_sets,
            "checked_elements": self.checked_elements, "seconds_wall": self.seconds_wall,
            "telemetry": self.telemetry, "candidates": [c.to_dict() for c in self.candidates],
            "series": None if self.series is None else [{"t": t, "seconds": s} for t, s in self.series],
            "series_telemetry": self.series_telemetry,
        }


def _figure(f: hardware.Figure | None) -> dict | None:
    if f is None:
        return None
    return {"value": f.value, "unit": f.unit, "source": f.source, "note": f.note}


@dataclass(frozen=True)
class GemmConfig:
    dtypes: tuple[str, ...] = ("bf16",)
    shapes: tuple[Shape, ...] = (Shape(8192, 8192, 8192),)
    layout: str = "auto"
    gpus: tuple[int, ...] = (0,)
    candidates: int = 8
    samples: int = 5
    sample_s: float = 0.02
    warmup: int = 3
    check: bool = True
    one_at_a_time: bool = False
    search: tuple[int, ...] | None = None  # grid values for M, N and K
    search_refine: int = 4  # best shapes of the coarse pass measured again in full
    duration_s: float = 0.0
    interval_s: float = 0.5
    workspace: int = DEFAULT_WORKSPACE
    peak_overrides: Mapping[str, float] = field(default_factory=dict)
    fp8_fast_accum: bool = False
    init: str = "uniform"  # a key of INITS
    seed: int = 20261129


@dataclass
class GemmRun:
    config: GemmConfig
    devices: list[dict]
    results: list[GemmResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    telemetry_error: str | None = None
    stopped: str | None = None  # "interrupted", "failed"
    stop_message: str | None = None
    wall_seconds: float = 0.0

    def measured(self, phase: str | None = None) -> list[GemmResult]:
        return [r for r in self.results if phase is None or r.phase == phase]


# ------------------------------------------------------------------------------------ checks

def devices_or_error(spec: str | None) -> tuple[list[int], list[dict]]:
    from mgpu_bench.machine.selection import require_gpus

    return require_gpus("gemm", spec)


def validate(cfg: GemmConfig, devices: Sequence[Mapping[str, Any]], free_bytes: Mapping[int, int]) -> None:
    """Bad requests become InputError before any GPU work: fp8 on a GPU without fp8 tensor
    cores, a shape whose operands do not fit in free memory."""
    for dev in devices:
        cc = tuple(dev["compute_capability"])
        if "fp8" in cfg.dtypes and cc < FP8_MIN_CC:
            raise InputError(f"fp8 needs fp8 tensor cores (compute capability 8.9 or later); GPU {dev['index']} "
                             f"({dev['name']}) is {cc[0]}.{cc[1]}: drop fp8 from --dtype")
    # The probe sizes its buffers for the largest M, N and K over all shapes (see _largest), and
    # fp8 keeps a separate C; 4x L2 per buffer at least, which is small beside these.
    shapes = [_largest(cfg)] if (cfg.shapes or cfg.search) else []
    for dtype in cfg.dtypes:
        for shape in shapes:
            need = operand_bytes(dtype, shape) + cfg.workspace
            if dtype == "fp8":
                need += shape.m * shape.n * ELEMENT_BYTES["fp8"][1]
            for dev in devices:
                free = free_bytes.get(dev["index"])
                if free is not None and need > 0.9 * free:
                    raise InputError(
                        f"{dtype} {shape} needs {need / 2**30:.1f} GiB for A, B and D on GPU {dev['index']}, "
                        f"which has {free / 2**30:.1f} GiB free: choose a smaller --shape")


def peak_for(device_name: str, dtype: str, overrides: Mapping[str, float]) -> hardware.Figure | None:
    """The dense peak a GEMM of ``dtype`` is measured against (a user's --peak wins); None for
    a GPU not in the database, never another model's figure."""
    key = PEAK_KEY[dtype]
    over: dict[str, float] = {}
    for name, value in overrides.items():
        given = hardware.peak_dtype(name)
        if given == key or (dtype == "fp64" and given == "fp64"):
            over[key] = value
    return hardware.peak_flops(device_name, key, over)


# ------------------------------------------------------------------------------------ running

def run_gemm(cfg: GemmConfig, devices: list[dict], progress: Callable[[str], None] | None = None,
             telemetry_factory: Callable[..., Any] | None = None) -> GemmRun:
    """Measures every (dtype, shape) on every GPU; Ctrl-C stops at the next burst and keeps the
    results gathered so far (run.stopped = 'interrupted')."""
    from mgpu_bench import _native
    from mgpu_bench.machine import telemetry

    run = GemmRun(cfg, list(devices))
    t_start = time.monotonic()
    bus_ids = {d["index"]: d["pci_bus_id"] for d in devices}
    sampler_cls = telemetry_factory or telemetry.Sampler
    probes: dict[int, Any] = {}
    with sampler_cls(bus_ids, interval_s=0.1) as sampler:
        run.telemetry_error = sampler.error
        try:
            with faults_end_the_run(run, probes, "the results gathered so far are kept"):
                for dtype in cfg.dtypes:
                    layout = layout_for(dtype, cfg.layout)
                    largest = _largest(cfg)
                    probes.clear()

                    def make(dev: dict, dtype=dtype, layout=layout, largest=largest) -> None:
                        probes[dev["index"]] = _native.GemmProbe(
                            dev["index"], dtype, layout, largest.m, largest.n, largest.k, cfg.workspace,
                            cfg.seed, cfg.fp8_fast_accum, INITS[cfg.init])

                    on_gpus(devices, make, probes, cfg.one_at_a_time)
                    if progress:
                        progress(f"{dtype}: probes ready")
                    shapes = list(cfg.shapes)
                    if cfg.search:
                        shapes = _search(cfg, run, devices, probes, dtype, layout, sampler, progress)
                    for shape in shapes:
                        if progress:
                            progress(f"{dtype} {shape}")
                        phase = "search-best" if cfg.search else "shape"
                        _measure_all(cfg, run, devices, probes, dtype, layout, shape, sampler, phase,
                                     cfg.candidates, cfg.samples, cfg.sample_s, cfg.warmup, cfg.check)
                    if cfg.duration_s > 0:
                        if progress:
                            progress(f"{dtype}: sustained {cfg.duration_s:g} s")
                        _sustain_all(cfg, run, devices, probes, dtype, sampler)
                    if dtype == cfg.dtypes[-1]:  # measured: a stop signal now waits while the GPU memory is freed
                        defer_sigterm()
                    probes.clear()
        finally:
            # Free the GPU memory now: a stopped worker's traceback can hold a probe in a
            # reference cycle, and a probe freed at interpreter exit outlives the CUDA runtime.
            probes.clear()
            gc.collect()
    run.wall_seconds = time.monotonic() - t_start
    return run


def _largest(cfg: GemmConfig) -> Shape:
    shapes = list(cfg.shapes)
    if cfg.search:
        top = max(cfg.search)
        shapes.append(Shape(top, top, top))
    return Shape(max(s.m for s in shapes), max(s.n for s in shapes), max(s.k for s in shapes))




def _measure_all(cfg, run, devices, probes, dtype, layout, shape, sampler, phase, candidates, samples,
                 sample_s, warmup, check) -> list[GemmResult]:
    def one(dev: dict) -> GemmResult:
        probe = probes[dev["index"]]
        t0 = time.monotonic()
        raw = probe.measure(shape.m, shape.n, shape.k, candidates, samples, sample_s, warmup, check)
        t1 = time.monotonic()
        if probe.stopped:
            raise Stopped()
        return GemmResult(
            gpu=dev["index"], gpu_name=dev["name"], dtype=dtype, shape=shape, layout=layout,
            candidates=[Candidate.from_native(c) for c in raw["candidates"]],
            buffer_sets=raw["buffer_sets"], checked_elements=raw["checked_elements"],
            seconds_wall=t1 - t0, peak=peak_for(dev["name"], dtype, cfg.peak_overrides),
            telemetry=_window(sampler, dev["index"], t0, t1), phase=phase,
            fast_accum=dtype == "fp8" and cfg.fp8_fast_accum)

    out = on_gpus(devices, one, probes, cfg.one_at_a_time)
    results = [out[d["index"]] for d in devices]
    run.results.extend(results)
    return results


def _window(sampler, gpu: int, t0: float, t1: float) -> dict | None:
    from mgpu_bench.machine import telemetry

    if sampler.error:
        return None
    return telemetry.summarize(sampler.window(gpu, t0, t1), sampler.static.get(gpu))


def _search(cfg, run, devices, probes, dtype, layout, sampler, progress) -> list[Shape]:
    """Coarse pass over the grid (heuristic's first algorithm, two short bursts, no check) on
    every GPU; returns the cfg.search_refine best shapes by the GPUs' median TFLOP/s."""
    grid = [Shape(m, n, k) for m, n, k in itertools.product(cfg.search, repeat=3)]
    score: dict[Shape, float] = {}
    for i, shape in enumerate(grid):
        if progress:
            progress(f"{dtype} search {i + 1}/{len(grid)} {shape}")
        res = _measure_all(cfg, run, devices, probes, dtype, layout, shape, sampler, "search",
                           1, 2, 0.01, 1, False)
        vals = [r.tflops for r in res if r.tflops]
        if vals:
            score[shape] = statistics.median(vals)
    ranked = sorted(score, key=score.__getitem__, reverse=True)
    return ranked[: max(1, cfg.search_refine)]


def _sustain_all(cfg, run, devices, probes, dtype, sampler) -> None:
    """Per GPU, the best algorithm of the first --shape (with --search: of the fastest shape
    found) run for cfg.duration_s, on every GPU at once unless --one-at-a-time."""
    best_shape: dict[int, GemmResult] = {}
    for r in run.results:
        if r.dtype == dtype and r.phase in ("shape", "search-best") and r.best is not None:
            cur = best_shape.get(r.gpu)
            if cur is None or (cfg.search and (r.tflops or 0) > (cur.tflops or 0)):
                best_shape[r.gpu] = r

    def one(dev: dict) -> None:
        r = best_shape.get(dev["index"])
        if r is None or r.best is None:
            return
        probe = probes[dev["index"]]
        t0 = time.monotonic()
        series = probe.sustain(r.shape.m, r.shape.n, r.shape.k, r.best.index, cfg.duration_s, cfg.interval_s)
        t1 = time.monotonic()
        r.series = [(t - t0, s) for t, s in series]
        if not sampler.error:
            from mgpu_bench.machine import telemetry

            samples = sampler.window(dev["index"], t0, t1)
            r.series_telemetry = {"summary": telemetry.summarize(samples, sampler.static.get(dev["index"])),
                                  **telemetry.series(samples, t0)}
        if probe.stopped:
            raise Stopped()

    # Sustained runs are the hot case: all GPUs together unless asked otherwise.
    on_gpus(devices, one, probes, cfg.one_at_a_time)
