"""The suite report from a stored suite document (tests/fixtures/suite: real CPU runs of comm and
model, constructed GPU documents, one failed probe, hostile outside text): verdicts, the Markdown
summary, the self-contained HTML page, and a screenshot of it in headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from mgpu_bench.probes.comm import analyse as comm_analyse
from mgpu_bench.probes.comm import document as comm_document
from mgpu_bench.probes.gemm import analyse as gemm_analyse
from mgpu_bench.probes.gemm import document as gemm_document
from mgpu_bench.probes.links import document as links_document
from mgpu_bench.probes.memory import analyse as memory_analyse
from mgpu_bench.probes.memory import document as memory_document
from mgpu_bench.probes.model import analyse as model_analyse
from mgpu_bench.probes.model import document as model_document
from mgpu_bench.results.probe import OK, PROBLEM, SEVERITIES, WARNING
from mgpu_bench.results.sizes import format_bytes
from mgpu_bench.suite import judge as suite_judge
from mgpu_bench.suite import report as suite_report

FIXTURES = Path(__file__).parent / "fixtures"
SUITE = FIXTURES / "suite" / "suite.json"
PNG = b"\x89PNG\r\n\x1a\n"
TREND = {
    "bf16 GEMM median <script>$x$": [
        ("2026-09-30T09:00:00+00:00", 722.0, "TFLOP/s"),
        ("2026-10-30T09:00:00+00:00", 719.5, "TFLOP/s"),
        ("2026-11-30T09:00:00+00:00", 717.7, "TFLOP/s"),
    ],
    "HBM copy": [
        ("2026-10-30T09:00:00+00:00", 4.26, "TB/s"),
        ("not a time", 1.0, "TB/s"),
    ],
}


@pytest.fixture
def doc() -> dict:
    return json.loads(SUITE.read_text())


# Drawing the stored suite's plots (about ten figures) is what costs here, seconds each on CI's
# loaded cores: they are drawn once for the module (write_report, below), the tests that only read
# the page's text or its images share that drawing, and the tests that change a plotted figure
# still draw their own.


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[Path]]:
    """suite_report.write_report() of the stored suite with TREND, once for the module: (its
    folder, the paths it returned). test_write_report checks it; the screenshot test shows it."""
    out = tmp_path_factory.mktemp("written") / "rep"
    return out, suite_report.write_report(json.loads(SUITE.read_text()), out, TREND)


@pytest.fixture(scope="module")
def drawn(written) -> dict[str, bytes]:
    """suite_report.images() of the stored suite with TREND, as write_report wrote them: each PNG
    under its key as the file's stem (html_page.write_bundle), not drawn a second time."""
    return {p.stem: p.read_bytes() for p in written[1] if p.suffix == ".png"}


def untrended(drawn: dict[str, bytes]) -> dict[str, bytes]:
    """What images() gives without a trend: the same plots, no history (see suite_report._images)."""
    return {k: v for k, v in drawn.items() if k != "history"}


def probe(doc: dict, name: str) -> dict:
    return next(p for p in doc["probes"] if p["name"] == name)


def texts(fs, severity: str | None = None) -> list[str]:
    return [f.text for f in fs if severity is None or f.severity == severity]


# ------------------------------------------------------------------------------------ fixture


def test_fixture_is_small_and_says_what_is_real():
    folder = SUITE.parent
    assert sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) < 300_000
    readme = (folder / "README.md").read_text()
    assert "Real runs" in readme and "Constructed" in readme


