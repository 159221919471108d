"""gemm reports (CPU, real matplotlib) from a GemmRun built by hand: 2 GPUs, bf16 measured per
shape and sustained, fp8 through a shape search, GPU 1 10% slower, hostile outside strings."""

from __future__ import annotations

import base64
import html
import io
import statistics
from html.parser import HTMLParser

import pytest

from mgpu_bench.machine import hardware, telemetry
from mgpu_bench.probes.gemm import analyse as gemm_analyse
from mgpu_bench.probes.gemm import render as gemm_render
from mgpu_bench.probes.gemm import report as gemm_report
from mgpu_bench.probes.gemm.measure import Candidate, GemmConfig, GemmResult, GemmRun, Shape

PNG = b"\x89PNG\r\n\x1a\n"
BF16_PEAK = hardware.Figure(989e12, "FLOP/s", "nvidia-h200-datasheet")
FP8_PEAK = hardware.Figure(1979e12, "FLOP/s", "nvidia-h200-datasheet")
HOSTILE = "<script>alert(1)</script> $\\frac{$"  # HTML and an unclosed matplotlib mathtext
SQUARE = Shape(8192, 8192, 8192)
SEARCH = (Shape(4096, 4096, 4096), Shape(8192, 8192, 4096), SQUARE)
# Seconds per GEMM of the best algorithm on GPU 0; GPU 1 gives 10% fewer FLOP/s.
BEST_S = {"bf16": 1.6e-3, "fp8": 0.9e-3}
SLOWER = 0.9
STATIC = {"sm_max_hz": 1.98e9, "power_limit_w": 700.0}
IDENT = {"algo_id": 21, "tile": "256x128", "stages": 4, "split_k": 1, "reduction": 0, "swizzle": 0,
         "custom": 0, "cluster": "", "workspace": 0, "waves": 1.0}


def seconds_of(gpu: int, dtype: str) -> float:
    return BEST_S[dtype] / (SLOWER if gpu == 1 else 1.0)


