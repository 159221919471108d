"""`comm --tune` on real GPUs (run with `pytest -m gpu` on a machine with 2+ GPUs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from mgpu_bench.probes.comm.tune import rule as tune_rule
from mgpu_bench.probes.comm.tune import run as tune_run
from mgpu_bench.probes.comm.tune import trials as tune_trials
from mgpu_bench.results.measurement import CommRequest, TimingOptions

EXPORT = re.compile(r"^export (NCCL_[A-Z_]+)=(\S+)$")
TARGET_S = 60.0  # issue 18: allreduce 1M-1G tuned in under 60 s on 2 GPUs


def mgpu_bench(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mgpu_bench.cli", *args], check=False, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.multi_gpu(2)
def test_allreduce_1m_1g_is_tuned_in_under_a_minute_with_lines_that_parse(tmp_path):
    out = tmp_path / "tune.json"
    t0 = time.monotonic()
    r = mgpu_bench("comm", "--tune", "--gpus", "2", "--sizes", "1M-1G", "--json", str(out), "--no-store")
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert wall < TARGET_S, f"{wall:.1f} s"
    assert re.search(r"comm: about \d+ s for \d+ NCCL settings", r.stderr)  # the estimate, said at the start
    doc = json.loads(out.read_text())
    tu = doc["tuning"]
    trials = tu["trials"]
    assert [t["label"] for t in trials if t["group"] == "default"] == ["default", "default"]
    assert all(t["error"] is None for t in trials), [(t["label"], t["error"]) for t in trials]
    assert all(m["wrong"] == [0, 0] for t in trials for m in t["measurements"])
    default = trials[0]
    if "NCCL_DEBUG" not in os.environ:  # read from NCCL's log: the channel trials ran
        assert default["channels"] and default["channels"] > 0
        assert any(t["group"] == "channels" for t in trials)
    assert len(default["measurements"]) == 6 and doc["measurements"] == default["measurements"]
    # the printed lines are the document's, and each parses as VAR=value of a setting measured here
    printed = [line for line in r.stdout.splitlines() if line.startswith("export ")]
    given = tu["advice"]["lines"] + [x for o in tu["advice"]["only_for"] for x in o["lines"]]
    assert printed == given
    measured = {(k, v) for t in trials for k, v in t["env"].items()}
    for line in printed:
        m = EXPORT.match(line)
        assert m and (m.group(1), m.group(2)) in measured, line
    if os.environ.get("NCCL_NVLS_ENABLE") == "0":
        assert not tu["nvls"]["allowed"] and not any("NVLS" in line for line in printed)
        assert not any("NVLS" in t["label"] for t in trials)
    # every recommendation is backed by figures that pass the rule
    for c in tu["choices"]:
        if c["recommended"]:
            assert c["gain"] > max(tune_rule.MIN_GAIN, tune_rule.NOISE_FACTOR * c["noise"])
    print(r.stdout[-3000:], f"\nwall {wall:.1f} s")


@pytest.mark.multi_gpu(2)
def test_a_setting_that_returns_wrong_data_is_never_recommended():
    cfg = tune_trials.TuneConfig(ops=("allreduce",), dtype="fp32", redop="sum", sizes=(1 << 20,), inplace=(False,),
                          timing=TimingOptions(), timeout_s=60.0)
    req = [CommRequest("allreduce", "fp32", "sum", 1 << 20, False)]
    default = tune_trials.Candidate((), tune_trials.DEFAULT, ("allreduce",))
    cand = tune_trials.Candidate((("NCCL_PROTO", "allreduce:LL"),), tune_trials.PROTOCOL, ("allreduce",))
    trials = [tune_run.run_trial(default, req, [0, 1], ["cuda:0", "cuda:1"], cfg, run=n) for n in (1, 2)]
    # the test plants the corruption (the native test hook), in the trial's own process
    bad = tune_run.run_trial(cand, req, [0, 1], ["cuda:0", "cuda:1"], cfg, corrupt_rank=1)
    assert bad.error is None and bad.wrong >= 1 and bad.measurements[0].wrong[1] >= 1
    band = tune_trials.Band("small", (1 << 20,))
    choices = tune_rule.decide(trials + [bad], (band,), ("allreduce",), tune_trials.Nvls(False, ""))
    assert not choices[0].recommended and choices[0].setting is None
    passing = tune_rule.evaluate(trials + [bad], (band,), ("allreduce",), tune_trials.Nvls(False, ""))
    assert tune_rule.advise(passing, trials + [bad]).lines == ()


@pytest.mark.gpu
def test_one_gpu_says_tuning_needs_two():
    r = mgpu_bench("comm", "--tune", "--gpus", "1", "--no-store", timeout=120.0)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stdout + r.stderr
    assert "--tune needs 2 or more GPUs: 1 selected" in lines[0] and "allreduce is a copy" in lines[0]


@pytest.mark.multi_gpu(2)
def test_ctrl_c_keeps_the_settings_measured(tmp_path):
    from conftest import interrupt_comm

    out = tmp_path / "tune.json"
    code, err = interrupt_comm(["--tune", "--gpus", "2", "--sizes", "1M-1G", "--json", str(out), "--no-store"])
    assert code == 130, err
    doc = json.loads(out.read_text())
    assert doc["status"]["stopped"] == "interrupted" and "while measuring" in doc["status"]["message"]
    first = doc["tuning"]["trials"][0]
    assert first["label"] == "default" and first["error"] is None and len(first["measurements"]) == 6
    assert doc["measurements"] == first["measurements"]
