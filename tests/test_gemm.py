"""The GEMM probe's Python side on CPU: parsing, FLOP counting, outliers, verdicts, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.core.errors import InputError
from mgpu_bench.machine import hardware
from mgpu_bench.probes.gemm import analyse as gemm_analyse
from mgpu_bench.probes.gemm import document as gemm_document
from mgpu_bench.probes.gemm import measure as gemm
from mgpu_bench.probes.gemm import render as gemm_render
from mgpu_bench.probes.gemm.measure import Candidate, GemmConfig, GemmResult, GemmRun, Shape
from mgpu_bench.results import sizes

H200 = hardware.Figure(989e12, "FLOP/s", "nvidia-h200-datasheet")


def cand(index: int, seconds: list[float], max_error: float | None = 1e-4, error: str | None = None) -> Candidate:
    ident = {"algo_id": 66, "tile": 20 + index, "stages": 35, "split_k": 1, "reduction": 0, "swizzle": 0,
             "custom": 0, "cluster": 2, "workspace": 0, "waves": 1.0}
    return Candidate(index, ident, seconds, 10, max_error, error)


BIG = Shape(8192, 8192, 8192)


def result(gpu: int, tflops: float, shape=BIG, dtype="bf16", spread=0.001, **kw) -> GemmResult:
    s = shape.flops / (tflops * 1e12)
    samples = [s * (1 + spread * d) for d in (-2, -1, 0, 1, 2)]
    return GemmResult(gpu=gpu, gpu_name="NVIDIA H200", dtype=dtype, shape=shape, layout="NN",
                      candidates=[cand(0, [x * 1.05 for x in samples]), cand(1, samples)], buffer_sets=1,
                      checked_elements=1024, seconds_wall=0.5, peak=H200, **kw)


# -- parsing ---------------------------------------------------------------------------------

def test_flops_are_two_m_n_k():
    assert Shape(8192, 8192, 8192).flops == 2 * 8192**3
    assert Shape(4096, 1024, 512).flops == 2 * 4096 * 1024 * 512


@pytest.mark.parametrize("text,want", [
    ("8192", (Shape(8192, 8192, 8192),)),
    ("4096x8192x1024", (Shape(4096, 8192, 1024),)),
    ("8k, 1024x2048x4096", (Shape(8192, 8192, 8192), Shape(1024, 2048, 4096))),
    ("8192,8192", (Shape(8192, 8192, 8192),)),
])
def test_parse_shapes(text, want):
    assert gemm.parse_shapes(text) == want


@pytest.mark.parametrize("text", ["0", "-5", "8192x0x8192", "4x4", "abc", "", "1x2x3x4", str(1 << 21)])
def test_parse_shapes_rejects(text):
    with pytest.raises(InputError):
        gemm.parse_shapes(text)


def test_parse_dtypes_aliases_and_errors():
    assert gemm.parse_dtypes("bf16, bfloat16,FP8,float32") == ("bf16", "fp8", "fp32")
    for bad in ("fp7", "int4", ",", "fp8_e5m2"):
        with pytest.raises(InputError):
            gemm.parse_dtypes(bad)


def test_layout_rules():
    assert gemm.layout_for("bf16", gemm.parse_layout("auto")) == "NN"
    assert gemm.layout_for("fp8", gemm.parse_layout("auto")) == "TN"
    assert gemm.layout_for("fp8", gemm.parse_layout("tn")) == "TN"
    with pytest.raises(InputError):
        gemm.layout_for("fp8", "NN")
    with pytest.raises(InputError):
        gemm.parse_layout("NX")


def test_parse_duration_and_range():
    assert sizes.parse_duration("60s") == 60 and sizes.parse_duration("2m") == 120
    assert sizes.parse_duration("1.5") == 1.5 and sizes.parse_duration("1h") == 3600
    for bad in ("0s", "-1", "1y", "", "8d"):
        with pytest.raises(InputError):
            sizes.parse_duration(bad)
    assert gemm.parse_range("2048:8192:2048") == (2048, 4096, 6144, 8192)
    assert gemm.parse_range("1k:3k:1k") == (1024, 2048, 3072)
    for bad in ("1:2", "4096:2048:1024", "1:100000:1", "0:4:1"):
        with pytest.raises(InputError):
            gemm.parse_range(bad)


def test_operand_bytes():
    assert gemm.operand_bytes("bf16", Shape(8192, 8192, 8192)) == 3 * 8192 * 8192 * 2
    # fp8 inputs are one byte, the bf16 output two
    assert gemm.operand_bytes("fp8", Shape(4, 8, 16)) == (4 * 16 + 16 * 8) + 4 * 8 * 2


# -- peaks and validation --------------------------------------------------------------------

def test_peak_for_uses_database_and_overrides():
    assert gemm.peak_for("NVIDIA H200", "bf16", {}).value == 989e12
    assert gemm.peak_for("NVIDIA H200", "fp64", {}).value == 67e12  # DGEMM on the fp64 tensor cores
    assert gemm.peak_for("NVIDIA H200", "tf32", {}).value == 494.5e12
    assert gemm.peak_for("Some Future GPU", "bf16", {}) is None  # never another GPU's figure
    over = gemm.peak_for("Some Future GPU", "bf16", hardware.parse_peak_overrides("bf16=1234"))
    assert over.value == 1234e12 and over.source == hardware.USER_OVERRIDE


def test_validate_rejects_fp8_on_ampere_and_oversized_shapes():
    a100 = {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "compute_capability": (8, 0)}
    with pytest.raises(InputError, match="fp8"):
        gemm.validate(GemmConfig(dtypes=("fp8",)), [a100], {0: 80 << 30})
    gemm.validate(GemmConfig(dtypes=("bf16",)), [a100], {0: 80 << 30})
    with pytest.raises(InputError, match="smaller --shape"):
        gemm.validate(GemmConfig(dtypes=("fp32",), shapes=(Shape(131072, 131072, 131072),)), [a100], {0: 80 << 30})
    with pytest.raises(InputError, match="smaller --shape"):
        gemm.validate(GemmConfig(dtypes=("bf16",), search=(2048, 131072)), [a100], {0: 80 << 30})


# -- results and verdicts --------------------------------------------------------------------

def test_best_is_the_fastest_correct_candidate():
    r = result(0, 780.0)
    assert r.best.index == 1
    assert r.tflops == pytest.approx(780.0, rel=1e-9)
    assert r.pct_peak == pytest.approx(100 * 780 / 989, rel=1e-9)
    # a faster candidate with wrong results is reported, never counted
    fast_wrong = cand(2, [x / 2 for x in r.candidates[1].seconds], max_error=0.5)
    r.candidates.append(fast_wrong)
    assert r.wrong == [fast_wrong]
    assert r.best.index == 1
    assert r.noise == pytest.approx(0.00158, rel=0.01)


def test_a_failed_candidate_is_skipped():
    r = result(0, 700.0)
    r.candidates.append(cand(3, [], max_error=None, error="cublasLtMatmul: CUBLAS_STATUS_NOT_SUPPORTED"))
    assert r.best.index == 1 and not r.wrong


def test_outliers_need_a_gap_beyond_noise():
    assert gemm_analyse.outliers({0: 780.0}, {0: 0.001}) == []  # one GPU: nothing to compare
    assert gemm_analyse.outliers({0: 780, 1: 781, 2: 779, 3: 770}, {g: 0.001 for g in range(4)}) == []  # 1.3% < 2%
    out = gemm_analyse.outliers({0: 780, 1: 781, 2: 779, 3: 700}, {g: 0.001 for g in range(4)})
    assert [o["gpu"] for o in out] == [3]
    assert out[0]["deficit"] == pytest.approx(1 - 700 / 779.5)
    # the same 10% gap inside a noisy run is not named: 3 x 5% noise is more than the gap
    assert gemm_analyse.outliers({0: 780, 1: 781, 2: 779, 3: 700}, {g: 0.05 for g in range(4)}) == []
    # two GPUs: the slower one is below the median by half the gap
    assert [o["gpu"] for o in gemm_analyse.outliers({0: 780, 1: 700}, {0: 0.001, 1: 0.001})] == [1]


def test_findings_name_the_slow_gpu_and_its_cause():
    tel_ok = {"sm_hz_median": 1.98e9, "sm_hz_min": 1.97e9, "sm_max_hz": 1.98e9, "power_w_max": 650.0,
              "power_limit_w": 700.0, "temp_c_max": 60.0, "limiting": [], "reasons": []}
    tel_slow = dict(tel_ok, sm_hz_median=1.41e9, sm_hz_min=1.40e9, power_w_max=699.0,
                    limiting=["power cap (software)"], reasons=["power cap (software)"])
    run = GemmRun(GemmConfig(), devices=[])
    run.results = [result(0, 780, telemetry=tel_ok), result(1, 782, telemetry=tel_ok),
                   result(2, 690, telemetry=tel_slow)]
    lines = [f.text for f in gemm_analyse.findings(run)]
    slow = [x for x in lines if x.startswith("GPU 2 bf16")]
    assert len(slow) == 1 and "below the node's median" in slow[0] and "1410 MHz" in slow[0]
    assert not any("power cap" in x and not x.startswith("GPU 2 bf16") for x in lines)  # normal under GEMM
    assert not any(x.startswith(("GPU 0 bf16", "GPU 1 bf16")) for x in lines)


def test_power_cap_at_the_default_limit_is_not_a_warning_but_a_lowered_limit_and_heat_are():
    healthy = {"sm_hz_median": 1.6e9, "sm_max_hz": 1.98e9, "power_limit_w": 700.0, "power_default_w": 700.0,
               "power_max_w": 700.0, "limiting": ["power cap (software)"], "reasons": ["power cap (software)"]}
    run = GemmRun(GemmConfig(), devices=[])
    run.results = [result(0, 780, telemetry=healthy), result(1, 781, telemetry=healthy)]
    assert gemm_analyse.findings(run) == []
    lowered = dict(healthy, power_limit_w=600.0)
    hot = dict(healthy, limiting=["power cap (software)", "thermal (software)"])
    run.results = [result(0, 780, telemetry=lowered), result(1, 781, telemetry=hot)]
    found = gemm_analyse.findings(run)
    assert [f.severity for f in found] == ["warning", "warning"]
    assert found[0].text == "GPU 0: power limit 600 W, below the GPU's default 700 W while measuring (bf16 8192x8192x8192)"
    assert found[1].text.startswith("GPU 1: thermal (software) while measuring")


def test_a_gemm_no_algorithm_ran_for_is_a_finding():
    run = GemmRun(GemmConfig(), devices=[])
    r = result(0, 780.0)
    r.candidates = [cand(i, [], max_error=None, error="cublasLtMatmul: CUBLAS_STATUS_NOT_SUPPORTED") for i in range(3)]
    run.results = [r]
    assert r.best is None
    (line,) = [f.text for f in gemm_analyse.findings(run)]
    assert "none of the 3 algorithms" in line and "NOT_SUPPORTED" in line


def test_validate_counts_the_buffers_of_the_largest_shape():
    h200 = {"index": 0, "name": "NVIDIA H200", "compute_capability": (9, 0)}
    # each shape alone fits in 140 GiB; the probe's buffers for max M, N, K (262144 x 262144 x 1024) do not
    cfg = GemmConfig(dtypes=("fp32",), shapes=(Shape(262144, 1024, 1024), Shape(1024, 262144, 1024)))
    with pytest.raises(InputError, match="smaller --shape"):
        gemm.validate(cfg, [h200], {0: 140 << 30})


def test_sustained_drop():
    flops = Shape(8192, 8192, 8192).flops
    steady = [(0.5 * i, flops / 780e12) for i in range(40)]
    assert gemm_analyse.sustained_drop(steady, flops)["drop"] == pytest.approx(0.0, abs=1e-12)
    falling = [(0.5 * i, flops / (780e12 if i < 20 else 700e12)) for i in range(40)]
    d = gemm_analyse.sustained_drop(falling, flops)
    assert d["drop"] == pytest.approx(1 - 700 / 780)
    assert gemm_analyse.sustained_drop(steady[:5], flops) is None
    run = GemmRun(GemmConfig(), devices=[])
    r = result(0, 780.0, series=falling, series_telemetry={"summary": {"limiting": ["thermal (software)"]}})
    run.results = [r]
    assert any("sustained" in x and "thermal (software)" in x for x in [f.text for f in gemm_analyse.findings(run)])


def test_document_and_csv_carry_the_figures():
    run = GemmRun(GemmConfig(), devices=[{"index": 0, "name": "NVIDIA H200"}])
    run.results = [result(0, 780.0), result(1, 760.0)]
    doc = gemm_document.document(run, {"host": "h"}, ["mgpu-bench", "gemm"])
    json.dumps(doc)  # serialisable
    assert doc["kind"] == "gemm" and doc["schema"] == "mgpu-bench/result"
    assert doc["results"][0]["flops_per_s"] == pytest.approx(780e12)
    assert len(doc["results"][1]["candidates"]) == 2 and doc["results"][1]["candidates"][1]["seconds"]
    csv_text = gemm_render.render_csv(run)
    header, first = csv_text.splitlines()[:2]
    assert header.split(",")[:3] == ["gpu", "gpu_name", "dtype"]
    row = dict(zip(header.split(","), first.split(","), strict=False))
    assert float(row["flops_per_s"]) == pytest.approx(780e12)
    lines = gemm_render.summary_lines(run)
    assert any("median 770.0 TFLOP/s" in x and "989" in x for x in lines)


# -- the command line --------------------------------------------------------------------------

@pytest.mark.parametrize("args,text", [
    (["--dtype", "fp7"], "unknown --dtype"),
    (["--shape", "0"], "must be positive"),
    (["--shape", "-8"], "must be positive"),
    (["--shape", "8x8"], "neither N"),
    (["--dtype", "fp8", "--layout", "NN"], "TN"),
    (["--duration", "soon"], "not a duration"),
    (["--candidates", "0"], "--candidates"),
    (["--peak", "bf16"], "no '='"),
    (["--search", "--search-range", "1:2"], "START:STOP:STEP"),
    (["--json", "/nonexistent/x.json"], "does not exist"),
])
def test_cli_bad_input_is_one_line_exit_2(args, text):
    res = CliRunner().invoke(cli, ["gemm", *args])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and text in lines[0] and "Traceback" not in res.output


def test_cli_without_gpu_says_so_exit_2():
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("this machine has GPUs")
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "gemm"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2
    assert "gemm needs NVIDIA GPUs" in proc.stderr and "Traceback" not in proc.stderr


def test_native_probe_is_built():
    from mgpu_bench import _native

    assert hasattr(_native, "GemmProbe")
    for name in ("measure", "sustain", "stop"):
        assert hasattr(_native.GemmProbe, name)