def test_every_document_is_recognised_and_rebuilt_faithfully(doc):
    """The loaders give back runs whose own findings and documents equal what was stored."""
    kinds = [suite_judge.sub_kind(p["document"]) for p in doc["probes"]]
    assert kinds == [
        "gemm",
        "memory",
        "model",
        "comm",
        "links",
        "model",
        "memory",
        "gemm",
        None,
    ]
    for p in doc["probes"]:
        d = p["document"]
        kind = suite_judge.sub_kind(d)
        if kind == "gemm":
            run = gemm_document.run_from_document(d)
            assert [f.text for f in gemm_analyse.findings(run)] == d["findings"]
            assert gemm_document.document(run, d["environment"])["results"] == d["results"]
        elif kind == "memory":
            assert [f.text for f in memory_analyse.findings(memory_document.run_from_document(d))] == d["findings"]
        elif kind == "model":
            run = model_document.run_from_document(d)
            again = model_document.document(run, d["environment"])
            assert [f.text for f in model_analyse.findings(run)] == d["findings"]
            assert (again["runs"], again["config"], again["scaling"]) == (
                d["runs"],
                d["config"],
                d["scaling"],
            )
        elif kind == "links":
            run, hops = links_document.run_from_document(d)
            again = links_document.document(run, hops)
            assert again["kind"] == "links"  # the stored document predates the field
            envelope = {"schema", "schema_version", "kind", "tool_version", "created", "command", "environment",
                        "topology"}
            assert all(again[k] == d[k] for k in again if k not in envelope)
        elif kind == "comm":
            run = comm_document.run_from_document(d)
            assert comm_analyse.summary(run) == d["summary"]


# ------------------------------------------------------------------------------------ findings


def test_findings_problems_first_with_figures_and_causes(doc):
    fs = suite_judge.findings(doc)
    assert [SEVERITIES.index(f.severity) for f in fs] == sorted(
        SEVERITIES.index(f.severity) for f in fs
    )
    assert fs[0].severity == PROBLEM and fs[0].text.startswith(
        "verdict: input-bound: the input pipeline costs"
    )
    assert "raise --num-workers" in fs[0].text and "round 1 model-1gpu" in fs[0].text
    # the headline is not repeated by the probe's own verdict line
    assert not [
        t
        for t in texts(fs)
        if t.startswith("round 1 model-1gpu: 1 process(es): input-bound")
    ]
    problems = texts(fs, PROBLEM)
    # the power-capped GPU named with its figure, its peers' figure, its clock and the cause
    capped = [t for t in problems if t.startswith("round 1 gemm: GPU 2 bf16")]
    assert len(capped) == 1
    for part in (
        "612.3 TFLOP/s",
        "below the node's median 717.7",
        "SM clock 1405 MHz vs 1610 MHz",
        "power-capped at a lower power limit (600 W vs 700 W on its peers)",
    ):
        assert part in capped[0]
    # the failed probe with its error, worded as the issue asks
    failed = probe(doc, "model-sustained")["error"]
    assert f"round 3 model-sustained failed: {failed}" in problems
    # short scaling with its figure, the healthy figure and the likely cause
    scaling = next(
        t for t in problems if t.startswith("round 2 model-scaling: scaling 1 -> 2")
    )
    eff = model_document.run_from_document(
        probe(doc, "model-scaling")["document"]
    ).scaling()[2]
    # each threshold beside its own metric: 90% is scaling efficiency's, 10% exposed communication's
    assert f"efficiency {100 * eff:.1f}% (T_2 / (2 x T_1); healthy >= 90%)" in scaling
    assert "exposed communication 0.0% of the step (healthy < 10%)" in scaling
    assert "while communication is hidden" in scaling
    warnings = texts(fs, WARNING)
    assert (
        "round 3 gemm-sustained: GPU 2 bf16 sustained: 610.4 -> 571.9 TFLOP/s (6.3% lower) over 30 s; "
        "power cap (software), thermal (software)" in warnings
    )
    oks = texts(fs, OK)
    assert (
        "round 1 hbm+memory: HBM copy on GPU 0: 4.27 TB/s, 89% of the 4.80 TB/s datasheet figure "
        "(healthy >= 80%)" in oks
    )
    assert any(
        t.startswith("round 2 links: GPU-to-GPU copies")
        and "87% of the 450 GB/s link theory" in t
        for t in oks
    )
    assert (
        "round 3 max-batch: largest batch of 350m at seq 2048: 54 per GPU without activation "
        "checkpointing, 135 per GPU with activation checkpointing" in oks
    )
    assert json.loads(json.dumps([f.to_dict() for f in fs]))[0]["severity"] == PROBLEM


