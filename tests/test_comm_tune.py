"""`comm --tune` on the CPU: the recommendation rule on constructed measurements, the plan
(bands, candidates), the document round trip, the terminal's paste lines, the input checks,
and a real trial process that fails without a GPU."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from mgpu_bench.probes.comm.plan import CommRun
from mgpu_bench.probes.comm.tune import rule as tune_rule
from mgpu_bench.probes.comm.tune import run as tune_run
from mgpu_bench.probes.comm.tune import trials as tune_trials
from mgpu_bench.probes.comm.tune.rule import Tuning, advise, decide, evaluate
from mgpu_bench.probes.comm.tune.trials import BUFFER, CHANNELS, DEFAULT, PROTOCOL, Band, Candidate, Nvls, Trial
from mgpu_bench.results.measurement import CommMeasurement, CommRequest, CommSpec, TimingOptions

MIB = 1 << 20
SMALL = Band("small", (1 * MIB, 4 * MIB))
LARGE = Band("large", (256 * MIB, 1024 * MIB))
NVLS_ON = Nvls(True, "NCCL set up 16 NVLS channels")
NVLS_OFF = Nvls(False, "NCCL_NVLS_ENABLE=0 in this environment")
EXPORT = re.compile(r"^export (NCCL_[A-Z_]+)=(\S+)$")


def measured(size: int, busbw: float, cov: float = 0.001, wrong: int = 0, op: str = "allreduce") -> CommMeasurement:
    """An allreduce over 2 ranks at `size` bytes with this busbw (bytes/s) and samples whose
    coefficient of variation is about `cov` (20 samples alternating around the mean)."""
    t = size / busbw  # 2 ranks: busbw = algbw x 2(n-1)/n = bytes / time
    signs = np.array([1.0, -1.0] * 10)
    samples = np.vstack([t * (1 + cov * signs)] * 2)
    spec = CommSpec(op, "fp32", "sum", size, size, size // 4, 2, False, "native", ("cuda:0", "cuda:1"))
    return CommMeasurement(spec, 20, 1, (t, t), samples, (0, wrong))


def trial(env: dict, figures: dict[int, float], group: str = PROTOCOL, run: int = 1, cov: float = 0.001,
          wrong_at: int | None = None, error: str | None = None) -> Trial:
    cand = Candidate(tuple(env.items()), group if env else DEFAULT, ("allreduce",))
    ms = [measured(s, bw, cov, 5 if s == wrong_at else 0) for s, bw in figures.items()]
    return Trial(cand, run, ms, error=error)


def defaults(bw_small: float = 100e9, bw_large: float = 300e9, second: float = 1.0) -> list[Trial]:
    """The default twice; the second run `second` times the first."""
    first = {1 * MIB: bw_small, 4 * MIB: bw_small, 256 * MIB: bw_large, 1024 * MIB: bw_large}
    return [trial({}, first), trial({}, {s: b * second for s, b in first.items()}, run=2)]


def choice(trials, band=SMALL, nvls=NVLS_OFF):
    return next(c for c in decide(trials, (SMALL, LARGE), ("allreduce",), nvls) if c.band == band)


def test_a_gain_under_2_percent_is_not_recommended():
    t = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 101.5e9, 4 * MIB: 101.5e9})
    c = choice(defaults() + [t])
    assert c.setting == "NCCL_PROTO=allreduce:LL128" and not c.recommended
    assert c.at.gain == pytest.approx(0.015) and c.at.needed == pytest.approx(0.02)
    assert "within the 2.0% needed" in c.reason
    assert advise(evaluate(defaults() + [t], (SMALL,), ("allreduce",), NVLS_OFF), defaults() + [t]).lines == ()


def test_3_percent_with_2_percent_noise_is_not_recommended():
    t = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 103e9, 4 * MIB: 103e9}, cov=0.02)
    c = choice(defaults() + [t])
    assert not c.recommended
    assert c.at.noise == pytest.approx(0.02, rel=0.05) and c.at.needed == pytest.approx(3 * c.at.noise)
    assert "3 x noise 2.1%" in c.reason


def test_a_clear_gain_is_recommended_with_the_exact_line():
    t = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 112e9, 4 * MIB: 108e9, 256 * MIB: 300e9,
                                                  1024 * MIB: 300e9})
    trials = defaults() + [t]
    c = choice(trials)
    assert c.recommended and c.costs == ()
    assert c.at.size == 4 * MIB and c.at.gain == pytest.approx(0.08)  # the size that decides: the smaller gain
    assert "+8.0% at 4 MiB" in c.reason
    assert not choice(trials, LARGE).recommended  # no gain there
    assert advise(evaluate(trials, (SMALL, LARGE), ("allreduce",), NVLS_OFF), trials).lines == (
        "export NCCL_PROTO=allreduce:LL128",)


def test_the_spread_of_two_default_runs_is_noise():
    t = trial({"NCCL_PROTO": "allreduce:LL"}, {1 * MIB: 110e9, 4 * MIB: 110e9})
    assert choice(defaults() + [t]).recommended
    c = choice(defaults(second=0.96) + [t])  # two fresh communicators 4% apart
    assert not c.recommended and c.at.noise == pytest.approx(0.04)
    assert c.at.default_busbw == pytest.approx(100e9)  # the better default run is the one to beat


def test_a_setting_that_failed_the_data_check_is_never_recommended():
    bad = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 150e9, 4 * MIB: 150e9}, wrong_at=4 * MIB)
    good = trial({"NCCL_ALGO": "allreduce:Tree"}, {1 * MIB: 110e9, 4 * MIB: 110e9})
    c = choice(defaults() + [bad, good])
    assert c.setting == "NCCL_ALGO=allreduce:Tree" and c.recommended
    assert "NCCL_PROTO=allreduce:LL128 did better but failed the data check: 5 wrong element(s)" in c.reason
    c = choice(defaults() + [bad])
    assert c.setting is None and not c.recommended
    tu = Tuning(("allreduce",), (SMALL,), 22809, NVLS_OFF, defaults() + [bad])
    assert tu.wrong == [bad] and tu.advice().lines == ()


def test_a_setting_that_failed_to_run_is_never_recommended():
    broken = trial({"NCCL_BUFFSIZE": "16777216"}, {1 * MIB: 150e9, 4 * MIB: 150e9}, group=BUFFER,
                   error="NCCL error 5 (invalid usage)")
    c = choice(defaults() + [broken])
    assert not c.recommended and c.setting is None


def test_nvls_is_never_recommended_where_it_is_off():
    nvls = trial({"NCCL_ALGO": "allreduce:NVLS"}, {1 * MIB: 140e9, 4 * MIB: 140e9}, group=tune_trials.ALGORITHM)
    assert nvls.candidate.uses_nvls
    assert choice(defaults() + [nvls], nvls=NVLS_ON).recommended  # the same figures where NVLS is on
    c = choice(defaults() + [nvls], nvls=NVLS_OFF)
    assert not c.recommended and c.setting is None
    assert tune_rule.exclusion(nvls, NVLS_OFF) == "NVLS is off here: NCCL_NVLS_ENABLE=0 in this environment"
    forced = Candidate((("NCCL_NVLS_ENABLE", "1"),), tune_trials.ALGORITHM, ("allreduce",))
    assert forced.uses_nvls and not Candidate((("NCCL_NVLS_ENABLE", "0"),), "x", ()).uses_nvls


def test_too_few_samples_give_no_recommendation():
    t = trial({"NCCL_PROTO": "allreduce:LL"}, {1 * MIB: 130e9, 4 * MIB: 130e9})
    few = [Trial(d.candidate, d.run, [CommMeasurement(m.spec, 3, 1, m.burst_seconds, m.samples[:, :3], m.wrong)
                                      for m in d.measurements]) for d in defaults()]
    c = choice(few + [t])
    assert not c.recommended and c.at.noise is None and "no noise figure" in c.reason


def test_a_setting_that_costs_elsewhere_is_given_only_for_its_band():
    t = trial({"NCCL_PROTO": "allreduce:LL"}, {1 * MIB: 120e9, 4 * MIB: 120e9, 256 * MIB: 240e9,
                                               1024 * MIB: 250e9})
    trials = defaults() + [t]
    c = choice(trials)
    assert c.recommended and c.costs == ("-20.0% at 256 MiB", "-16.7% at 1 GiB")
    advice = advise(evaluate(trials, (SMALL, LARGE), ("allreduce",), NVLS_OFF), trials)
    assert advice.lines == ()
    assert advice.only_for == ((("export NCCL_PROTO=allreduce:LL",), "allreduce 1 MiB-4 MiB (+20.0%)",
                                ("-20.0% at 256 MiB", "-16.7% at 1 GiB")),)
    # a smaller gain that costs nothing is given for every job, beside the band's best
    safe = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 110e9, 4 * MIB: 110e9, 256 * MIB: 300e9,
                                                     1024 * MIB: 300e9})
    c = choice(trials + [safe])
    assert c.setting == "NCCL_PROTO=allreduce:LL" and c.costs
    advice = advise(evaluate(trials + [safe], (SMALL, LARGE), ("allreduce",), NVLS_OFF), trials + [safe])
    assert advice.lines == ("export NCCL_PROTO=allreduce:LL128",) and len(advice.only_for) == 1
    # on a tie the band shows the one that costs nothing
    tie = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 120e9, 4 * MIB: 120e9, 256 * MIB: 300e9,
                                                    1024 * MIB: 300e9})
    assert choice(trials + [tie]).setting == "NCCL_PROTO=allreduce:LL128"


def test_two_settings_are_given_together_only_once_measured_together():
    small = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 110e9, 4 * MIB: 110e9, 256 * MIB: 300e9,
                                                      1024 * MIB: 300e9})
    large = trial({"NCCL_BUFFSIZE": "16777216"}, {1 * MIB: 100e9, 4 * MIB: 100e9, 256 * MIB: 345e9,
                                                  1024 * MIB: 345e9}, group=BUFFER)
    trials = defaults() + [small, large]
    advice = advise(evaluate(trials, (SMALL, LARGE), ("allreduce",), NVLS_OFF), trials)
    assert advice.lines == ("export NCCL_BUFFSIZE=16777216",)  # the larger gain alone, until measured together
    assert advice.combined is not None and advice.combined.label == "NCCL_BUFFSIZE=16777216 NCCL_PROTO=allreduce:LL128"
    both = Trial(advice.combined, 1, [measured(s, b) for s, b in
                                      ((MIB, 111e9), (4 * MIB, 111e9), (256 * MIB, 344e9), (1024 * MIB, 344e9))])
    again = advise(evaluate(trials + [both], (SMALL, LARGE), ("allreduce",), NVLS_OFF), trials + [both])
    assert again.lines == ("export NCCL_BUFFSIZE=16777216", "export NCCL_PROTO=allreduce:LL128")
    assert again.given == ("NCCL_BUFFSIZE=16777216: allreduce 256 MiB-1 GiB (+15.0%)",
                           "NCCL_PROTO=allreduce:LL128: allreduce 1 MiB-4 MiB (+10.0%)")
    assert again.combined is None and "measured together: +11.0% at 1 MiB" in again.notes[0]
    worse = Trial(advice.combined, 1, [measured(s, b) for s, b in
                                       ((MIB, 101e9), (4 * MIB, 101e9), (256 * MIB, 344e9), (1024 * MIB, 344e9))])
    third = advise(evaluate(trials + [worse], (SMALL, LARGE), ("allreduce",), NVLS_OFF), trials + [worse])
    assert third.lines == ("export NCCL_BUFFSIZE=16777216",) and "did not hold" in third.notes[0]


def test_one_value_per_variable_the_larger_gain_wins():
    a = trial({"NCCL_BUFFSIZE": "8388608"}, {256 * MIB: 320e9, 1024 * MIB: 320e9}, group=BUFFER)
    b = trial({"NCCL_BUFFSIZE": "16777216"}, {256 * MIB: 340e9, 1024 * MIB: 340e9}, group=BUFFER)
    trials = defaults() + [a, b]
    choices = decide(trials, (SMALL, LARGE), ("allreduce",), NVLS_OFF)
    assert [c.setting for c in choices if c.recommended] == ["NCCL_BUFFSIZE=16777216"]
    advice = advise(evaluate(trials, (SMALL, LARGE), ("allreduce",), NVLS_OFF), trials)
    assert advice.lines == ("export NCCL_BUFFSIZE=16777216",)
    assert advice.given == ("NCCL_BUFFSIZE=16777216: allreduce 256 MiB-1 GiB (+13.3%)",)
    assert advice.notes == (("NCCL_BUFFSIZE=8388608 also beat the default: allreduce 256 MiB-1 GiB (+6.7%), but sets "
                             "what NCCL_BUFFSIZE=16777216 sets, which gained more"),)


def test_env_lines_are_exact_and_quoted_for_a_shell():
    cand = Candidate((("NCCL_ALGO", "allreduce:Tree"), ("NCCL_PROTO", "LL,Simple;allreduce:^LL")), PROTOCOL, ())
    assert cand.lines() == ["export NCCL_ALGO=allreduce:Tree", "export NCCL_PROTO='LL,Simple;allreduce:^LL'"]
    assert cand.label == "NCCL_ALGO=allreduce:Tree NCCL_PROTO=LL,Simple;allreduce:^LL"


def test_bands_take_the_ends_of_each():
    from mgpu_bench.results.sizes import parse_sizes

    bands = tune_trials.cut_bands(parse_sizes("1M-1G", None, None))
    assert [(b.name, b.sizes) for b in bands] == [("small", (MIB, 4 * MIB)), ("medium", (8 * MIB, 64 * MIB)),
                                                  ("large", (128 * MIB, 1024 * MIB))]
    assert bands[0].label == "1 MiB-4 MiB"
    assert [(b.name, b.sizes) for b in tune_trials.cut_bands([64 * MIB])] == [("medium", (64 * MIB,))]
    assert tune_trials.cut_bands(parse_sizes("1M-1G", None, None), 3)[2].sizes == (128 * MIB, 512 * MIB, 1024 * MIB)


def test_candidates_per_collective_with_nccl_s_syntax():
    labels = [c.label for c in tune_trials.first_candidates(["allreduce", "allgather"], 22809, NVLS_OFF)]
    assert labels == ["NCCL_ALGO=allreduce:Ring", "NCCL_ALGO=allreduce:Tree", "NCCL_PROTO=allreduce:LL",
                      "NCCL_PROTO=allreduce:LL128", "NCCL_PROTO=allreduce:Simple", "NCCL_PROTO=allgather:LL",
                      "NCCL_PROTO=allgather:LL128", "NCCL_PROTO=allgather:Simple", "NCCL_BUFFSIZE=8388608",
                      "NCCL_BUFFSIZE=16777216"]
    on = [c.label for c in tune_trials.first_candidates(["allreduce"], 22809, NVLS_ON) if c.uses_nvls]
    assert on == ["NCCL_ALGO=allreduce:NVLS"]
    # before NCCL 2.24 a setting applies to every collective: Tree only where allreduce runs alone
    old = tune_trials.first_candidates(["allreduce", "allgather"], 22304, NVLS_OFF)
    assert [c.label for c in old][:2] == ["NCCL_ALGO=Ring", "NCCL_PROTO=LL"]
    assert all(c.ops == ("allreduce", "allgather") for c in old)
    assert "NCCL_ALGO=Tree" in [c.label for c in tune_trials.first_candidates(["allreduce"], 22304, NVLS_OFF)]
    assert [c.label for c in tune_trials.channel_candidates(["allreduce"], 24)] == ["NCCL_MAX_NCHANNELS=12",
                                                                               "NCCL_MIN_NCHANNELS=48"]
    assert [c.label for c in tune_trials.channel_candidates(["allreduce"], 64)] == ["NCCL_MAX_NCHANNELS=32"]
    assert tune_trials.channel_candidates(["allreduce"], None) == []
    assert all(c.group == CHANNELS for c in tune_trials.channel_candidates(["allreduce"], 8))


def test_nvls_state_from_the_environment_and_nccl_s_log():
    assert tune_trials.nvls_before({"NCCL_NVLS_ENABLE": "0"}) == NVLS_OFF
    assert tune_trials.nvls_before({}) is None
    assert tune_trials.nvls_after(16, {}).allowed and not tune_trials.nvls_after(0, {}).allowed
    assert "NCCL_DEBUG is set" in tune_trials.nvls_after(None, {"NCCL_DEBUG": "WARN"}).why
    assert tune_trials.nvls_after(None, {}).why == "NVLS support is unknown (NCCL's log did not state it): NVLS not tried"
    log = "h:1:2 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p"
    assert tune_trials.channels_in(log) == (24, 0) and tune_trials.channels_in("") == (None, None)


def test_the_recorded_nccl_log_gives_the_channels():
    from pathlib import Path

    log = (Path(__file__).parent / "fixtures" / "nccl_info_2x_h200.log").read_text()
    assert tune_trials.channels_in(log) == (24, 0)


def test_the_document_round_trip_and_the_paste_lines_on_the_terminal():
    from rich.console import Console

    from mgpu_bench.probes.comm.render import render_tuning

    t = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 112e9, 4 * MIB: 112e9, 256 * MIB: 300e9,
                                                  1024 * MIB: 300e9})
    bad = trial({"NCCL_PROTO": "allreduce:LL"}, {1 * MIB: 90e9, 4 * MIB: 90e9, 256 * MIB: 200e9, 1024 * MIB: 200e9},
                wrong_at=MIB)
    tu = Tuning(("allreduce",), (SMALL, LARGE), 22809, NVLS_OFF, defaults() + [t, bad], ["a note"])
    doc = json.loads(json.dumps(tu.to_dict()))
    assert doc["advice"]["lines"] == ["export NCCL_PROTO=allreduce:LL128"]
    assert [c["recommended"] for c in doc["choices"]] == [True, False]
    assert len(doc["trials"]) == 4 and doc["trials"][3]["measurements"][0]["wrong"] == [0, 5]
    back = Tuning.from_dict(doc)
    assert [c.to_dict() for c in back.choices()] == doc["choices"]
    out = io.StringIO()
    run = CommRun("native", ["cuda:0", "cuda:1"], [])
    render_tuning(doc, Console(file=out, width=100), run)
    text = out.getvalue()
    exports = [EXPORT.match(line) for line in text.splitlines() if line.startswith("export ")]
    assert [(m.group(1), m.group(2)) for m in exports] == [("NCCL_PROTO", "allreduce:LL128")]
    assert "failed the data check: 5 wrong element(s)" in text and "note: a note" in text
    assert "NVLS: NCCL_NVLS_ENABLE=0 in this environment" in text


def test_the_report_page_summary_and_csv_carry_the_tuning(tmp_path):
    """`comm --tune --report/--csv`: the settings per band and the lines to paste on the page and in
    summary.md, every setting's measurements in the CSV."""
    import csv as csvmod

    from mgpu_bench.probes.comm import PROBE
    from mgpu_bench.probes.comm.document import result_document

    t = trial({"NCCL_PROTO": "allreduce:LL128"}, {1 * MIB: 112e9, 4 * MIB: 112e9, 256 * MIB: 300e9,
                                                  1024 * MIB: 300e9})
    tu = Tuning(("allreduce",), (SMALL, LARGE), 22809, NVLS_OFF, defaults() + [t])
    run = CommRun("native", ["cuda:0", "cuda:1"], [], measurements=list(tu.trials[0].measurements))
    doc = json.loads(json.dumps(result_document(run, {}, ["mgpu-bench"], tu.to_dict())))
    paths = PROBE.report(doc, tmp_path / "rep")
    page = (tmp_path / "rep" / "report.html").read_text()
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert any(p.name == "report.html" for p in paths)
    for text in (page, md):
        assert "NCCL settings (comm --tune)" in text and "export NCCL_PROTO=allreduce:LL128" in text
    assert "| allreduce | small 1 MiB-4 MiB |" in md
    rows = list(csvmod.DictReader(io.StringIO(PROBE.csv(doc))))
    assert {r["setting"] for r in rows} == {tu.trials[0].candidate.label, "NCCL_PROTO=allreduce:LL128"}
    assert len(rows) == sum(len(x.measurements) for x in tu.trials) and all(float(r["busbw_Bps"]) > 0 for r in rows)


