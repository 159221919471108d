"""The check's contract with the scheduler at its edges (issue 33): the verdict comes from this run
only (a measuring process killed before it handed its document over is unknown, whatever an older
--json holds), the exit code is the verdict's whatever stdout does, scontrol is told one node, a
refusal under --format npd is a line on stdout, outside text is escaped, a daemon's HOME costs no
check, and a reference needs enough passing runs to know its noise. Real processes throughout:
the command, its measuring process, the gloo ranks, SQLite."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_cluster import processes

from mgpu_bench.cli import cli
from mgpu_bench.core import slurm
from mgpu_bench.history import History
from mgpu_bench.probes.check import analyse, contract, reference

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpu" / "check-1xh200.json"
CHECK = [sys.executable, "-m", "mgpu_bench.cli", "check"]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TORCHELASTIC", "OMPI_", "PMI_",
                                                                   "MGPU_BENCH"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "CUDA_VISIBLE_DEVICES": "", "SLURMD_NODENAME": "cpu-node", **extra}


def _old_document(verdict: str) -> dict:
    """An earlier run's document of this node, as --json left it: the H200 check, re-labelled."""
    doc = json.loads(FIXTURE.read_text())
    doc["node"] = doc["environment"]["host"] = "cpu-node"
    doc["verdict"]["state"] = verdict
    if verdict == "problem":
        doc["verdict"]["reason"] = "GPU 0: an OLD problem from an earlier run"
        doc["verdict"]["npd"] = "GPU 0 OLD problem"
    return doc


