from __future__ import annotations

import copy
import importlib.resources
import json

import pytest

from mgpu_bench.core.errors import InputError
from mgpu_bench.machine import hardware as hw


@pytest.fixture()
def raw() -> dict:
    """A private copy of the shipped JSON, to break."""
    return copy.deepcopy(json.loads(
        importlib.resources.files("mgpu_bench").joinpath("data/hardware.json").read_text(encoding="utf-8")))


# ------------------------------------------------------------------------------- the data file

def test_data_file_ships_inside_the_package():
    assert importlib.resources.files("mgpu_bench").joinpath("data/hardware.json").is_file()


def test_shipped_file_validates():
    assert hw.validate(hw.load()) == []


def test_load_is_cached_and_versioned():
    assert hw.load() is hw.load()
    assert hw.load().schema_version == hw.SCHEMA_VERSION == 1


def test_every_required_model_is_listed():
    keys = set(hw.load().gpus)
    assert {"a100_sxm4_80gb", "a100_pcie_80gb", "h100_sxm5", "h100_pcie", "h200_sxm", "h20", "b200",
            "gb200", "l40s", "l4"} <= keys


def test_every_loaded_figure_has_a_source_and_bandwidths_a_direction():
    db = hw.load()
    figs = [f for g in db.gpus.values() for f in (g.memory, g.memory_bandwidth, g.nvlink_bandwidth,
                                                   g.pcie_bandwidth, *g.peak.values()) if f is not None]
    figs += [f for n in db.nvlink.values() for f in (n.per_link, n.per_link_raw) if f is not None]
    figs += [f for p in db.pcie.values() for f in (p.per_lane, p.x16)] + list(db.network.values())
    assert len(figs) > 100
    for f in figs:
        assert f.source.strip() and f.source not in db.data["sources"]  # resolved to the citation
        assert f.unit in hw.UNITS
        assert (f.direction in hw.DIRECTIONS) if f.unit == "B/s" else f.direction is None
        assert f.value is None and f.note or f.value > 0


def test_figure_without_source_is_reported(raw):
    del raw["gpus"]["h200_sxm"]["peak"]["bf16"]["source"]
    raw["network"]["NDR"]["source"] = "no-such-document"
    problems = hw.validate(raw)
    assert "gpus.h200_sxm.peak.bf16: no source" in problems
    assert any(p.startswith("network.NDR: source 'no-such-document'") for p in problems)


def test_bandwidth_without_direction_is_reported(raw):
    del raw["gpus"]["l4"]["memory_bandwidth"]["direction"]
    raw["nvlink"]["4"]["per_link"]["direction"] = "bidirectional"
    problems = hw.validate(raw)
    assert any(p.startswith("gpus.l4.memory_bandwidth: bandwidth without a direction") for p in problems)
    assert "nvlink.4.per_link: direction is bidirectional, must be per_direction" in problems


def test_duplicate_match_string_is_reported(raw):
    raw["gpus"]["h20"]["match"].append("nvidia h200 ")  # another model's name, other case/spacing
    problems = hw.validate(raw)
    assert "gpus.h20.match: 'nvidia h200 ' is also a match string of gpus.h200_sxm" in problems \
        or "gpus.h200_sxm.match: 'NVIDIA H200' is also a match string of gpus.h20" in problems
    # and a database built from it maps the shared name to neither model
    assert hw.from_dict(raw).find_gpu("NVIDIA H200") is None