def test_the_probe_fails_a_run_where_a_setting_gave_wrong_data():
    from mgpu_bench.probes.comm import PROBE
    from mgpu_bench.probes.comm.document import result_document

    bad = trial({"NCCL_PROTO": "allreduce:LL"}, {1 * MIB: 90e9, 4 * MIB: 90e9}, wrong_at=MIB)
    tu = Tuning(("allreduce",), (SMALL,), 22809, NVLS_OFF, defaults() + [bad])
    run = CommRun("native", ["cuda:0", "cuda:1"], [], measurements=list(tu.trials[0].measurements))
    doc = json.loads(json.dumps(result_document(run, {}, ["mgpu-bench"], tu.to_dict())))
    assert PROBE.failure(doc) == "5 wrong element(s) with NCCL_PROTO=allreduce:LL: the data did not arrive intact"
    doc["tuning"]["trials"].pop()
    assert PROBE.failure(doc) is None


@pytest.mark.parametrize("args, words", [
    (["--tune"], "--tune tunes NCCL on GPUs, and no NVIDIA GPU is usable here"),
    (["--tune", "--ops", "allreduce,sendrecv"], "sendrecv run as point-to-point sends: drop them from --ops"),
    (["--tune", "--backend", "torch"], "drop --backend torch"),
    (["--tune", "--launch", "processes"], "drop --launch processes"),
    (["--tune", "--no-check"], "drop --no-check"),
])
def test_bad_tune_input_is_one_line_and_exit_2(args, words):
    from click.testing import CliRunner

    from mgpu_bench.cli import cli

    r = CliRunner().invoke(cli, ["comm", *args, "--no-store"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0].startswith("mgpu-bench: error: ") and words in lines[0]


def test_a_trial_process_without_a_gpu_ends_with_the_driver_s_message():
    from mgpu_bench.machine import selection

    if selection.visible_gpu_count():
        pytest.skip("a GPU is visible: the trial would run (tests/test_gpu_comm_tune.py covers it)")
    cfg = tune_trials.TuneConfig(ops=("allreduce",), dtype="fp32", redop="sum", sizes=(MIB,), inplace=(False,),
                          timing=TimingOptions(iters=5), timeout_s=30.0)
    kept: list[Trial] = []
    t = tune_run.run_trial(Candidate((("NCCL_PROTO", "allreduce:LL"),), PROTOCOL, ("allreduce",)),
                       [CommRequest("allreduce", "fp32", "sum", MIB, False)], [0, 1], ["cuda:0", "cuda:1"], cfg,
                       keep=kept)
    assert kept == [t] and t.measurements == [] and t.stopped == "error"
    assert t.error and selection.no_gpu_reason().split(" (")[0] in t.error
    assert tune_rule.exclusion(t, NVLS_OFF).startswith("failed: ")
