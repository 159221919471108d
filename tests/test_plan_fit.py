"""`mgpu-bench plan`, fit first, and tensor and pipeline parallelism: a layout that does not fit is
given no days and no GPU count, exit code 1, and what fits instead is answered with its days
(each checked by planning that layout on its own); tensor, pipeline and data parallel degrees with
sequence parallelism and recomputation, their memory per GPU and step checked against the
published formulas (Korthikanti et al. 2022; Narayanan et al. 2021, SC21) from the figures the
document itself gives; the two end-to-end estimates of Narayanan et al. section 5.1 reproduced
within 10% from their per-GPU rates. The history is the H200 documents of the fixtures."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.history import History
from mgpu_bench.probes.plan.estimate.project import Bandwidth
from mgpu_bench.results.probe import headline

FIX = Path(__file__).parent / "fixtures"
SUITE = json.loads((FIX / "suite" / "suite.json").read_text())
GIB = float(1 << 30)
GPT3 = "layers=96,width=12288,heads=96,vocab=51200"  # GPT-3 175B as Narayanan et al. 2021 train it (V 51,200)
ONE_T = "layers=128,width=25600,heads=160,vocab=51200"  # their 1T model (Table 1's last row)


def invoke(*args: str):
    return CliRunner().invoke(cli, ["plan", *args])


def plan_json(tmp_path: Path, db: Path, *args: str, code: int = 0) -> tuple[dict, str]:
    out = tmp_path / f"plan-{len(list(tmp_path.glob('plan-*.json')))}.json"
    r = invoke(*args, "--db", str(db), "--json", str(out), "--no-store")
    assert r.exit_code == code, r.output
    return json.loads(out.read_text()), r.output


@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> Path:
    """The 2x H200 comm sweep, 350m on one H200 (healthy), the 350m max-batch search."""
    db = tmp_path_factory.mktemp("h200") / "h.sqlite3"
    docs = [json.loads((FIX / "comm_2x_h200.json").read_text()), json.loads((FIX / "gpu" / "model-healthy.json").read_text()),
            next(p["document"] for p in SUITE["probes"] if p["name"] == "max-batch")]
    with History.open(db) as h:
        for d in docs:
            h.save(d)
    return db


@pytest.fixture(scope="module")
def empty(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("empty") / "h.sqlite3"
    History.open(db).close()
    return db


def _fig(doc: dict, start: str) -> dict:
    return next(f for f in doc["figures"] if f["name"].startswith(start))


def _point(doc: dict, n: int) -> dict:
    return next(p for p in doc["curve"] if p["gpus"] == n)


def _instead(doc: dict, start: str) -> dict:
    return next(o for o in doc["answer"]["instead"] if o["what"].startswith(start))


def _parallel(o: dict) -> list[str]:
    """The --parallel (and --checkpointing) that plans an alternative's layout on its own."""
    lay = o["layout"]
    text = lay["shard"] if lay["tp"] == lay["pp"] == 1 else f"tp={lay['tp']},pp={lay['pp']},{lay['shard']}"
    return ["--parallel", text, *(["--checkpointing"] if lay["checkpointing"] else [])]


# -- fit first -------------------------------------------------------------------------------------

def test_the_7b_ddp_plan_gives_no_days_and_says_what_fits(tmp_path, h200):
    """7.46B under DDP on 64 H200: 16 B x 7.46B of states on every GPU do not fit one; the
    answer has no days, the exit code is 1, and each alternative's days are what planning it
    alone gives."""
    common = ("--model", "layers=36,width=4096", "--tokens", "300B", "--gpus", "64", "--network", "NDR",
              "--gpus-per-node", "8")
    doc, out = plan_json(tmp_path, h200, *common, code=1)
    a = doc["answer"]
    assert a["fits"] is False and a["days"] is None and a["gpus"] is None and a["layout"]["name"] == "ddp"
    assert a["memory"] > a["capacity"] * 0.98
    assert doc["curve"] == [] and "does not fit as asked" in out and "exit code 1" in out
    names = [m.name for m in headline(doc)]  # what the history would keep: the memory, no step, no time to train
    assert "plan.gpt-L36-d4096.ddp.b8.memory" in names and not [n for n in names if n.endswith((".step", ".time_to_train"))]
    fsdp = _instead(doc, "full sharding (FSDP)")
    assert fsdp["gpus"] == 64 and fsdp["at_asked"] and fsdp["days"] > 0
    alone, _ = plan_json(tmp_path, h200, *common, *_parallel(fsdp))
    assert alone["answer"]["fits"] is True and alone["answer"]["days"] == pytest.approx(fsdp["days"])
    for o in a["instead"]:
        assert o["days"] is not None and o["memory"] <= doc["device"]["memory"] * 0.98, o
    assert f"instead: full sharding (FSDP): FSDP at micro-batch {doc['batch']}" in out


