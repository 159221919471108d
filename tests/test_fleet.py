"""mgpu-bench fleet: the schedule and the decisions on modelled figures, bad input, and the whole pass
on 8 emulated nodes (real torchrun agents on this host, gloo between them) with one node, then
one pair of nodes, slowed by the test; a node killed mid-pass (4 ranks with torchrun's
environment, started without agents) and nodes that never arrive (Slurm's environment)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from itertools import combinations
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import scaled

from mgpu_bench.cli import cli
from mgpu_bench.core import launch
from mgpu_bench.probes.fleet import analyse, schedule

NODES = 8


# -- the schedule ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 8, 9, 64, 1000])
def test_rounds_are_matchings_that_never_repeat_a_pair(n):
    rounds = schedule.pairing_rounds(n, schedule.default_rounds(n), seed=3)
    assert len(rounds) == schedule.default_rounds(n) == min(n - 1, max(4, (n - 1).bit_length()))
    seen = set()
    for pairs in rounds:
        nodes = [x for p in pairs for x in p]
        assert len(nodes) == len(set(nodes)) and len(pairs) == n // 2  # every node once; one rests when odd
        assert not seen & set(pairs)
        seen |= set(pairs)
    assert schedule.pairing_rounds(n, 4, seed=3) == schedule.pairing_rounds(n, 4, seed=3)  # every rank agrees


def test_all_rounds_meet_every_pair_once():
    rounds = schedule.pairing_rounds(8, 7, seed=1)
    assert sorted(p for r in rounds for p in r) == list(combinations(range(8), 2))


def test_isolation_halves_to_the_slow_group_and_names_a_slow_path_between_halves():
    slow_nodes = {5}

    def measure(groups):
        return [0.5 if slow_nodes & set(g) else 1.0 for g in groups]

    res = schedule.isolate(list(range(8)), measure, 1.0, lambda f, r: f < 0.8 * r)
    assert res["found"] == [[4, 5]] and len(res["levels"]) == 2

    def between(groups):  # only the whole is slow: the path between its halves
        return [1.0 for _ in groups]

    res = schedule.isolate(list(range(8)), between, 1.0, lambda f, r: f < 0.8 * r)
    assert res["between"] == [list(range(8))] and res["found"] == []


# -- the decisions, on modelled figures --------------------------------------------------------------


def _doc(slow_node=None, slow_rail=None, slow_pair=None, rails=4, n=8, noise=0.01, seed=0, models=None):
    import random

    rng = random.Random(seed)
    nodes = [{"index": i, "node": f"gpu{i + 1:02d}", "host": f"gpu{i + 1:02d}", "model": (models or {}).get(i, "H200"),
              "answered": True, "ranks": list(range(i * rails, (i + 1) * rails)),
              "gpus": [{"local": g, "flops_per_s": 720e12 * rng.gauss(1, noise), "copy_bytes_per_s":
                        4.2e12 * rng.gauss(1, noise), "health": []} for g in range(rails)]} for i in range(n)]
    pairings = []
    for k, pairs in enumerate(schedule.pairing_rounds(n, schedule.default_rounds(n), seed)):
        for a, b in pairs:
            f = 0.5 if slow_node in (a, b) or (slow_pair and {a, b} == set(slow_pair)) else 1.0
            rails_ = {}
            for r in range(rails):
                rf = 0.5 if slow_rail and slow_rail[1] == r and slow_rail[0] in (a, b) else 1.0
                rails_[str(r)] = {"busbw": 48e9 * f * rf * rng.gauss(1, noise)}
            ar = min(v["busbw"] for v in rails_.values()) * 0.9
            pairings.append({"round": k, "a": a, "b": b, "rails": rails_, "allreduce": {"busbw": ar}})
    return {"nodes": nodes, "pairings": pairings, "world": None}


def _named(doc):
    return sorted((s["what"], s["node"], s["part"]) for s in analyse.judge(doc)["suspects"])


def test_a_healthy_fleet_has_no_suspect():
    for seed in range(5):
        assert _named(_doc(seed=seed)) == []


def test_a_slow_node_is_named_and_its_partners_are_not():
    for seed in range(5):
        assert _named(_doc(slow_node=3, seed=seed)) == [("node", 3, None)]


def test_a_slow_rail_is_named_not_its_node():
    for seed in range(5):
        assert _named(_doc(slow_rail=(6, 2), seed=seed)) == [("rail", 6, 2)]


def test_a_slow_pair_is_the_link_between_them():
    doc = _doc(seed=2)
    a, b = doc["pairings"][5]["a"], doc["pairings"][5]["b"]
    assert _named(_doc(slow_pair=(a, b), seed=2)) == [("link", a, b)]


def test_gpus_are_compared_within_their_model():
    doc = _doc(models={0: "A100", 1: "A100", 2: "A100"})
    for n in doc["nodes"][:3]:
        for g in n["gpus"]:
            g["flops_per_s"] *= 0.4  # an A100 among H200s is not slow for an A100
    assert _named(doc) == []
    doc["nodes"][1]["gpus"][2]["flops_per_s"] *= 0.8
    (s,) = analyse.judge(doc)["suspects"]
    assert (s["what"], s["node"], s["part"]) == ("gpu", 1, 2) and "(A100;" in s["text"]


def test_cpu_ranks_get_wider_floors_than_gpus():
    doc = _doc()
    doc["nodes"][4]["gpus"][1]["flops_per_s"] *= 0.88  # 12% below: a GPU part, or a CPU rank's scheduling
    assert _named(doc) == [("gpu", 4, 1)]
    for n in doc["nodes"]:
        n["model"] = "cpu"
    assert _named(doc) == []
    doc["nodes"][4]["gpus"][1]["flops_per_s"] *= 0.5
    assert _named(doc) == [("gpu", 4, 1)]


def test_figures_too_spread_to_judge_say_so():
    verdicts = analyse.judge(_doc(noise=0.25, rails=1, seed=4))
    noisy = [s for s in verdicts["suspects"] if s["what"] == "noise"]
    g = verdicts["stats"]["gpu"]
    expect = {name for name, noise in (("GEMM figures (H200)", g["compute:H200"][1]),
                                       ("Copy figures (H200)", g["memory:H200"][1]))
              if analyse.threshold("compute", noise, 8) >= analyse.TOO_NOISY} | {"Pairings"}
    assert {s["text"].split(" too noisy")[0] for s in noisy} == expect
    assert all(s["severity"] == "warning" and not s["drain"] for s in noisy)
    assert not [s for s in verdicts["suspects"] if s["what"] in ("node", "rail", "link")]


def test_hostlists_compress_and_parse_back():
    names = ["gpu01", "gpu02", "gpu03", "gpu07", "login-a", "gpu10"]
    text = launch.compress_hostlist(names)
    assert text == "gpu[01-03,07,10],login-a"
    assert launch.expand_hostlist(text) == ["gpu01", "gpu02", "gpu03", "gpu07", "gpu10", "login-a"]
    assert launch.parse_hostlist("gpu[01-03]") == ["gpu01", "gpu02", "gpu03"]


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env,args,words", [
    ({}, [], "fleet runs under the cluster's launcher"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, [], "has one"),
    ({}, ["--timeout", "0"], "--timeout must be a positive"),
    ({}, ["--expect", "gpu[01-"], "does not parse"),
    ({}, ["--expect", "gpu[05-01]"], "not a number or a low-high range"),
    ({}, ["--phases", "node,lunch"], "--phases"),
])
def test_bad_input_is_one_line_and_exit_2(monkeypatch, env, args, words):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(cli, ["fleet", *args])
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert line.startswith("mgpu-bench: error: ") and words in line


# -- 8 emulated nodes ------------------------------------------------------------------------------


class Throttle:
    """Slows a process the way a bad node is slow: stopped 3/4 of the time (SIGSTOP 30 ms,
    SIGCONT 10 ms) while on. The test plants this; the product only measures."""

    def __init__(self, pids: list[int]):
        self.pids, self.on, self.done = pids, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            if not self.on.wait(0.01):
                continue
            for p in self.pids:
                with _quiet():
                    os.kill(p, signal.SIGSTOP)
            time.sleep(0.03)
            for p in self.pids:
                with _quiet():
                    os.kill(p, signal.SIGCONT)
            time.sleep(0.01)

    def stop(self):
        self.done.set()
        self.thread.join()
        for p in self.pids:
            with _quiet():
                os.kill(p, signal.SIGCONT)


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], ProcessLookupError)


def _worker_of(agent: subprocess.Popen, timeout: float = 120) -> int:
    """The pid of the rank the torchrun agent started (its child running mgpu_bench)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                with _quiet():
                    try:
                        stat = Path(f"/proc/{pid}/stat").read_text()
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if int(stat.rsplit(")", 1)[1].split()[1]) == agent.pid and b"mgpu_bench" in cmd:
                        return int(pid)
        time.sleep(0.1)
    raise AssertionError("no worker under the agent")


