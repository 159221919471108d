"""model reports from a hand-built run (1 and 2 GPUs, synthetic and loader data): real
matplotlib on the CPU, no GPU needed."""

from __future__ import annotations

import re

import pytest

from mgpu_bench.machine import hardware
from mgpu_bench.probes.model import report as model_report
from mgpu_bench.probes.model.config import ModelConfig
from mgpu_bench.probes.model.figures import ModelRun, StepStats

PNG = b"\x89PNG\r\n\x1a\n"
HOSTILE = "<script>x</script>"
ESCAPED = "&lt;script&gt;x&lt;/script&gt;"
CFG = ModelConfig(model="tiny", seq_len=128, batch_size=4, steps=8, warmup_steps=2, device="cuda")
FLOPS_PER_TOKEN = 1.0e9
PEAK = 1.0e15  # FLOP/s per GPU
WINDOW = (2, 8, True)  # the first two timed steps are slow, then steady


def _stats(world: int, data: str, step_s: float, phases_s: tuple[float, float, float, float],
           exposed: float | None = None, error: str | None = None) -> StepStats:
    """Ranks with per-step phase lists (rank r is 1% slower per rank) and the derived figures
    figures.analyse would give them."""
    tokens_per_step = CFG.batch_size * CFG.grad_accum * world * CFG.seq_len
    st = StepStats(world=world, data=data, ranks=[], window=WINDOW, samples_per_step=CFG.batch_size * world,
                   tokens_per_step=tokens_per_step, flops_per_token=FLOPS_PER_TOKEN, error=error)
    if error:
        st.ranks = [{"rank": r, "error": error} for r in range(world)]
        return st
    for r in range(world):
        steps = [3 * step_s, 2 * step_s] + [step_s * (1 - 0.01 * r)] * (CFG.steps - 2)
        ph = {p: [v] * CFG.steps for p, v in zip(("data", "forward", "backward", "optimizer"), phases_s, strict=True)}
        st.ranks.append({"rank": r, "error": None, "phases": {**ph, "step": steps}})
    tps = tokens_per_step / step_s
    d = {"step_s": step_s, "step_mean_s": step_s, "window_steps": 6, "samples_per_s": st.samples_per_step / step_s,
         "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / world,
         "flops_per_s_per_gpu": tps / world * FLOPS_PER_TOKEN, "mfu": tps / world * FLOPS_PER_TOKEN / PEAK,
         "data_s": phases_s[0], "forward_s": phases_s[1], "backward_s": phases_s[2], "optimizer_s": phases_s[3],
         "data_share": phases_s[0] / step_s, "peak_allocated": 30 * 2**30, "peak_reserved": 36 * 2**30,
         "total_memory": 140 * 2**30}
    if exposed is not None:
        d["exposed_comm_share"] = exposed
        d["no_sync_step_s"] = step_s * (1 - exposed)
    st.derived = d
    return st


def _run(counts=(1, 2)) -> ModelRun:
    run = ModelRun(CFG, list(counts), ["synthetic", "loader"], HOSTILE + " $1", hardware.Figure(PEAK, "FLOP/s", "test"))
    all_stats = {1: [_stats(1, "synthetic", 0.050, (0.001, 0.015, 0.030, 0.003)),
                     _stats(1, "loader", 0.060, (0.011, 0.015, 0.030, 0.003))],
                 2: [_stats(2, "synthetic", 0.055, (0.001, 0.015, 0.034, 0.003), exposed=0.12),
                     _stats(2, "loader", 0.0, (0, 0, 0, 0), error="out of memory: tried to allocate")]}
    run.stats = [s for n in counts for s in all_stats[n]]
    run.notes = [f"note with {HOSTILE}"]
    return run


ENV = {"host": HOSTILE, "nvidia_driver": "570.1", "cuda_driver": "12.8", "torch": "2.7",
       "gpus": [{"name": HOSTILE}, {"name": HOSTILE}], "env": {"NCCL_X": HOSTILE}}


def test_plots_are_pngs():
    run = _run()
    for fn in (model_report.plot_steps, model_report.plot_phases, model_report.plot_scaling):
        png = fn(run)
        assert png is not None and png[:8] == PNG


def test_scaling_plot_needs_two_gpu_counts():
    run = _run(counts=(1,))
    assert model_report.plot_scaling(run) is None
    assert model_report.plot_steps(run)[:8] == PNG
    assert set(model_report.images(run)) == {"steps", "phases"}


def test_plots_without_measurements_are_none():
    run = ModelRun(CFG, [2], ["synthetic"], None, None, stats=[_stats(2, "synthetic", 0, (0,) * 4, error="boom")])
    assert model_report.plot_steps(run) is None
    assert model_report.plot_phases(run) is None
    assert model_report.plot_scaling(run) is None


