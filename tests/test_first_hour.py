"""A new user's first hour on a 2-core machine without a GPU, again (issue 25): the help with no
command, one list of what runs without a GPU, verdicts that agree, figures that explain
themselves, compare, history and the small inconsistencies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.machine import selection
from mgpu_bench.results import probe as registry

FIX = Path(__file__).parent / "fixtures"
README = Path(__file__).resolve().parent.parent / "README.md"
cpu_only = pytest.mark.skipif(selection.visible_gpu_count() > 0, reason="checks what a machine without a GPU does")


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


# -- 3. no command: the help, as --help shows it ----------------------------------------------------


@pytest.mark.parametrize("group", [[], ["history"], ["baseline"]])
def test_a_group_without_a_command_shows_its_help_as_help_does(group):
    bare = CliRunner().invoke(cli, group, prog_name="mgpu-bench")
    asked = CliRunner().invoke(cli, [*group, "--help"], prog_name="mgpu-bench")
    assert asked.exit_code == 0
    assert bare.exit_code == 2  # click's code for a missing command (README: exit codes)
    assert bare.stdout == asked.stdout and bare.stderr == ""
    assert bare.stdout.startswith("Usage: mgpu-bench")
    assert len(bare.stdout.splitlines()) > 5


# -- 5. one list of what runs without a GPU ----------------------------------------------------------


def test_what_runs_without_a_gpu_comes_from_the_probes():
    assert selection.cpu_commands() == [n if registry.get(n).cpu is True else f"{n} ({registry.get(n).cpu})"
                                        for n in registry.names() if registry.get(n).cpu]
    assert {"comm", "model", "overlap", "check", "suite"} <= set(selection.cpu_commands())
    assert "fleet (under torchrun)" in selection.cpu_commands()
    assert not {"gemm", "memory", "links", "sdc"} & set(selection.cpu_commands())
    sentence = selection.without_gpu()
    assert sentence == ("without a GPU, comm, model, fleet (under torchrun), overlap, check and suite run on CPU "
                        "processes (gloo)")


def test_the_group_help_and_the_readme_say_the_same_list():
    sentence = selection.without_gpu()
    assert sentence[1:] in _flat(CliRunner().invoke(cli, ["--help"]).stdout)
    assert sentence[1:] in _flat(README.read_text())


@cpu_only
@pytest.mark.parametrize("command", ["gemm", "memory", "links", "sdc"])
def test_every_gpu_only_command_names_the_same_list(command):
    r = CliRunner().invoke(cli, [command])
    assert r.exit_code == 2 and r.output.strip().endswith(selection.without_gpu()), r.output


def test_the_suite_says_why_it_skips_a_probe_that_runs_on_cpu_by_itself(tmp_path):
    from mgpu_bench.suite.run import SuiteConfig, plan, run_probe

    steps = {s.name: s for s in plan(SuiteConfig(quick=True, rounds=(1, 2, 3), duration_s=20.0, gpus=(),
                                                 tolerance=0.05))}
    overlap = run_probe(steps["overlap"], 0, tmp_path)
    assert overlap["status"] == "skipped"
    assert "needs 2 NVIDIA GPU(s)" not in overlap["error"]
    assert overlap["error"] == "the suite runs overlap on 2 NVIDIA GPU(s) only; `mgpu-bench overlap` runs on CPU processes"
    gemm = next(s for name, s in steps.items() if name.startswith("gemm"))
    assert run_probe(gemm, 0, tmp_path)["error"] == "needs an NVIDIA GPU"


# -- 6. one judgement for the same figures -----------------------------------------------------------


def _suite_with_scaling(exposed: float) -> dict:
    """The suite fixture (its model-scaling run on 2 CPU processes: scaling 46.5%) with the
    2-process run's exposed communication set to `exposed`, and only that probe."""
    import copy
    import json

    suite = copy.deepcopy(json.loads((FIX / "suite" / "suite.json").read_text()))
    suite["probes"] = [p for p in suite["probes"] if p["name"] == "model-scaling"]
    for r in suite["probes"][0]["document"]["runs"]:
        if r["world"] == 2:
            r["derived"]["exposed_comm_share"] = exposed
    return suite


@pytest.mark.parametrize("exposed", [0.0, 0.306])
def test_the_model_and_the_suite_give_one_verdict_on_cpu_processes(exposed):
    """`model --scaling 1,2` said "communication-bound: exposed communication is 30.6%" and the
    suite "contention" on the same CPU machine: on CPU processes the all-reduce (gloo) runs on the
    cores the step computes on, so both shares are the ranks competing for them."""
    from mgpu_bench.suite import judge

    suite = _suite_with_scaling(exposed)
    doc = suite["probes"][0]["document"]
    model = registry.get("model")
    v = model.verdict(doc)
    assert v.bound == "contention" and v.text.startswith("contention: scaling 1 -> 2 is 46.5%")
    assert f"exposed communication {100 * exposed:.1f}%" in v.text
    headline = judge.verdict(suite)
    assert headline.text == f"verdict: {v.text} ({v.where}, round 2 model-scaling)"
    lines = [f.text for f in model.findings(doc)]
    assert not any("communication-bound" in line for line in lines), lines


