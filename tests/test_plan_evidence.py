"""Where `mgpu-bench plan` takes its figures from: only runs whose own documents say their figures
are their GPUs' (a run that shared its GPU with another process, was throttled, interrupted or
below a check floor is left out and named); found through the history's metric index, so that
thousands of runs it has no use for cost it nothing; and for a GPU the history never measured
(--gpu), the step scaled from the nearest measured one and labelled so, or an assumed rate.
The documents are the real H200 ones of tests/fixtures/gpu (model-shared.json ran beside another
job: 186 TFLOP/s against model-healthy.json's 425)."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.history import History
from mgpu_bench.machine import hardware
from mgpu_bench.probes.plan.sources import clean

FIX = Path(__file__).parent / "fixtures"
GPU = FIX / "gpu"


def load(name: str) -> dict:
    return json.loads((GPU / name).read_text())


def plan_json(tmp_path: Path, db: Path, *args: str, code: int = 0) -> tuple[dict, str]:
    out = tmp_path / f"plan-{len(list(tmp_path.glob('plan-*.json')))}.json"
    r = CliRunner().invoke(cli, ["plan", *args, "--db", str(db), "--json", str(out), "--no-store"])
    assert r.exit_code == code, r.output
    return json.loads(out.read_text()), r.output


def history(path: Path, *docs: dict) -> dict[str, str]:
    ids = {}
    with History.open(path) as h:
        for i, d in enumerate(docs):
            ids[str(i)] = h.save(d)
    return ids


def _fig(doc: dict, start: str) -> dict:
    return next(f for f in doc["figures"] if f["name"].startswith(start))


def _step(doc: dict) -> float:
    return doc["runs"][0]["derived"]["step_s"]


# -- clean evidence --------------------------------------------------------------------------------

def test_a_run_that_shared_its_gpu_is_left_out_and_named(tmp_path):
    """The shared 350m run is the newest: the plan takes the healthy one's step and says which run
    it left out and why."""
    healthy, shared = load("model-healthy.json"), load("model-shared.json")
    ids = history(tmp_path / "h.sqlite3", healthy, shared)
    doc, out = plan_json(tmp_path, tmp_path / "h.sqlite3", "--model", "350m", "--tokens", "300B", "--gpus", "1")
    step = _fig(doc, "step on 1 GPU")
    assert step["source"] == ids["0"] and step["value"] == pytest.approx(_step(healthy))
    assert doc["left_out"] == [{"run": ids["1"], "why": "model: shared with another process: GPU 0 shared with pid 1715 "
                                                        "(python3, 24.9 GiB)"}]
    assert f"left out: {ids['1']}, model: shared with another process" in out


def test_the_nearest_gpts_rate_comes_from_a_clean_run(tmp_path):
    """1.3b has no run of its own: its step is its FLOPs at the rate the 350m reached, from the
    healthy run (425 TFLOP/s), never the shared one (186), which issue 34 saw picked for being 0.5%
    nearer in FLOPs; with only the shared run stored there is no step at all."""
    healthy, shared = load("model-healthy.json"), load("model-shared.json")
    ids = history(tmp_path / "h.sqlite3", healthy, shared)
    doc, _ = plan_json(tmp_path, tmp_path / "h.sqlite3", "--model", "1.3b", "--tokens", "300B", "--gpus", "1",
                       "--batch-size", "4")
    step = _fig(doc, "step on 1 GPU")
    rate = healthy["runs"][0]["derived"]["flops_per_s_per_gpu"]
    assert ids["0"] in step["source"] and ids["1"] not in step["source"]
    assert step["value"] == pytest.approx(4 * _fig(doc, "FLOPs per sample")["value"] / rate)
    assert [x["run"] for x in doc["left_out"]] == [ids["1"]]
    only = tmp_path / "shared.sqlite3"
    sid = history(only, shared)["0"]
    doc, out = plan_json(tmp_path, only, "--model", "1.3b", "--tokens", "300B", "--gpus", "1", "--batch-size", "4",
                         code=1)  # no estimate: marked incomplete
    assert doc["answer"]["days"] is None and "missing: the step time of 1.3b" in out
    assert [x["run"] for x in doc["left_out"]] == [sid]


def test_the_rules_read_what_each_document_recorded():
    assert clean.taint(load("model-healthy.json")) is None
    assert clean.taint(load("model-shared.json")).startswith("shared with another process: GPU 0 shared with pid 1715")
    assert clean.taint(load("check-shared-1xh200.json")).startswith("shared with another process")
    stopped = load("model-healthy.json")
    stopped["status"] = {"completed": False, "stopped": "interrupted", "message": "Ctrl-C"}
    assert clean.taint(stopped) == "interrupted (interrupted: Ctrl-C)"
    gemm = load("gemm-dtypes-1xh200.json")
    assert clean.taint(gemm) is None  # the power cap at the default limit is how an H200 runs dense GEMM
    hot = copy.deepcopy(gemm)
    hot["results"][1]["telemetry"]["limiting"].append("thermal (hardware)")
    assert clean.taint(hot) == "throttled: thermal (hardware)"
    capped = copy.deepcopy(gemm)
    capped["results"][0]["telemetry"]["power_limit_w"] = 500.0
    assert clean.taint(capped) == "throttled: power limit 500 W, below the GPU's default 700 W"
    floor = load("check-shared-1xh200.json")
    floor["occupancy"]["foreign"] = []
    assert clean.taint(floor) == "below a check floor: " + next(f for f in floor["findings"] if "below its floor" in f)


def test_a_suites_throttled_probe_is_left_out_by_what_the_suite_sampled(tmp_path):
    """A suite samples the telemetry beside its model-sustained probe: a thermal slowdown there
    leaves that probe's figures out (its own document holds no telemetry)."""
    suite = json.loads((GPU / "suite-quick-1xh200.json").read_text())
    entry = next(p for p in suite["probes"] if p["name"] == "model-sustained")
    assert clean.taint(entry["document"], entry) is None
    hot = copy.deepcopy(entry)
    hot["telemetry"]["gpus"]["0"]["summary"]["limiting"].append("thermal (software)")
    assert clean.taint(hot["document"], hot) == "throttled: thermal (software)"