@pytest.mark.parametrize("mutate, expect", [
    (lambda d: d["gpus"]["b200"]["peak"]["fp8"].__setitem__("unit", "TFLOP/s"), "is not a base unit"),
    (lambda d: d["gpus"]["b200"]["peak"]["fp8"].__setitem__("value", -1), "is not a positive number"),
    (lambda d: d["gpus"]["b200"]["peak"]["fp8"].update(value=None, note=None), "null value without a note"),
    (lambda d: d["gpus"]["b200"]["peak"].pop("tf32"), "gpus.b200.peak.tf32: missing"),
    (lambda d: d["gpus"]["b200"].__setitem__("nvlink_links", 12), "is not 12 links"),
    (lambda d: d["gpus"]["b200"].__setitem__("pcie_generation", 9), "is not in the pcie section"),
    (lambda d: d["gpus"]["b200"]["memory"].__setitem__("direction", "aggregate"), "not a bandwidth"),
    (lambda d: d["pcie"]["5"]["x16"].__setitem__("value", 64e9), "is not 16 x per_lane"),
    (lambda d: d.__setitem__("schema_version", 2), "schema_version is 2"),
])
def test_other_problems_are_reported(raw, mutate, expect):
    mutate(raw)
    problems = hw.validate(raw)
    assert any(expect in p for p in problems), problems


def test_validate_survives_a_mangled_file():
    assert hw.validate([]) == ["hardware data is not a JSON object"]
    assert hw.validate({"schema_version": 1, "gpus": {"x": 3}})  # reports, does not raise


# ----------------------------------------------------------------------------------- GPU lookup

def test_h200_is_found_with_its_datasheet_figures():
    g = hw.find_gpu("NVIDIA H200")
    assert g is not None and g.key == "h200_sxm"
    assert g.peak["bf16"].value == 989e12 and g.peak["fp16"].value == 989e12
    assert g.peak["tf32"].value == 494.5e12 and g.peak["fp32"].value == 67e12
    assert g.peak["fp8"].value == 1979e12
    assert g.memory_bandwidth.value == 4.8e12 and g.memory_bandwidth.direction == "aggregate"
    assert g.compute_capability == (9, 0)
    assert (g.nvlink_generation, g.nvlink_links, g.pcie_generation, g.pcie_width) == (4, 18, 5, 16)
    assert "H200" in g.peak["bf16"].source


def test_device_names_as_drivers_report_them():
    assert hw.find_gpu("NVIDIA H100 80GB HBM3").key == "h100_sxm5"
    assert hw.find_gpu("NVIDIA H100 PCIe").key == "h100_pcie"
    assert hw.find_gpu("NVIDIA A100-SXM4-80GB").key == "a100_sxm4_80gb"
    assert hw.find_gpu("NVIDIA A100 80GB PCIe").key == "a100_pcie_80gb"
    assert hw.find_gpu("NVIDIA L40S").key == "l40s"
    assert hw.find_gpu("NVIDIA L4").key == "l4"
    assert hw.find_gpu("NVIDIA H20").key == "h20"
    assert hw.find_gpu("NVIDIA B200").key == "b200"
    assert hw.find_gpu("NVIDIA GB200").key == "gb200"


def test_match_is_trimmed_and_case_blind():
    assert hw.find_gpu("  nvidia h200\n").key == "h200_sxm"
    assert hw.find_gpu("NVIDIA A100-sxm4-80gb").key == "a100_sxm4_80gb"


@pytest.mark.parametrize("name", [
    "NVIDIA H999", "Tesla T4", "", "NVIDIA H200 NVL", "NVIDIA H100 NVL", "NVIDIA H100",
    "NVIDIA A100-SXM4-40GB", "NVIDIA L40", "NVIDIA GeForce RTX 4090", "H200", "NVIDIA",
])
def test_unknown_gpus_give_none_not_a_neighbour(name):
    assert hw.find_gpu(name) is None


def test_a_substring_of_another_models_name_does_not_match_it():
    # "NVIDIA H20" is inside "NVIDIA H200"; "NVIDIA L4" inside "NVIDIA L40S"; "NVIDIA B200" inside
    # "NVIDIA GB200": each must find its own model and nothing else.
    assert hw.find_gpu("NVIDIA H20").key == "h20" and hw.find_gpu("NVIDIA H200").key == "h200_sxm"
    assert hw.find_gpu("NVIDIA L4").key == "l4" and hw.find_gpu("NVIDIA L40S").key == "l40s"
    assert hw.find_gpu("NVIDIA B200").key == "b200" and hw.find_gpu("NVIDIA GB200").key == "gb200"
    assert hw.find_gpu("NVIDIA H2") is None and hw.find_gpu("NVIDIA L") is None