def test_the_suites_own_telemetry_names_the_slow_gpu_and_the_capped_ones(doc, drawn):
    """model-sustained failed, but the suite sampled the GPUs while it ran: GPU 2's clock stayed
    below its peers' (telemetry.explain names why); the GEMM probes judge their own samples."""
    cause = (
        "round 3 model-sustained: GPU 2 while it ran: SM clock 1405 MHz vs 1610 MHz on its peers "
        "(-13%), power cap (software) seen, 599 W of 600 W: power-capped at a lower power limit "
        "(600 W vs 700 W on its peers)"
    )
    fs = suite_judge.findings(doc)
    assert cause in texts(fs, WARNING)
    assert not [
        t
        for t in texts(fs)
        if t.startswith("round 3 gemm-sustained: GPU") and "while it ran" in t
    ]
    for g in probe(doc, "model-sustained")["telemetry"]["gpus"].values():  # all at one clock, all capped
        g["summary"].update(sm_hz_median=1.5e9, limiting=["power cap (software)"], power_limit_w=700.0)
    assert not [t for t in texts(suite_judge.findings(doc)) if "model-sustained: GPU" in t]  # normal under load
    for g in probe(doc, "model-sustained")["telemetry"]["gpus"].values():
        g["summary"].update(limiting=["power cap (software)", "thermal (software)"])
    assert (
        "round 3 model-sustained: GPU 0, 1, 2, 3 while it ran: thermal (software)"
        in texts(suite_judge.findings(doc), WARNING)
    )
    # the page's text of the changed summaries; the plots drawn from the series, which are unchanged
    page = suite_report.page(doc, pngs=untrended(drawn))
    assert page.count("<b>telemetry sampled by the suite</b> every 0.5 s") == 2
    assert "<th>clock-event reasons seen</th>" in page


def test_gemm_sustained_without_the_suites_telemetry_draws_its_own_temperature(doc):
    probe(doc, "gemm-sustained")["telemetry"] = None
    # only gemm-sustained is drawn: the other entries kept in place (their numbers name the files)
    # without a document or samples to draw
    for p in doc["probes"]:
        if p["name"] != "gemm-sustained":
            p.update(document=None, telemetry=None)
    imgs = suite_report.images(doc)
    assert (
        "08_gemm-sustained_temperature_bf16" in imgs
        and "08_gemm-sustained_telemetry" not in imgs
    )


def test_skipped_interrupted_and_missing_documents_are_warnings(doc):
    probe(doc, "links").update(
        status="skipped", error="needs 2 GPUs or more", document=None
    )
    probe(doc, "comm").update(status="interrupted", error="Ctrl-C")
    probe(doc, "max-batch")["document"] = None
    fs = suite_judge.findings(doc)
    warnings = texts(fs, WARNING)
    assert "round 2 links skipped: needs 2 GPUs or more" in warnings
    assert "round 2 comm interrupted: Ctrl-C" in warnings
    assert "round 3 max-batch: no result document" in warnings


def test_a_broken_document_is_a_problem_not_an_exception(doc, drawn):
    probe(doc, "gemm")["document"]["results"] = [{"gpu": 0}]
    probe(doc, "comm")["document"]["measurements"] = [{"kind": "comm"}]
    problems = texts(suite_judge.findings(doc), PROBLEM)
    assert (
        "round 1 gemm: its result document could not be read: KeyError: 'dtype'"
        in problems
    )
    assert any(
        t.startswith("round 2 comm: its result document could not be read")
        for t in problems
    )
    # the plots as drawn from the readable documents: an unreadable entry shows none of its probe's
    page = suite_report.page(doc, pngs=untrended(drawn))
    assert "result document not readable: KeyError" in page
    assert "| 1 | gemm | ok | 7.8 | - | - |" in suite_report.markdown(doc)


