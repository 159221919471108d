from __future__ import annotations

import json

import numpy as np
import pytest

from mgpu_bench.probes.comm import analyse as comm_analyse
from mgpu_bench.probes.comm import document as comm_document
from mgpu_bench.probes.comm import render as report
from mgpu_bench.probes.comm.plan import CommRun
from mgpu_bench.results import document
from mgpu_bench.results.measurement import CommMeasurement, CommSpec


def make(op="allreduce", nbytes=1 << 30, nranks=2, burst=(0.004, 0.005), samples=None, wrong=(0, 0),
         inplace=False):
    spec = CommSpec(op=op, dtype="fp32", redop="sum" if op == "allreduce" else None, size=nbytes, bytes=nbytes,
                    count=nbytes // 4, nranks=nranks, inplace=inplace, backend="native",
                    devices=tuple(f"cuda:{i}" for i in range(nranks)))
    if samples is None:
        samples = np.array([[0.004, 0.0041, 0.0039, 0.004, 0.004, 0.0042], [0.005, 0.004, 0.004, 0.004, 0.0045, 0.004]])
    return CommMeasurement(spec=spec, iters=20, batch=1, burst_seconds=burst, samples=np.asarray(samples), wrong=wrong)


def test_time_is_the_slowest_ranks_burst_and_bandwidths_follow():
    m = make()
    assert m.time_s == 0.005
    assert m.algbw == pytest.approx((1 << 30) / 0.005)
    assert m.busbw == pytest.approx(m.algbw * 1.0)  # 2 ranks: 2(n-1)/n = 1
    m8 = make(nranks=8, burst=(0.005,) * 8, samples=np.full((8, 6), 0.005), wrong=(0,) * 8)
    assert m8.busbw == pytest.approx(m8.algbw * 1.75)


def test_per_sample_is_max_over_ranks():
    m = make()
    assert m.per_sample.tolist() == [0.005, 0.0041, 0.004, 0.004, 0.0045, 0.0042]
    assert m.median_s == pytest.approx(0.00415)
    assert m.p99_s == pytest.approx(np.percentile(m.per_sample, 99))
    assert m.cov == pytest.approx(np.std(m.per_sample, ddof=1) / np.mean(m.per_sample))


def test_few_samples_give_no_noise_estimate():
    m = make(samples=np.array([[0.004, 0.004, 0.004], [0.004, 0.004, 0.004]]))
    assert m.cov is None
    assert any("no noise estimate" in w for w in m.warnings)


def test_large_spread_warns():
    m = make(samples=np.array([[0.004, 0.008, 0.004, 0.004, 0.004, 0.008]] * 2))
    assert any("vary" in w for w in m.warnings)


def test_wrong_elements_count_and_warn():
    m = make(wrong=(3, 4))
    assert m.total_wrong == 7
    assert any("7 wrong" in w for w in m.warnings)
    assert make(wrong=None).total_wrong == 0


def test_json_round_trip_keeps_raw_samples(tmp_path):
    run = CommRun(backend="native", devices=["cuda:0", "cuda:1"], requests=[],
                  measurements=[make(), make(inplace=True, wrong=None)])
    doc = comm_document.result_document(run, {"host": "h", "env": {"NCCL_NVLS_ENABLE": "0"}}, ["mgpu-bench", "comm"])
    path = tmp_path / "r.json"
    document.write_json(path, doc)
    raw = json.loads(path.read_text())
    assert raw["schema"] == "mgpu-bench/result" and raw["schema_version"] == 1
    assert raw["environment"]["env"] == {"NCCL_NVLS_ENABLE": "0"}
    assert raw["status"]["completed"] is True
    _, back = comm_document.load_measurements(path)
    assert len(back) == 2
    for a, b in zip(run.measurements, back):
        assert a.spec == b.spec
        assert np.array_equal(a.samples, b.samples)
        assert a.busbw == b.busbw and a.wrong == b.wrong


def test_load_rejects_other_schemas(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": "mgpu-bench/result", "schema_version": 99, "measurements": []}))
    with pytest.raises(ValueError, match="schema version 99"):
        comm_document.load_measurements(p)


def test_summary_uses_largest_size_and_mean_over_large_sizes():
    ms = [make(nbytes=1 << 20, burst=(1e-4, 1e-4)), make(nbytes=64 << 20, burst=(2.5e-4, 2.5e-4)),
          make(nbytes=1 << 30, burst=(3.2e-3, 3.2e-3))]
    run = CommRun(backend="native", devices=["cuda:0", "cuda:1"], requests=[], measurements=ms)
    (s,) = comm_analyse.summary(run)
    assert s["largest_bytes"] == 1 << 30
    assert s["busbw_at_largest"] == pytest.approx((1 << 30) / 3.2e-3)
    assert s["large_sizes"] == 2
    assert s["mean_busbw_large"] == pytest.approx(((64 << 20) / 2.5e-4 + (1 << 30) / 3.2e-3) / 2)


def test_csv_has_one_row_per_measurement_in_base_units():
    run = CommRun(backend="native", devices=["cuda:0", "cuda:1"], requests=[], measurements=[make(), make(inplace=True)])
    lines = report.render_csv(run).strip().splitlines()
    assert len(lines) == 3
    header = lines[0].split(",")
    first = dict(zip(header, lines[1].split(",")))
    assert float(first["time_s"]) == pytest.approx(0.005)
    assert float(first["busbw_Bps"]) == pytest.approx((1 << 30) / 0.005, rel=1e-5)
    assert first["placement"] == "out-of-place"