# -- the index -------------------------------------------------------------------------------------

def _grow(db: Path, run_id: str, copies: int) -> None:
    """`copies` more stored runs like `run_id` (its row and its metrics), as a busy history holds."""
    row = int(run_id[1:])
    con = sqlite3.connect(db)
    with con:
        for _ in range(copies):
            new = con.execute("INSERT INTO runs (created, kind, command, host, fingerprint, document) SELECT created, "
                              "kind, command, host, fingerprint, document FROM runs WHERE id = ?", (row,)).lastrowid
            con.execute("INSERT INTO metrics (run, name, value, unit, better, samples, labels) SELECT ?, name, value, "
                        "unit, better, samples, labels FROM metrics WHERE run = ?", (new, row))
    con.close()


def test_the_evidence_is_found_through_the_index_not_by_reading_every_run(tmp_path):
    """The same question on a history 2,200 runs larger (a node's `check` every 10 minutes for two
    weeks, runs of another workload) reads the same documents and answers the same."""
    docs = (json.loads((FIX / "comm_2x_h200.json").read_text()), load("model-healthy.json"), load("model-1xh200.json"),
            load("check-1xh200.json"))
    small, big = tmp_path / "small.sqlite3", tmp_path / "big.sqlite3"
    history(small, *docs)
    ids = history(big, *docs)
    _grow(big, ids["3"], 2000)  # check runs
    _grow(big, ids["2"], 200)  # 125m runs: another workload
    args = ("--model", "350m", "--tokens", "300B", "--gpus", "8", "--gpus-per-node", "8")
    a, _ = plan_json(tmp_path, small, *args)
    b, _ = plan_json(tmp_path, big, *args)
    assert a["answer"] == b["answer"] and a["figures"] == b["figures"]
    assert a["documents_read"] == b["documents_read"] <= 4
    with History.open(big, readonly=True) as h:
        assert len(h.list(limit=10_000)) == 2204


def test_many_runs_of_the_workload_itself_are_read_only_to_a_bound(tmp_path):
    from mgpu_bench.probes.plan.sources.evidence import MODEL_DOCS

    db = tmp_path / "h.sqlite3"
    ids = history(db, load("model-healthy.json"))
    _grow(db, ids["0"], 100)
    doc, _ = plan_json(tmp_path, db, "--model", "350m", "--tokens", "300B", "--gpus", "1")
    assert doc["documents_read"] <= MODEL_DOCS and doc["answer"]["days"] > 0


# -- a GPU the history never measured --------------------------------------------------------------