def test_model_and_suite_say_how_long_they_expect_to_take_start_up_included():
    """The estimate is the whole command's: model "about 18 s" took 93 s and suite "about 83 s"
    200 s when start-up was left out. Now it says it is included, and it is at least this
    process's own start-up so far plus, per configuration or probe, a new process's start-up on
    this host now (mgpu_bench/core/startup.py)."""
    import click

    from mgpu_bench.core import startup
    from mgpu_bench.suite.run import estimate as suite_estimate

    for name, args in (("model", ["--scaling", "1,2"]), ("suite", ["--quick"])):
        probe = registry.get(name)
        params = click.Command(name, params=probe.options()).make_context(name, args).params
        cfg = probe.configure(params)
        said = probe.estimate(cfg) if name == "model" else suite_estimate(cfg)
        m = re.match(r"about (\d+) (s|min) for ", said or "")
        assert m and "start-up included" in said, said
        seconds = int(m.group(1)) * (60 if m.group(2) == "min" else 1)
        processes = 2 if name == "model" else 4  # model: 1 and 2 ranks; suite: its 4 CPU probes
        assert seconds >= 0.9 * (startup.spent_s() + processes * startup.process_s(1, 1.0)) - 1, said


# -- 7. figures that explain themselves --------------------------------------------------------------


def _cpu_comm_doc() -> dict:
    """The 2x H200 comm document as a CPU run's: backend torch-gloo, no theory, every time 10^4
    times longer (1 MiB reads about 0.008 GB/s)."""
    import copy
    import json

    doc = copy.deepcopy(json.loads((FIX / "comm_2x_h200.json").read_text()))
    doc["theory"], doc["backend"] = None, "torch-gloo"
    for m in doc["measurements"]:
        m["spec"]["backend"] = "torch-gloo"
        m["burst_seconds"] = [s * 1e4 for s in m["burst_seconds"]]
        m["samples"] = [[s * 1e4 for s in rank] for rank in m["samples"]]
    return doc


def test_a_cpu_run_says_why_there_is_no_theory_and_shows_its_small_bandwidths(tmp_path):
    import io

    from rich.console import Console

    from mgpu_bench.probes.comm import analyse, render
    from mgpu_bench.probes.comm.report import markdown, summary_html

    doc = _cpu_comm_doc()
    probe = registry.get("comm")
    console = Console(file=io.StringIO(), width=100, color_system=None)
    probe.render(doc, console)
    text = console.file.getvalue()
    assert text.count("no link theory: the ranks are CPU processes") == 1
    run = probe.load(doc)
    small = min(run.measurements, key=lambda m: m.spec.bytes)
    shown = analyse.gbs(small.busbw)
    assert 0 < small.busbw < 1e7 and shown != "0.00" and float(shown) == pytest.approx(small.busbw / 1e9, rel=0.01)
    assert shown in text.split() and " 0.00 " not in text
    # one formatter for every medium: the summary line, Markdown and HTML say the same figure
    largest = max(run.measurements, key=lambda m: m.spec.bytes)
    figure = f"{analyse.gbs(largest.busbw)} GB/s"
    assert figure in text and figure in markdown(run, doc["environment"]) and figure in summary_html(run)
    assert "no link theory: the ranks are CPU processes" in markdown(run, doc["environment"])
    assert render.format_cell(next(c for c in render.COLUMNS if c.key == "busbw"), 330.77e9) == "330.77"


# -- 8. compare: what both runs share, and one exit code ---------------------------------------------


def _comm_sizes(sizes: set[int]) -> dict:
    import copy
    import json

    doc = copy.deepcopy(json.loads((FIX / "comm_2x_h200.json").read_text()))
    doc["measurements"] = [m for m in doc["measurements"] if m["spec"]["bytes"] in sizes]
    return doc


def test_compare_sets_side_by_side_the_sizes_both_runs_measured(tmp_path):
    import json

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    sizes = sorted({m["spec"]["bytes"] for m in json.loads((FIX / "comm_2x_h200.json").read_text())["measurements"]})
    a.write_text(json.dumps(_comm_sizes(set(sizes[:2]))))  # 1 MiB, 64 MiB... as the fixture has them
    b.write_text(json.dumps(_comm_sizes(set(sizes[1:]))))
    db = str(tmp_path / "h.db")
    assert CliRunner().invoke(cli, ["history", "add", str(a), str(b), "--db", db]).exit_code == 0
    r = CliRunner().invoke(cli, ["compare", "r2", "--baseline", "r1", "--db", db])
    assert r.exit_code in (0, 1), r.output
    line = next(x for x in r.stdout.splitlines() if "metric(s) compared" in x)
    compared = int(line.split()[0])
    assert compared > 0 and "only in r1" in line and "only in r2" in line
    assert "share no metric" not in r.output


