"""`mgpu-bench plan --noise-scale`: beside each GPU count's plain figures, the statistical efficiency
of its global batch E = (B_noise + B_0) / (B_noise + B) (Pollux, Qiao et al. OSDI 2021), the
goodput (throughput x E) and the days to the same training progress (the days / E), each figure
checked against hand arithmetic from the formula and the stored run's own noise scale. The history
is r1, the document a real StepMonitor(..., noise_scale=True) job stored (tests/fixtures/monitor:
least squares on 2 gloo processes; make_noise_job.py writes it again), and the H200 documents of
the fixtures (r2 the 2x H200 comm sweep, r3 350m on one H200, r4 the max-batch search: the newest
run is an H200's, as in tests/test_plan_fit.py)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.history import History

FIX = Path(__file__).parent / "fixtures"
SUITE = json.loads((FIX / "suite" / "suite.json").read_text())
JOB = json.loads((FIX / "monitor" / "noise-scale-2cpu.json").read_text())
PLANNING = Path(__file__).resolve().parent.parent / "docs" / "planning.md"
ASK = ("--model", "350m", "--tokens", "300B", "--gpus", "64", "--network", "NDR", "--gpus-per-node", "8")


def invoke(*args: str):
    return CliRunner().invoke(cli, ["plan", *args])


def plan_json(tmp_path: Path, db: Path, *args: str, code: int = 0, store: bool = False) -> tuple[dict, str]:
    out = tmp_path / f"plan-{len(list(tmp_path.glob('plan-*.json')))}.json"
    r = invoke(*args, "--db", str(db), "--json", str(out), *([] if store else ["--no-store"]))
    assert r.exit_code == code, r.output
    return json.loads(out.read_text()), r.output


def _history(db: Path) -> dict[str, str]:
    docs = {"job": JOB, "comm": json.loads((FIX / "comm_2x_h200.json").read_text()),
            "model": json.loads((FIX / "gpu" / "model-healthy.json").read_text()),
            "memory": next(p["document"] for p in SUITE["probes"] if p["name"] == "max-batch")}
    with History.open(db) as h:
        return {k: h.save(d) for k, d in docs.items()}


@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    db = tmp_path_factory.mktemp("noise") / "h.sqlite3"
    return db, _history(db)


def _efficiency(noise: float, b0: float, batch: float) -> float:
    return (noise + b0) / (noise + batch)


def _fig(doc: dict, start: str) -> dict:
    return next(f for f in doc["figures"] if f["name"].startswith(start))


PLAIN = ("gpus", "step_s", "low_s", "high_s", "measured", "samples", "rate_per_gpu", "efficiency", "days", "days_low",
         "days_high")


def test_each_gpu_count_gets_e_goodput_and_days_to_the_same_progress_from_the_stored_run(tmp_path, h200):
    """The figures of every curve point and of the answer against the formula, from the noise scale
    and batch the job's document stored; the plain figures are those of the plan without it."""
    db, ids = h200
    stored = JOB["job"]["noise_scale"]
    noise, err, b0 = stored["b_simple"], stored["stderr"], stored["b_big"]
    assert ids["job"] == "r1" and b0 == 64 and err > 0
    doc, out = plan_json(tmp_path, db, *ASK, "--noise-scale", ids["job"])
    plain, _ = plan_json(tmp_path, db, *ASK)
    assert [{k: p[k] for k in PLAIN} for p in doc["curve"]] == [{k: p[k] for k in PLAIN} for p in plain["curve"]]
    assert "noise_scale" not in plain and not any("stat_efficiency" in p for p in plain["curve"])
    assert len(doc["curve"]) >= 5
    for p in doc["curve"]:
        batch = doc["batch"] * p["gpus"]  # DDP, one micro-batch of the plan's batch per GPU
        e = _efficiency(noise, b0, batch)
        ends = [_efficiency(noise + k * err, b0, batch) for k in (-2, 2)]
        assert p["global_batch"] == batch == p["samples"]
        assert p["stat_efficiency"] == pytest.approx(e, rel=1e-12)
        assert (p["stat_efficiency_low"], p["stat_efficiency_high"]) == pytest.approx((min(ends), max(ends)), rel=1e-12)
        assert p["goodput"] == pytest.approx(p["rate_per_gpu"] * p["gpus"] * e, rel=1e-9)  # tokens/s, all GPUs
        assert p["days_progress"] == pytest.approx(p["days"] / e, rel=1e-12)
        assert p["days_progress_low"] == pytest.approx(p["days_low"] / max(ends), rel=1e-12)
        assert p["days_progress_high"] == pytest.approx(p["days_high"] / min(ends), rel=1e-12)
        assert (e > 1) == (batch < b0) and (p["days_progress"] < p["days"]) == (batch < b0)
    a, at64 = doc["answer"], next(p for p in doc["curve"] if p["gpus"] == 64)
    assert a["global_batch"] == 512 and a["days"] == plain["answer"]["days"]
    for k in ("stat_efficiency", "goodput", "days_progress", "days_progress_low", "days_progress_high"):
        assert a[k] == at64[k]
    e64 = _efficiency(noise, b0, 512)
    ns = doc["noise_scale"]
    assert (ns["b_noise"], ns["stderr"], ns["b0"], ns["run"]) == (noise, err, b0, "r1")
    assert ns["workload"] == JOB["workload"]["key"] == "job:least-squares" and ns["same_workload"] is False
    b_fig, b0_fig = _fig(doc, "gradient noise scale B_noise"), _fig(doc, "tuned at batch B_0")
    assert b_fig["value"] == noise and b_fig["unit"] == "samples" and b0_fig["value"] == b0
    assert b_fig["source"].startswith("r1: the StepMonitor job job:least-squares") and f"+- {err:.3g}" in b_fig["source"]
    assert "McCandlish et al. 2018" in b_fig["source"] and b0_fig["source"].startswith("r1: the global batch")
    assert _fig(doc, "statistical efficiency at 64 GPUs")["value"] == pytest.approx(e64)
    assert "Pollux (Qiao et al., OSDI 2021)" in _fig(doc, "statistical efficiency at 64")["source"]
    # said on the terminal: the answer's line, the table per GPU count, where the noise scale came from
    line = next(ln for ln in out.splitlines() if ln.startswith("plan: goodput at 64 GPUs"))
    assert f"the global batch 512 samples is {512 / noise:.3g}x the gradient noise scale {noise:.3g} +- {err:.3g}" \
           " samples (r1: the job job:least-squares's, not 350m's)" in line
    assert f"statistical efficiency E = {e64:.3f}" in line and "to the same training progress as 300B tokens" in line
    # doubling 512 divides the steps by (1 + N / 512) / (1 + N / 1024) < 1.2: more GPUs buy tokens/s, not convergence
    assert f"divides the steps to the same loss by only {(1 + noise / 512) / (1 + noise / 1024):.2f}" in line
    assert "goodput per GPU count" in out and "same progress" in out
    assert "not on 350m" in out and "job:least-squares" in out
    # its 6 windows rise (45.7 ... 67.2), but not beyond what 6 windows can tell from noise (issue 40: a
    # trend was claimed for a job whose weights never moved): S = 11 of 15 pairs, exact p = 40 / 720
    note = next(ln for ln in out.splitlines() if ln.startswith("note: --noise-scale r1: its estimate"))
    assert ("no significant trend (Mann-Kendall trend test over its 6 windows: S = 11, p = 0.056; per window 43.8 to "
            "67.2 samples, median 47.8): the plan takes the whole run's 48.6") in note
    assert "grows" not in note and "went from" not in out