def _fleet(tmp_path, seed, slow_node=None, slow_pair=None, phases="node,links", iters=60, kill=None, nodes=NODES,
           timeout=120, agents=True):
    """8 torchrun agents, one rank each, gloo over loopback; one node slowed all along, or two nodes
    slowed during the round that pairs them. With `agents` False, the ranks are started directly,
    each with the environment its agent would give it (one rank per node; rank 0 serves the job's
    store): half the processes, each importing torch. -> (rank 0's document, the drain file, the
    agents' (or ranks') exit codes, rank 0's progress lines, rank 0's stdout)."""
    port = launch.free_port()
    out, drain = tmp_path / f"fleet{seed}.json", tmp_path / f"drain{seed}.txt"
    args = ["fleet", "--no-store", "--progress", "--iters", str(iters), "--concurrency", "1", "--phases", phases,
            "--seed", str(seed), "--json", str(out), "--exclude-file", str(drain), "--timeout", str(timeout)]
    logs = [open(tmp_path / f"node{k}.out", "w+") for k in range(nodes)]  # noqa: SIM115 - closed below

    def start(k: int) -> subprocess.Popen:
        if agents:
            cmd, env = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(k),
                        "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)], None
        else:
            cmd = [sys.executable]
            env = {**os.environ, "RANK": str(k), "WORLD_SIZE": str(nodes), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "GROUP_RANK": str(k), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        return subprocess.Popen([*cmd, "-m", "mgpu_bench.cli", *args], stdout=logs[k],
                                stderr=subprocess.PIPE if k == 0 else logs[k], text=True, cwd=tmp_path, env=env,
                                start_new_session=True)  # its own process group: killed with its workers below

    procs = [start(k) for k in range(nodes)]
    rank = _worker_of if agents else (lambda proc: proc.pid)  # the pid of the process running mgpu_bench
    throttle, always, target, lines = None, None, None, []
    try:
        if slow_node is not None:
            always = Throttle([rank(procs[slow_node])])
            always.on.set()
        if slow_pair is not None:
            rounds = schedule.pairing_rounds(NODES, schedule.default_rounds(NODES), seed)
            target = next(k for k, pairs in enumerate(rounds) if tuple(sorted(slow_pair)) in pairs) + 1
            throttle = Throttle([rank(procs[i]) for i in slow_pair])
        victim = rank(procs[kill[0]]) if kill else None
        for line in procs[0].stderr:  # rank 0's progress: the pair is slowed during its round only
            lines.append(line)
            if victim and f"links round {kill[1]}/" in line:
                os.kill(victim, signal.SIGKILL)  # the node dies mid-pass
                victim = None
            if target is not None and f"links round {target}/" in line:
                if "done" in line:
                    throttle.on.clear()
                else:
                    throttle.on.set()
        codes = [p.wait(timeout=scaled(300)) for p in procs]
    finally:
        for t in (throttle, always):
            if t:
                t.stop()
        for p in procs:
            with _quiet():
                os.killpg(p.pid, signal.SIGKILL)  # the agent and any worker it left (or the rank)
    logs[0].seek(0)
    stdout = logs[0].read()
    for f in logs:
        f.close()
    return json.loads(out.read_text()), drain.read_text().strip(), codes, "".join(lines), stdout


def _suspects(doc):
    return sorted((s["what"], s["node"], s["part"]) for s in doc["verdicts"]["suspects"] if s["severity"] == "problem")


def _links_too_noisy(doc):
    """Whether the pass said it cannot judge the links (emulated nodes on a loaded 2-core host):
    then it must not have named any link part either."""
    return any(s["what"] == "noise" and s["text"].startswith("Pairings") for s in doc["verdicts"]["suspects"])


# Eight emulated nodes on two cores are at the edge of what the pass can tell from noise: in CI it
# named no node, or a partner of the slowed pair as well, in 3 of the 5 runs of 2026-12-01. `-m slow`
# runs it; in CI the srun fleet --drain test of tests/test_slurm.py (four nodes, one slowed) and the
# verdict tests above carry it.
@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.parametrize("seed", [11, 12])
def test_eight_emulated_nodes_name_the_slow_node_and_the_slow_link(tmp_path, seed):
    """One node slowed all along; two others only during the round that pairs them. Eight emulated
    nodes share two cores: a pass that names no node at all (exit 0: every figure within the
    noise it measured) is run once more, as test_slurm.py does; a pass that names a wrong node fails
    at once."""
    bad = seed % NODES
    rounds = schedule.pairing_rounds(NODES, schedule.default_rounds(NODES), seed)
    pair = next(p for p in rounds[1] if bad not in p)  # met in round 2
    for attempt in range(2):
        where = tmp_path / f"try{attempt}"
        where.mkdir()
        doc, drain, codes, progress, stdout = _fleet(where, seed, slow_node=bad, slow_pair=pair)
        if codes[0] != 0 or drain:
            break
    name = doc["nodes"][bad]["node"]
    assert codes[0] == 1 and all(c == 0 for c in codes[1:]), progress[-3000:] + stdout[-3000:]  # a node to drain
    assert [n["node"] for n in doc["nodes"]] == [f"{doc['nodes'][0]['host']}#{k}" for k in range(NODES)]
    got = _suspects(doc)
    assert ("gpu", bad, 0) in got  # its own GEMM and copy, one rank at a time
    assert drain == name and "links round 4/4" in progress  # the link is not a node to drain
    link = ("link", min(pair), max(pair))
    if _links_too_noisy(doc):  # emulated nodes on a loaded host: nothing named from the pairings
        assert {s[1] for s in got} == {bad} and "too noisy to judge" in stdout, got
    else:  # the links name both: the node slow with every partner, the pair slow only together
        assert {s for s in got if s[0] != "gpu"} == {("node", bad, None), link}, got
        assert f"finding: {name}: its 4 pairings at a median" in stdout
        assert "slow while both are fine with their other partners" in stdout


def _slurm_task(k: int, tasks: int, nodelist: str, port: int, args: list[str], log: Path) -> subprocess.Popen:
    """One srun task as Slurm starts it (one task per node, the node named by SLURMD_NODENAME)."""
    env = {key: v for key, v in os.environ.items()
           if not key.startswith(("SLURM", "TORCHELASTIC", "OMPI_", "PMI_")) and key not in
           ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    env.update(SLURM_PROCID=str(k), SLURM_NTASKS=str(tasks), SLURM_LOCALID="0", SLURM_NODEID=str(k),
               SLURM_JOB_NODELIST=nodelist, SLURM_TASKS_PER_NODE=f"1(x{tasks})", SLURM_JOB_ID="4242",
               SLURMD_NODENAME=f"gpu{k + 1}", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               CUDA_VISIBLE_DEVICES="")
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", *args], stdout=f, stderr=subprocess.STDOUT,
                                env=env, cwd=log.parent)


def _drained_for_a_reason(doc, drained: list[str], missing: list[str]) -> None:
    """The drain list holds every node in `missing`, and any other node it holds is one the pass
    named with a figure of its own (emulated nodes measured on a loaded 2-core host may be: each is
    judged against the others' median, and a node that shares the cores can fall below it). The
    list and the verdicts never disagree."""
    assert set(missing) <= set(drained), (drained, missing)
    names = {n["index"]: n["node"] for n in doc["nodes"]}
    named = {names[s["node"]] for s in doc["verdicts"]["suspects"] if s["drain"] and s["node"] >= 0}
    assert set(drained) == named, (drained, named)


def test_a_node_that_never_arrives_is_drained_and_each_node_is_its_own_history(tmp_path):
    """Slurm starts 3 tasks on gpu[1-3]; gpu3's never starts, and --expect names a gpu4 the job
    never had. The two that arrive measure; both missing nodes are named and drained; each
    measured node is stored under its own host with a baseline of its own. (The two that arrive
    share the host's cores: their own figures decide nothing here, _drained_for_a_reason.)"""
    db = tmp_path / "h.sqlite3"
    args = ["fleet", "--db", str(db), "--iters", "5", "--timeout", "6", "--expect", "gpu[1-4]",
            "--json", str(tmp_path / "fleet.json"), "--exclude-file", str(tmp_path / "drain.txt")]
    port = launch.free_port()
    tasks = [_slurm_task(k, 3, "gpu[1-3]", port, args, tmp_path / f"task{k}.out") for k in range(2)]
    codes = [t.wait(timeout=scaled(240)) for t in tasks]
    out0 = (tmp_path / "task0.out").read_text()
    assert codes == [1, 0], out0[-2000:]  # rank 0: nodes to drain; the other measured and left
    doc = json.loads((tmp_path / "fleet.json").read_text())
    assert [(n["node"], n["answered"]) for n in doc["nodes"]] == [
        ("gpu1", True), ("gpu2", True), ("gpu3", False), ("gpu4", False)]
    _drained_for_a_reason(doc, launch.expand_hostlist((tmp_path / "drain.txt").read_text().strip()), ["gpu3", "gpu4"])
    assert "gpu3: no answer (never arrived)" in out0 and "gpu4: no answer (never started; --expect names it)" in out0

    run = CliRunner().invoke
    listed = run(cli, ["history", "list", "--db", str(db)], catch_exceptions=False).output
    assert listed.count("fleet") >= 3 and "gpu2" in listed  # the pass, then one run per measured node
    trend = run(cli, ["history", "trend", "fleet.gpu0.tflops", "--host", "gpu2", "--db", str(db)])
    assert trend.exit_code == 0 and "gpu2" in trend.output and "gpu1" not in trend.output, trend.output
    node_run = next(line.split()[0] for line in listed.splitlines() if "gpu2" in line)
    made = run(cli, ["baseline", "set", node_run, "--db", str(db)])
    assert made.exit_code == 0 and "baseline for fleet@gpu2 runs" in made.output, made.output
    gpu1_run = next(line.split()[0] for line in listed.splitlines() if "gpu1" in line and "fleet" in line)
    none = run(cli, ["compare", gpu1_run, "--db", str(db)])
    assert none.exit_code == 2 and "no baseline" in none.output  # gpu1 is not compared with gpu2


def test_a_node_that_dies_mid_pass_is_named_and_what_was_measured_is_kept(tmp_path):
    t0, limit = time.monotonic(), scaled(150)
    # the ranks without their agents (what is tested is the pass, not torchrun), and 20 iterations a
    # figure: nothing here judges a figure, only who answered and what was kept
    doc, drain, codes, progress, stdout = _fleet(tmp_path, 31, kill=(2, 2), nodes=4, timeout=10, iters=20,
                                                 agents=False)
    assert time.monotonic() - t0 < limit  # every survivor gone within 2 x --timeout + 30 s of the death (the watchdog)
    assert codes[0] == 1 and codes[2] != 0, progress[-3000:]
    lost = [n for n in doc["nodes"] if not n["answered"]]
    assert [n["node"] for n in lost] == [doc["nodes"][2]["node"]] and lost[0]["lost"] == "lost in the links phase"
    _drained_for_a_reason(doc, launch.expand_hostlist(drain), [lost[0]["node"]])  # drained as no answer
    assert doc["status"]["completed"] is False and "stopped in the links phase" in doc["status"]["message"]
    assert len(doc["nodes"][0]["gpus"]) == 1 and doc["pairings"]  # the node pass and round 1 are kept
    assert f"{lost[0]['node']}: no answer (lost in the links phase)" in stdout
