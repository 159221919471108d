"""A new user's first hour on a 2-core machine without a GPU, again (issue 25): the help with no
command, one list of what runs without a GPU, verdicts that agree, figures that explain
themselves, compare, history and the small inconsistencies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench import probe as registry
from mgpu_bench import selection
from mgpu_bench.cli import cli

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
    assert {"comm", "model", "overlap", "suite"} <= set(selection.cpu_commands())
    assert "fleet (under torchrun)" in selection.cpu_commands()
    assert not {"gemm", "memory", "links", "sdc"} & set(selection.cpu_commands())
    sentence = selection.without_gpu()
    assert sentence == "without a GPU, comm, model, fleet (under torchrun), overlap and suite run on CPU processes (gloo)"


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


def test_model_and_suite_say_how_long_they_expect_to_take():
    import click

    for name, args in (("model", ["--scaling", "1,2"]), ("suite", ["--quick"])):
        probe = registry.get(name)
        params = click.Command(name, params=probe.options()).make_context(name, args).params
        said = probe.estimate(probe.configure(params))
        assert said and re.match(r"about \d+ (s|min) for ", said), said