def test_comm_far_below_theory_is_a_problem_named_with_the_transport(doc):
    """The real gloo figures set against an NVLink theory, with NCCL's SHM finding: the P2P-disabled
    case of RESULTS.md (27 GB/s, 6% of 450)."""
    comm = probe(doc, "comm")["document"]
    shm = (
        "rank 0 -> rank 1: NCCL uses SHM on 4 channel(s) where NVLink allows P2P (P2P disabled? "
        "NCCL_P2P_DISABLE / NCCL_P2P_LEVEL, or peer access off)"
    )
    comm["theory"] = {
        "bandwidth": 450e9,
        "practical": 360e9,
        "summary": "NVLink 4 x18: 450.0 GB/s per direction",
    }
    comm["findings"] = [shm]
    fs = suite_judge.findings(doc)
    s = next(
        x
        for x in comm_analyse.summary(comm_document.run_from_document(comm))
        if x["op"] == "allreduce" and x["placement"] == "out-of-place"
    )
    bw = s["busbw_at_largest"]
    expect = (
        f"round 2 comm: allreduce busbw {bw / 1e9:.2f} GB/s at {format_bytes(s['largest_bytes'])}, "
        f"{100 * bw / 450e9:.0f}% of the 450 GB/s theory (NVLink 4 x18: 450.0 GB/s per direction): {shm}"
    )
    assert expect in texts(fs, PROBLEM)
    assert f"round 2 comm: {shm}" in texts(fs, WARNING)
    row = next(r for r in suite_judge.headline_rows(doc) if r["probe"] == "comm")
    assert row["expected"] == f"{100 * bw / 450e9:.0f}% of 450 GB/s theory"


def test_comm_of_a_real_h200_run_is_ok_against_its_theory(doc):
    """tests/fixtures/comm_2x_h200.json (a real 2x H200 sweep) as the comm probe: allreduce at 1 GiB
    reaches 74% of the 450 GB/s NVLink theory, under the 80% ring ceiling."""
    comm = json.loads((FIXTURES / "comm_2x_h200.json").read_text())
    comm["theory"] = {
        "bandwidth": 450e9,
        "practical": 360e9,
        "summary": "NVLink 4 x18: 450.0 GB/s per direction",
    }
    probe(doc, "comm")["document"] = comm
    oks = texts(suite_judge.findings(doc), OK)
    assert (
        "round 2 comm: allreduce busbw 330.77 GB/s at 1 GiB, 74% of the 450 GB/s theory (NVLink 4 x18: "
        "450.0 GB/s per direction); NCCL rings reach about 360 GB/s"
    ) in oks
    row = next(r for r in suite_judge.headline_rows(doc) if r["probe"] == "comm")
    assert (row["figure"], row["expected"]) == (
        "allreduce 1 GiB busbw 330.77 GB/s",
        "74% of 450 GB/s theory",
    )


def test_scaling_above_ideal_says_the_baseline_is_suspect(doc):
    runs = probe(doc, "model-scaling")["document"]["runs"]
    one = next(r for r in runs if r["world"] == 1)
    two = next(r for r in runs if r["world"] == 2)
    two["derived"]["tokens_per_s"] = 2.3 * one["derived"]["tokens_per_s"]
    warnings = texts(suite_judge.findings(doc), WARNING)
    assert any(
        t.startswith("round 2 model-scaling: scaling 1 -> 2: efficiency 115.0%")
        and "above 100%" in t
        for t in warnings
    )


