"""`mgpu-bench suite --quick` on real GPUs (run with `pytest -m slow` on the 2-GPU machine): all
three rounds, every probe ok, under the 5-minute target, stored and rendered. Slow (about 3
minutes alone): `pytest -m gpu` leaves it out; benchmarks/gpu_smoke.sh runs the suite too."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu(2), pytest.mark.slow]


def test_quick_suite_covers_three_rounds_in_under_five_minutes(tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "suite", "--quick", "--report", "rep",
                           "--prometheus", "m.prom"], capture_output=True, text=True, timeout=900, check=False,
                          cwd=tmp_path)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "rep" / "suite.json").read_text())
    assert {p["round"] for p in doc["probes"]} == {1, 2, 3}
    assert [p["name"] for p in doc["probes"] if p["status"] != "ok"] == []
    sustained = next(p for p in doc["probes"] if p["name"] == "model-sustained")
    series = next(iter(sustained["telemetry"]["gpus"].values()))["series"]
    assert len(series["t"]) >= 10 and all(x is not None for x in series["sm_hz"])
    assert wall < 300, f"suite --quick took {wall:.0f} s"
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "<script src" not in html and "data:image/png;base64," in html
    print(f"suite --quick: {wall:.1f} s wall; " + "; ".join(f"{p['name']} {p['seconds']:.1f} s" for p in doc["probes"]))