def test_a100_has_no_fp8_and_ada_no_fp64_tensor():
    a100 = hw.find_gpu("NVIDIA A100-SXM4-80GB")
    assert a100.peak["fp8"].value is None and "FP8" in a100.peak["fp8"].note
    assert a100.peak["bf16"].value == 312e12 and a100.peak["tf32"].value == 156e12
    assert hw.find_gpu("NVIDIA L40S").peak["fp64_tensor"].value is None
    assert hw.find_gpu("NVIDIA L4").nvlink_generation is None
    assert hw.find_gpu("NVIDIA L4").nvlink_links is None


def test_b200_matches_the_anchor_figures():
    b200 = hw.find_gpu("NVIDIA B200")
    assert b200.peak["bf16"].value == 2250e12 and b200.peak["fp8"].value == 4500e12
    assert b200.nvlink_generation == 5 and b200.nvlink_links == 18


# -------------------------------------------------------------------------------- link rates

def test_nvlink4_per_link_nominal_and_raw():
    nominal = hw.nvlink_rate(4)
    assert nominal.value == 25e9 and nominal.direction == "per_direction" and nominal.unit == "B/s"
    raw = hw.nvlink_rate(4, raw=True)
    assert raw.value == 26.5625e9 and raw.direction == "per_direction"


def test_nvlink_totals_per_direction():
    h200 = hw.find_gpu("NVIDIA H200")
    assert h200.nvlink_links * hw.nvlink_rate(h200.nvlink_generation).value == 450e9
    assert hw.nvlink_total(h200).value == 450e9
    assert hw.nvlink_total(h200, raw=True).value == pytest.approx(478.125e9)
    assert hw.nvlink_total(hw.find_gpu("NVIDIA B200")).value == 900e9
    assert hw.nvlink_total(hw.find_gpu("NVIDIA A100-SXM4-80GB")).value == 300e9
    assert hw.nvlink_total(hw.find_gpu("NVIDIA L40S")) is None
    # the datasheet's bidirectional total is twice the per-direction sum
    assert h200.nvlink_bandwidth.value == 900e9 and h200.nvlink_bandwidth.direction == "bidirectional"


def test_other_nvlink_generations():
    assert hw.nvlink_rate(3).value == 25e9 and hw.nvlink_rate(3, raw=True).value == 25e9
    assert hw.nvlink_rate(5).value == 50e9 and hw.nvlink_rate(5, raw=True).value == 53.125e9
    assert hw.nvlink_rate(2, raw=True).value == 25.78125e9
    with pytest.raises(InputError, match="choose from 2, 3, 4, 5"):
        hw.nvlink_rate(7)


def test_pcie_rates_per_direction_after_encoding():
    gen5 = hw.pcie_rate(5, 16)
    assert gen5.value == pytest.approx(63.015e9, rel=1e-4) and gen5.direction == "per_direction"
    assert hw.pcie_rate(4, 16).value == pytest.approx(31.5e9, rel=1e-3)
    assert hw.pcie_rate(3, 1).value == pytest.approx(0.985e9, rel=1e-3)
    assert hw.pcie_rate(6, 1).value == pytest.approx(7.5625e9)
    assert hw.pcie_rate(6, 16).value == pytest.approx(121e9)
    assert hw.pcie_rate(5, 8).value == pytest.approx(gen5.value / 2)
    assert hw.pcie_rate(5, 16).value == pytest.approx(hw.load().pcie[5].x16.value)
    with pytest.raises(InputError, match="x3 is not a link width"):
        hw.pcie_rate(5, 3)
    with pytest.raises(InputError, match="no PCIe generation '9'"):
        hw.pcie_rate(9, 16)