def test_a_given_number_and_batch(tmp_path, h200):
    """--noise-scale N --noise-batch B0: the same formula at the given figures, no range, said as given;
    --noise-batch beside a stored run replaces its batch."""
    db, _ = h200
    doc, out = plan_json(tmp_path, db, *ASK, "--noise-scale", "1.5K", "--noise-batch", "256")
    for p in doc["curve"]:
        e = _efficiency(1500, 256, p["global_batch"])
        assert p["stat_efficiency"] == p["stat_efficiency_low"] == p["stat_efficiency_high"] == pytest.approx(e)
        assert p["days_progress"] == pytest.approx(p["days"] / e)
    assert doc["noise_scale"]["run"] is None and doc["noise_scale"]["stderr"] is None
    assert _fig(doc, "gradient noise scale")["source"] == "--noise-scale 1,500 samples (given; no uncertainty)"
    assert "no uncertainty given" in out and "1,500 samples, as given, taken as 350m's" in out
    over, _ = plan_json(tmp_path, db, *ASK, "--noise-scale", "R1", "--noise-batch", "128")
    noise = JOB["job"]["noise_scale"]["b_simple"]
    assert over["noise_scale"]["b0"] == 128 and _fig(over, "tuned at batch B_0")["source"] == "--noise-batch"
    assert over["answer"]["stat_efficiency"] == pytest.approx(_efficiency(noise, 128, 512))


