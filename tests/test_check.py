"""`mgpu-bench check` on CPU processes, end to end (the measuring process, the gloo ranks, the
history, the Prometheus textfile, the NPD line, the NHC check file), and its verdict rules on
documents built from real parts' shapes. The Slurm contract is tests/test_slurm.py's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import scaled
from slurm_cluster import Throttle, processes

from mgpu_bench.cli import cli
from mgpu_bench.probes.check import analyse, budget

NHC = Path(__file__).resolve().parents[1] / "mgpu_bench" / "data" / "nhc" / "check_mgpu_bench.nhc"
NPD = Path(__file__).resolve().parents[1] / "mgpu_bench" / "data" / "npd" / "mgpu-bench-check-monitor.json"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TORCHELASTIC", "OMPI_", "PMI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "CUDA_VISIBLE_DEVICES": "", "SLURMD_NODENAME": "cpu-node", **extra}


def _check(*args: str, env: dict | None = None, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "check", *args], check=False, capture_output=True,
                       text=True, env=env or _env(), timeout=timeout)
    return r, time.monotonic() - t0


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One CPU check of node cpu-node, stored and made the node's baseline: (its result, wall s,
    the document, the database, the textfile)."""
    d = tmp_path_factory.mktemp("check")
    db, out, prom = d / "h.sqlite3", d / "check.json", d / "check.prom"
    r, wall = _check("--db", str(db), "--json", str(out), "--prometheus", str(prom))
    doc = json.loads(out.read_text())
    run_id = next(w for w in r.stderr.split() if w.startswith("r") and w[1:].isdigit())
    made = CliRunner().invoke(cli, ["baseline", "set", run_id, "--db", str(db)])
    assert made.exit_code == 0, made.output
    return r, wall, doc, db, prom


def test_a_cpu_check_runs_its_share_within_its_budget_and_is_stored(baseline):
    r, wall, doc, db, prom = baseline
    assert r.returncode == 0, r.stdout + r.stderr
    assert wall < 60.0  # --budget 60s, the whole command
    parts = {p["part"]: p for p in doc["parts"]}
    assert parts["health"]["status"] == "measured" and parts["processes"]["status"] == "skipped"
    ranks = parts["ranks"]
    assert ranks["status"] == "measured", ranks
    kinds = sorted((f["device"], f["kind"]) for f in ranks["figures"])
    assert kinds == [("node", "allreduce"), ("rank0", "copy"), ("rank0", "gemm"), ("rank1", "copy"), ("rank1", "gemm")]
    assert all(f["value"] > 0 and len(f["samples"]) >= 3 for f in ranks["figures"])
    assert next(f for f in ranks["figures"] if f["kind"] == "allreduce")["detail"]["wrong"] == 0
    assert doc["verdict"]["state"] == "ok" and doc["node"] == "cpu-node" and doc["environment"]["host"] == "cpu-node"
    assert "check cpu-node: ok in" in r.stdout and "judged against the floors alone" in r.stdout
    listed = CliRunner().invoke(cli, ["history", "list", "--db", str(db)]).output
    assert "check" in listed and "cpu-node" in listed
    # the stored check renders again (seen on one H200: `report rN` of a check was a traceback)
    rid = re.search(r"\b(r\d+)\b.*check", listed).group(1)
    rep = db.parent / "check-report"
    shown = CliRunner().invoke(cli, ["report", rid, "--db", str(db), "--out", str(rep)])
    assert shown.exit_code == 0, shown.output
    page = (rep / "report.html").read_text()
    assert "check of cpu-node: ok" in page and "<td class=l>ranks</td>" in page and "judged against the floors" in page
    assert "| ranks | measured |" in (rep / "summary.md").read_text()
    text = prom.read_text()
    assert 'mgpu_bench_check_healthy_ratio{host="cpu-node",node="cpu-node",textfile="check.prom"} 1.0' in text
    assert 'mgpu_bench_check_flops_per_second{host="cpu-node",node="cpu-node",device="rank0",textfile="check.prom"}' \
        in text
    # the command typed (its own --json and --prometheus), not the child's (a document in a temporary folder)
    assert "mgpu-bench-check-" not in listed and "--prometheus" in listed


