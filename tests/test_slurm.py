"""The scheduler acts on the verdict, on a real Slurm cluster on this host (tests/slurm_cluster.py:
munge, slurmctld, four slurmd named node1..node4 whose names resolve nowhere): `fleet --drain`
under `srun -N4` drains the node slowed from outside, `check --drain` as a node's
HealthCheckProgram drains the node whose check falls below its baseline, `--resume` resumes what
mgpu-bench drained and leaves another tool's reason alone, a job submitted with --exclude from
fleet's list avoids the node, and a job whose first node has no address says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurm_cluster
from click.testing import CliRunner
from slurm_cluster import Throttle, processes

from mgpu_bench.cli import cli
from mgpu_bench.core import launch, slurm

CLI = [sys.executable, "-m", "mgpu_bench.cli"]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    print(f"\nSlurm cluster up in {c.started_s:.1f} s: {c.run('sinfo', '-V').stdout.strip()}")
    yield c
    c.stop()


@pytest.fixture
def idle(cluster):
    """The cluster with every node in service, and again after the test."""
    cluster.reset()
    yield cluster
    cluster.reset()


def _env(cluster, **extra) -> dict:
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("SLURM_JOB", "SLURM_STEP", "SLURM_PROCID",
                                                                       "SLURMD_NODENAME"))}
    return {**env, "CUDA_VISIBLE_DEVICES": "", **extra}


def test_the_node_names_resolve_nowhere_and_slurm_knows_their_address(cluster, monkeypatch):
    """The premise of the fleet tests: a job's first node is reached by Slurm's NodeAddr."""
    assert not launch.resolves("node1")
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    launch.slurm_node_address.cache_clear()
    try:
        assert launch.slurm_node_address("node1") == ("127.0.0.1", None)
    finally:
        launch.slurm_node_address.cache_clear()


def _fleet_with_node3_slowed(c, tmp_path, attempt: int) -> tuple[int, str, float, dict, str]:
    """srun -N4 fleet --drain, node3's task stopped 3/4 of the time from its start (the duty cycle
    tests/test_fleet.py plants; started once every rank had arrived, it came after node3's part of
    a quick node pass on an idle host). -> (exit code, output, wall s, document, drain file)."""
    drain, out = tmp_path / f"drain{attempt}.txt", tmp_path / f"fleet{attempt}.json"
    t0 = time.monotonic()
    job = subprocess.Popen(["srun", "-N4", "--ntasks-per-node", "1", "--immediate=30", *CLI, "fleet", "--drain",
                            "--phases", "node", "--no-store", "--progress", "--timeout", "60", "--json", str(out),
                            "--exclude-file", str(drain)],
                           env=_env(c), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    slow = Throttle(lambda: processes("mgpu_bench.cli fleet", {"SLURMD_NODENAME": "node3"}))
    try:
        lines = list(job.stdout)
        job.wait(timeout=180)
    finally:
        if slow:
            slow.stop()
        if job.poll() is None:
            job.kill()
    said = "".join(lines)
    assert slow is not None and slow.slowed, said[-3000:]
    return job.returncode, said, time.monotonic() - t0, json.loads(out.read_text()), drain.read_text()


@pytest.mark.timing  # judges measured speed (against what the same run measured)
def test_srun_fleet_drain_drains_exactly_the_slowed_node_and_a_job_excluding_it_avoids_it(idle, tmp_path):
    """node3 (and only it) is drained with mgpu-bench's reason; the exclude file names it, and a job
    submitted with --exclude from it runs on the three others. Four emulated nodes share two cores
    with whatever else runs: a pass that says its GEMM or copy figures are too noisy to judge has
    named nothing (it must not have drained either), and is run again, up to three times."""
    c = idle
    for attempt in range(3):
        code, said, wall, doc, drain = _fleet_with_node3_slowed(c, tmp_path, attempt)
        assert wall < 120, f"{wall:.0f} s"  # the names resolve nowhere: the job meets at NodeAddr, not after 400 s
        assert "cannot be retrieved" not in said
        assert [n["node"] for n in doc["nodes"]] == ["node1", "node2", "node3", "node4"]
        if code == 0 and "too noisy to judge" in said:
            assert drain == "" and c.reasons() == {}, said[-3000:]
            continue
        break
    assert code == 1, said[-3000:]  # rank 0: a node to drain
    assert drain == "node3\n"
    reasons = c.reasons()
    assert list(reasons) == ["node3"] and reasons["node3"].startswith("mgpu-bench: fleet: "), reasons
    assert "drained node3 in Slurm: mgpu-bench: fleet: " in said
    assert doc["drained"] == [{"node": "node3", "reason": reasons["node3"], "error": None}]

    c.reset()  # every node in service again: only the job's --exclude keeps node3 out
    ran = c.run("srun", "-N3", f"--exclude={drain.strip()}", "--immediate=30", "printenv", "SLURMD_NODENAME",
                env=_env(c), timeout=60)
    assert sorted(ran.stdout.split()) == ["node1", "node2", "node4"]
    four = c.run("srun", "-N4", "--exclude=node3", "--immediate=5", "true", env=_env(c), check=False, timeout=60)
    assert four.returncode != 0  # four nodes without node3 do not exist


def test_a_job_whose_first_node_has_no_address_says_what_to_set_within_seconds(idle, tmp_path):
    """Without scontrol on the tasks' PATH nothing can give node1's address: every task says in one
    line to set MASTER_ADDR, at once, instead of waiting out --timeout."""
    c = idle
    t0 = time.monotonic()
    r = c.run("srun", "-N2", "--ntasks-per-node", "1", "--immediate=30", "/usr/bin/env", "PATH=/nonexistent", *CLI,
              "fleet", "--no-store", "--timeout", "300", env=_env(c), check=False, timeout=120, cwd=tmp_path)
    wall = time.monotonic() - t0
    said = r.stdout + r.stderr
    assert r.returncode == 2, said
    assert wall < 60, f"{wall:.0f} s (--timeout was 300 s)"
    lines = [x for x in said.splitlines() if "MASTER_ADDR" in x]
    assert len(lines) == 2 and all(x.startswith("mgpu-bench: error: the job's first node node1") for x in lines), said
    assert "scontrol is not on PATH" in lines[0] and "cannot be retrieved" not in said


def _check_script(c, node_db: str, out: str, log: str, *args: str) -> str:
    """What an administrator's HealthCheckProgram wrapper runs: the tool, by its full path, with the
    site's Slurm configuration and this test's tree; slurmd gives it SLURMD_NODENAME and no PATH."""
    return (f"export SLURM_CONF={c.conf} PYTHONPATH={os.environ.get('PYTHONPATH', '')} CUDA_VISIBLE_DEVICES=\n"
            f"exec {' '.join(CLI)} check {' '.join(args)} --db {node_db} --json {out} > {log} 2>&1\n")


@pytest.fixture(scope="module")
def first_check(cluster, tmp_path_factory):
    """node2's first check, run as it while another tool holds it drained: `check --resume`, stored
    in a database of its own. It serves two tests: what --resume does with another tool's reason
    (test_resume_leaves_a_reason_another_tool_wrote_alone), and node2's baseline for the health
    check (each check is a measuring process importing torch, and seconds of wall time).
    -> (the check's process, the reasons Slurm held right after it, the database)."""
    c = cluster
    c.reset()
    c.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=site-tool: disk smart errors")
    folder = tmp_path_factory.mktemp("node2")
    db = folder / "node2.sqlite3"
    try:
        r = subprocess.run([*CLI, "check", "--resume", "--db", str(db), "--json", str(folder / "base.json")],
                           check=False, env=_env(c, SLURMD_NODENAME="node2"), capture_output=True, text=True,
                           timeout=120)
        reasons = c.reasons()
    finally:
        c.reset()
    return r, reasons, db


@pytest.mark.timing  # judges measured speed (against what the same run measured)
def test_check_as_health_check_program_drains_a_node_below_its_baseline_and_resume_brings_it_back(
        first_check, idle, tmp_path):
    """node2 gets a baseline from a check run as it (first_check); then slurmd's HealthCheckProgram
    runs `check --drain` on node2 while its CPU ranks are stopped 3/4 of the time once they run:
    node2 is drained with the figure that fell. A later `check --resume` on node2, not slowed (and,
    as after a repair, with no reference stored), passes and resumes it."""
    c = idle
    first, _reasons, db = first_check
    assert first.returncode == 0, first.stdout + first.stderr
    run_id = next(w for w in first.stderr.split() if w.startswith("r") and w[1:].isdigit())
    assert CliRunner().invoke(cli, ["baseline", "set", run_id, "--db", str(db)]).exit_code == 0

    out, log = tmp_path / "hc.json", tmp_path / "hc.log"
    t0 = time.monotonic()
    c.arm("node2", _check_script(c, str(db), str(out), str(log), "--drain", "--budget", "45s"))
    with Throttle(lambda: processes("mgpu_bench.probes.check.cpu_rank", {"SLURMD_NODENAME": "node2"}), count=2) as slow:
        while "node2" not in c.reasons() and time.monotonic() - t0 < 120:
            time.sleep(0.2)
    wall = time.monotonic() - t0
    reasons = c.reasons()
    said = log.read_text() if log.exists() else ""
    assert slow.slowed, said
    assert list(reasons) == ["node2"], (reasons, said[-3000:])
    doc = json.loads(out.read_text())
    assert doc["verdict"]["state"] == "problem" and doc["reference"]["kind"] == "baseline"
    assert reasons["node2"] == slurm.reason(doc["verdict"]["reason"])
    assert "below this node's baseline" in reasons["node2"]  # a rank's figure, or (on a loaded host) the node's
    assert "drained node2 in Slurm: mgpu-bench: " in said
    assert wall < 45 + 10  # its budget (slurmd's kill is at 60 s), and slurmd's 2 s interval

    fresh = tmp_path / "after-repair.sqlite3"  # as after a repair: no reference to hold against it, its floors alone
    again = subprocess.run([*CLI, "check", "--resume", "--db", str(fresh)], check=False,
                           env=_env(c, SLURMD_NODENAME="node2"), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "node2 in Slurm: resumed (it was drained: mgpu-bench: " in again.stdout
    assert "node2" not in c.reasons()


def test_resume_leaves_a_reason_another_tool_wrote_alone(first_check):
    r, reasons, _db = first_check  # node2 drained by another tool, then `check --resume` run as node2
    assert r.returncode == 0, r.stdout + r.stderr  # the check passed; the node stays out
    assert "node2 in Slurm: left drained: its reason 'site-tool: disk smart errors' was not written by mgpu-bench" \
        in r.stdout
    assert reasons == {"node2": "site-tool: disk smart errors"}


def test_slurm_that_refuses_says_why_in_one_line(idle, monkeypatch):
    """A node Slurm does not know, a caller it refuses (not root), no scontrol: SlurmError, one line
    naming the fix; nothing changes in the cluster."""
    import shutil
    import tempfile

    c = idle
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    with pytest.raises(slurm.SlurmError, match=r"Slurm knows no node 'node9'.*set SLURMD_NODENAME"):
        slurm.drain("node9", "test")
    with pytest.raises(slurm.SlurmError, match=r"Slurm knows no node 'node9'"):
        slurm.resume("node9")
    with monkeypatch.context() as m:
        m.setenv("PATH", "/nonexistent")
        with pytest.raises(slurm.SlurmError, match=r"scontrol is not on PATH .*slurm-client"):
            slurm.drain("node2", "test")
    shared = tempfile.mkdtemp(prefix="mgpu-bench-slurm-conf-")  # the test's own folder is root's alone
    try:
        os.chmod(shared, 0o755)
        conf = shutil.copy(c.conf, shared)
        # mgpu_bench.core.slurm and children, all it imports, need nothing but the standard library: the
        # system's Python runs copies of the two as nobody (the test's interpreter lives under root's
        # home, which nobody cannot enter)
        pkg = Path(shared) / "mgpu_bench" / "core"
        pkg.mkdir(parents=True)
        for folder in (pkg, pkg.parent):
            (folder / "__init__.py").write_text("")
        for name in ("slurm.py", "children.py"):
            shutil.copy(Path(slurm.__file__).with_name(name), pkg / name)
        subprocess.run(["chmod", "-R", "a+rX", shared], check=True)
        code = ("from mgpu_bench.core import slurm\n"
                "try:\n    slurm.drain('node2', 'test')\nexcept slurm.SlurmError as e:\n    print(e)\n")
        r = subprocess.run(["/usr/bin/python3", "-c", code], check=False,
                           env=_env(c, SLURM_CONF=conf, HOME=shared, PYTHONPATH=shared),
                           user="nobody", capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert len(r.stdout.strip().splitlines()) == 1, r.stderr[-2000:]
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith("Slurm refused to change node 'node2'") and "run as root or SlurmUser" in line, r.stderr
    assert c.reasons() == {}


def test_a_reason_slurm_holds_is_read_whatever_its_bytes_and_printed_escaped(idle, tmp_path):
    """Another tool's reason with ESC / OSC 8 and bytes that are not UTF-8: scontrol's answer is
    read (no traceback), and `check --resume` prints it escaped; the node stays drained."""
    c = idle
    evil = b"site-tool: \x1b]8;;http://x\x07disk\x1b]8;;\x07 \xff\xfe bad"
    subprocess.run([b"scontrol", b"update", b"NodeName=node1", b"State=DRAIN", b"Reason=" + evil], env=c.env,
                   check=True, capture_output=True, timeout=30)
    n = slurm.parse_node(subprocess.run(["scontrol", "show", "node", "node1"], env=c.env, capture_output=True,
                                        timeout=30, check=True).stdout.decode("utf-8", "replace"), "node1")
    assert n.drained and not n.ours
    r = subprocess.run([*CLI, "check", "--resume", "--no-store"], check=False, env=_env(c, SLURMD_NODENAME="node1"),
                       capture_output=True, timeout=120)
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode(errors="replace")
    assert "node1 in Slurm: left drained: its reason" in out and "\x1b" not in out and "\\x1b" in out, out
    assert list(c.reasons()) == ["node1"]


def test_all_is_refused_though_scontrol_would_take_it_for_every_node(idle, monkeypatch):
    """`scontrol update NodeName=ALL` is refused by mgpu-bench before scontrol runs: Slurm may take
    it for every node of the cluster (the test accepts either answer of this Slurm), which a
    health check must never ask."""
    c = idle
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    with pytest.raises(slurm.SlurmError, match="is ALL, every node"):
        slurm.drain("ALL", "test")
    r = c.run("scontrol", "update", "NodeName=ALL", "State=DRAIN", "Reason=test", check=False)
    drained = c.reasons()
    c.reset()
    assert r.returncode != 0 or len(drained) == 4, (r.stderr, drained)
