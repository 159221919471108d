"""The GEMM probe on a real GPU: every dtype runs and checks, the CLI writes its documents,
Ctrl-C keeps what was measured. Run with `pytest -m gpu` on a GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import interrupt_cli

from mgpu_bench.machine.selection import require_gpus
from mgpu_bench.probes.gemm import measure as gemm
from mgpu_bench.probes.gemm.measure import GemmConfig, Shape

pytestmark = pytest.mark.gpu


def _devices(n=1):
    _gpus, devices = require_gpus("gemm", str(n))
    return devices


@pytest.mark.parametrize("dtype", gemm.GEMM_DTYPES)
def test_every_dtype_runs_and_checks(dtype):
    from mgpu_bench import _native

    dev = _devices()[0]
    if dtype == "fp8" and tuple(dev["compute_capability"]) < gemm.FP8_MIN_CC:
        pytest.skip("no fp8 tensor cores")
    layout = gemm.layout_for(dtype, "auto")
    probe = _native.GemmProbe(0, dtype, layout, 2048, 2048, 2048, 32 << 20, 7)
    raw = probe.measure(2048, 1024, 512, 3, 5, 0.005, 1, True)
    assert raw["buffer_sets"] >= 2  # small operands rotate against L2
    ok = [c for c in raw["candidates"] if c["error"] is None]
    assert ok, raw
    for c in ok:
        assert c["max_error"] is not None and c["max_error"] <= gemm.TOLERANCE[dtype], c
        assert len(c["seconds"]) == 5 and all(s > 0 for s in c["seconds"])
    assert len({c["index"] for c in raw["candidates"]}) == len(raw["candidates"])


def test_bf16_reaches_a_sane_fraction_of_peak():
    cfg = GemmConfig(dtypes=("bf16",), shapes=(Shape(8192, 8192, 8192),), gpus=(0,), candidates=4)
    run = gemm.run_gemm(cfg, _devices())
    assert run.stopped is None, run.stop_message
    (r,) = run.results
    assert r.best is not None and not r.wrong
    if r.pct_peak is not None:
        assert 40 < r.pct_peak < 100, r.pct_peak
    if run.telemetry_error is None:
        assert r.telemetry["samples"] >= 2 and r.telemetry["sm_hz_median"] > 0


def test_sustain_gives_a_series():
    from mgpu_bench import _native

    probe = _native.GemmProbe(0, "bf16", "NN", 4096, 4096, 4096, 32 << 20, 1)
    series = probe.sustain(4096, 4096, 4096, 0, 1.0, 0.1)
    assert len(series) >= 5
    times = [t for t, _ in series]
    assert times == sorted(times) and times[-1] - times[0] < 1.5
    assert all(0 < s < 0.1 for _, s in series)


def test_search_small_grid():
    cfg = GemmConfig(dtypes=("bf16",), shapes=(), gpus=(0,), search=(1024, 2048), search_refine=2, candidates=2)
    run = gemm.run_gemm(cfg, _devices())
    assert run.stopped is None
    assert len(run.measured("search")) == 8  # 2^3 shapes on one GPU
    best = run.measured("search-best")
    assert len(best) == 2 and all(r.candidates and r.best for r in best)


def test_cli_json_csv_report(tmp_path):
    j, c, rep = tmp_path / "g.json", tmp_path / "g.csv", tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "gemm", "--dtype", "bf16,fp16",
                           "--shape", "4096,2048x4096x1024", "--gpus", "1", "--json", str(j), "--csv", str(c),
                           "--report", str(rep), "--duration", "1s", "--interval", "0.1"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "TFLOP/s" in proc.stdout
    doc = json.loads(j.read_text())
    assert doc["kind"] == "gemm" and doc["status"]["completed"]
    assert {(r["dtype"], r["m"], r["n"], r["k"]) for r in doc["results"]} == {
        ("bf16", 4096, 4096, 4096), ("bf16", 2048, 4096, 1024), ("fp16", 4096, 4096, 4096), ("fp16", 2048, 4096, 1024)}
    assert all(r["flops_per_s"] > 1e12 for r in doc["results"])
    assert any(r["series"] for r in doc["results"])
    assert len(c.read_text().splitlines()) == 5
    assert (rep / "report.html").exists() and (rep / "summary.md").exists()


def test_cli_ctrl_c_keeps_results(tmp_path):
    j = tmp_path / "g.json"
    code, err = interrupt_cli(["gemm", "--gpus", "1", "--shape", "4096", "--duration", "60s", "--json", str(j)],
                              after_s=12)
    assert code == 130, err
    assert "Traceback" not in err
    doc = json.loads(j.read_text())
    assert doc["status"]["stopped"] == "interrupted"
    assert doc["results"] and doc["results"][0]["flops_per_s"] > 0
