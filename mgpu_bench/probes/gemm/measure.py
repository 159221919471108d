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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgpu_bench import hardware
from mgpu_bench.errors import InputError, MgpuError, OutOfMemoryError, interruption

GEMM_DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")
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
LAYOUTS = ("NN", "NT", "TN", "TT")
# Input distributions (the probe's init codes). They change the power a GEMM draws and so, on a
# power-capped GPU, its TFLOP/s: say which one a figure used when comparing with other tools.
INITS = {"uniform": 0, "normal": 1, "positive": 2}
FP8_MIN_CC = (8, 9)  # Ada and Hopper: the first with fp8 tensor cores
DEFAULT_WORKSPACE = 32 << 20  # cuBLAS's recommendation for Hopper
OUTLIER_FLOOR = 0.02  # a GPU is named only when it is this far below the median, or 3x noise
MAX_DIM = 1 << 20


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


def parse_duration(text: str) -> float:
    """'60s', '2m', '90' (seconds), '1h' -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h)?\s*", text.lower())
    if not m:
        raise InputError(f"--duration '{text}' is not a duration: write e.g. 60s, 5m or 1h")
    value = float(m.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, None: 1}[m.group(2)]
    if not (0 < value <= 7 * 24 * 3600):
        raise InputError(f"--duration '{text}' must be more than 0 and at most a week")
    return value


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
    from mgpu_bench.probes.comm.measure import require_gpus

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

class _Stop(Exception):
    pass


def run_gemm(cfg: GemmConfig, devices: list[dict], progress: Callable[[str], None] | None = None,
             telemetry_factory: Callable[..., Any] | None = None) -> GemmRun:
    """Measures every (dtype, shape) on every GPU; Ctrl-C stops at the next burst and keeps the
    results gathered so far (run.stopped = 'interrupted')."""
    from mgpu_bench import _native, telemetry

    run = GemmRun(cfg, list(devices))
    t_start = time.monotonic()
    bus_ids = {d["index"]: d["pci_bus_id"] for d in devices}
    sampler_cls = telemetry_factory or telemetry.Sampler
    probes: dict[int, Any] = {}
    with sampler_cls(bus_ids, interval_s=0.1) as sampler:
        run.telemetry_error = sampler.error
        try:
            for dtype in cfg.dtypes:
                layout = layout_for(dtype, cfg.layout)
                largest = _largest(cfg)
                probes.clear()

                def make(dev: dict, dtype=dtype, layout=layout, largest=largest) -> None:
                    probes[dev["index"]] = _native.GemmProbe(
                        dev["index"], dtype, layout, largest.m, largest.n, largest.k, cfg.workspace,
                        cfg.seed, cfg.fp8_fast_accum, INITS[cfg.init])

                _on_gpus(devices, make, cfg.one_at_a_time, probes)
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
                probes.clear()
        except (KeyboardInterrupt, _Stop) as exc:
            for p in list(probes.values()):
                p.stop()
            run.stopped = "interrupted"
            run.stop_message = f"{interruption(exc)}: the results gathered so far are kept"
        except OutOfMemoryError as exc:
            run.stopped = "failed"
            run.stop_message = f"out of memory: {str(exc).split(' [', 1)[0]}"
        except MgpuError as exc:
            run.stopped = "failed"
            run.stop_message = str(exc)
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


def _on_gpus(devices: Sequence[dict], fn: Callable[[dict], Any], one_at_a_time: bool,
             probes: Mapping[int, Any]) -> dict[int, Any]:
    """fn(device) for every GPU, each in its own thread: all at once, or one after another.
    The main thread waits in 0.1 s slices so that Ctrl-C reaches it while a GPU works in native
    code; it then stops every probe, lets the threads return what they have, and re-raises.
    The first exception of a worker is raised here."""
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def work(dev: dict, done: threading.Event) -> None:
        try:
            results[dev["index"]] = fn(dev)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)
            for p in list(probes.values()):
                p.stop()
        finally:
            done.set()

    # Completion is awaited on Events, not Thread.join: on Python <= 3.12 a KeyboardInterrupt
    # inside join() can mark a still-running thread as finished (bpo-45274's clean-up), and a
    # later join() would then return while the GPU is still working.
    batches = [[d] for d in devices] if one_at_a_time else [list(devices)]
    for batch in batches:
        events = [threading.Event() for _ in batch]
        for d, ev in zip(batch, events, strict=True):
            threading.Thread(target=work, args=(d, ev), daemon=True).start()
        try:
            for ev in events:
                while not ev.wait(0.1):
                    pass
        except KeyboardInterrupt:
            for p in list(probes.values()):
                p.stop()
            for ev in events:
                ev.wait()
            raise
        if errors:
            raise errors[0]
    return results


def _measure_all(cfg, run, devices, probes, dtype, layout, shape, sampler, phase, candidates, samples,
                 sample_s, warmup, check) -> list[GemmResult]:
    def one(dev: dict) -> GemmResult:
        probe = probes[dev["index"]]
        t0 = time.monotonic()
        raw = probe.measure(shape.m, shape.n, shape.k, candidates, samples, sample_s, warmup, check)
        t1 = time.monotonic()
        if probe.stopped:
            raise _Stop()
        return GemmResult(
            gpu=dev["index"], gpu_name=dev["name"], dtype=dtype, shape=shape, layout=layout,
            candidates=[Candidate.from_native(c) for c in raw["candidates"]],
            buffer_sets=raw["buffer_sets"], checked_elements=raw["checked_elements"],
            seconds_wall=t1 - t0, peak=peak_for(dev["name"], dtype, cfg.peak_overrides),
            telemetry=_window(sampler, dev["index"], t0, t1), phase=phase,
            fast_accum=dtype == "fp8" and cfg.fp8_fast_accum)

    out = _on_gpus(devices, one, cfg.one_at_a_time, probes)
    results = [out[d["index"]] for d in devices]
    run.results.extend(results)
    return results


def _window(sampler, gpu: int, t0: float, t1: float) -> dict | None:
    from mgpu_bench import telemetry

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
            from mgpu_bench import telemetry

            samples = sampler.window(dev["index"], t0, t1)
            r.series_telemetry = {"summary": telemetry.summarize(samples, sampler.static.get(dev["index"])),
                                  **telemetry.series(samples, t0)}
        if probe.stopped:
            raise _Stop()

    # Sustained runs are the hot case: all GPUs together unless asked otherwise.
    _on_gpus(devices, one, cfg.one_at_a_time, probes)


# ------------------------------------------------------------------------------------ verdicts

def outliers(values: Mapping[int, float], noise: Mapping[int, float | None]) -> list[dict]:
    """GPUs below the node's median by more than max(2%, 3x their noise): [{gpu, value,
    median, deficit, threshold}]. Needs two GPUs or more."""
    if len(values) < 2:
        return []
    med = statistics.median(values.values())
    if med <= 0:
        return []
    known = [n for n in noise.values() if n is not None]
    pooled = statistics.median(known) if known else None
    out = []
    for gpu, v in sorted(values.items()):
        n = noise.get(gpu)
        n = max(n, pooled) if n is not None and pooled is not None else (n if n is not None else pooled)
        threshold = max(OUTLIER_FLOOR, 3 * n) if n is not None else OUTLIER_FLOOR
        deficit = 1.0 - v / med
        if deficit > threshold:
            out.append({"gpu": gpu, "value": v, "median": med, "deficit": deficit, "threshold": threshold})
    return out


def sustained_drop(series: Sequence[tuple[float, float]], flops: int) -> dict | None:
    """TFLOP/s over the first and the last 10% of a sustained run (at least 3 bursts each) and
    the relative drop; None for a series too short to say."""
    n = len(series)
    tail = max(3, n // 10)
    if n < 2 * tail:
        return None
    first = statistics.median(flops / s for _, s in series[:tail])
    last = statistics.median(flops / s for _, s in series[-tail:])
    return {"first": first, "last": last, "drop": 1.0 - last / first, "bursts": tail}


def findings(run: GemmRun) -> list[str]:
    """Lines a person can act on: wrong results, the slow GPU with its likely cause, a
    sustained run that lost throughput, throttling seen while measuring."""
    from mgpu_bench import telemetry

    lines: list[str] = []
    for r in run.results:
        if r.best is None and r.candidates and not r.wrong:
            errors = sorted({c.error for c in r.candidates if c.error})
            lines.append(f"GPU {r.gpu} {r.dtype} {r.shape}: none of the {len(r.candidates)} algorithms cuBLASLt "
                         f"proposed ran ({'; '.join(errors) or 'no timings'})")
        for c in r.wrong:
            lines.append(f"GPU {r.gpu} {r.dtype} {r.shape}: algorithm {c.name()} gave wrong results "
                         f"(normalised error {c.max_error:.2e} > tolerance {r.tolerance:.0e}): a faulty GPU "
                         "or library; this algorithm is not counted")
    groups: dict[tuple[str, Shape], list[GemmResult]] = {}
    for r in run.results:
        if r.phase != "search" and r.tflops:
            groups.setdefault((r.dtype, r.shape), []).append(r)
    for (dtype, shape), rs in groups.items():
        by_gpu = {r.gpu: r for r in rs}
        for o in outliers({r.gpu: r.tflops for r in rs}, {r.gpu: r.noise for r in rs}):  # type: ignore[misc]
            r = by_gpu[o["gpu"]]
            cause = None
            if r.telemetry:
                peers = [p.telemetry for p in rs if p.gpu != r.gpu and p.telemetry]
                cause = telemetry.explain(r.telemetry, peers)
            lines.append(f"GPU {r.gpu} {dtype} {shape}: {o['value']:.1f} TFLOP/s, {100 * o['deficit']:.1f}% below "
                         f"the node's median {o['median']:.1f} (threshold {100 * o['threshold']:.1f}%)"
                         + (f"; {cause}" if cause else "; no clock or power cause seen: check the card"))
    for r in run.results:
        if r.series:
            d = sustained_drop(r.series, r.shape.flops)
            if d and d["drop"] > max(0.03, 3 * (r.noise or 0)):
                tel = (r.series_telemetry or {}).get("summary") or {}
                why = ", ".join(tel.get("limiting") or []) or "no throttle reason reported"
                lines.append(f"GPU {r.gpu} {r.dtype} sustained: {d['first'] / 1e12:.1f} -> {d['last'] / 1e12:.1f} "
                             f"TFLOP/s ({100 * d['drop']:.1f}% lower) over {r.series[-1][0]:.0f} s; {why}")
    seen: set[tuple[int, str]] = set()
    for r in run.results:
        for reason in ((r.telemetry or {}).get("limiting") or []):
            if (r.gpu, reason) not in seen:
                seen.add((r.gpu, reason))
                lines.append(f"GPU {r.gpu}: clocks lowered by {reason} while measuring ({r.dtype} {r.shape})")
    return lines


# ------------------------------------------------------------------------------------ document

def document(run: GemmRun, environment: dict, command: list[str] | None = None) -> dict:
    import datetime as _dt

    from mgpu_bench import __version__
    from mgpu_bench.probes.comm.render import RESULT_SCHEMA, RESULT_SCHEMA_VERSION

    return {
        "schema": RESULT_SCHEMA, "schema_version": RESULT_SCHEMA_VERSION, "kind": "gemm",
        "tool_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command, "environment": environment, "devices": run.devices,
        "config": {"dtypes": list(run.config.dtypes), "shapes": [str(s) for s in run.config.shapes],
                   "layout": run.config.layout, "candidates": run.config.candidates,
                   "samples": run.config.samples, "sample_s": run.config.sample_s,
                   "one_at_a_time": run.config.one_at_a_time,
                   "search": list(run.config.search) if run.config.search else None,
                   "duration_s": run.config.duration_s, "workspace": run.config.workspace,
                   "fp8_fast_accum": run.config.fp8_fast_accum, "init": run.config.init},
        "status": {"completed": run.stopped is None, "stopped": run.stopped, "message": run.stop_message},
        "notes": run.notes, "telemetry_error": run.telemetry_error, "wall_seconds": run.wall_seconds,
        "findings": findings(run),
        "results": [r.to_dict() for r in run.results],
    }



# ------------------------------------------------------------------------------------ rendering

CSV_FIELDS = ("gpu", "gpu_name", "dtype", "phase", "m", "n", "k", "layout", "flops", "best", "best_seconds",
              "flops_per_s", "peak_flops_per_s", "pct_peak", "noise", "max_error", "sm_hz_median",
              "power_w_max", "temp_c_max", "limiting")


def rows(run: GemmRun, phases: Sequence[str] = ("shape", "search-best")) -> list[dict]:
    """One row per result (base units), shared by the terminal table and the CSV."""
    out = []
    for r in run.results:
        if r.phase not in phases:
            continue
        b = r.best
        t = r.telemetry or {}
        out.append({
            "gpu": r.gpu, "gpu_name": r.gpu_name, "dtype": r.dtype, "phase": r.phase, "m": r.shape.m,
            "n": r.shape.n, "k": r.shape.k, "layout": r.layout, "flops": r.shape.flops,
            "best": b.name() if b else None, "best_seconds": b.median_s if b else None,
            "flops_per_s": r.flops_per_s, "peak_flops_per_s": r.peak.value if r.peak else None,
            "pct_peak": r.pct_peak, "noise": r.noise,
            "max_error": b.max_error if b else None, "sm_hz_median": t.get("sm_hz_median"),
            "power_w_max": t.get("power_w_max"), "temp_c_max": t.get("temp_c_max"),
            "limiting": ";".join(t.get("limiting") or []),
        })
    return out


def render_csv(run: GemmRun) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows(run):
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_terminal(run: GemmRun, console) -> None:
    """One table (100 columns) per run, then the best algorithm of every row, then the summary."""
    from rich.table import Table

    t = Table(title="GEMM (cuBLASLt): TFLOP/s = 2*M*N*K / median seconds per GEMM of the best candidate; "
                    f"{run.config.init} inputs",
              title_justify="left", pad_edge=False, box=None, header_style="bold")
    for name, just in (("GPU", "right"), ("dtype", "left"), ("M x N x K  layout", "left"), ("TFLOP/s", "right"),
                       ("% peak", "right"), ("best", "right"), ("noise\n%", "right"), ("SM\nMHz", "right"),
                       ("power\nW max", "right"), ("temp\nC max", "right"), ("clock limits", "left")):
        t.add_column(name, justify=just, overflow="fold")  # type: ignore[arg-type]
    table_rows = rows(run)
    for row in table_rows:
        t.add_row(str(row["gpu"]), row["dtype"], f"{row['m']}x{row['n']}x{row['k']}  {row['layout']}",
                  _num(row["flops_per_s"] and row["flops_per_s"] / 1e12, ".1f"), _num(row["pct_peak"], ".1f"),
                  (row["best"] or "-").split(" ", 1)[0], _num(row["noise"] and 100 * row["noise"], ".2f"),
                  _num(row["sm_hz_median"] and row["sm_hz_median"] / 1e6, ".0f"), _num(row["power_w_max"], ".0f"),
                  _num(row["temp_c_max"], ".0f"), row["limiting"].replace(";", ", ") or "-")
    console.print(t)
    for row in table_rows:
        if row["best"]:
            console.print(f"  best for GPU {row['gpu']} {row['dtype']} {row['m']}x{row['n']}x{row['k']}: "
                          f"{row['best']}", highlight=False, soft_wrap=True)
    for line in summary_lines(run):
        console.print(line, highlight=False, soft_wrap=True)


def summary_lines(run: GemmRun) -> list[str]:
    """Per dtype and shape, the node's figures in one line each (for grep); the search and the
    sustained runs summarised."""
    lines = []
    groups: dict[tuple[str, Shape], list[GemmResult]] = {}
    for r in run.results:
        if r.phase != "search" and r.tflops:
            groups.setdefault((r.dtype, r.shape), []).append(r)
    for (dtype, shape), rs in groups.items():
        vals = [r.tflops for r in rs if r.tflops]
        pcts = [r.pct_peak for r in rs if r.pct_peak is not None]
        peaks = {(r.peak.value, r.peak.source) for r in rs if r.peak and r.peak.value}
        first = [r.shape.flops / r.heuristic_first.median_s / 1e12 for r in rs
                 if r.heuristic_first and r.heuristic_first.median_s]
        lines.append(f"gemm {dtype} {shape}: {len(vals)} GPU(s), median {statistics.median(vals):.1f} TFLOP/s "
                     f"(min {min(vals):.1f}, max {max(vals):.1f})"
                     + (f", median {statistics.median(pcts):.1f}% of the dense peak ("
                        + "; ".join(f"{v / 1e12:g} TFLOP/s, {src}" for v, src in sorted(peaks)) + ")"
                        if pcts else ", no peak figure for this GPU")
                     + (f"; the heuristic's first choice alone: {statistics.median(first):.1f}" if first else ""))
    coarse = run.measured("search")
    if coarse:
        by_dtype: dict[str, list[GemmResult]] = {}
        for r in coarse:
            by_dtype.setdefault(r.dtype, []).append(r)
        for dtype, rs in by_dtype.items():
            shapes = {r.shape for r in rs}
            secs = sum(r.seconds_wall for r in rs) / max(1, len({r.gpu for r in rs}))
            lines.append(f"search {dtype}: {len(shapes)} shapes, about {secs:.1f} s of measuring per GPU; "
                         "the best shapes were measured again in full (rows above)")
    for r in run.results:
        if r.series:
            tps = [r.shape.flops / s / 1e12 for _, s in r.series]
            tel = (r.series_telemetry or {}).get("summary") or {}
            extra = ""
            if tel.get("sm_hz_median"):
                extra = (f"; SM clock median {tel['sm_hz_median'] / 1e6:.0f} MHz (min {tel['sm_hz_min'] / 1e6:.0f}), "
                         f"power max {_num(tel.get('power_w_max'), '.0f')} W of {_num(tel.get('power_limit_w'), '.0f')} W, "
                         f"temperature max {_num(tel.get('temp_c_max'), '.0f')} C")
            lines.append(f"sustained GPU {r.gpu} {r.dtype} {r.shape}: {r.series[-1][0]:.1f} s, {len(tps)} bursts, "
                         f"median {statistics.median(tps):.1f} TFLOP/s (min {min(tps):.1f}, max {max(tps):.1f}){extra}")
    return lines