def test_the_175b_days_question_answers_only_layouts_that_fit(tmp_path, h200):
    """--days 34 for the GPT-3 175B shape at batch 8: neither DDP nor FSDP holds it at that batch
    (its activations alone are more than an H200), so no GPU count is given for it; each
    alternative is the fewest GPUs that make 34 days, and fits there."""
    common = ("--model", "layers=96,width=12288", "--tokens", "300B", "--network", "NDR", "--gpus-per-node", "8")
    doc, out = plan_json(tmp_path, h200, *common, "--days", "34", "--batch-size", "8", code=1)
    a = doc["answer"]
    assert a["fits"] is False and a["gpus"] is None and "on any number of GPUs" in a["text"]
    assert doc["fit"]["fewest_gpus_ddp"] is None and doc["fit"]["fewest_gpus_fsdp"] is None
    assert doc["curve"] == [] and "296 GPUs" not in out
    whats = [o["what"] for o in a["instead"]]
    assert any(w.startswith("tensor and pipeline parallelism") for w in whats), whats
    assert any("checkpointing" in w or "smaller micro-batch" in w for w in whats), whats
    for o in a["instead"]:
        assert o["days"] <= 34 and o["gpus"] >= 8, o
        alone, _ = plan_json(tmp_path, h200, *common, "--batch-size", str(o["batch"]), "--gpus", str(o["gpus"]),
                             *_parallel(o))
        assert alone["answer"]["fits"] is True and alone["answer"]["days"] == pytest.approx(o["days"]), o


def test_70b_on_8_a100_fits_by_no_sharding_and_says_what_would(tmp_path, h200):
    """The seeds' example: a 70B model (69.7B at these sizes) on 8 A100 80GB: 16 B/param is 1.12 TB
    of states against 640 GiB of GPU memory. It does not fit by any sharding: the answer says so,
    names the fewest GPUs that hold it, and the host memory that optimizer states there would take."""
    doc, out = plan_json(tmp_path, h200, "--model", "layers=86,width=8192,heads=64", "--tokens", "2T", "--gpus", "8",
                         "--gpu", "a100_sxm4_80gb", "--network", "NDR", code=1)
    params = doc["workload"]["params"]
    assert 69e9 < params < 70e9 and 16 * params == pytest.approx(1.115e12, rel=1e-3)
    assert doc["device"]["memory"] == 80 * GIB and doc["device"]["name"] == "NVIDIA A100-SXM4-80GB"
    a = doc["answer"]
    assert a["fits"] is False and a["days"] is None
    assert "model states alone (1.01 TiB) are more than the 640.00 GiB of 8 GPUs" in out
    fewest = min(o["gpus"] for o in a["instead"] if o.get("host_bytes") is None)
    assert 8 < fewest and all(o["gpus"] > 8 for o in a["instead"] if o.get("host_bytes") is None)
    host = next(o for o in a["instead"] if o.get("host_bytes") is not None)
    assert host["host_bytes"] == 12 * params and host["gpus"] == 8 and host["days"] is None
    assert host["gpu_state_bytes"] == pytest.approx(4 * params / 8) and host["fits"] is (host["gpu_bytes"] <= 0.98 * 80 * GIB)
    assert "optimizer states in host memory (ZeRO-Offload)" in out and "not timed" in out


def test_a_plan_that_fits_is_answered_and_exits_0(tmp_path, h200):
    doc, out = plan_json(tmp_path, h200, "--model", "350m", "--tokens", "300B", "--gpus", "64", "--network", "NDR",
                         "--gpus-per-node", "8")
    assert doc["answer"]["fits"] is True and doc["answer"]["days"] > 0 and "instead" not in doc["answer"]
    assert "does not fit" not in out