def test_headline_agrees_with_the_scaling_problem_and_is_compute_bound_only_when_scaling_is(doc):
    """The suite's verdict never contradicts its problems: 2 CPU processes at 46.5% scaling with
    the communication hidden is contention, a problem, not a green compute-bound."""
    doc["probes"] = [p for p in doc["probes"] if p["name"] != "model-1gpu"]
    head = suite_judge.verdict(doc)
    assert head.severity == PROBLEM
    assert head.text.startswith(
        "verdict: contention: scaling 1 -> 2 is 46.5% (healthy >= 90%) with exposed communication 0.0% "
        "(healthy < 10%): the step itself is 2.1x longer on 2 processes while communication is hidden")
    assert any(t.startswith("round 2 model-scaling: scaling 1 -> 2: efficiency 46.5%")
               for t in texts(suite_judge.findings(doc), PROBLEM))
    runs = probe(doc, "model-scaling")["document"]["runs"]
    one = next(r for r in runs if r["world"] == 1)
    two = next(r for r in runs if r["world"] == 2)
    two["derived"]["tokens_per_s"] = 1.9 * one["derived"]["tokens_per_s"]  # 95%: healthy scaling
    head = suite_judge.verdict(doc)
    assert head.severity == OK
    assert (
        head.text
        == "verdict: compute-bound (CPU processes: no profile or matmul ceiling to hold it against), exposed "
        "communication 0.0% (2 process(es), round 2 model-scaling)"
    )
    assert not texts(suite_judge.findings(doc), PROBLEM) or not any(
        "scaling 1 -> 2" in t for t in texts(suite_judge.findings(doc), PROBLEM))
    doc["probes"] = [p for p in doc["probes"] if not p["name"].startswith("model")]
    assert suite_judge.verdict(doc) is None


# ------------------------------------------------------------------------------------ markdown


def test_markdown_has_the_machine_the_verdicts_and_the_key_figures(doc):
    md = suite_report.markdown(doc)
    assert (
        "- machine: host gpu-node-07\\<script>alert(1)\\</script>; 4x NVIDIA H200; driver 580.159.04; "
        "CUDA 13.0 (runtime 13.0); NCCL 2.28.9; torch 2.11.0" in md
    )
    assert "## Verdicts (6 problem(s), 3 warning(s), 6 ok)" in md
    assert "- **PROBLEM** verdict: input-bound" in md
    comm = comm_document.run_from_document(probe(doc, "comm")["document"])
    s = next(
        x
        for x in comm_analyse.summary(comm)
        if x["op"] == "allreduce" and x["placement"] == "out-of-place"
    )
    for row in (
        (
            "| 1 | gemm | ok | 7.8 | bf16 8192x8192x8192: median 717.7 TFLOP/s over 4 GPU(s) (lowest GPU 2: 612.3) "
            "| 989 TFLOP/s dense peak (73%) |"
        ),
        (
            "| 1 | hbm+memory | ok | 26.0 | HBM copy 4.27 TB/s; worst fragmentation 2.6% (async, small-between-large) "
            "| 4.80 TB/s datasheet (89%); \\<= 5% healthy |"
        ),
        (
            f"| 2 | comm | ok | 14.2 | allreduce 16 MiB busbw {s['busbw_at_largest'] / 1e9:.2f} GB/s "
            "| no link theory (torch-gloo ranks) |"
        ),
        (
            "| 2 | links | ok | 4.4 | copy engine median 390.9 GB/s over 12 pair(s) (slowest 0 -> 1: 390.1) "
            "| 87% of 450 GB/s per direction |"
        ),
        "| 3 | max-batch | ok | 61.0 | max batch 350m seq 2048: 54, 135 with checkpointing | - |",
        "| 3 | model-sustained | failed | 4.1 | - | - |",
    ):
        assert row in md
    assert re.search(
        r"\| 2 \| model-scaling \| ok \| 33\.9 \| scaling 1 -> 2: \d+\.\d% \(\d+ tokens/s against the "
        r"ideal \d+\) \| \\>= 90%; exposed communication 0\.0% \(healthy \\< 10%\) \|",  # a leading > escaped
        md,
    )
    assert re.search(
        r"\| 1 \| model-1gpu \| ok \| 31\.5 \| 1 process\(es\): \d+ tokens/s, step [\d.]+ ms \(\d+ "
        r"tokens/s with the DataLoader\) \| no peak figure: no MFU \|",
        md,
    )
    assert "## Failed or incomplete probes" in md
    assert "- round 3 model-sustained failed: RuntimeError: NCCL error" in md


