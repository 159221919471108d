"""comm reports from stored results (a real 2x H200 result file and topology snapshot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.machine import theory
from mgpu_bench.probes.comm import analyse as comm_analyse
from mgpu_bench.probes.comm import document as comm_document
from mgpu_bench.probes.comm import report as comm_report

FIX = Path(__file__).with_name("fixtures")


@pytest.fixture()
def run():
    doc = json.loads((FIX / "comm_2x_h200.json").read_text())
    snap = json.loads((FIX / "topo_2x_h200.json").read_text())
    r = comm_document.run_from_document(doc)
    r.theory = theory.ring_theory(snap, [(g["index"], g["pci_bus_id"]) for g in snap["gpus"]]).to_dict()
    return r


def test_report_files_are_written_and_self_contained(run, tmp_path):
    env = {"host": "<script>alert(1)</script>", "gpus": [{"name": "NVIDIA H200"}], "env": {"NCCL_X": "a&b"}}
    paths = comm_report.write_report(run, tmp_path / "rep", env)
    names = sorted(p.name for p in paths)
    assert names == sorted([f"busbw_{op}.png" for op in ("allreduce", "allgather", "reducescatter", "alltoall",
                                                           "broadcast", "sendrecv")] + ["report.html", "summary.md"])
    for p in paths:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "rep" / "report.html").read_text()
    assert page.count("src='data:image/png;base64,") == 6
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "NCCL_X=a&amp;b" in page
    assert "NVLink 4 x18 via NVSwitch: 450.0 GB/s per direction" in page


def test_markdown_summary_sets_busbw_against_theory(run):
    md = comm_report.markdown(run, {"host": "h", "gpus": [{"name": "NVIDIA H200"}]})
    # allreduce 1 GiB busbw 330.77 GB/s over 450 GB/s = 74%
    assert "| allreduce | out-of-place | 330.77 GB/s at 1 GiB | 300.17 GB/s | 74% | 0 |" in md
    assert "- theory: NVLink 4 x18 via NVSwitch: 450.0 GB/s per direction" in md


def test_report_command_renders_a_stored_file(tmp_path):
    r = CliRunner().invoke(cli, ["report", str(FIX / "comm_2x_h200.json"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "report.html").exists()


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "missing.json", "cannot read"),
    (lambda d: (d / "x.json").write_text("not json") and d / "x.json", "is not JSON"),
    (lambda d: (d / "y.json").write_text("{}") and d / "y.json", "not an mgpu-bench result"),
    (lambda d: (d / "z.json").write_text('{"schema": "mgpu-bench/result", "kind": "gemm"}') and d / "z.json",
     "z.json: schema_version: missing"),
    (lambda d: (d / "w.json").write_text('{"schema": "mgpu-bench/result", "schema_version": 1, "kind": "dance"}')
     and d / "w.json", "w.json: kind: is 'dance', not a kind of result (comm, "),
    (lambda d: (d / "v.json").write_text('{"schema": "mgpu-bench/result", "schema_version": 1, "kind": "gemm"}')
     and d / "v.json", "v.json: config: missing (a gemm result document needs config, status, devices and results)"),
])
def test_report_command_bad_input(tmp_path, make, words):
    r = CliRunner().invoke(cli, ["report", str(make(tmp_path)), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1


def test_report_folder_must_be_creatable(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = CliRunner().invoke(cli, ["comm", "--report", str(f), "--sizes", "1K"])
    assert r.exit_code == 2 and "is a file" in r.output
    r = CliRunner().invoke(cli, ["comm", "--report", str(tmp_path / "a" / "b"), "--sizes", "1K"])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_busbw_above_theory_is_explained_never_bare(run):
    from mgpu_bench.machine import nccl_log

    log = (FIX / "nccl_info_2x_h200.log").read_text()
    table = nccl_log.tuning_table(log)
    run.algorithms = {f"{m.spec.op}@{m.spec.bytes}": nccl_log.predicted_algorithm(table, m.spec.op, m.spec.bytes)
                      for m in run.measurements if m.spec.op != "alltoall" and m.spec.op != "sendrecv"}
    assert comm_analyse.explain_above_theory(run) == []  # all below 450 GB/s on this machine
    run.theory = dict(run.theory, bandwidth=300e9, summary="a made-up 300 GB/s link")
    text = comm_analyse.explain_above_theory(run)
    assert any(t.startswith("allreduce 1 GiB out-of-place: busbw 330.77 GB/s is above the link theory 300 GB/s "
                            "with no in-switch algorithm") for t in text)
    run.algorithms["allreduce@1073741824"] = "NVLS/Simple"
    assert any("NCCL's model picks NVLS/Simple" in t for t in comm_analyse.explain_above_theory(run))


def test_algorithm_spans_group_sizes(run):
    from mgpu_bench.probes.comm import render as report

    run.algorithms = {"allreduce@1048576": "Ring/LL128", "allreduce@67108864": "Ring/Simple",
                      "allreduce@1073741824": "Ring/Simple"}
    assert report._algorithm_spans(run, "allreduce") == "Ring/LL128 1 MiB, Ring/Simple 64 MiB-1 GiB"


def test_markdown_keeps_outside_text_on_one_line():
    """A host name with a newline or a pipe cannot start a heading or split a table row."""
    import json
    from pathlib import Path

    from mgpu_bench.probes.comm.document import run_from_document
    from mgpu_bench.probes.comm.report import markdown

    doc = json.loads((Path(__file__).with_name("fixtures") / "comm_2x_h200.json").read_text())
    md = markdown(run_from_document(doc), {"host": "evil\n# injected | heading", "gpus": []})
    assert "\n# injected" not in md and "evil # injected \\| heading" in md


def test_outside_text_cannot_make_markdown_links_code_or_html():
    from mgpu_bench.output.html_page import md

    assert md("gpu|07 [x](javascript:y) <b> `c` \\[") == "gpu\\|07 \\[x\\](javascript:y) \\<b> \\`c\\` \\\\\\["
    assert md("two\nlines") == "two lines"