def test_the_npd_form_is_one_line_of_80_bytes_and_the_next_check_is_judged_against_the_baseline(baseline, tmp_path):
    db = baseline[3]
    out = tmp_path / "second.json"
    r, _ = _check("--format", "npd", "--db", str(db), "--json", str(out))
    doc = json.loads(out.read_text())
    assert doc["reference"]["kind"] == "baseline" and doc["reference"]["label"].startswith("this node's baseline r")
    assert set(doc["reference"]["metrics"]) >= {"check.rank0.tflops", "check.allreduce_busbw"}
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and len(lines[0].encode()) <= 80, r.stdout  # NPD keeps the first 80 bytes
    state = doc["verdict"]["state"]
    assert r.returncode == {"ok": 0, "problem": 1}[state], (r.stdout, r.stderr)
    assert lines[0] == doc["verdict"]["npd"]
    assert "check of cpu-node" in r.stderr  # the table went to stderr


def test_a_budget_too_small_to_measure_is_unknown_printed_stored_and_exit_2(tmp_path):
    db, out = tmp_path / "h.sqlite3", tmp_path / "c.json"
    r, wall = _check("--budget", "8s", "--drain", "--db", str(db), "--json", str(out),
                     env=_env(PATH="/nonexistent"))  # --drain: nothing may be asked of Slurm (none here)
    assert r.returncode == 2, r.stdout + r.stderr
    assert wall < 8.0 + scaled(1.0)  # its budget, and the interpreter's exit (12.7 s beside 8 busy processes)
    doc = json.loads(out.read_text())
    assert doc["verdict"]["state"] == "unknown" and doc["verdict"]["fix"].startswith("give --budget ")
    assert {p["part"]: p["status"] for p in doc["parts"]}["ranks"] == "skipped"
    closing = r.stdout.strip().splitlines()[-1]
    assert "unknown" in closing and "give --budget" in closing
    assert "drain" not in r.stdout + r.stderr  # unknown never drains, and nothing tried to
    listed = CliRunner().invoke(cli, ["history", "list", "--db", str(db)]).output
    assert "check" in listed