def test_the_days_question_and_what_fits_instead(tmp_path, h200):
    """--days: the answer's GPUs are the plain ones, with the days to the same progress there; a
    layout that does not fit: each alternative gets its own global batch's efficiency."""
    db, _ = h200
    noise = JOB["job"]["noise_scale"]["b_simple"]
    doc, out = plan_json(tmp_path, db, "--model", "350m", "--tokens", "300B", "--days", "2", "--network", "NDR",
                         "--gpus-per-node", "8", "--noise-scale", "r1")
    a = doc["answer"]
    n = a["gpus"]
    point = next(p for p in doc["curve"] if p["gpus"] == n)
    assert a["budget_days"] == 2 and a["days"] == point["days"] <= 2 and a["global_batch"] == 8 * n
    assert a["days_progress"] == pytest.approx(point["days"] / _efficiency(noise, 64, 8 * n))
    assert a["global_batch"] > 64 and a["days_progress"] > 2 and "not the 2.0 days asked" in out  # E < 1 past B_0
    big, out = plan_json(tmp_path, db, "--model", "layers=36,width=4096", "--tokens", "300B", "--gpus", "64",
                         "--network", "NDR", "--gpus-per-node", "8", "--noise-scale", "r1", code=1)
    instead = [o for o in big["answer"]["instead"] if o.get("host_bytes") is None]
    assert instead and "stat_efficiency" not in big["answer"]
    for o in instead:
        e = _efficiency(noise, 64, o["global_batch"])
        assert o["stat_efficiency"] == pytest.approx(e) and o["days_progress"] == pytest.approx(o["days"] / e)
        assert o["goodput"] == pytest.approx(o["global_batch"] * 2048 / o["step_s"] * e)
    fsdp = next(o for o in instead if o["what"] == "full sharding (FSDP)")
    assert f"{fsdp['global_batch']} samples), 64 GPUs" in out and f"to the same progress at E = " \
           f"{_efficiency(noise, 64, fsdp['global_batch']):.3f}" in out


def test_the_report_carries_the_goodput_table_and_curve(tmp_path, h200):
    db, _ = h200
    folder = tmp_path / "report"
    doc, _ = plan_json(tmp_path, db, *ASK, "--noise-scale", "r1", "--report", str(folder))
    summary, page = (folder / "summary.md").read_text(), (folder / "report.html").read_text()
    assert "| GPUs | global batch | E | range | goodput tokens/s | days | same progress | range |" in summary
    for p in doc["curve"]:
        assert f"| {p['gpus']} | {p['global_batch']:,} | {p['stat_efficiency']:.3f} | " in summary
    assert "goodput per GPU count" in page and (folder / "scaling.png").stat().st_size > 0


def test_the_plan_with_its_goodput_is_stored_and_read_back(tmp_path):
    db = tmp_path / "h.sqlite3"
    ids = _history(db)
    doc, _ = plan_json(tmp_path, db, *ASK, "--noise-scale", ids["job"], store=True)
    with History.open(db) as h:
        rec = h.get("latest")  # read through the plan's declared shape
    assert rec.kind == "plan" and rec.document["noise_scale"] == doc["noise_scale"]
    assert rec.document["curve"][-1]["days_progress"] == doc["curve"][-1]["days_progress"]


@pytest.mark.parametrize(("args", "words"), [
    (["--noise-scale", "0", "--noise-batch", "64"], "--noise-scale 0: a noise scale is a positive number of samples"),
    (["--noise-scale", "-5", "--noise-batch", "64"], "--noise-scale -5: a noise scale is a positive number"),
    (["--noise-scale", "1e30", "--noise-batch", "64"], "at most 1e+15 samples"),
    (["--noise-scale", "bananas"], "give a stored run (r12, latest"),
    (["--noise-scale", "2000"], "--noise-scale 2000 is a number of samples: give --noise-batch B0"),
    (["--noise-scale", "12"], "(or r12 for the stored run)"),
    (["--noise-batch", "64"], "--noise-batch 64 without --noise-scale"),
    (["--noise-scale", "2000", "--noise-batch", "0"], "--noise-batch 0: the batch the job was tuned at"),
    (["--noise-scale", "2000", "--noise-batch", "nan"], "--noise-batch nan"),
])
def test_bad_input_is_one_line_and_exit_2_before_the_history_is_opened(tmp_path, args, words):
    r = invoke(*ASK, *args, "--db", str(tmp_path / "h.sqlite3"))
    text = r.output.strip()
    assert r.exit_code == 2, text
    assert len(text.splitlines()) == 1 and text.startswith("mgpu-bench: error: ") and "Traceback" not in text, text
    assert words in text, text
    assert not (tmp_path / "h.sqlite3").exists()


