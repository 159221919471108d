"""mgpu_bench.machine.telemetry: the sampler over a stand-in NVML, the reason words, the summaries and
the explanations; one GPU test samples a real GPU.

The stand-in answers with pynvml's function names and units (MHz, mW, C) and raises its own
NVMLError class, so nothing here depends on pynvml's error table. The real pynvml is exercised
too: without a driver the sampler must say so in `error`, not raise.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest

from mgpu_bench.machine import telemetry
from mgpu_bench.machine.telemetry import Sample, Sampler, explain, reason_names, series, summarize

NOT_SUPPORTED, NOT_FOUND, LIBRARY_NOT_FOUND = 3, 6, 12  # nvmlReturn_t

# ---------------------------------------------------------------------------------------------
# a stand-in for pynvml


class FakeNVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """Two H200s as NVML reports them; bus ids in NVML's own spelling, the only one this
    stand-in accepts (the sampler must translate). `fail` holds (gpu, function name) pairs that
    raise FakeNVMLError(NOT_SUPPORTED)."""

    def __init__(self, fail: set | None = None, init_error: int | None = None, bytes_only: bool = False):
        self.gpus = {
            "00000000:18:00.0": {"name": "NVIDIA H200", "sm": [1980, 1755], "mem": 3201,
                                 "mw": [700_000, 690_000], "temp": 61, "reasons": [0x1, 0x4],
                                 "max_sm": 1980, "limit_mw": 700_000},
            "00000000:2A:00.0": {"name": "NVIDIA H200", "sm": [1410], "mem": 3201, "mw": [650_000],
                                 "temp": 91, "reasons": [0x40], "max_sm": 1980, "limit_mw": 650_000},
        }
        self.fail = fail or set()
        self.init_error = init_error
        self.bytes_only = bytes_only
        self.inits = self.shutdowns = 0
        self.calls: dict[str, int] = {}  # function name -> calls, all GPUs
        self.rounds: dict[tuple[str, str], int] = {}  # (handle, function name) -> calls

    def _gpu(self, name: str, h) -> dict:
        self.calls[name] = self.calls.get(name, 0) + 1
        if (h, name) in self.fail:
            raise FakeNVMLError(NOT_SUPPORTED)
        return self.gpus[h]

    def _next(self, h, name: str, key: str):
        """Cycles through the GPU's scripted readings, one per call."""
        values = self._gpu(name, h)[key]
        k = self.rounds[h, name] = self.rounds.get((h, name), 0) + 1
        return values[(k - 1) % len(values)]

    def nvmlInit(self):
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        if self.bytes_only and not isinstance(bus, bytes):
            raise TypeError("bytes or integer address expected instead of str instance")  # as ctypes says
        bus = bus.decode() if isinstance(bus, bytes) else bus
        if bus not in self.gpus:
            raise FakeNVMLError(NOT_FOUND)
        return bus  # the handle is the bus id

    def nvmlDeviceGetName(self, h):
        return self._gpu("nvmlDeviceGetName", h)["name"].encode()  # older bindings give bytes

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        assert clock == 1  # SM
        return self._gpu("nvmlDeviceGetMaxClockInfo", h)["max_sm"]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", h)["limit_mw"]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        self._gpu("nvmlDeviceGetPowerManagementDefaultLimit", h)
        return 700_000

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h):
        self._gpu("nvmlDeviceGetPowerManagementLimitConstraints", h)
        return (200_000, 700_000)

    def nvmlDeviceGetClockInfo(self, h, clock):
        if clock == 1:
            return self._next(h, "nvmlDeviceGetClockInfo", "sm")
        return self._gpu("nvmlDeviceGetClockInfo", h)["mem"]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._next(h, "nvmlDeviceGetPowerUsage", "mw")

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        return self._gpu("nvmlDeviceGetTemperature", h)["temp"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._next(h, "nvmlDeviceGetCurrentClocksEventReasons", "reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._next(h, "nvmlDeviceGetCurrentClocksThrottleReasons", "reasons")

    def module(self, drop: tuple[str, ...] = ()) -> SimpleNamespace:
        """The stand-in as a module: its nvml* functions less `drop`, and NVMLError."""
        names = [n for n in dir(self) if n.startswith("nvml") and n not in drop]
        return SimpleNamespace(NVMLError=FakeNVMLError, **{n: getattr(self, n) for n in names})


BUS = {0: "0000:18:00.0", 1: "00000000:2a:00.0"}  # sysfs' and NVML's spelling, lower-case hex


def _run(fake: FakeNvml, bus=BUS, seconds: float = 0.05, **kw) -> Sampler:
    with Sampler(bus, interval_s=0.01, nvml=fake.module(**kw)) as s:
        thread = s._thread
        time.sleep(seconds)
    assert thread is None or not thread.is_alive()
    return s


# ---------------------------------------------------------------------------------------------
# the sampler


def test_sampler_collects_and_stops():
    fake = FakeNvml()
    s = Sampler(BUS, interval_s=0.01, nvml=fake.module())
    with s:
        thread = s._thread
        assert thread is not None and thread.is_alive() and thread.daemon
        assert s.running
        time.sleep(0.05)
    assert not thread.is_alive() and not s.running
    assert s.error is None and s.warnings == []
    assert fake.inits == fake.shutdowns == 1
    for i in (0, 1):
        got = s.samples[i]
        assert len(got) >= 2
        assert [x.t for x in got] == sorted(x.t for x in got)
    # units: MHz -> Hz, mW -> W; the scripted readings in turn
    first, second = s.samples[0][:2]
    assert first == Sample(t=first.t, sm_hz=1980e6, mem_hz=3201e6, power_w=700.0, temp_c=61.0, reasons=0x1)
    assert (second.sm_hz, second.power_w, second.reasons) == (1755e6, 690.0, 0x4)
    assert s.samples[1][0].temp_c == 91.0
    assert s.static == {
        0: {"name": "NVIDIA H200", "pci_bus_id": "0000:18:00.0", "sm_max_hz": 1980e6, "power_limit_w": 700.0,
            "power_default_w": 700.0, "power_max_w": 700.0},
        1: {"name": "NVIDIA H200", "pci_bus_id": "0000:2a:00.0", "sm_max_hz": 1980e6, "power_limit_w": 650.0,
            "power_default_w": 700.0, "power_max_w": 700.0},
    }
    n = len(s.samples[0])
    time.sleep(0.03)
    assert len(s.samples[0]) == n  # stopped means stopped


def test_short_probe_still_has_two_samples():
    fake = FakeNvml()
    with Sampler(BUS, interval_s=60, nvml=fake.module()) as s:
        pass
    assert [len(s.samples[i]) for i in (0, 1)] == [2, 2]


def test_stop_is_idempotent_and_start_once():
    fake = FakeNvml()
    s = Sampler(BUS, interval_s=60, nvml=fake.module())
    s.start()
    s.start()
    s.stop()
    s.stop()
    assert fake.inits == fake.shutdowns == 1
    assert len(s.samples[0]) == 2


def test_bus_id_as_bytes_for_older_bindings():
    s = _run(FakeNvml(bytes_only=True))
    assert s.error is None
    assert all(len(s.samples[i]) >= 2 for i in (0, 1))


def test_failing_query_gives_none_not_a_crash():
    fake = FakeNvml(fail={("00000000:2A:00.0", "nvmlDeviceGetTemperature"),
                          ("00000000:2A:00.0", "nvmlDeviceGetEnforcedPowerLimit")})
    s = _run(fake)
    assert s.error is None
    assert len(s.samples[1]) >= 2
    assert all(x.temp_c is None for x in s.samples[1])
    assert all(x.sm_hz == 1410e6 and x.power_w == 650.0 for x in s.samples[1])  # the rest still read
    assert all(x.temp_c == 61.0 for x in s.samples[0])  # the other GPU untouched
    assert s.static[1]["power_limit_w"] is None
    # one line per GPU and field, however many samples failed
    assert len(s.warnings) == 2
    assert any(w.startswith("GPU 1 temp_c: NVML error 3") for w in s.warnings)
    assert fake.calls["nvmlDeviceGetTemperature"] > 2 * 2


def test_older_binding_uses_throttle_reasons():
    fake = FakeNvml()
    s = _run(fake, drop=("nvmlDeviceGetCurrentClocksEventReasons",))
    assert s.error is None
    assert s.samples[1][0].reasons == 0x40
    assert "nvmlDeviceGetCurrentClocksEventReasons" not in fake.calls
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] >= 4


def test_a_gpu_nvml_cannot_find_is_a_warning_all_of_them_an_error():
    s = _run(FakeNvml(), bus={0: "0000:18:00.0", 5: "0000:99:00.0"})
    assert s.error is None
    assert s.samples[5] == [] and len(s.samples[0]) >= 2
    assert s.warnings == ["GPU 5: no NVML handle for bus id '0000:99:00.0': NVML error 6"]

    fake = FakeNvml()
    s = _run(fake, bus={0: "0000:99:00.0", 1: None})
    assert s.error.startswith("no GPU found through NVML: GPU 0: no NVML handle")
    assert "GPU 1: no NVML handle for bus id None: no bus id" in s.error
    assert s.samples == {0: [], 1: []}
    assert fake.inits == fake.shutdowns == 1


def test_nvml_init_failing_gives_error_not_exception():
    fake = FakeNvml(init_error=LIBRARY_NOT_FOUND)
    with Sampler(BUS, nvml=fake.module()) as s:
        assert s._thread is None
    assert s.error.startswith("nvmlInit failed: NVML error 12")
    assert "is the NVIDIA driver installed?" in s.error
    assert s.samples == {0: [], 1: []}
    assert s.window(0, 0, float("inf")) == []


def test_binding_surprise_is_contained():
    fake = FakeNvml()
    mod = fake.module()

    def broken(h, clock):
        raise RuntimeError("binding bug")

    mod.nvmlDeviceGetClockInfo = broken
    with Sampler(BUS, nvml=mod) as s:
        pass
    assert s.error == "NVML setup failed: RuntimeError('binding bug')"
    assert fake.shutdowns == 1


def test_real_pynvml_without_driver_gives_error():
    """The real binding: with no driver nvmlInit fails; on a GPU machine no GPU sits at this bus
    id. Either way `error` says why, and nothing raises."""
    pytest.importorskip("pynvml")
    with Sampler({0: "ffff:ff:1f.7"}, interval_s=0.01) as s:
        pass
    assert isinstance(s.error, str) and s.error
    assert s.samples == {0: []}


def test_pynvml_missing_gives_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with Sampler({0: "0000:18:00.0"}) as s:
        pass
    assert s.error.startswith("nvidia-ml-py is not installed")


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        Sampler(BUS, interval_s=0)


def test_window():
    s = Sampler({0: "x"}, nvml=FakeNvml().module())
    s.samples[0] = [Sample(t=float(t)) for t in range(10)]
    assert [x.t for x in s.window(0, 2.0, 4.0)] == [2.0, 3.0, 4.0]
    assert [x.t for x in s.window(0, 2.5, 2.6)] == []
    assert [x.t for x in s.window(0, 2.5, 2.6, margin_s=0.5)] == [2.0, 3.0]
    assert s.window(7, 0, 10) == []


# ---------------------------------------------------------------------------------------------
# reasons


def test_reason_table_matches_nvml_h():
    # nvml.h's nvmlClocksEventReason* values (nvidia-ml-py carries the same constants)
    pynvml = pytest.importorskip("pynvml")
    names = {bit: f"nvmlClocksEventReason{short}" for bit, (short, _words) in telemetry.REASONS.items()}
    missing = [name for name in names.values() if not hasattr(pynvml, name)]
    assert missing == [], f"nvidia-ml-py has no {', '.join(missing)}: a reason name of ours that NVML lacks"
    assert {bit: getattr(pynvml, name) for bit, name in names.items()} == {bit: bit for bit in names}


def test_reason_names():
    assert reason_names(None) == []
    assert reason_names(0) == []
    assert reason_names(0x4) == ["power cap (software)"]
    assert reason_names(0x4 | 0x40) == ["power cap (software)", "thermal (hardware)"]
    assert reason_names(0x1 | 0x2 | 0x10 | 0x100) == ["idle", "application clocks", "sync boost",
                                                      "display clock"]
    assert reason_names(0x8 | 0x20 | 0x80) == ["hardware slowdown", "thermal (software)",
                                               "power brake (hardware)"]
    assert reason_names(0x4 | 0x200 | 0x1000) == ["power cap (software)", "0x200", "0x1000"]


# ---------------------------------------------------------------------------------------------
# summaries


def _s(t, sm=None, mem=None, w=None, c=None, r=None) -> Sample:
    return Sample(t=t, sm_hz=sm, mem_hz=mem, power_w=w, temp_c=c, reasons=r)


def test_summarize_numbers():
    samples = [
        _s(0.0, 1980e6, 3201e6, 120.0, 40.0, 0x1),  # idle at start
        _s(0.1, 1410e6, 3201e6, 700.0, 70.0, 0x4),
        _s(0.2, None, None, 690.0, None, None),  # a failed round
        _s(0.3, 1755e6, 2619e6, None, 82.0, 0x4 | 0x20),
        _s(0.4, 1500e6, 3201e6, 650.0, 80.0, 0x10),
    ]
    got = summarize(samples, {"sm_max_hz": 1980e6, "power_limit_w": 700.0, "name": "NVIDIA H200"})
    assert got == {
        "samples": 5,
        "sm_hz_median": (1500e6 + 1755e6) / 2,  # of 1410, 1500, 1755, 1980 MHz
        "sm_hz_min": 1410e6,
        "sm_hz_max": 1980e6,
        "sm_max_hz": 1980e6,
        "mem_hz_median": 3201e6,
        "power_w_mean": pytest.approx((120 + 700 + 690 + 650) / 4),  # 540 W
        "power_w_max": 700.0,
        "power_limit_w": 700.0,
        "power_default_w": None,
        "power_max_w": None,
        "temp_c_max": 82.0,
        "temp_c_mean": pytest.approx((40 + 70 + 82 + 80) / 4),  # 68 C
        "reasons": ["power cap (software)", "sync boost", "thermal (software)"],  # no 'idle'
        "limiting": ["power cap (software)", "thermal (software)"],
    }


def test_summarize_odd_count_and_no_static():
    got = summarize([_s(0, 1e9, w=100.0), _s(1, 3e9, w=200.0), _s(2, 2e9, w=600.0)])
    assert (got["sm_hz_median"], got["sm_hz_min"], got["sm_hz_max"]) == (2e9, 1e9, 3e9)
    assert got["power_w_mean"] == pytest.approx(300.0)
    assert got["sm_max_hz"] is None and got["power_limit_w"] is None
    assert got["reasons"] == [] and got["limiting"] == []


def test_summarize_empty():
    got = summarize([])
    assert got["samples"] == 0
    assert got["reasons"] == [] and got["limiting"] == []
    assert all(v is None for k, v in got.items() if k not in ("samples", "reasons", "limiting"))


def test_series():
    samples = [_s(10.0, 1e9, w=100.0, c=50.0), _s(10.5, 2e9, w=None, c=51.0)]
    assert series(samples, 10.0) == {"t": [0.0, 0.5], "sm_hz": [1e9, 2e9], "power_w": [100.0, None],
                                     "temp_c": [50.0, 51.0]}
    assert series([], 0.0) == {"t": [], "sm_hz": [], "power_w": [], "temp_c": []}


# ---------------------------------------------------------------------------------------------
# explanations


def _summary(**kw) -> dict:
    base = summarize([], {"sm_max_hz": 1980e6, "power_limit_w": 700.0})
    base.update(samples=20, sm_hz_median=1980e6, power_w_mean=600.0, temp_c_max=60.0)
    base.update(kw)
    base["limiting"] = [r for r in base["reasons"] if r in telemetry.LIMITING]
    return base


PEERS = [_summary(), _summary(sm_hz_median=1975e6), _summary(sm_hz_median=1985e6)]


def test_explain_power_capped():
    gpu = _summary(sm_hz_median=1410e6, power_w_mean=698.0, reasons=["power cap (software)"])
    assert explain(gpu, PEERS) == ("SM clock 1410 MHz vs 1980 MHz on its peers (-29%), power cap (software) "
                                   "seen, 698 W of 700 W: power-capped")


def test_explain_thermal():
    gpu = _summary(sm_hz_median=1600e6, temp_c_max=91.0, reasons=["thermal (hardware)"])
    assert explain(gpu, PEERS) == ("SM clock 1600 MHz vs 1980 MHz on its peers (-19%), thermal (hardware) "
                                   "seen, 91 C: thermal throttling")


def test_explain_lower_power_limit():
    gpu = _summary(sm_hz_median=1881e6, power_limit_w=650.0)
    text = explain(gpu, PEERS)
    assert text == ("SM clock 1881 MHz vs 1980 MHz on its peers (-5%) with no throttle reason reported: "
                    "a lower power limit (650 W vs 700 W on its peers)")
    capped = _summary(sm_hz_median=1700e6, power_limit_w=650.0, power_w_mean=649.0,
                      reasons=["power cap (software)"])
    assert explain(capped, PEERS).endswith("power cap (software) seen, 649 W of 650 W: power-capped at a "
                                           "lower power limit (650 W vs 700 W on its peers)")


def test_explain_slow_clock_without_reason():
    text = explain(_summary(sm_hz_median=1881e6), PEERS)
    assert text.startswith("SM clock 1881 MHz vs 1980 MHz on its peers (-5%) with no throttle reason")
    assert "application or locked clocks" in text
    app = explain(_summary(sm_hz_median=1500e6, reasons=["application clocks"]), PEERS)
    assert "application clocks seen" in app


def test_explain_healthy_is_none():
    assert explain(_summary(sm_hz_median=1960e6), PEERS) is None  # -1 %: within 2 %
    assert explain(_summary(reasons=["sync boost"]), PEERS) is None  # not a limiting reason
    assert explain(_summary(power_limit_w=650.0), PEERS) is None  # a lower limit that did not bite
    assert explain(summarize([]), []) is None  # nothing measured


def test_explain_limiting_reason_at_peer_clock_still_said():
    gpu = _summary(reasons=["power cap (software)"], power_w_mean=700.0)
    assert explain(gpu, PEERS) == "SM clock 1980 MHz, as on its peers, power cap (software) seen, " \
                                  "700 W of 700 W: power-capped"


def test_explain_severe_reasons_first():
    gpu = _summary(sm_hz_median=900e6, temp_c_max=95.0,
                   reasons=["hardware slowdown", "power brake (hardware)", "thermal (hardware)"])
    text = explain(gpu, PEERS)
    assert text.startswith("SM clock 900 MHz vs 1980 MHz on its peers (-55%), ")
    assert "95 C" in text
    causes = text.split(": ", 1)[1]
    order = [causes.index(w) for w in ("power brake", "hardware slowdown", "thermal throttling")]
    assert order == sorted(order)


def test_explain_single_gpu_compares_with_its_max_clock():
    gpu = _summary(sm_hz_median=1755e6, power_w_mean=699.0, reasons=["power cap (software)"])
    assert explain(gpu, []) == ("SM clock 1755 MHz vs its max 1980 MHz (-11%), power cap (software) "
                                "seen, 699 W of 700 W: power-capped")
    assert explain(_summary(sm_hz_median=1970e6), []) is None


# ---------------------------------------------------------------------------------------------
# a real GPU


@pytest.mark.gpu
def test_real_sampler_on_gpu0():
    from mgpu_bench import _native

    bus = _native.device_info(0)["pci_bus_id"]
    with Sampler({0: bus}, interval_s=0.05) as s:
        time.sleep(0.3)
    assert s.error is None, s.error
    got = s.samples[0]
    assert len(got) >= 2
    assert all(x.sm_hz and x.sm_hz > 0 for x in got)
    assert all(x.power_w and x.power_w > 0 for x in got)
    assert s.static[0]["sm_max_hz"] and s.static[0]["power_limit_w"]
    summary = summarize(got, s.static[0])
    assert summary["samples"] == len(got) and summary["sm_hz_median"] > 0