def test_a_gpu_without_runs_gets_a_step_scaled_by_the_datasheet_peaks(tmp_path):
    healthy = load("model-healthy.json")
    ids = history(tmp_path / "h.sqlite3", healthy, json.loads((FIX / "comm_2x_h200.json").read_text()))
    doc, _ = plan_json(tmp_path, tmp_path / "h.sqlite3", "--model", "350m", "--tokens", "300B", "--gpus", "8",
                         "--gpu", "a100_sxm4_80gb")
    a100, h200 = hardware.load().gpus["a100_sxm4_80gb"], hardware.load().gpus["h200_sxm"]
    step = _fig(doc, "step on 1 GPU")
    ratio = h200.peak["bf16"].value / a100.peak["bf16"].value
    assert step["value"] == pytest.approx(_step(healthy) * ratio)
    assert step["source"].startswith(f"scaled: {ids['0']} on the NVIDIA H200") and "datasheet peaks" in step["source"]
    assert doc["device"]["name"] == "NVIDIA A100-SXM4-80GB" and _fig(doc, "device memory")["value"] == a100.memory.value
    node = _fig(doc, "allreduce busbw, one node")
    assert node["value"] == pytest.approx(12 * 25e9 * 0.8) and "NVLink" in node["source"]
    assert "datasheet" in node["source"]  # the H200 comm run is not the A100 node's
    assert doc["answer"]["days"] > 0 and doc["answer"]["fits"] is True


def test_the_measured_matmul_ceilings_scale_the_step_where_both_gpus_have_them(tmp_path):
    """A gemm run on each GPU model: the step takes the ratio of what their matmuls measured. (The
    A100 document here is the H200's with its device names changed: the test checks the ratio
    taken, whatever the figures.)"""
    h200 = load("gemm-dtypes-1xh200.json")
    a100 = copy.deepcopy(h200)
    for g in a100["environment"]["gpus"]:
        g["name"] = "NVIDIA A100-SXM4-80GB"
    for r in a100["results"]:
        r["gpu_name"] = "NVIDIA A100-SXM4-80GB"
        r["flops_per_s"] *= 0.4
    healthy = load("model-healthy.json")
    ids = history(tmp_path / "h.sqlite3", healthy, h200, a100)
    doc, _ = plan_json(tmp_path, tmp_path / "h.sqlite3", "--model", "350m", "--tokens", "300B", "--gpus", "1",
                       "--gpu", "a100_sxm4_80gb")
    best = {name: max(r["flops_per_s"] for r in d["results"] if r["dtype"] == "bf16") for name, d in
            (("h200", h200), ("a100", a100))}
    step = _fig(doc, "step on 1 GPU")
    assert step["value"] == pytest.approx(_step(healthy) * best["h200"] / best["a100"])
    assert "matmul ceilings measured" in step["source"] and ids["1"] in step["source"] and ids["2"] in step["source"]


def test_the_gpu_the_history_measured_is_planned_from_its_own_runs(tmp_path):
    healthy = load("model-healthy.json")
    ids = history(tmp_path / "h.sqlite3", healthy)
    doc, _ = plan_json(tmp_path, tmp_path / "h.sqlite3", "--model", "350m", "--tokens", "300B", "--gpus", "1",
                       "--gpu", "h200")
    assert _fig(doc, "step on 1 GPU")["source"] == ids["0"]


def test_no_run_at_all_takes_an_assumed_mfu_and_says_so(tmp_path):
    db = tmp_path / "empty.sqlite3"
    History.open(db).close()
    common = ("--model", "layers=24,width=2048", "--tokens", "100B", "--gpus", "64", "--gpu", "h100_sxm5", "--network",
              "NDR")
    without, out = plan_json(tmp_path, db, *common, code=1)  # no estimate: marked incomplete
    assert without["answer"]["days"] is None and "missing: the step time" in out
    doc, out = plan_json(tmp_path, db, *common, "--mfu", "0.4")
    peak = hardware.load().gpus["h100_sxm5"].peak["bf16"].value
    per_sample = _fig(doc, "FLOPs per sample")["value"]
    assert _fig(doc, "FLOP/s per GPU")["value"] == pytest.approx(0.4 * peak)
    assert "assumed: --mfu 0.4" in _fig(doc, "FLOP/s per GPU")["source"]
    assert doc["answer"]["days"] == pytest.approx(100e9 / 2048 * per_sample / (64 * 0.4 * peak) / 86400)
    assert "at the given rate (assumed)" in out