@pytest.mark.parametrize(("run", "words"), [
    ("memory", ("r4 (a memory run) has no gradient noise scale: give the run of a job monitored with "
                "StepMonitor(..., noise_scale=True)")),
    ("r99", "no run r99 in"),
])
def test_a_run_without_a_noise_scale_is_one_line_and_exit_2(h200, run, words):
    db, ids = h200
    with History.open(db) as h:
        before = len(h.list(100))
    r = invoke(*ASK, "--noise-scale", ids.get(run, run), "--db", str(db))
    text = r.output.strip()
    assert r.exit_code == 2, text
    assert len(text.splitlines()) == 1 and text.startswith("mgpu-bench: error: ") and words in text, text
    with History.open(db) as h:
        assert len(h.list(100)) == before  # nothing planned, nothing stored


def test_the_synthetic_datas_noise_scale_of_a_model_run_is_said_to_be_its():
    """Where a model run's document keeps the noise scale of its synthetic data (workload.noise_scale,
    as the model probe's findings read it), the plan says whose it is. The figures are the job's own,
    moved to where a model run keeps them."""
    from mgpu_bench.probes.plan.estimate import goodput

    doc = json.loads(json.dumps(JOB))
    doc["workload"]["noise_scale"] = doc["job"].pop("noise_scale")
    found, whose = goodput.stored(doc)
    assert found["b_simple"] == JOB["job"]["noise_scale"]["b_simple"] and whose == goodput.SYNTHETIC
    assert goodput.stored(JOB)[1] == goodput.JOB and goodput.stored({"kind": "comm"}) == (None, None)


def _readme_plan_section() -> str:
    """The docs site's planning page (the README's plan section moved there with issue 37)."""
    return PLANNING.read_text()


def test_the_readme_plan_example_runs_and_prints_what_the_readme_shows(tmp_path, h200):
    """The plan section's --noise-scale example, run on the history it names (the StepMonitor job r1
    and the fixtures' H200 runs), prints the line the planning page shows, word for word."""
    db, ids = h200
    section = _readme_plan_section()
    assert "McCandlish et al. 2018" in section and "Pollux" in section
    command = next(m.group(1) for m in re.finditer(r"`(plan [^`]*--noise-scale[^`]*)`", section))
    shown = [ln for ln in section.splitlines() if ln.startswith("plan: goodput at")]
    assert len(shown) == 1 and f"--noise-scale {ids['job']}" in command
    args = shlex.split(command)[1:]
    r = invoke(*args, "--db", str(db), "--no-store")
    assert r.exit_code == 0, r.output
    assert shown[0] in r.output.splitlines(), r.output
    # the examples' line: its options parse and pass configure(); only the run it names is not in this history
    listed = next(ln for ln in section.splitlines() if ln.startswith("mgpu-bench plan") and "--noise-scale" in ln)
    r = invoke(*shlex.split(listed.split("#")[0])[2:], "--db", str(db), "--no-store")
    assert r.exit_code == 2 and r.output.startswith("mgpu-bench: error: no run r12 in"), r.output


def _job_with_windows(per_window: list[float]) -> dict:
    doc = json.loads(json.dumps(JOB))
    doc["job"]["noise_scale"]["per_window"] = per_window
    return doc


@pytest.mark.parametrize(("per_window", "said", "not_said"), [
    # a job whose weights never moved (issue 40: 18-206 per window, median about 42): lognormal, no order
    ([41.7, 18.3, 63.0, 25.9, 206.0, 33.1, 47.5, 22.4, 88.2, 39.0, 30.6, 57.7, 19.8, 71.3, 44.1, 28.5, 120.4, 36.2,
      52.9, 24.0], "no significant trend (Mann-Kendall trend test over its 20 windows", ("grows", "falls")),
    # the noise scale growing as the loss falls, twice its first value by the end, with the same kind of scatter
    ([40.0 * (1 + i / 12) * (1.15 if i % 3 == 0 else 0.9 if i % 3 == 1 else 1.0) for i in range(20)],
     "its estimate grows over the run (Mann-Kendall trend test over its 20 windows", ("no significant",)),
])
def test_a_trend_over_the_windows_is_claimed_only_where_the_test_finds_one(tmp_path, per_window, said, not_said):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        rid = h.save(_job_with_windows(per_window))
        for d in (json.loads((FIX / "comm_2x_h200.json").read_text()),
                  json.loads((FIX / "gpu" / "model-healthy.json").read_text())):
            h.save(d)
    doc, out = plan_json(tmp_path, db, *ASK, "--noise-scale", rid)
    note = next(ln for ln in out.splitlines() if ln.startswith(f"note: --noise-scale {rid}: its estimate"))
    assert said in note and "p = " in note, note
    assert not any(w in note.split("(")[0] for w in not_said), note
    assert doc["noise_scale"]["per_window"] == per_window