def test_markdown_escapes_outside_text(doc):
    md = suite_report.markdown(doc)
    assert "\\<script>alert(1)\\</script>" in md and "\\<img src=x" in md
    assert not re.search(r"(?<!\\)<", md)  # no raw HTML: every < escaped
    assert "](javascript" not in md.replace("\\](javascript", "")
    assert (
        "\\[log\\](javascript:alert(1))" in md
        and "unhandled system error \\| see" in md
    )
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table and all(len(re.findall(r"(?<!\\)\|", line)) == 7 for line in table)


# ------------------------------------------------------------------------------------ page


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.style = ""
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.style += data


def test_page_escapes_outside_text_and_loads_nothing(doc, drawn):
    doc["environment"]["env"]["NCCL_HOOK"] = (
        "https://evil.example/x.js' onerror='alert(1)"
    )
    page = suite_report.page(doc, TREND, pngs=drawn)  # no plot draws the environment
    assert (
        "<script" not in page
        and "<img src=x" not in page
        and "onerror='alert" not in page
    )
    assert "gpu-node-07&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "](javascript:x)" in page  # as text in a cell, not a link
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    parser = _Tags()
    parser.feed(page)
    names = {t for t, _ in parser.tags}
    assert names <= {
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "h1",
        "h2",
        "h3",
        "p",
        "div",
        "span",
        "b",
        "table",
        "tr",
        "th",
        "td",
        "ul",
        "li",
        "img",
    }
    attrs = [(k, v) for _, a in parser.tags for k, v in a.items()]
    assert not [
        k for k, _ in attrs if k in ("href", "srcset", "action", "onerror", "onload")
    ]
    srcs = [v for k, v in attrs if k == "src"]
    assert srcs and all(v.startswith("data:image/png;base64,") for v in srcs)
    assert (
        "http" not in parser.style
        and "url(" not in parser.style
        and "@import" not in parser.style
    )
    # URLs only inside escaped text
    assert all(f"={q}http" not in page for q in ("'", '"', ""))


def test_page_puts_the_verdicts_on_top_and_every_round_after(doc, drawn):
    page = suite_report.page(doc, TREND, pngs=drawn)
    order = [
        page.index(s)
        for s in (
            "class='verdict problem'",
            "<li class=problem>",
            "<li class=warning>",
            "<li class=ok>",
            "<h2>probes</h2>",
            "<h2>round 1: single-GPU baseline</h2>",
            "<h2>round 2: multi-GPU scaling</h2>",
            "<h2>round 3: limit throughput</h2>",
            "<h2>failed or incomplete probes</h2>",
            "<h2>history</h2>",
            "<h2>environment</h2>",
        )
    ]
    assert order == sorted(order)
    assert (
        page.count("verdict: input-bound") == 1
    )  # in the box above the list, not again in it
    assert "<b>sustained runs</b>" in page and "<th>throttle reasons</th>" in page
    assert "thermal (software)" in page


def test_page_embeds_every_image(doc, drawn):
    imgs = drawn  # suite_report.images(doc, TREND), as write_report wrote them
    assert {
        "01_gemm_gemm_bf16",
        "02_hbm-memory_hbm",
        "03_model-1gpu_phases",
        "04_comm_busbw_allreduce",
        "05_links_links_ce_uni",
        "06_model-scaling_scaling",
        "08_gemm-sustained_sustained_bf16",
        "08_gemm-sustained_telemetry",
        "09_model-sustained_telemetry",
        "history",
    } <= set(imgs)
    assert all(png[:8] == PNG for png in imgs.values())
    page = suite_report.page(doc, TREND, pngs=imgs)
    embedded = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert sorted(base64.b64decode(b) for b in embedded) == sorted(imgs.values())


def test_history_plot_reads_what_it_can():
    assert suite_report.plot_history(TREND)[:8] == PNG
    assert suite_report.plot_history({"x": [("yesterday", 1.0, "s")]}) is None
    assert suite_report.plot_history({}) is None