def test_step_series_is_the_slowest_rank_per_step():
    s = _stats(2, "synthetic", 0.055, (0.001, 0.015, 0.034, 0.003))
    assert model_report.step_series(s) == [0.165, 0.11] + [0.055] * 6


def test_markdown_table_carries_the_figures():
    md = model_report.markdown(_run(), ENV)
    # 1 GPU synthetic: 4 x 128 tokens per 50 ms step
    tps1 = 4 * 128 / 0.050
    assert (f"| 1 | synthetic | 50.00 | {4 / 0.050:.1f} | {tps1:.0f} | {tps1:.0f} | {tps1 * 1e9 / 1e12:.1f} | "
            f"{100 * tps1 * 1e9 / PEAK:.1f} | {100 * 0.001 / 0.050:.1f} | 15.00 | 30.00 | 3.00 | - | - | 36.00 | "
            "2-7 of 8 |") in md
    tps2 = 2 * 4 * 128 / 0.055
    assert (f"| 2 | synthetic | 55.00 | {8 / 0.055:.1f} | {tps2:.0f} | {tps2 / 2:.0f} | {tps2 / 2 * 1e9 / 1e12:.3g} | "
            f"{100 * tps2 / 2 * 1e9 / PEAK:.1f} | {100 * 0.001 / 0.055:.1f} | 15.00 | 34.00 | 3.00 | 12.0 | - | "
            "36.00 | 2-7 of 8 |") in md
    assert "| 2 | loader | failed: out of memory: tried to allocate |" in md
    assert ("| GPUs | data | steady step ms | samples/s total | tokens/s total | tokens/s per GPU | TFLOP/s per GPU | "
            "MFU % |") in md
    assert "exposed comm % | long steps % of time | peak reserved GiB |" in md
    # scaling: T_2 / (2 x T_1)
    assert f"| 2 | synthetic | {tps2:.0f} | {2 * tps1:.0f} | {100 * tps2 / (2 * tps1):.1f} |" in md
    assert "communication-bound: exposed communication is 12.0% of the step" in md


def test_page_is_self_contained_and_escaped():
    run = _run()
    page = model_report.page(run, ENV, model_report.images(run))
    assert "<script" not in page
    assert ESCAPED in page and f"NCCL_X={ESCAPED}" in page and f"note with {ESCAPED}" in page
    refs = re.findall(r"(?:src|href)\s*=\s*['\"]?([^'\"\s>]*)", page, flags=re.IGNORECASE)
    assert len(refs) == 3 and all(r.startswith("data:image/png;base64,") for r in refs)
    assert "http://" not in page and "https://" not in page and "url(" not in page
    assert "<th>exposed comm %</th>" in page and "<th>peak reserved GiB</th>" in page


def test_write_report_writes_what_it_returns(tmp_path):
    paths = model_report.write_report(_run(), tmp_path / "rep", ENV)
    assert [p.name for p in paths] == ["steps.png", "phases.png", "scaling.png", "report.html", "summary.md"]
    assert all(p.exists() and p.parent == tmp_path / "rep" for p in paths)
    assert all(p.read_bytes()[:8] == PNG for p in paths if p.suffix == ".png")
    assert (tmp_path / "rep" / "report.html").read_text(encoding="utf-8").count("data:image/png;base64,") == 3


def test_write_report_needs_the_parent(tmp_path):
    with pytest.raises(FileNotFoundError):
        model_report.write_report(_run(), tmp_path / "missing" / "rep", ENV)


def test_a_small_flop_rate_reads_the_same_on_the_terminal_and_in_markdown():
    """TFLOP/s of a CPU process (3e10 FLOP/s) is 0.03 on the terminal and in summary.md alike,
    never 0.0 in one and 0.03 in the other; a GPU's rate keeps one decimal."""
    import io

    from rich.console import Console

    from mgpu_bench.probes.model.render import render_terminal, tflops

    assert (tflops(3e10), tflops(4.25e14), tflops(None)) == ("0.03", "425.0", "-")
    run = _run((1,))
    for s in run.stats:
        s.derived["flops_per_s_per_gpu"] = 3e10
    buf = io.StringIO()
    render_terminal(run, Console(file=buf, width=200, color_system=None))
    md = model_report.markdown(run, {})
    rows = [ln.split() for ln in buf.getvalue().splitlines() if ln.split()[:1] == ["1"] and "GPU(s)," not in ln]
    assert rows and all("0.03" in r for r in rows)  # the TFLOP/s column of every row
    assert md.count("| 0.03 |") == len(run.stats)