# -- stale outputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, old", [("--drain", "problem"), ("--resume", "ok")])
def test_a_measuring_process_killed_before_it_hands_over_is_unknown_whatever_an_older_json_says(tmp_path, flag, old):
    """SIGKILL of the measuring process 1 s in: exit 2, one npd line saying so, nothing asked of
    Slurm (no scontrol here: asking would be a line), the old --json file left as it was."""
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(_old_document(old)))
    before = stale.read_bytes()
    proc = subprocess.Popen([*CHECK, flag, "--no-store", "--json", str(stale), "--budget", "30s", "--format", "npd"],
                            env=_env(PATH="/nonexistent"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0, killed = time.monotonic(), []
    while not killed and time.monotonic() - t0 < 20 and proc.poll() is None:
        kids = processes("mgpu_bench.cli check", below=proc.pid)
        kids = [k for k in kids if k != proc.pid]
        if kids:
            time.sleep(1.0)
            for k in kids:
                os.kill(k, signal.SIGKILL)
            killed = kids
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    assert killed, err
    assert proc.returncode == 2, out + err
    (line,) = out.splitlines()
    assert line.startswith("unknown: the measuring process was killed by SIGKILL") and len(line.encode()) <= 80, line
    assert "drain" not in err and "resume" not in err and "OLD" not in out + err, err
    assert stale.read_bytes() == before


# HOME -> what the check's stdout is: three ok checks serve the five tests of a stdout that cannot
# take the npd line and of a HOME that holds no history (a check is three processes, its command,
# its measuring process and its rank process: 5 s of CPU; one run takes both edges).
OK_CHECKS = {"": ">&-", "/nonexistent": ">/dev/full", "/dev": ""}


@pytest.fixture(scope="module")
def ok_checks(tmp_path_factory) -> dict[str, dict]:
    """`check --format npd` (stored) with each HOME of OK_CHECKS, stdout redirected as it says; no
    XDG_DATA_HOME, XDG_STATE_HOME a folder of its own. -> HOME: the run's exit code, stderr, state
    folder, and whether the place refused (HOME/.local/share/mgpu-bench) existed before it."""
    runs = {}
    for home, redirect in OK_CHECKS.items():
        folder = tmp_path_factory.mktemp("check-home")
        env = _env(XDG_STATE_HOME=str(folder))
        env.pop("XDG_DATA_HOME", None)
        env["HOME"] = home  # empty, missing or a special place (unset, root's passwd entry gives /root: usable)
        made = Path(home or "/nonexistent", ".local", "share", "mgpu-bench")
        there = made.exists()
        out = redirect or f">{folder / 'out'}"
        cmd = f"{' '.join(CHECK)} --format npd {out} 2>{folder / 'err'}"
        r = subprocess.run(["bash", "-c", cmd], env=env, timeout=120, check=False)
        runs[home] = {"redirect": redirect, "code": r.returncode, "err": (folder / "err").read_text(),
                      "state": folder, "made": made, "there": there}
    return runs


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"])
def test_an_ok_check_exits_0_when_its_stdout_is_closed_or_full(ok_checks, redirect):
    """1 is "drain this node": a stdout that cannot take the line must not turn ok into it."""
    (run,) = [r for r in ok_checks.values() if r["redirect"] == redirect]
    err = run["err"]
    assert run["code"] == 0, err
    assert "could not write to stdout" in err and "the exit code is the verdict's all the same (0: ok)" in err


# -- one node for scontrol ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["node[1-100]", "node1,node2", "ALL", "node1 node2", "node1\x1b[2J", "n=1", ""])
@pytest.mark.parametrize("flag", ["--drain", "--resume"])
def test_a_node_name_that_is_not_one_node_is_refused_before_measuring(monkeypatch, name, flag):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("SLURMD_NODENAME", name)
    if not name:  # an empty SLURMD_NODENAME: the host name stands in, which is one node
        monkeypatch.setattr("socket.gethostname", lambda: "node[3]")
    r = CliRunner().invoke(cli, ["check", flag, "--no-store", "--format", "npd"])
    assert r.exit_code == 2, r.output
    err = [x for x in r.output.splitlines() if x.startswith("mgpu-bench: error: ")]
    assert len(err) == 1 and "is not one node's name" in err[0] and "\x1b" not in r.output, r.output
    npd = [x for x in r.output.splitlines() if x.startswith("error: ")]
    assert len(npd) == 1 and len(npd[0].encode()) <= 80, r.output


def test_slurm_itself_refuses_a_hostlist_and_all_before_running_scontrol(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # reaching scontrol would be another message
    for name in ("node[1-2]", "a,b", "all"):
        with pytest.raises(slurm.SlurmError, match="is not one node's name"):
            slurm.drain(name, "x")
        with pytest.raises(slurm.SlurmError, match="is not one node's name"):
            slurm.resume(name)


def test_scontrol_output_of_any_size_parses_in_linear_time():
    """A 50 MB line took 90 s (a backtracking pattern): now its length."""
    t0 = time.monotonic()
    node = slurm.parse_node("NodeName=node1 " + "x" * 50_000_000 + " State=IDLE+DRAIN\n   Reason=" + "[" * 5_000_000
                            + " slow [root@2026-12-01T11:34:56]\n", "node1")
    assert time.monotonic() - t0 < 10.0
    assert node.state == ("IDLE", "DRAIN") and node.reason.endswith("slow")
    n = slurm.parse_node("NodeName=node2 State=DRAIN\n   Reason=mgpu-bench: GPU 1 slow [root@2026-12-01T11:34:56]\n",
                         "node2")
    assert n.reason == "mgpu-bench: GPU 1 slow" and n.ours and n.drained


# -- escaping -------------------------------------------------------------------------------------------

EVIL = "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\x1b[2J"


def test_reasons_npd_lines_and_slurm_reasons_carry_no_control_character():
    busy = {"foreign": [{"gpu": 0, "device": "gpu0", "pid": 4242, "name": EVIL, "used_bytes": 1 << 30,
                         "owner": "foreign", "busy": True}]}
    v = analyse.verdict_of([{"part": "processes", "status": "measured", "seconds": 0.1, "figures": [],
                             "facts": busy, "errors": {}}],
                           [{"name": "gpu0", "index": 0, "model": "NVIDIA H200"}], None, 60, 20)
    assert v["state"] == "problem" and "\x1b" in v["reason"]  # the finding keeps the text; every printer escapes
    assert v["npd"].isprintable() and v["npd"].isascii() and "\\x1b" in v["npd"]
    why = slurm.reason(v["reason"])
    assert why.isprintable() and "\\x1b" in why and why.startswith("mgpu-bench: GPU 0")
    assert "\\x07" in slurm.printable("\x07") and slurm.printable("plain text") == "plain text"


# -- npd refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--budget", "1s"], "--budget 1s: at least 5s"), (["--bogus"], "No such option '--bogus'"),
    (["--nproc", "x"], "'--nproc'"), (["--gpus", "1"], "--gpus"),
    (["--db", "/nonexistent/h.sqlite3"], "/nonexistent/h.sqlite3"),
])
def test_under_npd_a_refusal_is_one_line_on_stdout_and_exit_2(args, words):
    r = subprocess.run([*CHECK, "--format", "npd", *args], env=_env(), capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stdout.splitlines()
    assert line.startswith("error: ") and words in line and len(line.encode()) <= 80, line
    assert r.stderr.startswith("mgpu-bench: error: ")


# -- a daemon's HOME ------------------------------------------------------------------------------------


@pytest.mark.parametrize("home", list(OK_CHECKS))
def test_a_check_runs_without_a_usable_home_stores_elsewhere_and_says_so(ok_checks, home):
    """NHC and slurmd run checks with no HOME, or one that holds no history: the check runs, stores
    in $XDG_STATE_HOME/mgpu-bench (root's default: /var/lib/mgpu-bench), says so, and the stored
    run's command is the one typed (not the measuring process's)."""
    run = ok_checks[home]
    db = run["state"] / "mgpu-bench" / "history.sqlite3"
    assert run["code"] == 0, run["err"]
    assert f": stored in {db} instead (give --db PATH" in run["err"] and "note: " in run["err"]
    assert run["made"].exists() == run["there"]  # nothing made in the place refused
    with History.open(db, readonly=True) as h:
        (info,) = h.list()
        rec = h.get(info.run_id)
    assert info.kind == "check" and info.command.endswith("cli.py check --format npd"), info.command
    assert any("stored in" in n for n in rec.document["notes"])


def test_the_fallback_is_the_xdg_state_folder_root_s_state_folder_or_a_private_one(monkeypatch, tmp_path):
    from mgpu_bench.history import place as store

    assert contract.SHIPPED_DB == store.FALLBACK_DB  # the shipped configurations' --db is root's fallback
    assert contract.HISTORY_FALLBACK_ENV == store.FALLBACK_ENV  # how the check asks the history for it
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setattr(store, "FALLBACK_DB", str(tmp_path / "var-lib" / "history.sqlite3"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert store.fallback_path() == tmp_path / "var-lib" / "history.sqlite3"
    monkeypatch.setattr(contract, "SHIPPED_DB", str(tmp_path / "shipped" / "history.sqlite3"))
    contract._shipped_folder({"db_path": contract.SHIPPED_DB})  # root's --db of the shipped configs: its folder made
    assert (tmp_path / "shipped").is_dir()
    (tmp_path / "state").mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert store.fallback_path() == tmp_path / "state" / "mgpu-bench" / "history.sqlite3"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # a folder that is not this user's (it is root's): never used
    assert store.fallback_path() is None


# -- the reference needs its noise -----------------------------------------------------------------------


def _passing(node: str, i: int) -> dict:
    doc = json.loads(FIXTURE.read_text())
    doc["node"] = doc["environment"]["host"] = node
    doc["created"] = f"2026-12-01T10:{i:02d}:00+00:00"
    return doc


def test_recent_checks_judge_only_from_five_passing_ones(tmp_path):
    """One earlier check (or four) cannot tell how much a figure moves between runs: the floors
    alone judge, and the note says why; the fifth makes a reference, and the 80-byte line of a
    drop against it says what it was held against ("vs last 5", never "vs baseline")."""
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        for i in range(4):
            h.save(_passing("n1", i))
        h.save(_passing("other", 9))
        got, why = reference._from(h, "n1")
        assert got is None and "4 stored passing check(s) of n1" in why and "5 are needed" in why
        h.save(_passing("n1", 5))
        got, why = reference._from(h, "n1")
    assert why is None and got["kind"] == "recent" and len(got["runs"]) == 5 and "r5" not in got["runs"]
    ref = got["metrics"]["check.gpu0.tflops"]
    fig = {"device": "gpu0", "kind": "gemm", "value": ref["value"] * 0.5, "unit": "FLOP/s", "samples": [],
           "detail": {}}
    v = analyse.verdict_of([{"part": "gemm", "status": "measured", "seconds": 1.0, "figures": [fig], "facts": {},
                             "errors": {}}], [{"name": "gpu0", "index": 0, "model": "unknown GPU"}], got, 60, 20)
    assert v["state"] == "problem" and "vs last 5" in v["npd"] and "baseline" not in v["npd"], v["npd"]


# -- the NHC check file ---------------------------------------------------------------------------------

NHC = Path(__file__).resolve().parents[1] / "mgpu_bench" / "data" / "nhc" / "check_mgpu_bench.nhc"


def _nhc(tmp_path: Path, command: str, args: str = "") -> tuple[list[str], list[str], int]:
    record = tmp_path / f"record{time.monotonic_ns()}"
    script = f"""
die() {{ printf 'die|%s\\n' "$*" >> "$RECORD"; }}
log() {{ printf 'log|%s\\n' "$*" >> "$RECORD"; }}
. {NHC}
check_mgpu_bench {args}
echo "rc|$?" >> "$RECORD"
"""
    subprocess.run(["bash", "-c", script], env=_env(RECORD=str(record), MGPU_BENCH=command), timeout=120, check=False)
    lines = record.read_text().splitlines()
    return ([x[4:] for x in lines if x.startswith("die|")], [x[4:] for x in lines if x.startswith("log|")],
            int(next(x[3:] for x in lines if x.startswith("rc|"))))


def test_the_nhc_check_fails_with_a_message_when_mgpu_bench_is_missing_or_refuses_its_arguments(tmp_path):
    died, logged, rc = _nhc(tmp_path, "/nonexistent/mgpu-bench")
    assert rc == 1 and not logged and len(died) == 1, (died, logged)
    assert "exit code 127" in died[0] and "set MGPU_BENCH to its full path" in died[0]
    wrapper = tmp_path / "mgpu-bench"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m mgpu_bench.cli \"$@\"\n")
    wrapper.chmod(0o755)
    died, logged, rc = _nhc(tmp_path, str(wrapper), "--budget 1s")
    assert rc == 1 and not logged and len(died) == 1, (died, logged)
    assert "the check did not run (exit code 2): error: --budget 1s: at least 5s" in died[0]
    assert shutil.which("bash")


def test_a_cpu_rank_that_dies_leaves_the_check_unknown_never_a_problem(tmp_path):
    """The ranks' process killed (an OOM killer's SIGKILL) before it gave its figures: the part is
    an error of the check, not hung GPU work: unknown, exit 2, nothing drained."""
    proc = subprocess.Popen([*CHECK, "--drain", "--no-store", "--format", "npd", "--json", str(tmp_path / "c.json")],
                            env=_env(PATH="/nonexistent"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0, killed = time.monotonic(), []
    while not killed and time.monotonic() - t0 < 60 and proc.poll() is None:
        ranks = processes("mgpu_bench.probes.check.cpu_rank", below=proc.pid)
        if ranks:
            time.sleep(0.3)
            for p in ranks:
                os.kill(p, signal.SIGKILL)
            killed = ranks
        time.sleep(0.02)
    out, err = proc.communicate(timeout=120)
    assert killed, err
    assert proc.returncode == 2, out + err
    doc = json.loads((tmp_path / "c.json").read_text())
    ranks = {p["part"]: p for p in doc["parts"]}["ranks"]
    assert ranks["status"] == "error" and "before giving their figures" in ranks["why"], ranks
    assert doc["verdict"]["state"] == "unknown" and out.startswith("unknown: the check could not run its ranks part")
    assert "drain" not in err


# -- properties -------------------------------------------------------------------------------------------

NAME_CHARS = st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@settings(max_examples=300, deadline=None)
@given(st.text(NAME_CHARS, min_size=1, max_size=60), st.text(min_size=0, max_size=8), st.text(NAME_CHARS, max_size=8))
def test_one_node_takes_a_plain_name_and_refuses_anything_scontrol_reads_as_more(name, middle, tail):
    if name.upper() != "ALL":
        assert slurm.one_node(name) == name
    joined = name + middle + tail
    special = any(c in "[],= \t\n\"'\\" or not ("\x21" <= c <= "\x7e") for c in middle)
    if special or joined.upper() == "ALL":
        with pytest.raises(slurm.SlurmError):
            slurm.one_node(joined)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_scontrol_text_parses_to_a_node_without_raising(text):
    node = slurm.parse_node(text, "n1")
    assert isinstance(node.reason, str) and all(isinstance(s, str) for s in node.state)
    assert slurm.reason(text).isprintable() and len(slurm.reason(text)) <= slurm.MAX_REASON


def test_a_measuring_process_stopped_at_the_deadline_on_cpu_is_unknown_never_143_nor_a_problem(tmp_path):
    """The measuring process stopped from outside 30/31 of the time cannot finish: the command
    stops it at its deadline and says unknown (exit 2): not its SIGTERM's 143, which the scheduler's
    contract does not know, nor a problem (CPU ranks that run late name no bad GPU)."""
    from slurm_cluster import Throttle

    t0 = time.monotonic()
    proc = subprocess.Popen([*CHECK, "--drain", "--no-store", "--format", "npd", "--budget", "10s"],
                            env=_env(PATH="/nonexistent"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with Throttle(lambda: [k for k in processes("mgpu_bench", below=proc.pid) if k != proc.pid], stop_s=0.3,
                  run_s=0.01):
        out, err = proc.communicate(timeout=120)
    print(f"\ncheck --budget 10s with its measuring process stopped from outside: {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 2, out + err
    (line,) = out.splitlines()
    assert line.startswith("unknown: give --budget 20s or more: the check did not finish within"), line
    assert "drain" not in err