def test_write_report_writes_a_page_that_works_alone(doc, tmp_path, written):
    folder, paths = written  # suite_report.write_report(doc, folder, TREND)
    names = [p.name for p in paths]
    assert names[-2:] == ["report.html", "summary.md"] and "history.png" in names
    pngs = [p for p in paths if p.suffix == ".png"]
    assert pngs and all(p.read_bytes()[:8] == PNG for p in pngs)
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == len(pngs)
    assert (folder / "summary.md").read_text(
        encoding="utf-8"
    ) == suite_report.markdown(doc)
    # a folder whose parent is missing is refused whatever the suite holds: one with no probes,
    # which draws nothing before the refusal (the stored suite drew all its plots first)
    with pytest.raises(FileNotFoundError):
        suite_report.write_report({**doc, "probes": []}, tmp_path / "missing" / "rep")


# ------------------------------------------------------------------------------------ screenshot

WIDTH, HEIGHT = 1280, 2000


def _chromium() -> str | None:
    for name in (
        "chromium-headless-shell",
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ):
        path = shutil.which(name)
        if path:
            return path
    return None


def _screenshot(exe: str, page: Path, out: Path, profile: Path, offline: bool) -> None:
    args = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--screenshot={out}",
        f"--window-size={WIDTH},{HEIGHT}",
    ]
    if (
        offline
    ):  # every request would fail: a page that loads anything from the network shows it
        args += ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]
    subprocess.run([*args, page.as_uri()], check=True, timeout=120, capture_output=True)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG
    length, kind, width, height = struct.unpack(">I4sII", data[8:24])
    assert (length, kind) == (13, b"IHDR")
    return width, height


@pytest.mark.skipif(
    _chromium() is None,
    reason="no headless Chromium on PATH (chromium-headless-shell, chromium "
    "or google-chrome): Debian's chromium-headless-shell provides one",
)
def test_screenshot_of_the_page_shows_the_verdicts(tmp_path, written):
    import matplotlib.image
    import numpy as np

    page = written[0] / "report.html"  # suite_report.write_report(doc, folder, TREND)
    shots = {}
    for offline in (False, True):
        out = tmp_path / f"shot_{'offline' if offline else 'plain'}.png"
        _screenshot(_chromium(), page, out, tmp_path / f"profile_{offline}", offline)
        data = out.read_bytes()
        assert _png_size(data) == (WIDTH, HEIGHT)
        shots[offline] = matplotlib.image.imread(out)[..., :3]
    img = shots[True]
    assert img.shape == (HEIGHT, WIDTH, 3)
    # Not blank: an empty page is one colour; this one has text, tables and plots.
    ink = (img < 0.9).any(axis=-1).mean()
    assert (
        ink > 0.03
        and len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 64
    )
    # The problems are marked at the top: the red of their left border within the first 600 px.
    red = np.abs(img[:600] - np.array([0xC6, 0x28, 0x28]) / 255).max(axis=-1) < 0.03
    assert red.sum() > 200
    # Network blocked or not, the page looks the same: it loads nothing.
    assert np.array_equal(shots[False], shots[True])


def test_report_command_renders_every_kind_of_document_again(tmp_path):
    """Each probe's document of the stored suite, written out as its command's --json would be,
    renders through `mgpu-bench report` with the loader of the module that wrote it."""
    from click.testing import CliRunner

    from mgpu_bench.cli import cli
    from mgpu_bench.results.document import document_kind

    doc = json.loads((FIXTURES / "suite" / "suite.json").read_text())
    kinds = set()
    for p in doc["probes"]:
        sub = p.get("document")
        if not sub:
            continue
        src = tmp_path / f"{p['name']}.json"
        src.write_text(json.dumps(sub))
        out = tmp_path / f"out-{p['name']}"
        r = CliRunner().invoke(cli, ["report", str(src), "--out", str(out)])
        assert r.exit_code == 0, r.output
        paths = [Path(line) for line in r.output.split()]
        assert paths and all(x.exists() and x.stat().st_size > 0 for x in paths)
        kind = document_kind(sub)
        kinds.add(kind)
        if kind != "links":  # links writes heatmaps only
            assert (out / "report.html").exists() and (out / "summary.md").exists()
    assert kinds == {"gemm", "memory", "model", "comm", "links"}