def bursts(median_s: float, n: int = 7) -> list[float]:
    """n bursts around median_s (+-0.3%), the middle one exactly median_s."""
    return [median_s * (1 + 0.001 * (i - n // 2)) for i in range(n)]


def cand(index: int, seconds: list[float], max_error: float | None = 1e-4) -> Candidate:
    return Candidate(index, dict(IDENT, algo_id=20 + index), seconds, 10, max_error, None)


def samples(gpu: int, t0: float, n: int) -> list[telemetry.Sample]:
    """GPU 1 runs at a lower clock, power-capped at its 700 W limit."""
    sm, power, reasons = (1.98e9, 650.0, 0) if gpu == 0 else (1.75e9, 700.0, 0x4)
    return [telemetry.Sample(t0 + 0.1 * i, sm_hz=sm - 1e6 * (i % 3), mem_hz=3.2e9, power_w=power + i % 5,
                             temp_c=60.0 + i % 10, reasons=reasons) for i in range(n)]


def result(gpu: int, dtype: str, shape: Shape, phase: str = "shape") -> GemmResult:
    s = seconds_of(gpu, dtype)
    if phase == "search":  # the coarse pass: the heuristic's first algorithm, two bursts, no check
        cands = [cand(0, [s, s], None)]
    else:
        cands = [cand(0, bursts(1.05 * s)), cand(1, bursts(s))]
    return GemmResult(gpu=gpu, gpu_name="NVIDIA H200" if gpu == 0 else HOSTILE, dtype=dtype, shape=shape,
                      layout="TN" if dtype == "fp8" else "NN", candidates=cands, buffer_sets=4,
                      checked_elements=4096, seconds_wall=0.5,
                      peak=BF16_PEAK if dtype == "bf16" else FP8_PEAK,
                      telemetry=telemetry.summarize(samples(gpu, 100.0, 20), STATIC), phase=phase)


def sustain(r: GemmResult, telemetry_too: bool = True) -> None:
    """40 bursts of 0.5 s; the second half 6% slower per GEMM."""
    s = seconds_of(r.gpu, r.dtype)
    r.series = [(0.5 * i, s * (1.06 if i > 20 else 1.0)) for i in range(1, 41)]
    if telemetry_too:
        got = samples(r.gpu, 500.0, 200)
        r.series_telemetry = {"summary": telemetry.summarize(got, STATIC), **telemetry.series(got, 500.0)}


def make_run(sustained: bool = True, search: bool = True) -> GemmRun:
    run = GemmRun(GemmConfig(dtypes=("bf16", "fp8"), shapes=(SQUARE,), gpus=(0, 1), samples=7),
                  [{"index": 0, "name": "NVIDIA H200"}, {"index": 1, "name": HOSTILE}])
    for g in (0, 1):
        r = result(g, "bf16", SQUARE)
        if sustained:
            sustain(r)
        run.results.append(r)
    if search:
        run.results += [result(g, "fp8", shape, "search") for shape in SEARCH for g in (0, 1)]
        run.results += [result(g, "fp8", SQUARE, "search-best") for g in (0, 1)]
        # The fastest fp8 algorithm on GPU 0 is wrong: it is reported and not counted.
        run.results[-2].candidates.append(cand(2, bursts(0.5 * BEST_S["fp8"]), max_error=0.5))
    run.notes.append("a note with <b>markup</b>")
    run.wall_seconds = 12.5
    return run


ENV = {"host": "node-7", "nvidia_driver": "560.35.03", "cuda_driver": "12.6", "cuda_runtime": "12.6",
       "cublaslt": "120603", "torch": "2.5.1", "gpus": [{"name": "NVIDIA H200"}, {"name": HOSTILE}],
       "env": {"NCCL_DEBUG": "INFO\"><img src=x onerror=alert(1)>"}}


def tflops(gpu: int, dtype: str) -> float:
    return SQUARE.flops / seconds_of(gpu, dtype) / 1e12


def red_pixels(png: bytes) -> int:
    """Pixels of the outlier colour (matplotlib's tab:red, #d62728)."""
    import matplotlib.image
    import numpy as np

    img = matplotlib.image.imread(io.BytesIO(png))[..., :3]
    return int((np.abs(img - np.array([0xD6, 0x27, 0x28]) / 255).max(axis=-1) < 0.01).sum())


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_the_inputs_make_an_outlier_and_findings():
    run = make_run()
    assert [r.tflops for r in run.results[:2]] == pytest.approx([tflops(0, "bf16"), tflops(1, "bf16")])
    lines = [f.text for f in gemm_analyse.findings(run)]
    assert any(line.startswith("GPU 1 bf16 8192x8192x8192:") for line in lines)
    assert any("gave wrong results" in line for line in lines)
    assert any("sustained" in line for line in lines)


def test_report_files_are_written_and_self_contained(tmp_path):
    run = make_run()
    paths = gemm_report.write_report(run, tmp_path / "rep", ENV)
    assert [p.name for p in paths] == ["gemm_bf16.png", "sustained_bf16.png", "gemm_fp8.png",
                                       "search_fp8.png", "report.html", "summary.md"]
    assert all(p.is_file() and p.parent == tmp_path / "rep" for p in paths)
    pngs = {p.stem: p.read_bytes() for p in paths if p.suffix == ".png"}
    for data in pngs.values():
        assert data[:8] == PNG and len(data) > 10_000

    page = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    low = page.lower()
    assert "<script" not in low and "http://" not in low and "https://" not in low
    assert "url(" not in low and "@import" not in low
    parser = _Tags()
    parser.feed(page)
    tags = parser.tags
    assert not {t for t, _ in tags} & {"script", "link", "iframe", "object", "embed", "base", "meta refresh"}
    assert not [a for _, attrs in tags for a in attrs if a.startswith("on")]  # the img onerror stays text
    srcs = [attrs["src"] for t, attrs in tags if "src" in attrs]
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not [attrs for _, attrs in tags if "href" in attrs]
    assert sorted(base64.b64decode(s.split(",", 1)[1]) for s in srcs) == sorted(pngs.values())
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "&lt;b&gt;markup&lt;/b&gt;" in page
    for line in [f.text for f in gemm_analyse.findings(run)]:
        assert html.escape(f"finding: {line}") in page


def test_markdown_has_the_table_with_the_figures_from_the_seconds():
    run = make_run()
    md = gemm_report.markdown(run, ENV)
    assert md.startswith("# mgpu-bench gemm: 2 GPU(s), bf16, fp8\n")
    assert "- host: node-7; GPUs: NVIDIA H200, \\<script>alert(1)\\</script>" in md  # shown, never markup
    header = ("| GPU | dtype | M x N x K | layout | TFLOP/s | % peak | peak TFLOP/s | best algorithm "
              "| noise % | SM MHz | W max | C max | clock limits |")
    assert header in md
    for dtype, peak, layout in (("bf16", BF16_PEAK, "NN"), ("fp8", FP8_PEAK, "TN")):
        for gpu in (0, 1):
            tf = tflops(gpu, dtype)
            pct = 100 * tf * 1e12 / peak.value
            row = (f"| {gpu} | {dtype} | 8192x8192x8192 | {layout} | {tf:.1f} | {pct:.1f} "
                   f"| {peak.value / 1e12:g} |")
            assert row in md, row
    # bf16: 687.2 and 618.5 TFLOP/s on a 989 peak; the wrong fp8 algorithm (twice as fast) is not the best.
    assert f"{tflops(0, 'bf16'):.1f}" == "687.2" and f"{tflops(1, 'bf16'):.1f}" == "618.5"
    assert f"| {2 * tflops(0, 'fp8'):.1f} |" not in md
    # noise of the best bursts: sample stdev / mean of +-0.1% steps
    noise = statistics.stdev(bursts(1.0)) / statistics.mean(bursts(1.0))
    assert f"| #1 algo 21 tile 256x128 stages 4 | {100 * noise:.2f} |" in md
    for gpu, limits in ((0, "-"), (1, "power cap (software)")):  # SM MHz, W max, C max, clock limits
        got = samples(gpu, 100.0, 20)
        sm = statistics.median(x.sm_hz for x in got) / 1e6
        watts, celsius = max(x.power_w for x in got), max(x.temp_c for x in got)
        cells = f"| {sm:.0f} | {watts:.0f} | {celsius:.0f} | {limits} |"
        assert cells in md, cells
    for line in gemm_render.summary_lines(run) + [f.text for f in gemm_analyse.findings(run)]:
        assert line in md
    assert "a note with \\<b>markup\\</b>" in md and "Stopped early" not in md


def test_markdown_says_when_the_run_stopped_and_keeps_lines_whole():
    run = make_run(sustained=False, search=False)
    run.stopped, run.stop_message = "interrupted", "interrupted: the results gathered so far are kept"
    md = gemm_report.markdown(run, dict(ENV, host="node\n# injected"))
    assert "Stopped early (interrupted): interrupted: the results gathered so far are kept" in md
    assert "\n# injected" not in md and "host: node # injected;" in md


def test_plots_are_none_without_their_data():
    run = make_run(sustained=False, search=False)
    assert gemm_report.plot_sustained(run, "bf16") is None
    assert gemm_report.plot_search(run, "bf16") is None
    assert gemm_report.plot_search(make_run(), "bf16") is None  # the search ran for fp8 only
    assert gemm_report.plot_sustained(make_run(), "fp8") is None


def test_outliers_are_red_and_only_outliers():
    run = make_run(sustained=False, search=False)
    assert red_pixels(gemm_report.plot_tflops(run, "bf16")) > 500
    for r in run.results:
        r.candidates = [cand(0, bursts(BEST_S["bf16"]))]  # both GPUs equal
    png = gemm_report.plot_tflops(run, "bf16")
    assert png[:8] == PNG and red_pixels(png) == 0


def test_several_shapes_and_a_gpu_without_a_valid_result_still_plot():
    run = make_run(sustained=False, search=False)
    run.results += [result(g, "bf16", Shape(4096, 8192, 1024)) for g in (0, 1)]
    for c in run.results[-1].candidates:
        c.max_error = 1.0  # every algorithm wrong: no figure for GPU 1 at this shape
    png = gemm_report.plot_tflops(run, "bf16")
    assert png[:8] == PNG and red_pixels(png) > 100  # GPU 1 is still slow at 8192^3


def test_sustained_plot_without_telemetry_has_the_throughput_panel_only():
    run = make_run(sustained=False, search=False)
    for r in run.results:
        sustain(r, telemetry_too=False)
    with_panels = make_run(search=False)
    small, full = gemm_report.plot_sustained(run, "bf16"), gemm_report.plot_sustained(with_panels, "bf16")
    assert small and full and small[:8] == PNG == full[:8]
    assert len(small) < len(full)


def test_report_folder_parent_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError):
        gemm_report.write_report(make_run(), tmp_path / "a" / "b", ENV)
    paths = gemm_report.write_report(make_run(sustained=False, search=False), tmp_path / "c", {})
    assert [p.name for p in paths] == ["gemm_bf16.png", "report.html", "summary.md"]
    assert all(p.exists() for p in paths)
    assert "GPUs: NVIDIA H200, \\<script>" in (tmp_path / "c" / "summary.md").read_text(encoding="utf-8")