@pytest.mark.parametrize("name, rate", [
    ("NDR", 50e9), ("ndr", 50e9), ("IB NDR", 50e9), ("InfiniBand HDR", 25e9), ("HDR", 25e9),
    ("NDR200", 25e9), ("XDR", 100e9), ("EDR", 12.5e9), ("HDR100", 12.5e9), ("100GbE", 12.5e9),
    ("200GbE", 25e9), ("400 GbE", 50e9), ("800GbE", 100e9),
])
def test_network_rates_per_port_per_direction(name, rate):
    fig = hw.network_rate(name)
    assert fig.value == rate and fig.direction == "per_direction" and fig.unit == "B/s"


def test_unknown_network_names_the_choices():
    with pytest.raises(InputError, match="unknown network 'QDR': choose from .*NDR"):
        hw.network_rate("QDR")


# ------------------------------------------------------------------------ peaks and overrides

def test_peak_flops_from_the_database():
    fig = hw.peak_flops("NVIDIA H200", "bf16")
    assert fig.value == 989e12 and fig.unit == "FLOP/s" and fig.source != hw.USER_OVERRIDE
    assert hw.peak_flops("NVIDIA H200", "bfloat16").value == 989e12
    assert hw.peak_flops("NVIDIA H200", "fp8_e4m3").value == 1979e12
    assert hw.peak_flops("NVIDIA H200", "int8").unit == "OP/s"


def test_peak_flops_none_where_there_is_no_figure():
    assert hw.peak_flops("NVIDIA H999", "bf16") is None
    assert hw.peak_flops("NVIDIA A100-SXM4-80GB", "fp8") is None  # no FP8 unit
    assert hw.peak_flops("NVIDIA L4", "fp64") is None  # not in the datasheet


def test_overrides_win_and_are_labelled():
    fig = hw.peak_flops("NVIDIA H200", "bf16", {"bf16": 800e12})
    assert fig.value == 800e12 and fig.source == hw.USER_OVERRIDE
    unknown = hw.peak_flops("NVIDIA H999", "bfloat16", hw.parse_peak_overrides("bf16=500"))
    assert unknown.value == 500e12 and unknown.source == "user override"
    # an override for another dtype does not stand in for this one
    assert hw.peak_flops("NVIDIA H999", "fp16", {"bf16": 500e12}) is None
    assert hw.peak_flops("NVIDIA H200", "fp16", {"bf16": 500e12}).value == 989e12
    with pytest.raises(InputError, match="positive"):
        hw.peak_flops("NVIDIA H200", "bf16", {"bf16": 0.0})


def test_peak_flops_rejects_an_unknown_dtype():
    with pytest.raises(InputError, match="unknown dtype 'fp7'"):
        hw.peak_flops("NVIDIA H200", "fp7")


def test_parse_peak_overrides_good():
    assert hw.parse_peak_overrides("bf16=989,fp8=1979") == {"bf16": 989e12, "fp8": 1979e12}
    assert hw.parse_peak_overrides(" BF16 = 989.5 , tf32=494.5, ") == {"bf16": 989.5e12, "tf32": 494.5e12}
    assert hw.parse_peak_overrides("bfloat16=1e3") == {"bf16": 1000e12}
    assert hw.parse_peak_overrides("") == {}


@pytest.mark.parametrize("text, message", [
    ("bf16", "has no '='"),
    ("bf16:989", "has no '='"),
    ("fp7=100", "unknown dtype 'fp7'"),
    ("=100", "unknown dtype ''"),
    ("bf16=fast", "'fast' is not a number"),
    ("bf16=", "'' is not a number"),
    ("bf16=0", "positive"),
    ("bf16=-5", "positive"),
    ("bf16=nan", "positive"),
    ("bf16=inf", "positive"),
    ("bf16=1,bfloat16=2", "given twice"),
])
def test_parse_peak_overrides_bad(text, message):
    with pytest.raises(InputError, match=message) as info:
        hw.parse_peak_overrides(text)
    assert "\n" not in str(info.value)
