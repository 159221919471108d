"""GPU telemetry sampled through NVML while a probe runs: clocks, power, temperature and the
clock-event (throttle) reasons, per GPU, and the words that say why a GPU measured slow.

`Sampler` is a context manager that polls every GPU from a background thread; `summarize()`
reduces a list of `Sample`s to figures, `explain()` compares one GPU's summary with its peers'
and `series()` lays samples out for JSON and plots. Like `topo`, it never raises for a missing or
failing driver: `Sampler.error` says why nothing was recorded, and one query a GPU does not
support leaves that field None. Base units in data: seconds, Hz, W, degrees C.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Self

from .topo import _CLOCK_MEM, _CLOCK_SM, _Nvml, _open, _text, normalize_bus_id

_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU

# nvml.h's nvmlClocksEventReason* bits (nvmlClocksThrottleReason* before driver 535, same values):
# bit -> (nvml.h's short name, what it means). Checked against nvidia-ml-py 13.615's constants.
REASONS: dict[int, tuple[str, str]] = {
    0x1: ("GpuIdle", "idle"),
    0x2: ("ApplicationsClocksSetting", "application clocks"),
    0x4: ("SwPowerCap", "power cap (software)"),
    0x8: ("HwSlowdown", "hardware slowdown"),
    0x10: ("SyncBoost", "sync boost"),
    0x20: ("SwThermalSlowdown", "thermal (software)"),
    0x40: ("HwThermalSlowdown", "thermal (hardware)"),
    0x80: ("HwPowerBrakeSlowdown", "power brake (hardware)"),
    0x100: ("DisplayClockSetting", "display clock"),
}
IDLE = "idle"
POWER_CAP = "power cap (software)"
HW_SLOWDOWN = "hardware slowdown"
THERMAL_SW = "thermal (software)"
THERMAL_HW = "thermal (hardware)"
POWER_BRAKE = "power brake (hardware)"
APP_CLOCKS = "application clocks"
# The reasons that lower clocks under load; the others are settings or an idle GPU.
LIMITING = frozenset({POWER_CAP, HW_SLOWDOWN, THERMAL_SW, THERMAL_HW, POWER_BRAKE})

_CLOCK_TOLERANCE = 0.02  # a clock within 2 % of its reference is "as expected"
_POWER_LIMIT_TOLERANCE = 0.01  # enforced limits read back within 1 % are the same setting


def reason_names(mask: int | None) -> list[str]:
    """A clock-event reasons bitmask -> human words, lowest bit first; bits nvml.h does not name
    (in this table) as hex, e.g. '0x200'. None or 0 -> []."""
    if not mask:
        return []
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(REASONS[bit][1] if bit in REASONS else hex(bit))
        bit <<= 1
    return names


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU. Any field is None where its NVML query failed.

    t: time.monotonic() seconds when the reading began. sm_hz, mem_hz: the current SM and memory
    clocks in Hz. power_w: NVML's power reading in W (on Ampere and newer, GA100 excepted, the
    driver averages it over 1 s, so it lags a short probe). temp_c: the GPU die temperature in
    degrees C. reasons: the nvmlClocksEventReason bitmask (see REASONS, reason_names())."""

    t: float
    sm_hz: float | None = None
    mem_hz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    reasons: int | None = None


# ---------------------------------------------------------------------------------------------
# the sampler


def _bus_id_forms(bus_id: str) -> list[str]:
    """The spellings to try with nvmlDeviceGetHandleByPciBusId: as given, sysfs' 4-digit domain
    and NVML's own 8-digit domain with upper-case hex."""
    forms = [bus_id.strip()]
    norm = normalize_bus_id(bus_id)
    if norm:
        forms.append(norm)
        domain, _, rest = norm.partition(":")
        if rest:
            forms.append(f"{int(domain, 16):08x}:{rest}".upper())
    return list(dict.fromkeys(f for f in forms if f))


def handle_by_bus_id(nv: _Nvml, bus_id: str | None) -> tuple[object | None, str]:
    """(the NVML handle of the GPU at `bus_id`, or None and why): nvmlDeviceGetHandleByPciBusId
    over the bus id's spellings, each as str (nvidia-ml-py 11.450+ encodes it) and bytes (older
    releases pass it to ctypes as is)."""
    if not bus_id:
        return None, "no bus id"
    fn = getattr(nv.mod, "nvmlDeviceGetHandleByPciBusId", None)
    if fn is None:
        return None, "nvmlDeviceGetHandleByPciBusId is not in this nvidia-ml-py"
    why = "not found"
    for form in _bus_id_forms(bus_id):
        for arg in (form, form.encode()):
            try:
                handle = fn(arg)
            except Exception as exc:  # noqa: BLE001 - NVMLError_NotFound, or ctypes refusing str/bytes
                why = str(exc) or repr(exc)
                continue
            if handle is not None:
                return handle, ""
    return None, why


