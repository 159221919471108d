"""`mgpu-bench side-by-side`: N stored runs of different machines in one table, each figure set
against its own machine's theory, in every output (history/side_by_side.py and _render.py).
Machines are the GPU fixtures of tests/fixtures/gpu with their facts changed."""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.history import History
from mgpu_bench.history.side_by_side import build

FIX = Path(__file__).with_name("fixtures")
GPU = FIX / "gpu"


@pytest.fixture
def cli():
    from mgpu_bench.cli import cli as main

    return main


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "h.sqlite3"


def _run(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _machine(doc: dict, gpu: str, host: str, driver: str | None, scale: float, gpus: int = 1,
             drop: tuple[str, ...] = ()) -> dict:
    """A gemm document of another machine: its GPU model, host, driver and GPU count changed, its
    figures scaled, the dtypes in `drop` not measured."""
    d = copy.deepcopy(doc)
    env = d["environment"]
    env["host"], env["nvidia_driver"] = host, driver
    env["gpus"] = [{**env["gpus"][0], "index": i, "name": gpu, "uuid": f"GPU-{host}-{i}"} for i in range(gpus)]
    results = []
    for r in d["results"]:
        if r["dtype"] in drop:
            continue
        for i in range(gpus):
            x = copy.deepcopy(r)
            x["gpu"], x["gpu_name"] = i, gpu
            x["flops_per_s"] = r["flops_per_s"] * scale * (1 - 0.02 * i)  # GPU 1 a little slower
            for c in x.get("candidates") or []:
                c["seconds"] = [s / (scale * (1 - 0.02 * i)) for s in c["seconds"]]
            results.append(x)
    d["results"] = results
    d["devices"] = [{**(d["devices"][0] if d.get("devices") else {}), "index": i, "name": gpu} for i in range(gpus)]
    return d


def _three_machines(tmp_path: Path) -> list[Path]:
    base = json.loads((GPU / "gemm-dtypes-1xh200.json").read_text())
    docs = [base, _machine(base, "NVIDIA H100 80GB HBM3", "h100-box", "550.54.15", 0.9, gpus=2),
            _machine(base, "AMD Instinct MI300X", "mi300x-box", None, 1.3, drop=("fp64",))]
    paths = []
    for i, d in enumerate(docs):
        p = tmp_path / f"m{i}.json"
        p.write_text(json.dumps(d))
        paths.append(p)
    return paths


def test_three_machines_side_by_side_in_every_format_with_a_missing_figure_missing(cli, db, tmp_path):
    r = _run(cli, "history", "add", *_three_machines(tmp_path), "--db", db)
    assert r.exit_code == 0, r.output
    out = tmp_path / "out"
    out.mkdir()
    r = _run(cli, "side-by-side", "r1", "r2", "r3", "--db", db, "--json", out / "s.json", "--csv", out / "s.csv",
             "--report", out / "rep")
    assert r.exit_code == 0, r.output
    text = r.output
    lines = text.splitlines()

    def line(start: str) -> list[str]:
        return next(ln for ln in lines if ln.startswith(start)).split()

    # the facts that differ head the table; those shared are said once
    assert " ".join(line("GPU ")) == "GPU NVIDIA H200 NVIDIA H100 80GB HBM3 AMD Instinct MI300X"
    assert line("GPUs") == ["GPUs", "1", "2", "1"] and line("driver") == ["driver", "580.159.04", "550.54.15", "-"]
    assert "same on all: CUDA 13.0; NCCL 2.28.3" in text and "gemm tflops" in text
    # value per GPU, its share of that machine's dense peak, the ratio to the first, per watt
    bf16 = "\n".join(lines[lines.index(next(ln for ln in lines if ln.startswith("bf16"))):][:4])
    assert "756.2 TFLOP/s" in bf16 and "76% of 989.0 TFLOP/s" in bf16  # H200: 756.19 of 989
    assert "673.8 TFLOP/s (median, 2 GPUs)" in bf16 and "x0.89 vs first" in bf16  # H100: 0.9 and 0.882 of H200's
    assert "983.0 TFLOP/s" in bf16 and "75% of 1307.4 TFLOP/s" in bf16 and "x1.30 vs first" in bf16  # MI300X
    assert "2.12 TFLOP/s per W" in bf16  # 756.19 TFLOP/s at 356.9 W
    fp64 = next(ln for ln in lines if ln.startswith("fp64"))
    assert fp64.split()[-1] == "missing" and "62.2 TFLOP/s" in fp64
    assert "theory r3: AMD Instinct MI300X: dense datasheet peaks (hardware.json)" in text
    doc = json.loads((out / "s.json").read_text())
    assert doc["schema"] == "mgpu-bench/side-by-side" and [c["run"] for c in doc["runs"]] == ["r1", "r2", "r3"]
    assert set(doc["facts_differ"]) >= {"host", "GPU", "GPUs", "driver"}
    row = next(f for f in doc["figures"] if f["key"] == "gemm.fp64.tflops")
    assert row["cells"][2] is None and row["cells"][0]["value"] == pytest.approx(62.16262508084102e12)
    bf16 = next(f for f in doc["figures"] if f["key"] == "gemm.bf16.tflops")
    h100 = bf16["cells"][1]
    assert h100["gpus"] == 2 and h100["theory"] == 989e12 and h100["share"] == pytest.approx(h100["value"] / 989e12)
    assert h100["value"] == pytest.approx(756.1883800761734e12 * 0.9 * 0.99)  # the median of 0.9 and 0.882
    assert bf16["cells"][2]["theory"] == pytest.approx(1307.4e12) and bf16["cells"][0]["ratio"] == 1.0
    assert bf16["cells"][0]["per_watt"] == pytest.approx(756.1883800761734e12 / 356.9119090909091)
    rows = list(csv.DictReader(io.StringIO((out / "s.csv").read_text())))
    assert {r["run"] for r in rows} == {"r1", "r2", "r3"}
    gone = next(r for r in rows if r["key"] == "gemm.fp64.tflops" and r["run"] == "r3")
    assert gone["value_per_gpu"] == "" and gone["share_of_theory"] == ""  # missing, never 0
    html = (out / "rep" / "report.html").read_text()
    assert html.count("<img") == 1 and "missing" in html and "AMD Instinct MI300X" in html
    assert (out / "rep" / "family_0.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "rep" / "summary.md").read_text()
    assert md.startswith("# mgpu-bench side-by-side: r1, r2, r3 (gemm)") and "| fp64 |" in md and "missing" in md


def test_comm_runs_of_ours_and_of_a_nccl_tests_log_side_by_side(cli, db):
    r = _run(cli, "history", "add", FIX / "comm_2x_h200.json", "--join", FIX / "nccl-tests" / "all_reduce_perf_2xh200.log",
             FIX / "nccl-tests" / "all_gather_perf_2xh200.log", "--db", db)
    assert r.exit_code == 0, r.output
    with History.open(db, readonly=True) as h:
        sbs = build(h, ["r1", "r2"])
    rows = {r.key: r for r in sbs.rows}
    ours, log = rows["comm.allreduce.fp32.1GiB.out.busbw"].cells
    assert f"{ours.value / 1e9:.2f}" == "330.77" and f"{log.value / 1e9:.2f}" == "331.71"
    assert ours.theory == log.theory == 450e9 and log.ratio == pytest.approx(log.value / ours.value)
    assert rows["comm.allreduce.fp32.4GiB.out.busbw"].cells[0] is None  # a size only the log has
    assert rows["comm.broadcast.fp32.1GiB.out.busbw"].cells[1] is None  # a collective only ours has
    assert sbs.columns[1].facts["driver"] == "not in the log" and sbs.columns[1].facts["source"] == \
        "nccl-tests 2.19.6 log" and "NCCL" in sbs.differ


def test_suites_side_by_side_with_the_model_step_per_gpu_and_per_watt(cli, db, tmp_path):
    suite = json.loads((GPU / "suite-quick-1xh200.json").read_text())
    other = copy.deepcopy(suite)
    other["environment"]["host"], other["environment"]["nvidia_driver"] = "node2", "570.86.15"
    paths = []
    for i, d in enumerate((suite, other)):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(d))
    assert _run(cli, "history", "add", *paths, "--db", db).exit_code == 0
    with History.open(db, readonly=True) as h:
        sbs = build(h, ["r1", "r2"])
    rows = {r.key: r for r in sbs.rows}
    step = rows["model.350m.ddp.1gpu.synthetic.tokens_per_s@model-sustained"].cells[0]
    assert step.value == pytest.approx(150597.04894858616)  # one GPU: the total is the per-GPU figure
    watts = suite["probes"][[p["name"] for p in suite["probes"]].index("model-sustained")]["telemetry"]["gpus"]["0"]
    assert step.power_w == pytest.approx(watts["summary"]["power_w_mean"])
    assert sbs.differ == ["host", "driver"]


def test_bad_input_is_one_line_and_exit_2(cli, db, tmp_path):
    assert _run(cli, "history", "add", GPU / "gemm-dtypes-1xh200.json", FIX / "comm_2x_h200.json", "--db",
                db).exit_code == 0
    for args, words in ((["r1", "r2"], "runs of one kind side by side (r1 is gemm, r2 is comm)"),
                        (["r1"], "two or more different runs"), (["r1", "r1"], "two or more different runs"),
                        (["r1", "r9"], "no run r9"), (["r1", "r2", "--json", tmp_path / "no" / "x.json"], "--json"),
                        (["r1", "r2", "--csv", db], "would replace")):
        r = _run(cli, "side-by-side", *args, "--db", db)
        lines = r.output.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and words in lines[0], r.output


def test_help_says_what_each_figure_is_and_that_compare_is_the_gate(cli):
    r = _run(cli, "side-by-side", "--help")
    assert r.exit_code == 0 and "value per GPU" in r.output and "`compare` is" in r.output
    assert "side-by-side" in _run(cli, "--help").output
