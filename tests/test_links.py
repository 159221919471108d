"""links: localisation logic on CPU (synthetic runs), the command's input errors, and the real
probe on GPUs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.probes.links import analyse as links_analyse
from mgpu_bench.probes.links import measure as links
from mgpu_bench.probes.links import report as links_report
from mgpu_bench.probes.links.result import LinkMeasurement, LinkSpec, LinksRun


def synthetic(bw: dict[tuple[int, int], float], size=1 << 28) -> LinksRun:
    run = LinksRun(gpus=sorted({a for a, _ in bw} | {b for _, b in bw}))
    for (a, b), gbs in bw.items():
        t = size / (gbs * 1e9)
        run.measurements.append(LinkMeasurement(LinkSpec("copy", a, b, "ce", False, None, size), (t, t * 1.01, t * 0.99)))
    return run


def eight_gpus(slow_gpu=None, factor=0.6):
    bw = {}
    for a in range(8):
        for b in range(8):
            if a != b:
                x = 380.0 + ((a * 7 + b * 3) % 5) * 1.5  # a realistic spread of a few GB/s
                if slow_gpu in (a, b):
                    x *= factor
                bw[(a, b)] = x
    return bw


def test_bandwidth_is_bytes_over_median_and_bidirectional_counts_both_ways():
    spec = LinkSpec("copy", 0, 1, "ce", True, None, 1 << 30)
    m = LinkMeasurement(spec, (0.004, 0.005, 0.006))
    assert m.bandwidth == pytest.approx((1 << 30) / 0.005)
    assert m.total_bandwidth == pytest.approx(2 * (1 << 30) / 0.005)


def test_robust_z_is_zero_without_spread_and_large_for_the_outlier():
    assert set(links_analyse.robust_z({1: 5.0, 2: 5.0, 3: 5.0}).values()) == {0.0}
    z = links_analyse.robust_z({1: 10.0, 2: 10.5, 3: 9.5, 4: 10.2, 5: 3.0})
    assert z[5] < -3 and abs(z[1]) < 1


def test_a_healthy_node_has_no_outlier():
    assert links_analyse.outliers(synthetic(eight_gpus())) == []
    assert not any("slow pairs" in f for f in links_analyse.findings(synthetic(eight_gpus())))


def test_the_gpu_behind_the_slow_pairs_is_named():
    run = synthetic(eight_gpus(slow_gpu=5))
    slow = links_analyse.outliers(run)
    assert len(slow) == 14  # 7 pairs from GPU 5, 7 pairs to it
    assert all(5 in (s["src"], s["dst"]) for s in slow)
    text = [f.text for f in links_analyse.findings(run)]
    assert text[0].startswith("GPU 5 is in 14 of 14 slow pairs")


def test_one_slow_pair_is_named_without_blaming_a_gpu():
    bw = eight_gpus()
    bw[(2, 6)] *= 0.5
    text = [f.text for f in links_analyse.findings(synthetic(bw))]
    assert not any("slow pairs" in t for t in text)
    assert any(t.startswith("GPU 2 -> GPU 6 (ce, one direction)") for t in text)


def test_a_small_drop_within_10_percent_is_not_flagged_even_on_a_tight_node():
    bw = {k: 380.0 for k in eight_gpus()}
    bw[(1, 2)] = 350.0  # -8%: a MAD of 0 makes z huge, the 10% rule keeps it quiet
    assert links_analyse.outliers(synthetic(bw)) == []


def test_eight_gpu_estimate_scales_pairs_and_host_copies():
    run = LinksRun(gpus=[0, 1], per_pair_seconds=0.5, host_seconds=0.2)
    assert run.estimate_seconds(8) == pytest.approx(56 * 0.5 + 8 * 0.1)


def test_links_without_gpus_is_a_one_line_error(monkeypatch):
    from mgpu_bench import _native

    if _native.driver_version() != 0:
        pytest.skip("a driver is present")
    r = CliRunner().invoke(cli, ["links"])
    assert r.exit_code == 2
    assert r.output.strip().startswith("mgpu-bench: error: links needs NVIDIA GPUs: no NVIDIA driver found")


@pytest.mark.parametrize("args, words", [(["--size", "1Q"], "cannot read size"), (["--iters", "0"], "--iters must be")])
def test_links_bad_input(args, words):
    r = CliRunner().invoke(cli, ["links", *args])
    assert r.exit_code == 2 and words in r.output


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_real_pairs_on_nvlink():
    run = links.run_links([0, 1], size=64 << 20, iters=5, warmup=2)
    ce = run.copies("ce", False)
    assert set(ce) == {(0, 1), (1, 0)}
    assert all(m.bandwidth > 100e9 for m in ce.values())  # NVLink, not PCIe
    sm_bi = run.copies("sm", True)
    assert all(m.total_bandwidth > m.bandwidth for m in sm_bi.values())
    lat = run.latencies()
    assert all(0 < m.median_s < 20e-6 for m in lat.values())
    assert all(m.bandwidth > 10e9 for m in run.host("h2d").values())
    assert run.estimate_seconds(8) > 0


def test_a_copy_far_below_the_link_theory_is_a_finding():
    from mgpu_bench.machine.theory import Hop

    run = synthetic({(0, 1): 393.4, (1, 0): 250.0})
    hops = {(0, 1): Hop(0, 1, "nvlink", 450e9, "NVLink 4 x18"), (1, 0): Hop(1, 0, "nvlink", 450e9, "NVLink 4 x18")}
    (f,) = [f.text for f in links_analyse.findings(run, hops)]
    assert f.startswith("GPU 1 -> GPU 0: 250.0 GB/s, 56% of NVLink 4 x18 (450 GB/s per direction)")


def test_the_named_gpu_gets_the_topologys_explanation():
    run = synthetic(eight_gpus(slow_gpu=5))
    topo_findings = [{"severity": "warning", "subject": "GPU 5", "message": "GPU 5 has 16 active NVLinks, its peers 18"},
                     {"severity": "warning", "subject": "GPU 15", "message": "not this one"}]
    text = [f.text for f in links_analyse.findings(run, None, topo_findings)]
    assert text[0] == "GPU 5 is in 14 of 14 slow pairs; the topology says: GPU 5 has 16 active NVLinks, its peers 18"


def test_heatmaps_are_written(tmp_path):
    run = synthetic(eight_gpus(slow_gpu=5))
    (p,) = links_report.write_report(run, tmp_path / "rep")
    assert p.name == "links_ce_uni.png" and p.read_bytes()[:4] == b"\x89PNG"