class Sampler:
    """Samples every GPU in `bus_ids` every `interval_s` seconds from a daemon thread, between
    __enter__ and __exit__ (or start() and stop()).

    bus_ids maps the caller's GPU index (a CUDA index) to its PCI bus id ('00000000:18:00.0' or
    '0000:18:00.0'); `nvml` is a pynvml-like module, None for `import pynvml`. One sample is
    taken at start and one at stop, so even a short probe has two per GPU.

    Attributes: samples {index: [Sample, ...]} in time order; static {index: {name, pci_bus_id,
    sm_max_hz (Hz), power_limit_w (W, the enforced limit)}} read once at start; error: why nothing
    is recorded (NVML missing or failing, no GPU found), else None; warnings: one line per GPU and
    query that failed (a GPU without a handle, a field NVML refused), each said once. Never
    raises for NVML's absence or failure."""

    def __init__(self, bus_ids: Mapping[int, str], interval_s: float = 0.1, nvml=None):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        self.bus_ids = dict(bus_ids)
        self.interval_s = float(interval_s)
        self.samples: dict[int, list[Sample]] = {i: [] for i in self.bus_ids}
        self.static: dict[int, dict] = {
            i: {"name": None, "pci_bus_id": normalize_bus_id(b), "sm_max_hz": None, "power_limit_w": None}
            for i, b in self.bus_ids.items()
        }
        self.error: str | None = None
        self.warnings: list[str] = []
        self.status: dict = {}  # topo's NVML status: available, error, driver, ...
        self._nvml_arg = nvml
        self._nv: _Nvml | None = None
        self._handles: dict[int, object] = {}
        self._failed: set[tuple[int, str]] = set()
        self._reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False

    # context manager

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Opens NVML, finds the handles, reads the static facts, takes the first sample and
        starts the thread. Once only; never raises for NVML."""
        if self._started:
            return
        self._started = True
        try:
            self._open()
            if self._nv is None:
                return
            self._sample_all()
        except Exception as exc:  # noqa: BLE001 - a binding surprise costs the telemetry, not the probe
            self.error = f"NVML setup failed: {exc!r}"
            self._close()
            return
        self._thread = threading.Thread(target=self._run, name="mgpu-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops and joins the thread, takes the last sample and shuts NVML down. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            try:
                self._sample_all()
            except Exception as exc:  # noqa: BLE001 - as in _run
                self.warnings.append(f"last sample failed: {exc!r}")
        self._close()

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def window(self, index: int, t0: float, t1: float, margin_s: float = 0.0) -> list[Sample]:
        """GPU `index`'s samples with t0 - margin_s <= t <= t1 + margin_s (time.monotonic()
        seconds). A window shorter than interval_s may hold none; margin_s widens it."""
        lo, hi = t0 - margin_s, t1 + margin_s
        return [s for s in list(self.samples.get(index, ())) if lo <= s.t <= hi]

    # internals

    def _open(self) -> None:
        nv, self.status = _open(self._nvml_arg)
        if nv is None:
            self.error = self.status.get("error") or "NVML unavailable"
            return
        self._nv = nv
        if not hasattr(nv.mod, self._reasons_fn):  # nvidia-ml-py before the 535 driver's rename
            self._reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        for index, bus_id in self.bus_ids.items():
            handle, why = self._handle(bus_id)
            if handle is None:
                self.warnings.append(f"GPU {index}: no NVML handle for bus id {bus_id!r}: {why}")
                continue
            self._handles[index] = handle
            self._read_static(index, handle)
        if not self._handles:
            self.error = ("no GPU found through NVML: " + "; ".join(self.warnings)) if self.warnings \
                else "no GPUs to sample"
            self._close()

    def _handle(self, bus_id: str | None) -> tuple[object | None, str]:
        return handle_by_bus_id(self._nv, bus_id)

    def _query(self, index: int, field: str, name: str, *args):
        """One NVML call; a failure -> None and, the first time for this GPU and field, a
        warning line."""
        errs: list[str] = []
        value = self._nv.call(errs, field, name, *args)
        if errs and (index, field) not in self._failed:
            self._failed.add((index, field))
            self.warnings.append(f"GPU {index} {errs[0]}")
        return value

    def _read_static(self, index: int, h) -> None:
        st = self.static[index]
        st["name"] = _text(self._query(index, "name", "nvmlDeviceGetName", h))
        mhz = self._query(index, "sm_max_hz", "nvmlDeviceGetMaxClockInfo", h, _CLOCK_SM)
        st["sm_max_hz"] = mhz * 1e6 if mhz is not None else None
        mw = self._query(index, "power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", h)  # milliwatts
        st["power_limit_w"] = mw / 1000 if mw is not None else None
        mw = self._query(index, "power_default_w", "nvmlDeviceGetPowerManagementDefaultLimit", h)
        st["power_default_w"] = mw / 1000 if mw is not None else None
        lo_hi = self._query(index, "power_max_w", "nvmlDeviceGetPowerManagementLimitConstraints", h)
        st["power_max_w"] = lo_hi[1] / 1000 if isinstance(lo_hi, (tuple, list)) and len(lo_hi) == 2 else None

    def _sample(self, index: int, h) -> Sample:
        t = time.monotonic()
        q = self._query
        sm = q(index, "sm_hz", "nvmlDeviceGetClockInfo", h, _CLOCK_SM)  # MHz
        mem = q(index, "mem_hz", "nvmlDeviceGetClockInfo", h, _CLOCK_MEM)  # MHz
        mw = q(index, "power_w", "nvmlDeviceGetPowerUsage", h)  # milliwatts
        temp = q(index, "temp_c", "nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU)
        reasons = q(index, "reasons", self._reasons_fn, h)
        return Sample(
            t=t,
            sm_hz=sm * 1e6 if sm is not None else None,
            mem_hz=mem * 1e6 if mem is not None else None,
            power_w=mw / 1000 if mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            reasons=int(reasons) if reasons is not None else None,
        )

    def _sample_all(self) -> None:
        if self._nv is None:
            return
        for index, h in self._handles.items():
            self.samples[index].append(self._sample(index, h))

    def _run(self) -> None:
        """The thread: a sample of every GPU each interval_s, on a fixed schedule (a slow round
        delays the next, it does not shift the rest)."""
        deadline = time.monotonic()
        try:
            while True:
                deadline += self.interval_s
                now = time.monotonic()
                deadline = max(deadline, now)  # fell behind by more than a round: start afresh
                if self._stop.wait(deadline - now):
                    return
                self._sample_all()
        except Exception as exc:  # noqa: BLE001 - a bug or binding surprise ends sampling, not the probe
            self.warnings.append(f"sampling stopped: {exc!r}")

    def _close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):  # shutting down: nothing left to report to
                self._nv.mod.nvmlShutdown()
            self._nv = None


# ---------------------------------------------------------------------------------------------
# reductions


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def summarize(samples: Sequence[Sample], static: Mapping | None = None) -> dict:
    """One GPU's samples -> figures in base units (Hz, W, degrees C); None values are skipped and a
    figure with no values is None.

    Keys: samples (count); sm_hz_median/min/max (observed); sm_max_hz and power_limit_w (from
    `static`, Sampler.static[index]); mem_hz_median; power_w_mean/max; temp_c_max/mean; reasons
    (sorted names seen in any sample, 'idle' left out); limiting (those of them that lower clocks
    under load: power cap, thermal, hardware slowdown, power brake)."""
    static = static or {}
    sm = [s.sm_hz for s in samples if s.sm_hz is not None]
    mem = [s.mem_hz for s in samples if s.mem_hz is not None]
    power = [s.power_w for s in samples if s.power_w is not None]
    temp = [s.temp_c for s in samples if s.temp_c is not None]
    mask = 0
    for s in samples:
        mask |= s.reasons or 0
    reasons = sorted(n for n in reason_names(mask) if n != IDLE)
    return {
        "samples": len(samples),
        "sm_hz_median": _median(sm),
        "sm_hz_min": min(sm, default=None),
        "sm_hz_max": max(sm, default=None),
        "sm_max_hz": static.get("sm_max_hz"),
        "mem_hz_median": _median(mem),
        "power_w_mean": _mean(power),
        "power_w_max": max(power, default=None),
        "power_limit_w": static.get("power_limit_w"),
        "power_default_w": static.get("power_default_w"),
        "power_max_w": static.get("power_max_w"),
        "temp_c_max": max(temp, default=None),
        "temp_c_mean": _mean(temp),
        "reasons": reasons,
        "limiting": [r for r in reasons if r in LIMITING],
    }


def concerns(summary: Mapping) -> list[str]:
    """What in one GPU's summary() deserves a warning on its own: an enforced power limit below
    the GPU's default (or, the default unknown, its maximum), and the reasons that slow a GPU
    that is not set up wrong: thermal slowdown, hardware slowdown, the power brake. Running into
    the power cap at the default limit is not among them: dense GEMM on an H100/H200 always does
    (information, not a fault)."""
    out = []
    limit = summary.get("power_limit_w")
    ref = summary.get("power_default_w") or summary.get("power_max_w")
    if limit and ref and limit < ref * (1 - _POWER_LIMIT_TOLERANCE):
        which = "default" if summary.get("power_default_w") else "maximum"
        out.append(f"power limit {limit:.0f} W, below the GPU's {which} {ref:.0f} W")
    out += [r for r in summary.get("limiting") or [] if r != POWER_CAP]
    return out


def _mhz(hz: float) -> str:
    return f"{hz / 1e6:.0f} MHz"


def explain(gpu: Mapping, peers: Sequence[Mapping]) -> str | None:
    """A short likely cause for a GPU that measured slow, from its summary() and its peers'.

    Compares its median SM clock with the median of its peers' (with no peers, its sm_max_hz),
    names the limiting reasons seen, and a lower enforced power limit than its peers'. None when
    nothing stands out: the clock within 2 % of the reference (or unknown) and no limiting
    reason seen."""
    clock = gpu.get("sm_hz_median")
    peer_clocks = [p["sm_hz_median"] for p in peers if p.get("sm_hz_median") is not None]
    if peer_clocks:
        ref = statistics.median(peer_clocks)
    else:
        ref = gpu.get("sm_max_hz")
    low = None  # fraction below the reference, e.g. -0.29
    if clock is not None and ref:
        low = clock / ref - 1
        if low > -_CLOCK_TOLERANCE:
            low = None

    limit = gpu.get("power_limit_w")
    peer_limits = [p["power_limit_w"] for p in peers if p.get("power_limit_w") is not None]
    peer_limit = statistics.median(peer_limits) if peer_limits else None
    lower_limit = (limit is not None and peer_limit is not None
                   and limit < peer_limit * (1 - _POWER_LIMIT_TOLERANCE))
    limit_text = f"{limit:.0f} W vs {peer_limit:.0f} W on its peers" if lower_limit else ""

    limiting = list(gpu.get("limiting") or [])
    if low is None and not limiting:
        return None

    if low is not None:
        ref_text = f"{_mhz(ref)} on its peers" if peer_clocks else f"its max {_mhz(ref)}"
        head = f"SM clock {_mhz(clock)} vs {ref_text} ({low * 100:+.0f}%)"
    elif clock is not None and ref:
        head = f"SM clock {_mhz(clock)}, " + ("as on its peers" if peer_clocks else "near its max clock")
    else:
        head = "SM clock unknown"
    if not limiting:
        if lower_limit:
            return f"{head} with no throttle reason reported: a lower power limit ({limit_text})"
        if APP_CLOCKS in (gpu.get("reasons") or []):
            return f"{head}, application clocks seen: clocks set below the default (nvidia-smi -rac / -rgc)"
        return (f"{head} with no throttle reason reported: check application or locked clocks "
                "(nvidia-smi -q -d CLOCK)")

    seen = ", ".join(limiting) + " seen"
    temp = gpu.get("temp_c_max")
    if temp is not None and (THERMAL_SW in limiting or THERMAL_HW in limiting):
        seen += f", {temp:.0f} C"
    power = gpu.get("power_w_mean")
    if POWER_CAP in limiting and power is not None and limit is not None:
        seen += f", {power:.0f} W of {limit:.0f} W"
    causes = []  # most severe first
    if POWER_BRAKE in limiting:
        causes.append("hardware power brake (an external signal, e.g. the power supply)")
    if HW_SLOWDOWN in limiting:
        causes.append("hardware slowdown (overheating, power brake or a power excursion)")
    if THERMAL_SW in limiting or THERMAL_HW in limiting:
        causes.append("thermal throttling")
    if POWER_CAP in limiting:
        causes.append(f"power-capped at a lower power limit ({limit_text})" if lower_limit
                      else "power-capped")
    elif lower_limit:
        causes.append(f"a lower power limit ({limit_text})")
    return f"{head}, {seen}: {' and '.join(causes)}"


def series(samples: Sequence[Sample], t0: float) -> dict:
    """Samples as columns for JSON and plots: t (seconds since t0, a time.monotonic() value),
    sm_hz (Hz), power_w (W), temp_c (degrees C); None where a query failed."""
    return {
        "t": [s.t - t0 for s in samples],
        "sm_hz": [s.sm_hz for s in samples],
        "power_w": [s.power_w for s in samples],
        "temp_c": [s.temp_c for s in samples],
    }