def test_runs_that_cannot_be_compared_exit_1_as_the_help_says(tmp_path):
    from test_headline import comm_document, gemm_document

    from mgpu_bench.history import History

    db = tmp_path / "h.db"
    with History.open(db) as h:
        h.save(comm_document())
        h.save(gemm_document())
    r = CliRunner().invoke(cli, ["compare", "r1", "--baseline", "r2", "--db", str(db)])
    assert r.exit_code == 1, r.output
    assert "not comparable: the two runs share no metric" in r.stdout
    helptext = _flat(CliRunner().invoke(cli, ["compare", "--help"]).stdout)
    assert "1 at least one regression, or runs that cannot be compared" in helptext
    # the exit codes' table lives in the docs site's history page (the README links it)
    assert "runs that cannot be compared" in _flat((README.parent / "docs/concepts/history.md").read_text())


# -- 9. history list marks the runs that did not complete ---------------------------------------------


def test_history_list_marks_interrupted_terminated_and_failed_runs(tmp_path):
    import copy

    from test_headline import comm_document

    from mgpu_bench.history import History

    base = comm_document()
    ends = [(None, None, "complete"), ("interrupted", "interrupted at allreduce 1 GiB out-of-place", "interrupted"),
            ("interrupted", "terminated (SIGTERM) at allreduce 1 GiB out-of-place", "terminated"),
            ("timeout", "stopped at allreduce 1 GiB: did not finish", "stopped: timeout")]
    db = tmp_path / "h.db"
    with History.open(db) as h:
        for stopped, message, _ in ends:
            doc = copy.deepcopy(base)
            doc["status"] = {"completed": stopped is None, "stopped": stopped, "message": message}
            h.save(doc)
    r = CliRunner().invoke(cli, ["history", "list", "--db", str(db)])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert "status" in lines[0].split()
    for run_id, (_, _, shown) in zip(("r1", "r2", "r3", "r4"), ends, strict=True):
        row = next(x for x in lines if x.split() and x.split()[0].lstrip("*") == run_id)
        assert shown in row, row


# -- 10. small inconsistencies -------------------------------------------------------------------------


def test_plurals_in_the_comm_summary_and_the_compare_counts(tmp_path):
    from mgpu_bench.probes.comm.render import summary_lines

    run = registry.get("comm").load(_comm_sizes({64 << 20}))
    lines = summary_lines(run)
    assert lines and all("over 1 size >= 64 MiB" in line for line in lines), lines
    assert not any("1 sizes" in line for line in lines)


def test_the_fleet_heatmap_uses_the_tables_unit(monkeypatch):
    import matplotlib.axes
    from test_tables import _fleet

    from mgpu_bench.probes.fleet import analyse, report

    titles: list[str] = []
    real = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, text, *a, **k: (titles.append(text),
                                                                                         real(self, text, *a, **k))[1])
    doc = _fleet()
    for p in doc["pairings"]:  # CPU processes: pairs in MB/s
        p["allreduce"]["busbw"] /= 1e3
    assert report.plot_pairs(doc) is not None
    assert titles and "(MB/s)" in titles[-1]
    assert "MB/s" in analyse.fmt("allreduce", doc["pairings"][0]["allreduce"]["busbw"])


def test_fp8_is_one_type_under_both_names_in_both_commands():
    from mgpu_bench.probes.gemm.measure import parse_dtypes
    from mgpu_bench.results.ops import parse_dtype

    assert {parse_dtype(x) for x in ("fp8", "fp8_e4m3", "fp8-e4m3", "e4m3", "FP8")} == {"fp8_e4m3"}
    assert {parse_dtypes(x) for x in ("fp8", "fp8_e4m3", "fp8-e4m3", "e4m3")} == {("fp8",)}
    for command in ("comm", "gemm"):
        option = next(o for o in registry.get(command).options() if "--dtype" in o.opts)
        assert "fp8_e4m3" in option.help and "fp8" in option.help.replace("fp8_e4m3", ""), option.help


def test_the_suite_shows_the_command_a_user_would_type():
    from mgpu_bench.results.probe import Step
    from mgpu_bench.suite.run import user_command

    step = Step(2, 40, "overlap", "compute and communication together",
                ("overlap", "--duration", "3s", "--model-figures", '{"source": "model-scaling"}', "--gpus", "2"))
    assert user_command(step) == ["mgpu-bench", "overlap", "--duration", "3s", "--gpus", "2"]


def test_progress_lines_start_with_the_command_name_alone():
    """`model:` and `mgpu-bench model:` both appeared; the runner's Progress writes '<name>: ', and
    the model's step counter (its own line in a pipe) says the same."""
    pkg = Path(__file__).resolve().parent.parent / "mgpu_bench"
    counter = (pkg / "probes" / "model" / "measure.py").read_text()
    assert 'text = f"model: {world}' in counter and "mgpu-bench model:" not in counter
    from mgpu_bench.output.console import Progress

    assert 'f"{self.name}: {text}' in Path(__import__("inspect").getsourcefile(Progress)).read_text()