def test_a_resume_slurm_cannot_take_says_the_fix_in_one_line_and_the_passing_verdict_is_kept(tmp_path):
    """No scontrol on PATH: the check passes, is printed and stored; one line names the fix, and the
    exit code is 2 (the scheduler was not told), never 1 (the node is not bad)."""
    db = tmp_path / "h.sqlite3"
    r, _ = _check("--resume", "--db", str(db), env=_env(PATH="/nonexistent"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "check cpu-node: ok in" in r.stdout
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("mgpu-bench: could not resume")]
    assert "scontrol is not on PATH (/nonexistent): install Slurm's client" in line
    listed = CliRunner().invoke(cli, ["history", "list", "--db", str(db)]).output
    assert "check" in listed and "cpu-node" in listed
    # the stored check renders again (seen on one H200: `report rN` of a check was a traceback)
    rid = re.search(r"\b(r\d+)\b.*check", listed).group(1)
    rep = db.parent / "check-report"
    shown = CliRunner().invoke(cli, ["report", rid, "--db", str(db), "--out", str(rep)])
    assert shown.exit_code == 0, shown.output
    page = (rep / "report.html").read_text()
    assert "check of cpu-node: ok" in page and "<td class=l>ranks</td>" in page and "judged against the floors" in page
    assert "| ranks | measured |" in (rep / "summary.md").read_text()


@pytest.mark.parametrize("args, words", [
    (["--budget", "1s"], "at least 5s"), (["--budget", "2h"], "at most 60m"), (["--budget", "soon"], "not a duration"),
    (["--nproc", "1"], "--nproc 1: at least 2"), (["--gpus", "1"], "--gpus"), (["--format", "xml"], "--format"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    r = CliRunner().invoke(cli, ["check", *args])
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert line.startswith("mgpu-bench: error: ") and words in line, line


# -- the NHC check file, sourced as NHC sources it ---------------------------------------------------


def _nhc(args: str, db: Path, throttle: bool = False) -> tuple[list[str], list[str], int]:
    """check_mgpu_bench ARGS in bash with NHC's die and log stubbed (they record their arguments);
    -> (die's arguments, log's, the function's return code)."""
    script = f"""
die() {{ printf 'die|%s\\n' "$*" >> "$RECORD"; }}
log() {{ printf 'log|%s\\n' "$*" >> "$RECORD"; }}
. {NHC}
check_mgpu_bench {args} --db {db}
echo "rc|$?" >> "$RECORD"
"""
    record = db.parent / f"record{time.monotonic_ns()}"
    env = _env(RECORD=str(record), MGPU_BENCH=str(db.parent / "mgpu-bench"))  # the command, as NHC's PATH finds it
    Path(env["MGPU_BENCH"]).write_text(f"#!/bin/sh\nexec {sys.executable} -m mgpu_bench.cli \"$@\"\n")
    Path(env["MGPU_BENCH"]).chmod(0o755)
    proc = subprocess.Popen(["bash", "-c", script], env=env)
    slow = Throttle(lambda: processes("mgpu_bench.probes.check.cpu_rank", below=proc.pid), count=2) if throttle \
        else None
    try:
        proc.wait(timeout=150)
    finally:
        if slow:
            slow.stop()
    lines = record.read_text().splitlines()

    def pick(key: str) -> list[str]:
        return [x.split("|", 1)[1] for x in lines if x.startswith(key + "|")]

    return pick("die"), pick("log"), int(pick("rc")[0])


def test_the_nhc_check_dies_with_the_reason_when_the_node_is_slow_and_logs_when_it_cannot_tell(baseline):
    """Against the stored baseline, the CPU ranks slowed from outside (stopped 3/4 of the time once
    they run): die 1 with the rank and the figure. With a budget too short to measure: logged,
    not failed."""
    db = baseline[3]
    died, logged, rc = _nhc("", db, throttle=True)
    assert rc == 1 and len(died) == 1 and not logged, (died, logged)
    code, _, message = died[0].partition(" ")
    assert code == "1" and message.startswith("check_mgpu_bench: ")
    reason = message.split(": ", 1)[1]
    assert "rank" in reason and "vs baseline" in reason and len(reason.encode()) <= 80, reason
    died, logged, rc = _nhc("--budget 8s", db)
    assert rc == 0 and not died and len(logged) == 1 and "exit code 2" in logged[0] and "give --budget" in logged[0]


# -- the node-problem-detector sample config ---------------------------------------------------------


def _go_seconds(text: str) -> float:
    import re

    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * units[u] for n, u in parts)


def test_the_npd_sample_config_follows_the_custom_plugin_monitor_rules():
    """What NPD's CustomPluginConfig.Validate checks (plugin "custom", a rule's timeout at most the
    global one, a permanent rule's condition among the default conditions), and that the plugin's
    budget ends before NPD's timeout and its output fits max_output_length."""
    cfg = json.loads(NPD.read_text())
    assert cfg["plugin"] == "custom" and cfg["source"]
    glob = cfg["pluginConfig"]
    assert glob["max_output_length"] == analyse.NPD_MAX
    conditions = {c["type"] for c in cfg["conditions"]}
    (rule,) = cfg["rules"]
    assert rule["type"] == "permanent" and rule["condition"] in conditions
    assert _go_seconds(rule["timeout"]) <= _go_seconds(glob["timeout"])
    args = rule["args"]
    assert args[:3] == ["check", "--format", "npd"]
    assert budget.parse_budget(args[args.index("--budget") + 1]) < _go_seconds(rule["timeout"])
    assert Path(rule["path"]).name == "mgpu-bench"


# -- the verdict rules, on parts shaped as the measuring writes them ----------------------------------

H200 = "NVIDIA H200"


def _devices(n=2, model=H200):
    return [{"name": f"gpu{i}", "index": i, "model": model, "multiprocessors": 132} for i in range(n)]


def _part(name, figures=(), facts=None, status="measured", why=None, errors=None, seconds=1.0):
    return {"part": name, "status": status, "seconds": seconds, "why": why, "figures": list(figures),
            "facts": facts or {}, "errors": errors or {}}


def _gemm(dev, value, n=10, spread=0.01):
    samples = [value * (1 + spread * ((i % 3) - 1)) for i in range(n)]
    return {"device": dev, "kind": "gemm", "value": value, "unit": "FLOP/s", "samples": samples,
            "detail": {"max_error": 1e-3, "tolerance": 1e-2, "telemetry": {"limiting": []}}}


def test_a_gpu_below_its_datasheet_floor_is_a_problem_named_in_80_bytes():
    from mgpu_bench.machine import hardware

    peak = hardware.find_gpu(H200).peak["bf16"].value
    v = analyse.verdict_of([_part("gemm", [_gemm("gpu0", 0.72 * peak), _gemm("gpu1", 0.38 * peak)])], _devices(), None,
                           60, 20)
    assert v["state"] == "problem"
    (floor,) = [f for f in v["floors"] if f["kind"] == "gemm"]
    assert floor["value"] == pytest.approx(analyse.FLOORS["gemm"][0] * peak) and floor["source"]
    problems = [f for f in v["findings"] if f["severity"] == "problem"]
    assert [f["device"] for f in problems] == ["gpu1"]
    assert v["npd"].startswith("GPU 1 GEMM ") and "floor" in v["npd"] and len(v["npd"].encode()) <= 80
    lines = analyse.floor_lines(v["floors"])
    assert lines and f"{100 * analyse.FLOORS['gemm'][0]:.0f}% of the dense bf16 peak" in lines[0]


def test_against_the_reference_a_drop_beyond_the_threshold_and_the_noise_is_a_problem():
    ref = {"label": "this node's baseline r3", "metrics": {"check.gpu0.tflops": {"value": 700e12, "noise": 0.01}}}
    ok = analyse.verdict_of([_part("gemm", [_gemm("gpu0", 660e12)])], _devices(1), ref, 60, 20)
    assert ok["state"] == "ok"  # 6% below: within the 10% a GPU's short GEMM moves
    slow = analyse.verdict_of([_part("gemm", [_gemm("gpu0", 600e12)])], _devices(1), ref, 60, 20)
    assert slow["state"] == "problem" and "14% below this node's baseline r3" in slow["reason"]
    moving = {"label": "r4", "metrics": {"check.gpu0.tflops": {"value": 700e12, "noise": 0.06}}}
    wide = analyse.verdict_of([_part("gemm", [_gemm("gpu0", 600e12, spread=0.2)])], _devices(1), moving, 60, 20)
    assert wide["state"] == "ok"  # a reference that moves 6% widens the threshold to 18%, past a 14% drop
    assert analyse.verdict_of([_part("gemm", [_gemm("gpu0", 500e12, spread=0.2)])], _devices(1), moving, 60,
                              20)["state"] == "problem"  # the run's own spread widens nothing


def test_other_processes_hung_work_and_sdc_disagreement_are_problems_and_nothing_measured_is_unknown():
    busy = {"foreign": [{"gpu": 0, "device": "gpu0", "pid": 4242, "name": "python3", "used_bytes": 5 << 30,
                         "owner": "foreign", "busy": True}]}
    v = analyse.verdict_of([_part("processes", facts=busy)], _devices(), None, 60, 20)
    assert v["state"] == "problem" and "pid 4242" in v["npd"] and v["npd"].startswith("GPU 0 shared")
    hung = analyse.verdict_of([_part("allreduce", status="hung", why="the allreduce on node did not return")],
                              _devices(), None, 60, 20)
    assert hung["state"] == "problem" and hung["npd"].startswith("allreduce hung")
    sdc = {"gpu0": {"gemms": 16, "differs": False, "hash": "0x1", "hbm_bytes": 1 << 30, "hbm_mismatches": 0,
                    "peers": ["gpu0", "gpu1", "gpu2"]},
           "gpu1": {"gemms": 16, "differs": False, "hash": "0x2", "hbm_bytes": 1 << 30, "hbm_mismatches": 0,
                    "peers": ["gpu0", "gpu1", "gpu2"]},
           "gpu2": {"gemms": 16, "differs": False, "hash": "0x1", "hbm_bytes": 1 << 30, "hbm_mismatches": 3,
                    "peers": ["gpu0", "gpu1", "gpu2"]}}
    v = analyse.verdict_of([_part("sdc", facts=sdc)], _devices(3), None, 60, 20)
    assert sorted(f["device"] for f in v["findings"] if f["severity"] == "problem") == ["gpu1", "gpu2"]
    skipped = analyse.verdict_of([_part("health", facts={"gpu0": {"findings": []}}),
                                  _part("gemm", status="skipped", why="needs about 2.0 s")], _devices(1), None, 3, 14)
    assert skipped["state"] == "unknown" and skipped["fix"].startswith("give --budget 21s") and \
        skipped["npd"].startswith("unknown: give --budget 21s")
    error = analyse.verdict_of([_part("gemm", [_gemm("gpu0", 700e12)]), _part("hbm", status="error", why="TypeError")],
                               _devices(1), None, 60, 20)
    assert error["state"] == "unknown" and "hbm" in error["fix"]  # the check's own failure is never a bad node


def test_the_budget_plans_parts_from_their_cost_and_scales_by_what_ran():
    b = budget.Budget(time.monotonic() + 3.0, "gpu")
    assert b.fits("gemm") is None and "needs about" in (b.fits("allreduce") or "")
    b.done("health", 4 * budget.EXPECTED_S["gpu"]["health"])  # the host runs 4x slower than expected
    assert b.slowness == pytest.approx(4.0)
    assert "needs about 8.0 s" in (b.fits("gemm") or "")
    assert b.slot("hbm") <= b.deadline


# -- on a GPU (pytest -m gpu; skipped without one) ------------------------------------------------------


def _gpu_env(**extra) -> dict:
    env = _env(**extra)
    env.pop("CUDA_VISIBLE_DEVICES")
    return env


@pytest.mark.gpu
def test_a_healthy_gpu_passes_within_its_budget_with_every_part_and_its_floors(tmp_path):
    out = tmp_path / "check.json"
    r, wall = _check("--gpus", "1", "--json", str(out), "--no-store", env=_gpu_env())
    doc = json.loads(out.read_text())
    status = {p["part"]: p["status"] for p in doc["parts"]}
    assert r.returncode == 0, r.stdout + r.stderr
    assert wall < 60.0 and doc["verdict"]["state"] == "ok"
    assert status == {"health": "measured", "processes": "measured", "gemm": "measured", "hbm": "measured",
                      "allreduce": "skipped", "sdc": "measured"}, status
    kinds = {f["kind"] for f in doc["verdict"]["floors"]}
    assert kinds == {"gemm", "copy"} and "floor: GEMM on NVIDIA" in r.stdout
    print(f"\ncheck on one GPU: {wall:.1f} s, {doc['verdict']['npd']}")


@pytest.mark.gpu
def test_a_gemm_in_another_process_is_named_with_exit_1_in_npd_form(tmp_path):
    hog = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_hog.py"),
                            "0", "90", "24"], stdout=subprocess.PIPE, text=True)  # 24 GiB: more than this
    # pytest process holds from earlier GPU tests (the line names the largest holder first)
    try:
        assert "hog pid" in hog.stdout.readline()
        time.sleep(2.0)  # its matmuls are running
        r, wall = _check("--gpus", "0,", "--format", "npd", "--no-store", env=_gpu_env())
    finally:
        hog.kill()
        hog.wait()
    (line,) = r.stdout.splitlines()
    assert r.returncode == 1, r.stdout + r.stderr
    assert line.startswith("GPU 0") and len(line.encode()) <= 80, line
    assert f"pid {hog.pid}" in line or "GEMM" in line, line
    print(f"\ncheck beside gpu_hog.py: {wall:.1f} s, exit {r.returncode}: {line}")
