"""`comm --tune`, what is tried: the sweep's sizes cut into bands, the settings measured in each
(the default, NCCL_ALGO and NCCL_PROTO per collective, channels, NCCL_BUFFSIZE), whether NVLS may
be recommended here, the requests and the estimate said at the start; and a trial's record, one
setting measured in a process of its own (Trial). Why a fresh process: this folder's __init__.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.measurement import CommMeasurement, CommRequest

from ..plan import CommConfig

SIZES_PER_BAND = 2
# (upper edge in bytes, inclusive, or None; band name): where NCCL's protocols change regime
BAND_EDGES: tuple[tuple[int | None, str], ...] = ((4 << 20, "small"), (64 << 20, "medium"), (None, "large"))
# The collectives NCCL picks an algorithm and protocol for (alltoall and sendrecv are send/recv).
TUNABLE = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")
SCOPED_SYNTAX = 22400  # NCCL 2.24 reads "allreduce:Tree" in NCCL_ALGO / NCCL_PROTO (tuning.cc parseList)
PROTOCOLS = ("LL", "LL128", "Simple")
DEFAULT_BUFFSIZE = 4 << 20  # NCCL's DEFAULT_BUFFSIZE (src/init.cc)
BUFFSIZES = (8 << 20, 16 << 20)
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS (src/include/device.h, 2.28)
# Guesses for the estimate said at the start: a trial's fixed cost (Python, CUDA contexts, NCCL
# set-up and teardown on the GPUs) and the bus rate its sizes run at. Never a figure.
TRIAL_START_S = 2.5
_GUESS_RATE = 100e9
_GUESS_FIXED_S = 0.05

DEFAULT, ALGORITHM, PROTOCOL, CHANNELS, BUFFER, COMBINED = (
    "default", "algorithm", "protocol", "channels", "buffer", "combined")
TAG = "mgpu-bench-tune "  # a trial's result lines on its stdout start with this


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneConfig(CommConfig):
    """comm --tune: the comm config (its sizes are the range the bands are cut from; one
    placement) and how many sizes each band is measured at."""

    sizes_per_band: int = SIZES_PER_BAND


@dataclass(frozen=True)
class Band:
    """A size band: its name and the requested sizes (bytes) measured in it."""

    name: str
    sizes: tuple[int, ...]

    @property
    def label(self) -> str:
        from mgpu_bench.results.sizes import format_bytes

        lo, hi = min(self.sizes), max(self.sizes)
        return format_bytes(lo) if lo == hi else f"{format_bytes(lo)}-{format_bytes(hi)}"


@dataclass(frozen=True)
class Candidate:
    """One setting: the variables its trial sets on top of the environment, the group it
    belongs to and the collectives it is measured on (those its variables affect)."""

    env: tuple[tuple[str, str], ...]
    group: str
    ops: tuple[str, ...]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env) if self.env else "default"

    def lines(self) -> list[str]:
        """The environment lines that give this setting, exactly as a shell takes them."""
        return [f"export {k}={shlex.quote(v)}" for k, v in self.env]

    @property
    def uses_nvls(self) -> bool:
        return any((k == "NCCL_ALGO" and "nvls" in v.lower()) or (k == "NCCL_NVLS_ENABLE" and v.strip() != "0")
                   for k, v in self.env)


@dataclass(frozen=True)
class Nvls:
    """Whether NVLink SHARP may be recommended here, and why (or why not)."""

    allowed: bool
    why: str


def tune_config(cfg: CommConfig) -> TuneConfig:
    """The checks --tune adds (InputError, exit code 2, before any work) and its config: one
    placement (out-of-place unless --inplace alone was given)."""
    from dataclasses import fields

    from mgpu_bench.core import launch
    from mgpu_bench.machine import selection

    other = [op for op in cfg.ops if op not in TUNABLE]
    if other:
        raise InputError(f"--tune tunes the collectives NCCL picks an algorithm and protocol for ({', '.join(TUNABLE)}); "
                         f"{', '.join(other)} run as point-to-point sends: drop them from --ops")
    if not cfg.timing.check:
        raise InputError("--tune checks every setting's results (one that returns wrong data is never recommended): "
                         "drop --no-check")
    if launch.detect() is not None:
        raise InputError("--tune starts a process per NCCL setting on this node itself: run it directly, not under "
                         "torchrun, srun or mpirun")
    if cfg.launch == "processes":
        raise InputError("--tune already runs every setting in a process of its own: drop --launch processes")
    if cfg.backend == "torch":
        raise InputError("--tune tunes NCCL through the native backend: drop --backend torch")
    ngpu = selection.visible_gpu_count()
    if ngpu == 0:
        raise InputError(f"--tune tunes NCCL on GPUs, and no NVIDIA GPU is usable here ({selection.no_gpu_reason()}); "
                         "on CPU ranks `mgpu-bench comm` without --tune measures gloo, which has no such settings")
    gpus = selection.parse_gpus(cfg.gpus, ngpu)
    if len(gpus) < 2:
        raise InputError(f"--tune needs 2 or more GPUs: {len(gpus)} selected ({ngpu} visible); on one GPU an "
                         "allreduce is a copy, with no NCCL setting to tune")
    given = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    given["inplace"] = (True,) if tuple(cfg.inplace) == (True,) else (False,)
    return TuneConfig(**given)


def cut_bands(sizes: Sequence[int], per_band: int = SIZES_PER_BAND) -> tuple[Band, ...]:
    """The bands the sizes fall in, each with at most `per_band` of them: its ends (and, for
    more, sizes evenly spaced between them in the list)."""
    out = []
    lo = -1
    for hi, name in BAND_EDGES:
        inside = sorted({s for s in sizes if s > lo and (hi is None or s <= hi)})
        if inside:
            if len(inside) > per_band:
                step = (len(inside) - 1) / max(per_band - 1, 1)
                inside = sorted({inside[round(i * step)] for i in range(per_band)})
            out.append(Band(name, tuple(inside)))
        lo = hi if hi is not None else lo
    return tuple(out)


def scoped(var: str, op: str, value: str, nccl_version: int) -> tuple[str, str]:
    """NCCL_ALGO / NCCL_PROTO for one collective where NCCL reads that form (2.24+), else for all."""
    return (var, f"{op}:{value}" if nccl_version >= SCOPED_SYNTAX else value)


def first_candidates(ops: Sequence[str], nccl_version: int, nvls: Nvls) -> list[Candidate]:
    """Algorithm and protocol settings, per collective, and the buffer sizes."""
    out: list[Candidate] = []
    scoped_ok = nccl_version >= SCOPED_SYNTAX
    every = tuple(ops)
    for op in ops:
        algos = []
        if op == "allreduce":
            # Tree for all collectives (NCCL < 2.24) fails for those that have none: only alone
            algos = ["Ring", "Tree"] if scoped_ok or every == ("allreduce",) else ["Ring"]
        elif op in ("allgather", "reducescatter") and nvls.allowed:
            algos = ["Ring"]  # NVLS may be the default there
        if nvls.allowed and op in ("allreduce", "allgather", "reducescatter"):
            algos.append("NVLS")
        target = (op,) if scoped_ok else every
        out += [Candidate((scoped("NCCL_ALGO", op, a, nccl_version),), ALGORITHM, target) for a in algos]
        out += [Candidate((scoped("NCCL_PROTO", op, p, nccl_version),), PROTOCOL, target) for p in PROTOCOLS]
        if not scoped_ok:
            break  # one unscoped set of candidates covers every collective
    out += [Candidate((("NCCL_BUFFSIZE", str(b)),), BUFFER, every) for b in BUFFSIZES]
    return out


def channel_candidates(ops: Sequence[str], channels: int | None) -> list[Candidate]:
    """Half and twice the default's channel count (NCCL's INFO log said it), within 1..64."""
    if not channels:
        return []
    out = []
    if channels // 2 >= 1:
        out.append(Candidate((("NCCL_MAX_NCHANNELS", str(channels // 2)),), CHANNELS, tuple(ops)))
    if min(2 * channels, MAX_CHANNELS) > channels:
        out.append(Candidate((("NCCL_MIN_NCHANNELS", str(min(2 * channels, MAX_CHANNELS))),), CHANNELS, tuple(ops)))
    return out


def nvls_before(environ: Mapping[str, str]) -> Nvls | None:
    """What the environment alone says about NVLS (None: the default trial's log decides)."""
    if environ.get("NCCL_NVLS_ENABLE", "").strip() == "0":
        return Nvls(False, "NCCL_NVLS_ENABLE=0 in this environment")
    return None


def unread(environ: Mapping[str, str]) -> str:
    """Why NCCL's log did not give the default's channels."""
    if "NCCL_DEBUG" in environ or "NCCL_DEBUG_FILE" in environ:
        return "NCCL_DEBUG is set in this environment, so this tool does not read NCCL's log"
    return "NCCL's log did not state it"


def nvls_after(nvls_channels: int | None, environ: Mapping[str, str]) -> Nvls:
    """What the default trial's NCCL log says about NVLS."""
    if nvls_channels is None:
        return Nvls(False, f"NVLS support is unknown ({unread(environ)}): NVLS not tried")
    if nvls_channels == 0:
        return Nvls(False, "NCCL set up no NVLS channels on these GPUs (no NVSwitch multicast)")
    return Nvls(True, f"NCCL set up {nvls_channels} NVLS channels")


def tune_requests(cfg: CommConfig, bands: Sequence[Band]) -> list[CommRequest]:
    """ops x the bands' sizes, one placement."""
    from mgpu_bench.results.ops import OPS

    sizes = sorted({s for b in bands for s in b.sizes})
    return [CommRequest(op, cfg.dtype, cfg.redop if OPS[op].reduces else None, s, cfg.inplace[0])
            for op in cfg.ops for s in sizes]


def estimate(cfg: TuneConfig) -> str:
    """"about N s: ..." from the number of trials (their start-up) and their sizes (a guess)."""
    bands = cut_bands(cfg.sizes, cfg.sizes_per_band)
    sizes = sorted({s for b in bands for s in b.sizes})
    t = cfg.timing
    calls = max(2, t.warmup_iters) + 2 * (t.iters if t.iters > 0 else max(t.min_iters, 1)) + 1

    def per_size(size: int) -> float:
        return _GUESS_FIXED_S + calls * max(size / _GUESS_RATE, t.min_time_s / calls if t.iters <= 0 else 0.0)

    version = 99999  # the estimate assumes the scoped syntax: one collective per algorithm/protocol trial
    cands = first_candidates(cfg.ops, version, Nvls(False, "")) + channel_candidates(cfg.ops, 16)
    trials = [(2, len(cfg.ops))] + [(1, len(c.ops)) for c in cands]
    total = sum(n * (TRIAL_START_S + nops * sum(per_size(s) for s in sizes)) for n, nops in trials)
    count = sum(n for n, _ in trials)
    when = f"about {total:.0f} s" if total < 120 else f"about {total / 60:.0f} min"
    return (f"{when} for {count} NCCL settings (the default twice), each in a fresh process, x {len(sizes)} size(s) "
            f"in {len(bands)} band(s) x {len(cfg.ops)} op(s) (a guess: {TRIAL_START_S:g} s to start each, sizes at "
            f"{_GUESS_RATE / 1e9:g} GB/s)")


# -- one trial: a process of its own ------------------------------------------------------------


@dataclass
class Trial:
    """One setting measured in a process of its own: what it measured, how it ended, and what
    NCCL's log said (coll and NVLS channels, warnings). run: 1, or 2 for the default's repeat."""

    candidate: Candidate
    run: int = 1
    measurements: list[CommMeasurement] = field(default_factory=list)
    error: str | None = None
    stopped: str | None = None  # as CommRun.stopped, for a trial that ended early
    channels: int | None = None
    nvls_channels: int | None = None
    warnings: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0

    @property
    def wrong(self) -> int:
        return sum(m.total_wrong for m in self.measurements)

    def at(self, op: str, size: int) -> CommMeasurement | None:
        return next((m for m in self.measurements if m.spec.op == op and m.spec.size == size), None)

    def to_dict(self) -> dict:
        return {"label": self.candidate.label, "group": self.candidate.group, "env": dict(self.candidate.env),
                "ops": list(self.candidate.ops), "run": self.run, "error": self.error, "stopped": self.stopped,
                "channels": self.channels, "nvls_channels": self.nvls_channels, "warnings": self.warnings,
                "wall_seconds": self.wall_seconds, "measurements": [m.to_dict() for m in self.measurements]}

    @classmethod
    def from_dict(cls, d: Mapping) -> Trial:
        cand = Candidate(tuple((str(k), str(v)) for k, v in (d.get("env") or {}).items()), str(d["group"]),
                         tuple(d.get("ops") or ()))
        return cls(cand, int(d.get("run", 1)), [CommMeasurement.from_dict(m) for m in d.get("measurements") or []],
                   d.get("error"), d.get("stopped"), d.get("channels"), d.get("nvls_channels"),
                   list(d.get("warnings") or []), float(d.get("wall_seconds", 0.0)))


_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels, \d+ collnet channels, (\d+) nvls channels")


def channels_in(log: str) -> tuple[int | None, int | None]:
    """(coll channels, NVLS channels) NCCL's INFO log states at set-up, or None each."""
    m = _CHANNELS.search(log)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)