def test_the_exit_code_for_what_does_not_fit_is_documented():
    r = CliRunner().invoke(cli, ["plan", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "1 the layout asked does not fit" in text and "exits with code 1" in text


# -- tensor and pipeline parallelism ---------------------------------------------------------------

def test_tensor_and_pipeline_parallelism_time_every_part_from_the_figures(tmp_path, h200):
    """175B with tp=8, pp=16 and recomputation on 1,024 H200: the step is (m + p - 1) slots of the
    compute split 128 ways plus the tensor-parallel all-gathers and reduce-scatters (at the comm
    run's busbw) plus the pipeline's sends, then the data-parallel all-reduce; the bubble (p - 1)/m."""
    doc, _ = plan_json(tmp_path, h200, "--model", GPT3, "--tokens", "300B", "--gpus", "1024", "--parallel", "tp=8,pp=16",
                       "--checkpointing", "--global-batch", "1536", "--network", "NDR", "--gpus-per-node", "8")
    lay, a = doc["layout"], doc["answer"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["sp"], lay["checkpointing"]) == (8, 16, 8, True, True)
    m = 1536 // (8 * 1)
    assert a["fits"] is True and a["micro_batches"] == m == _fig(doc, "micro-batches")["value"]
    assert _fig(doc, "pipeline bubble")["value"] == pytest.approx(15 / m)
    p = _point(doc, 1024)
    comm = json.loads((FIX / "comm_2x_h200.json").read_text())

    def busbw(op: str) -> Bandwidth:  # the comm run's figure per size, the faster of in- and out-of-place
        pts: dict[int, float] = {}
        for x in comm["measurements"]:
            if x["spec"]["op"] == op:
                b = x["spec"]["bytes"] / max(x["burst_seconds"]) / 2  # 2 ranks: bus factor 1/2
                pts[x["spec"]["bytes"]] = max(pts.get(x["spec"]["bytes"], 0.0), b)
        return Bandwidth(tuple(sorted(pts.items())), op, 2)

    size = 2048 * 1 * 12288 * 2  # s b h x 2 bytes
    ag, rs = busbw("allgather"), busbw("reducescatter")
    per_layer = 6 * (size * 7 / 8 / ag.at(size) + size * 7 / 8 / rs.at(size))  # fwd, bwd, recomputed fwd: 3 x 2 pairs
    tp = 96 / 16 * per_layer
    assert p["tp_s"] == pytest.approx((m + 15) * tp, rel=0.02)
    send = size / 8
    assert p["pp_s"] == pytest.approx((m + 15) * 2 * send / (50e9 * 0.8))  # one NDR port at NCCL's 80%
    rc = _fig(doc, "FLOPs with recomputation")["value"]
    work = _fig(doc, "step on 1 GPU")["value"] * rc / 128
    assert p["compute_s"] == pytest.approx((m + 15) * work + p["tp_s"] + p["pp_s"])
    assert p["bubble_s"] == pytest.approx(15 * (work + (p["tp_s"] + p["pp_s"]) / (m + 15)))
    assert p["step_s"] == pytest.approx(p["compute_s"] + p["comm_s"]) and p["exposed_s"] == p["comm_s"]
    assert a["days"] == pytest.approx(300e9 / (1536 * 2048) * p["step_s"] / 86400)


def test_the_memory_per_gpu_of_a_layout_is_korthikantis(tmp_path, h200):
    """Model states of the first pipeline stage split by tp; activations of min(pp, m)
    micro-batches of its layers: s b h x 34 / t with sequence parallelism, 2 s b h / t with
    recomputation (plus one layer rebuilt), both times the ratio the measured activations bear to
    the formula at tp = pp = 1 (here none was measured for a bare size: 1)."""
    common = ("--model", GPT3, "--tokens", "300B", "--gpus", "1024", "--parallel", "tp=8,pp=16", "--global-batch",
              "1536", "--network", "NDR", "--gpus-per-node", "8")
    plain, _ = plan_json(tmp_path, h200, *common)
    ckpt, _ = plan_json(tmp_path, h200, *common, "--checkpointing")
    d, L, V, s = 12288, 96, 51200, 2048
    block = 12 * d * d + 13 * d
    other = (V + s) * d + 2 * d
    states = 16 * (L // 16 * block + other) / 8
    sbh = s * 1 * d
    for doc, layer, rebuilt in ((plain, 34 * sbh / 8, 0.0), (ckpt, 2 * sbh / 8, 34 * sbh / 8)):
        f = doc["fit"]["asked"]
        assert f["states"] == pytest.approx(states) and (f["tp"], f["pp"], f["dp"]) == (8, 16, 8)
        first = 16 * (L // 16) * layer + rebuilt
        last = (L // 16) * layer + rebuilt + s * V * 6 / 8
        assert f["activations"] == pytest.approx(max(first, last))
    assert ckpt["fit"]["asked"]["activations"] < plain["fit"]["asked"]["activations"] / 10


def test_search_finds_a_layout_no_slower_than_one_asked(tmp_path, h200):
    common = ("--model", GPT3, "--tokens", "300B", "--gpus", "1024", "--global-batch", "1536", "--network", "NDR",
              "--gpus-per-node", "8", "--batch-size", "1")
    found, out = plan_json(tmp_path, h200, *common, "--parallel", "search")
    asked, _ = plan_json(tmp_path, h200, *common, "--parallel", "tp=8,pp=16", "--checkpointing")
    assert found["answer"]["fits"] is True and found["answer"]["days"] <= asked["answer"]["days"] * (1 + 1e-9)
    assert "--parallel search:" in out and found["layout"]["tp"] * found["layout"]["pp"] * found["layout"]["dp"] == 1024


# -- ZeRO stages 1 and 2 (Rajbhandari et al. 2020) -------------------------------------------------

def test_the_model_states_of_each_zero_stage_are_figure_1s():
    """ZeRO's Figure 1 (section 3.1 / 5.1): 7.5B parameters on 64 GPUs with mixed-precision Adam
    (2 B fp16 weights, 2 B fp16 gradients, K = 12) hold 120, 31.4, 16.6 and 1.9 GB per GPU under
    DDP, P_os, P_os+g and P_os+g+p: from the plan's own memory function, to the paper's rounding."""
    from mgpu_bench.probes.plan.estimate.memory import ZERO_K, model_state_bytes

    psi, n = 7.5e9, 64
    gb = {s: model_state_bytes(psi, s, n) / 1e9 for s in ("ddp", "zero1", "zero2", "fsdp")}
    assert ZERO_K == 12
    assert gb == pytest.approx({"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "fsdp": 1.9}, abs=0.05)
    assert gb["zero1"] * 1e9 == pytest.approx(4 * psi + 12 * psi / n, rel=1e-12)
    assert gb["zero2"] * 1e9 == pytest.approx(2 * psi + 14 * psi / n, rel=1e-12)
    assert gb["fsdp"] * 1e9 == pytest.approx(16 * psi / n, rel=1e-12)
    assert model_state_bytes(psi, "zero1", 1) == model_state_bytes(psi, "ddp", 1) == 16 * psi  # one rank: nothing split


def test_zero_stages_move_ddps_volume_and_zero_3_half_as_much_again():
    """Per rank and step (section 7): ZeRO-1 and 2 reduce-scatter the gradients and all-gather the
    weights, the 2 Psi elements of DDP's all-reduce; ZeRO-3 (FSDP) gathers the weights twice, 3 Psi,
    less what FSDP2 keeps (the root, the last block). With every dtype 4 bytes (CPU processes) the
    bytes compare as the elements do."""
    from mgpu_bench.probes.plan.estimate.project import collectives
    from mgpu_bench.probes.plan.layout import Layout
    from mgpu_bench.probes.plan.workload import describe

    facts = describe("layers=24,width=1024", None, False)
    vol = {s: collectives(facts, Layout(shard=s), 4).volume(8) for s in ("ddp", "zero1", "zero2", "fsdp")}
    assert vol["ddp"] == pytest.approx(2 * 4 * facts.params * 7 / 8, rel=1e-12)
    assert vol["zero1"] == pytest.approx(vol["ddp"], rel=1e-12) and vol["zero2"] == pytest.approx(vol["ddp"], rel=1e-12)
    again = facts.block_params + facts.other_params  # not gathered a second time by FSDP2
    assert vol["fsdp"] == pytest.approx(4 * (3 * facts.params - again) * 7 / 8, rel=1e-12)
    assert 1.35 < vol["fsdp"] / vol["ddp"] < 1.5
    # the all-gather after the optimizer step is apart (never hidden); ZeRO-2 reduce-scatters every micro-batch
    z1, z2 = collectives(facts, Layout(shard="zero1"), 2, 4), collectives(facts, Layout(shard="zero2"), 2, 4)
    assert {op for op, _, _ in z1.after} == {"allgather"} and {op for op, _, _ in z1.calls} == {"reducescatter"}
    assert sum(k for _, _, k in z2.calls) == 4 * sum(k for _, _, k in z1.calls)


def test_zero_1_and_2_are_planned_beside_ddp_and_fsdp(tmp_path, h200):
    """--parallel zero1|zero2: the states per GPU the plan fits are ZeRO's formulas at the plan's GPU
    count (bf16 weights and gradients on an H200), the stage is named in the lines and the document,
    its collectives are timed with the all-gather exposed, and the fewest GPUs of a model DDP cannot
    hold are the fewest where the stage's shard leaves room."""
    common = ("--model", "350m", "--tokens", "300B", "--gpus", "64", "--network", "NDR", "--gpus-per-node", "8")
    docs, outs = {}, {}
    for stage in ("ddp", "zero1", "zero2", "fsdp"):
        docs[stage], outs[stage] = plan_json(tmp_path, h200, *common, "--parallel", stage)
    p = docs["ddp"]["workload"]["params"]
    assert docs["zero1"]["fit"]["zero1"]["states"] == pytest.approx(p * (4 + 12 / 64), rel=1e-12)
    assert docs["zero2"]["fit"]["zero2"]["states"] == pytest.approx(p * (2 + 14 / 64), rel=1e-12)
    states = [docs[s]["fit"][s]["states"] for s in ("ddp", "zero1", "zero2", "fsdp")]
    assert states == sorted(states, reverse=True)
    for stage, words in (("zero1", "ZeRO-1"), ("zero2", "ZeRO-2")):
        doc, out = docs[stage], outs[stage]
        assert doc["layout"]["shard"] == stage and doc["layout"]["text"] == words and doc["config"]["parallel"] == stage
        assert f"plan: fit ({words}): 350m at batch 8 needs" in out and f"64 GPUs (8 nodes of 8) with {words}:" in out
        assert f"{words}, batch 8 per GPU on NVIDIA H200" in " ".join(out.split())  # a title wraps at COLUMNS
        assert f"{words} reduce-scatters the 16-bit gradients" in _fig(doc, "gradient traffic")["source"]
        hidden = _fig(doc, "collective hidden by backward")
        assert hidden["value"] == 0 and "never hidden" in hidden["source"]
        point = _point(doc, 64)
        assert point["exposed_s"] == pytest.approx(point["comm_s"]) and point["high_s"] >= point["step_s"]
        assert doc["answer"]["days"] == pytest.approx(point["days"])
    help_text = " ".join(CliRunner().invoke(cli, ["plan", "--help"]).output.split())
    assert "zero1, zero2 (DeepSpeed's ZeRO stages 1 and 2" in help_text and "4 + 12 / N under ZeRO-1" in help_text
    # a 7.46B model DDP cannot hold at batch 8 on an H200: ZeRO-1's fewest GPUs hold it, one fewer does not
    big = ("--model", "layers=36,width=4096", "--tokens", "300B", "--network", "NDR", "--gpus-per-node", "8",
           "--parallel", "zero1")
    doc, out = plan_json(tmp_path, h200, *big, "--gpus", "64")
    k = doc["fit"]["fewest_gpus_zero1"]
    assert doc["fit"]["ddp"]["fits"] is False and k and k > 1 and doc["fit"]["zero1"]["fits"] is True
    at, _ = plan_json(tmp_path, h200, *big, "--gpus", str(k))
    below, out = plan_json(tmp_path, h200, *big, "--gpus", str(k - 1), code=1)
    assert at["answer"]["fits"] is True and below["answer"]["fits"] is False
    assert "with ZeRO-1 does not fit" in out
    # DDP asked: ZeRO-2 is among what fits instead, at the days of planning it on its own
    ddp, out = plan_json(tmp_path, h200, *big[:-1], "ddp", "--gpus", "64", code=1)
    z2 = _instead(ddp, "optimizer states and gradients partitioned (ZeRO-2)")
    alone, _ = plan_json(tmp_path, h200, *big[:-1], "zero2", "--gpus", str(z2["gpus"]))
    assert alone["answer"]["days"] == pytest.approx(z2["days"]) and "instead: optimizer states and gradients" in out


# -- the days answered ------------------------------------------------------------------------------

def test_the_days_headline_is_the_projection_of_the_gpus_answered(tmp_path, empty):
    """--days D answers the fewest GPUs within D and the days those GPUs take, the budget beside
    them (issue 40: the 1T model's "30.0 days ... 12288 GPUs" where its own table gave 21.2)."""
    doc, out = plan_json(tmp_path, empty, "--model", ONE_T, "--tokens", "450B", "--days", "90", "--parallel",
                         "tp=8,pp=64", "--checkpointing", "--global-batch", "3072", "--gpu", "a100_sxm4_80gb",
                         "--rate", "163T", "--network", "HDR")
    a = doc["answer"]
    n, point = a["gpus"], _point(doc, doc["answer"]["gpus"])
    assert a["budget_days"] == 90 and a["days"] == point["days"] <= 90 and a["days"] != 90
    assert (a["days_low"], a["days_high"]) == (point["days_low"], point["days_high"])
    line = next(ln for ln in out.splitlines() if ln.startswith(f"plan: {n} GPUs ("))
    assert f"finish 450B tokens in {a['days']:.1f} days" in line and "within the budget of 90.0 days" in line


# -- Megatron-LM (Narayanan et al. 2021, SC21) -----------------------------------------------------

@pytest.mark.parametrize(("model", "tokens", "gpus", "layout", "batch", "rate", "paper_days"), [
    # section 5.1: GPT-3 175B, 300B tokens, 1,024 A100 at 140 TFLOP/s: about 34 days (t = 8 within a node, as
    # Table 1 has it from 18B up; pp = 16 splits the 96 layers and leaves dp = 8 of 1,024)
    (GPT3, "300B", 1024, "tp=8,pp=16", 1536, "140T", 34.0),
    # section 5.1 and Table 1's last row: 1T parameters, 450B tokens, 3,072 A100 at 163 TFLOP/s (t 8, p 64, batch
    # 3,072): about 84 days
    (ONE_T, "450B", 3072, "tp=8,pp=64", 3072, "163T", 84.0),
])
def test_megatrons_end_to_end_estimates_come_out_within_10_percent(tmp_path, empty, model, tokens, gpus, layout,
                                                                   batch, rate, paper_days):
    doc, out = plan_json(tmp_path, empty, "--model", model, "--tokens", tokens, "--gpus", str(gpus), "--parallel", layout,
                         "--checkpointing", "--global-batch", str(batch), "--gpu", "a100_sxm4_80gb", "--rate", rate,
                         "--network", "HDR")
    a = doc["answer"]
    assert a["fits"] is True and a["memory"] <= 0.98 * 80 * GIB  # their configuration fits an 80 GB A100
    assert abs(a["days"] / paper_days - 1) <= 0.10, a["days"]
    # the days are the step's FLOPs (with recomputation, their X's convention) at the given rate, nothing added
    flops = _fig(doc, "FLOPs per sample")["value"] * _fig(doc, "FLOPs with recomputation")["value"]
    x = float(rate[:-1]) * 1e12
    assert a["days"] == pytest.approx(float(tokens[:-1]) * 1e9 / 2048 * flops / (gpus * x) / 86400)
    assert "assumed: --rate" in _fig(doc, "FLOP/s per GPU")["source"] and "at the given rate (assumed)" in out


# -- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "words"), [
    (["--gpus", "1000", "--parallel", "tp=8,pp=16"], "not a multiple of tp x pp = 128"),
    (["--gpus", "1024", "--parallel", "tp=8,pp=16,dp=4"], "that is 512 GPUs, not the 1024 asked"),
    (["--gpus", "1024", "--parallel", "tp=8,pp=7"], "must divide the 96 layers"),
    (["--gpus", "1024", "--parallel", "tp=16"], "stays within a node of 8 GPUs"),
    (["--gpus", "1024", "--parallel", "tp=5"], "must divide the 96 attention heads"),
    (["--gpus", "1024", "--parallel", "tp=8,zz=2"], "'zz=2' is not ddp, zero1, zero2, fsdp, search"),
    (["--gpus", "1024", "--parallel", ""], "--parallel ''"),
    (["--days", "30", "--parallel", "tp=8,pp=16,dp=8"], "fixes the GPUs"),
    (["--parallel", "search"], "needs the question"),
    (["--gpus", "1024", "--parallel", "tp=8,pp=16", "--global-batch", "1001"], "do not divide it"),
    (["--gpus", "8", "--gpu", "Z9000"], "not a GPU of the hardware database"),
    (["--gpus", "8", "--gpu", "A100"], "names 2 GPUs of the hardware database"),
    (["--gpus", "8", "--gpu", ""], "--gpu ''"),
    (["--gpus", "8", "--rate", "fast"], "write FLOP/s per GPU like 140T"),
    (["--gpus", "8", "--rate", "140T", "--mfu", "0.4"], "--rate and --mfu together"),
    (["--gpus", "8", "--mfu", "1.5"], "--mfu 1.5: at most 1"),
    (["--gpus", "8", "--mfu", "1e-300"], "--mfu 1e-300: at least 0.01"),  # it printed days of 300 digits
    (["--gpus", "8", "--mfu", "0"], "--mfu 0: at least 0.01"),
    (["--gpus", "8", "--mfu", "nan"], "--mfu nan: give a number from 0.01 to 1"),
    (["--gpus", "8", "--parallel", "zero1,zero2"], "give one of ddp, zero1, zero2, fsdp"),
    (["--gpus", "8", "--network", ""], "--network '' is blank"),
])
def test_bad_layouts_and_gpus_are_one_line_and_exit_2(tmp_path, args, words):
    r = invoke("--model", GPT3, "--tokens", "300B", "--gpus-per-node", "8", *args, "--db", str(tmp_path / "h.sqlite3"))
    text = r.output.strip()
    assert r.exit_code == 2, text
    assert len(text.splitlines()) == 1 and text.startswith("mgpu-bench: error: ") and "Traceback" not in text, text
    assert words in text, text
    assert not (tmp_path / "h.sqlite3").exists()  # refused before the history is opened


def test_tensor_parallelism_of_a_model_without_layers_is_refused(tmp_path):
    r = invoke("--model", "torchvision:resnet18", "--samples", "1M", "--gpus", "8", "--parallel", "tp=2",
               "--db", str(tmp_path / "h.sqlite3"))
    assert r.exit_code == 2 and "planned for GPT-shaped models" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_bare_size_out_of_bounds_answers_at_once(tmp_path):
    """Issue 33: layers=10000000,width=10000000 never answered (it was built on the meta device)."""
    for model, words in (("layers=10000000,width=10000000", "layers must be from 1 to 10000"),
                         ("layers=10000,width=1000000", "parameters; at most 1e+15")):
        t0 = time.monotonic()
        r = invoke("--model", model, "--tokens", "300B", "--db", str(tmp_path / "h.sqlite3"))
        assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output
        assert time.monotonic() - t0 < 30
    doc, _ = plan_json(tmp_path, tmp_path / "h2.sqlite3", "--model", "layers=10000,width=8192", "--tokens", "1T",
                       "--gpus", "1024", "--parallel", "fsdp", "--gpu", "h200", code=1)  # 8T parameters: counted, not built
    assert doc["workload"]["params"] == pytest.approx(12 * 10000 * 8192**2, rel=0.01)
    assert math.isfinite(doc["fit"]["asked"]["states"])


def test_a_bare_size_counts_what_the_built_gpt_holds():
    """The bare size's tensors, parameters and FLOPs written out from the GPT's layout are those of
    the built-in GPT built on the meta device (workloads/gpt.py)."""
    from mgpu_bench.probes.plan.workload import describe
    from mgpu_bench.workloads.gpt import GPT, ModelSpec, flops_per_token, param_count

    bare = describe("layers=3,width=128,heads=4,vocab=1000", 64, True)
    spec = ModelSpec("x", layers=3, d_model=128, heads=4, vocab=1000, max_seq=64)
    built = {id(p): int(p.numel()) for p in GPT(spec, device="meta").parameters()}
    assert bare.tensors == tuple(built.values()) and bare.params == param_count(spec)
    assert bare.flops_per_sample == pytest.approx(flops_per_token(spec, 64) * 64)
    assert bare.blocks == 3 and bare.block_params * 3 + bare.other_params == bare.params
    from mgpu_bench.workloads import resolve

    for name in ("tiny", "350m"):  # a built-in size, counted the same way, is what it builds
        facts, w = describe(name, 256, False), resolve(name, seq_len=256)
        built = {id(p): int(p.numel()) for p in w.build("meta").parameters()}
        assert facts.tensors == tuple(built.values()) and facts.kind == "gpt" and facts.key == name
        assert facts.flops_per_sample == pytest.approx(w.formula_flops(1)[0])
        assert facts.block_tensors == tuple(int(p.numel()) for p in w.blocks(w.build("meta"))[0].parameters())
