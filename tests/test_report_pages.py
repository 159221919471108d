"""The report pages as a reader opens them: the comm page's summary on top (headline per op with
units, theory, findings by severity, the run's status), a header without empty or None rows
that says plainly when the run was on CPU processes, and one layout (body margins) for every page.

Real documents: a comm sweep on CPU processes run through the CLI, and the stored fixtures."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_bench.machine import theory
from mgpu_bench.output import html_page
from mgpu_bench.probes.comm import document as comm_document
from mgpu_bench.probes.comm import report as comm_report
from mgpu_bench.probes.comm.analyse import gbs
from mgpu_bench.probes.model import report as model_report
from mgpu_bench.results import probe as registry
from mgpu_bench.suite import report as suite_report

FIX = Path(__file__).with_name("fixtures")


def _style_rule(page: str, selector: str) -> str:
    style = re.search(r"<style>(.*?)</style>", page, flags=re.DOTALL).group(1)
    return re.search(r"(?:^|})" + re.escape(selector) + r"\{([^}]*)\}", style).group(1)


def _kv(page: str) -> str:
    """The environment table of the page header."""
    return re.search(r"<table class=kv>.*?</table>", page, flags=re.DOTALL).group(0)


@pytest.fixture(scope="module")
def cpu_comm(tmp_path_factory) -> tuple[str, dict]:
    """A real sweep on 2 CPU processes (gloo), through the CLI: its page and its document."""
    out = tmp_path_factory.mktemp("comm")
    cmd = [sys.executable, "-m", "mgpu_bench.cli", "comm", "--sizes", "1K-4K", "--iters", "3", "--warmup-iters", "2",
           "--report", str(out / "rep"), "--json", str(out / "comm.json"), "--no-store"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (out / "rep" / "report.html").read_text(encoding="utf-8"), json.loads((out / "comm.json").read_text())


@pytest.fixture()
def gpu_run():
    """The stored 2x H200 sweep with the theory of its topology snapshot."""
    doc = json.loads((FIX / "comm_2x_h200.json").read_text())
    snap = json.loads((FIX / "topo_2x_h200.json").read_text())
    run = comm_document.run_from_document(doc)
    run.theory = theory.ring_theory(snap, [(g["index"], g["pci_bus_id"]) for g in snap["gpus"]]).to_dict()
    return run, doc["environment"]


def test_cpu_comm_page_opens_with_its_summary(cpu_comm):
    page, _ = cpu_comm
    summary = page.index("<h2>summary: peak busbw per op</h2>")
    first_op = page.index("<h2>allreduce</h2>")
    assert summary < page.index("<table") and summary < page.index("<table class=kv>") < first_op
    assert page.index("<img") > first_op
    top = page[:first_op]
    for op in ("allreduce", "allgather"):  # the peak busbw per op, with its unit
        assert re.search(rf"<td class=l>{op}</td><td>\d+\.\d+ GB/s</td><td>\d+ KiB</td>", top), op
    assert "STATUS</span>complete: 12 of 12 planned size(s) and placement(s) measured" in top
    assert "0 wrong element(s)" in top
    assert "no link theory: the ranks are CPU processes" in top
    assert "<h2>findings: 0 problem(s), 0 warning(s), 0 ok</h2>" in top


def test_cpu_comm_header_says_cpu_and_shows_no_empty_rows(cpu_comm):
    page, doc = cpu_comm
    kv = _kv(page)
    assert "None" not in kv and "<td></td>" not in kv
    assert "nvidia_driver" not in kv and "GPUs" not in kv and "nccl" not in kv  # no GPU stack on gloo
    assert "<th>ran on</th><td>2 CPU processes (torch.distributed, gloo); no GPU was used" in kv
    assert doc["environment"].get("nvidia_driver") is None  # the document keeps what it recorded
    assert "None" not in page


def test_gpu_comm_summary_has_theory_and_share(gpu_run):
    run, env = gpu_run
    page = comm_report.page(run, env, {})
    top = page[:page.index("<table class=kv>")]  # above the environment
    ar = [m for m in run.measurements if m.spec.op == "allreduce" and m.spec.scope == "world"]
    peak = max(ar, key=lambda m: m.busbw)
    cells = (f"<td class=l>allreduce</td><td>{gbs(peak.busbw)} GB/s</td><td>1 GiB</td>"
             f"<td class=l>{peak.spec.placement}</td><td>450 GB/s</td><td>{100 * peak.busbw / 450e9:.0f}%</td>")
    assert cells in top
    assert "<b>theory</b>: NVLink 4 x18 via NVSwitch: 450.0 GB/s per direction" in top
    assert "<span class=tag>OK</span>allreduce busbw 330.77 GB/s at 1 GiB, 74% of the 450 GB/s theory" in top
    kv = _kv(page)
    assert "<th>nvidia_driver</th><td>580.159.04</td>" in kv and "<th>GPUs</th><td>NVIDIA H200, NVIDIA H200</td>" in kv
    assert "ran on" not in kv and "None" not in kv


def test_comm_findings_carry_their_severity_and_a_stop_is_the_status(gpu_run):
    run, env = gpu_run
    run.findings = ["ranks 0->1 over SHM where NVLink allows P2P"]
    run.stopped, run.stop_message = "timeout", "stopped at allreduce 1 GiB out-of-place: timed out; 12 kept"
    page = comm_report.page(run, env, {})
    top = page[:page.index("<table class=kv>")]
    assert "<h2>findings: 0 problem(s), 1 warning(s), 1 ok</h2>" in top
    assert "<li class=warning><span class=tag>WARNING</span>ranks 0-&gt;1 over SHM" in top
    assert ("<li class=problem><span class=tag>STATUS</span>stopped early (timeout): stopped at allreduce 1 GiB "
            "out-of-place: timed out; 12 kept") in top
    md = comm_report.markdown(run, env)
    assert "- status: stopped early (timeout)" in md and "- warning: ranks 0->1 over SHM" in md


def test_header_leaves_out_empty_values():
    env = {"host": "h", "nvidia_driver": None, "cuda_driver": "", "nccl": "None", "torch": "2.7",
           "gpus": [{"name": None}], "env": {}}
    rows = dict(html_page.environment_rows(env))
    assert rows == {"host": "h", "torch": "2.7"}
    assert html_page.environment_rows({"host": "h", "gpus": []}) == [("host", "h"), ("ran on", "no GPU visible on this host")]
    assert html_page.environment_table({}) == ""
    page = html_page.page("t", env, [], [])
    assert "None" not in page and "<td></td>" not in page


def _model_run(device: str = "cuda"):
    doc = json.loads((FIX / "gpu" / "model-healthy.json").read_text())
    run = registry.get("model").load(doc)
    if device != "cuda":
        run.config = dataclasses.replace(run.config, device=device)
    return run, doc["environment"]


def test_model_page_has_the_layout_of_the_other_pages(gpu_run):
    run, env = _model_run()
    model = model_report.page(run, env, {})
    comm = comm_report.page(*gpu_run, {})
    suite = suite_report.page(json.loads((FIX / "suite" / "suite.json").read_text()), pngs={})
    body = _style_rule(model, "body")
    assert body == _style_rule(comm, "body") == _style_rule(suite, "body")
    assert "margin:2em auto" in body and "padding:0 1.5em" in body  # room at the sides in any window
    assert "<div class=wide><table>" in model  # the wide table scrolls inside the column
    assert "None" not in _kv(model)


def test_model_page_on_cpu_says_so():
    run, env = _model_run("cpu")
    env = dict(env, gpus=[], nvidia_driver=None)
    page = model_report.page(run, env, {})
    kv = _kv(page)
    assert "CPU process" in kv and "(torch.distributed, gloo); no GPU was used (none visible on this host)" in kv
    assert "None" not in kv and "nvidia_driver" not in kv
    assert "driver: None" not in model_report.markdown(run, env)
