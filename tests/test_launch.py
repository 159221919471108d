"""Launcher detection (torchrun, Slurm, Open MPI / PMI), and real torchrun launches of the
torch backend on CPU: rank 0 alone prints and writes; ranks started with different
arguments stop with one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import (
    AS_A_TERMINAL,
    DEADLINE_S,
    FIRST_SIZE,
    interrupt_cli,
    plain,
    scaled,
    slowdown,
    start_s,
    wait_for_output,
)

from mgpu_bench.core import launch
from mgpu_bench.core.errors import InputError

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
         "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456",
         "SLURM_STEP_ID": "0"}
OMPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "29501"}


def test_no_launcher():
    assert launch.detect({"PATH": "/bin"}) is None


def test_torchrun():
    le = launch.detect(TORCHRUN)
    assert (le.launcher, le.rank, le.world_size, le.local_rank, le.local_world_size) == ("torchrun", 3, 8, 1, 2)
    assert (le.node_rank, le.nnodes, le.master_addr, le.master_port) == (1, 4, "10.0.0.1", 29400)


def test_slurm_first_node_is_the_master_and_the_port_comes_from_the_job():
    le = launch.detect(SLURM)
    assert (le.launcher, le.rank, le.world_size, le.local_rank, le.local_world_size) == ("slurm", 5, 8, 1, 4)
    assert (le.nnodes, le.node_rank, le.master_addr, le.master_port) == (2, 1, "gpu07", 29500 + 456)
    assert launch.detect({**SLURM, "MASTER_ADDR": "ib-gpu07", "MASTER_PORT": "30000"}).master_addr == "ib-gpu07"


def test_torchrun_inside_slurm_wins():
    assert launch.detect({**SLURM, **TORCHRUN}).launcher == "torchrun"


def test_open_mpi_needs_a_master_address():
    le = launch.detect(OMPI)
    assert (le.launcher, le.rank, le.world_size, le.local_rank, le.nnodes) == ("mpi", 2, 4, 0, 2)
    with pytest.raises(InputError, match="MASTER_ADDR"):
        launch.detect({k: v for k, v in OMPI.items() if k != "MASTER_ADDR"})


@pytest.mark.parametrize("drop,name", [("WORLD_SIZE", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_RANK"),
                                       ("MASTER_PORT", "MASTER_PORT")])
def test_half_set_torchrun_names_the_missing_variable(drop, name):
    with pytest.raises(InputError, match=f"half-set: {name} is missing"):
        launch.detect({k: v for k, v in TORCHRUN.items() if k != drop})


def test_half_set_slurm_and_bad_values():
    with pytest.raises(InputError, match="SLURM_LOCALID is missing"):
        launch.detect({k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"})
    with pytest.raises(InputError, match="not a whole number"):
        launch.detect({**TORCHRUN, "RANK": "three"})
    with pytest.raises(InputError, match="outside the world"):
        launch.detect({**TORCHRUN, "RANK": "8"})


def test_expand_hostlist():
    assert launch.expand_hostlist("gpu[01-03,07],login-a") == ["gpu01", "gpu02", "gpu03", "gpu07", "login-a"]
    assert launch.expand_hostlist("node9") == ["node9"]
    assert launch.expand_hostlist("a[8-10]-ib") == ["a8-ib", "a9-ib", "a10-ib"]


def test_disagreement_names_the_ranks():
    assert launch.disagreement(["x", "x", "x"]) is None
    assert launch.disagreement(["x", "y", "x", "z"]).startswith("rank(s) 1, 3 were started with different")


def _torchrun(args: list[str], tmp_path, timeout=None, env=None):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], capture_output=True, text=True, timeout=timeout or scaled(240), cwd=tmp_path, check=False,
                          env=env)


# One torchrun job (its agent and two ranks) runs the four commands the tests below read, one
# after the other, each rank's output in files of its own: `comm` and `model` as every rank agrees,
# then each with an argument that differs on rank 1. A torchrun job of its own for each would start
# three more agents, each a process importing torch. Each command gets a job id of its own, as a
# restarted torchrun job does, so that its keys in the agent's store are fresh (ranks.key_prefix).
TORCHRUN_COMMANDS = {
    "comm": "comm --backend torch --ops allreduce --sizes 1K,64K --json r.json",
    "model": "model --steps 2 --warmup-steps 1 --batch-size 2 --seq-len 64 --data both --num-workers 0 --json m.json",
    "comm-disagree": 'comm --backend torch --ops allreduce --sizes $([ "$RANK" = 0 ] && echo 1K || echo 2K)',
    "model-disagree": 'model --steps 2 --warmup-steps 1 --seq-len 64 --batch-size $([ "$RANK" = 0 ] && echo 2 || echo 8)',
}


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    """TORCHRUN_COMMANDS under one `torchrun --nproc-per-node 2`: {name: [(exit code, stdout,
    stderr) of rank 0, of rank 1]}, and the folder they ran in (the JSON documents)."""
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0 or shutil.which("sh") is None:
        pytest.skip("CPU only: the GPU tests launch NCCL ranks instead")
    where = tmp_path_factory.mktemp("torchrun")
    # a module's fixture runs outside the per-test private history (conftest.py): --no-store, and a
    # database of its own for anything that reads one
    env = {**os.environ, "MGPU_BENCH_DB": str(where / "history.sqlite3")}
    script = "".join(f'TORCHELASTIC_RUN_ID="$TORCHELASTIC_RUN_ID-{name}" {sys.executable} -m mgpu_bench.cli {cmd} '
                     f'--no-progress --no-store > {name}-$RANK.out 2> {name}-$RANK.err; echo $? > {name}-$RANK.rc\n'
                     for name, cmd in TORCHRUN_COMMANDS.items())
    proc = _torchrun(["--no-python", "sh", "-c", script], where, timeout=scaled(480), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]  # the script's own end: each command's code is in its file
    got = {name: [(int((where / f"{name}-{rank}.rc").read_text()), (where / f"{name}-{rank}.out").read_text(),
                   (where / f"{name}-{rank}.err").read_text()) for rank in (0, 1)] for name in TORCHRUN_COMMANDS}
    return got, where


def _disagreed(ranks: list[tuple[int, str, str]]) -> None:
    """Every rank stopped with one line saying that the ranks' arguments differ, no traceback."""
    for code, _out, err in ranks:
        assert code != 0 and "Traceback" not in err, err[-3000:]
        lines = [x for x in err.splitlines() if x.startswith("mgpu-bench: error:")]
        assert len(lines) == 1 and "were started with different arguments than rank 0" in lines[0], err


def test_torchrun_two_gloo_ranks_rank0_prints_and_writes(torchrun_job):
    got, where = torchrun_job
    (code0, out0, err0), (code1, out1, err1) = got["comm"]
    assert code0 == code1 == 0, err0[-3000:] + err1[-3000:]
    assert out0.count("allreduce  (2 ranks, torch-gloo") == 1 and "allreduce" not in out1  # one table: rank 0's
    doc = json.loads((where / "r.json").read_text())
    assert doc["environment"]["launcher"]["kind"] == "torchrun"
    assert doc["environment"]["launcher"]["world_size"] == 2
    assert len(doc["measurements"]) == 4 and all(sum(m["wrong"]) == 0 for m in doc["measurements"])
    # the samples of both ranks reached rank 0: per-iteration figures are the slowest rank's
    assert all(len(m["samples"]) == 2 for m in doc["measurements"])


def test_torchrun_ranks_with_different_arguments_stop_with_one_line(torchrun_job):
    got, _ = torchrun_job
    _disagreed(got["comm-disagree"])


def test_torchrun_model_rank0_reports_the_whole_job(torchrun_job):
    got, where = torchrun_job
    (code0, out0, err0), (code1, out1, err1) = got["model"]
    assert code0 == code1 == 0, err0[-3000:] + err1[-3000:]
    assert out0.count("tiny training steps") == 1 and "tiny training steps" not in out1  # one table: rank 0's
    runs = json.loads((where / "m.json").read_text())["runs"]
    assert [r["data"] for r in runs] == ["synthetic", "loader"]
    for run in runs:
        assert run["world"] == 2 and run["tokens_per_step"] == 2 * 64 * 2


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def start_once() -> float:
    """start_s() measured once for the tests that need it only for a generous bound (a start probe
    is a process that imports torch: about 3 s of CPU)."""
    return start_s()


@pytest.mark.parametrize("rank,expect", [(0, "rank(s) 1 of 2 never arrived"),
                                         (1, "rank 0 (which serves it) never arrived")])
def test_a_rank_that_never_arrives_is_named_within_the_timeout(tmp_path, rank, expect, start_once):
    """One process of a two-rank job, started alone: it stops after --timeout with the missing
    rank named, exit code 1, no hang."""
    import os
    import time

    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    start = start_once  # how long a process takes to get going here (3-5 s idle, 20-40 s under load)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "comm", "--backend", "torch", "--ops",
                           "allreduce", "--sizes", "1K", "--timeout", "3", "--no-progress"], env=env,
                          capture_output=True, text=True, timeout=scaled(120), check=False, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert expect in " ".join((proc.stdout + proc.stderr).split())
    assert time.monotonic() - t0 < 3 + 3 * start + 10  # --timeout after it started, not the default 120 s


def test_uneven_slurm_layout_and_bad_numbers():
    env = {**SLURM, "SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_TASKS_PER_NODE": "1,2"}
    le = launch.detect(env)
    assert (le.rank, le.local_rank, le.local_world_size, le.node_rank) == (2, 1, 2, 1)
    assert launch._tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    for bad in ({**TORCHRUN, "LOCAL_WORLD_SIZE": "x"}, {**TORCHRUN, "GROUP_RANK": "one"},
                {**SLURM, "MASTER_PORT": "http"}, {**OMPI, "MASTER_PORT": "p"}):
        with pytest.raises(InputError, match="not a whole number"):
            launch.detect(bad)


def test_every_waiting_rank_names_the_missing_one(tmp_path):
    """Ranks 0 and 1 of a three-rank job: both stop after --timeout naming rank 2."""
    import os

    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    port = str(_free_port())
    # The two start together but arrive as far apart as a start takes under load (the later one's
    # imports): rank 1 waits that long for rank 0's store, so the timeout covers it (3 s idle).
    timeout = max(3, round(2 * start_s()))
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", "comm", "--backend", "torch", "--ops",
                                       "allreduce", "--sizes", "1K", "--timeout", str(timeout), "--no-progress"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path))
    for p in procs:
        out, err = p.communicate(timeout=scaled(90) + timeout)
        assert p.returncode == 1
        text = " ".join((out + err).split())
        assert "rank(s) 2 of 3 never arrived" in text and "Traceback" not in text


def test_torchrun_model_both_data_sources_and_argument_agreement(torchrun_job):
    got, _ = torchrun_job
    (code, out, err), _rank1 = got["model"]
    assert code == 0, err[-3000:]
    # both configurations ran on one process group, and the loader's cost against the synthetic batches
    # is said: as its own line, or in the verdict where the loader bounds the step (the tiny model's
    # step is a few milliseconds: it often does)
    assert re.search(r"input-pipeline loss|input-bound: the input pipeline costs", out), out[-3000:]
    _disagreed(got["model-disagree"])


def test_launch_processes_reruns_the_command_under_the_elastic_launcher(tmp_path):
    """`comm --launch processes`: one process per rank started by torch's elastic launcher,
    joined as under torchrun; rank 0 alone prints and writes."""
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    out, db = tmp_path / "l.json", tmp_path / "h.sqlite3"
    typed = ["comm", "--launch", "processes", "--nproc", "2", "--ops", "allreduce", "--sizes", "1K", "--no-progress",
             "--json", str(out), "--db", str(db)]
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", *typed],
                          capture_output=True, text=True, timeout=scaled(240), check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("allreduce  (2 ranks, torch-gloo") == 1
    doc = json.loads(out.read_text())
    assert doc["environment"]["launcher"]["world_size"] == 2 and len(doc["measurements"]) == 2
    # rank 0 (a child) stores the command the user typed, --launch included, not its own argv
    from mgpu_bench.history import History

    with History.open(db, readonly=True) as h:
        (run,) = h.list()
    assert run.command.split()[1:] == ["-m", "mgpu_bench.cli", *typed] and doc["command"][3:] == typed, run.command
    # the refusals come before any launch: in process
    from click.testing import CliRunner

    from mgpu_bench.cli import cli

    bad = CliRunner().invoke(cli, ["comm", "--launch", "processes", "--backend", "native"])
    assert bad.exit_code == 2 and "use --backend torch for CPU ranks" in bad.stderr, bad.output
    sizes = CliRunner().invoke(cli, ["comm", "--launch", "processes", "--sizes", "bogus"])
    assert sizes.exit_code == 2 and len(sizes.stderr.strip().splitlines()) == 1, sizes.output  # before any launch


def test_gpu_choice_maps_through_an_existing_cuda_visible_devices(monkeypatch):
    from mgpu_bench.machine.selection import pin_gpus as _pin_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,GPU-abc")
    _pin_gpus([1, 2])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,GPU-abc"  # not the other job's 1,2
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    _pin_gpus([0, 3])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,3"


def test_two_torchrun_agents_as_two_nodes_split_intra_and_inter_node(tmp_path):
    """Two torchrun agents (--nnodes 2) on one machine: the job is measured as a whole, per
    node and across nodes (one communicator per local rank); rank 0 alone writes."""
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    port = launch.free_port()
    out = tmp_path / "two-nodes.json"
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
         "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
         "-m", "mgpu_bench.cli", "comm", "--backend", "torch", "--ops", "allreduce,sendrecv", "--sizes", "4K,64K",
         "--outofplace", "--no-progress", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path) for node in (0, 1)]
    results = [a.communicate(timeout=scaled(300)) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    doc = json.loads(out.read_text())
    ms = doc["measurements"]
    by_scope = {}
    for m in ms:
        by_scope.setdefault(m["spec"]["scope"], []).append(m)
    # 2 ops x 2 sizes: world (4 ranks), 2 nodes x intra-node (2 ranks), 2 local ranks x inter-node (2 ranks)
    assert len(by_scope["world"]) == 4 and all(m["spec"]["nranks"] == 4 for m in by_scope["world"])
    assert len(by_scope["intra-node"]) == 8 and len(by_scope["inter-node"]) == 8
    assert {m["spec"]["group"] for m in by_scope["intra-node"]} == {f"node {n} ({socket.gethostname()})"
                                                                   for n in (0, 1)}
    assert {m["spec"]["group"] for m in by_scope["inter-node"]} == {"local rank 0", "local rank 1"}
    for m in by_scope["intra-node"] + by_scope["inter-node"]:
        assert m["spec"]["nranks"] == 2 and len(m["samples"]) == 2 and sum(m["wrong"]) == 0
    assert all(sum(m["wrong"]) == 0 and len(m["samples"]) == 4 for m in by_scope["world"])
    stdout = results[0][0] + results[1][0]
    assert stdout.count("allreduce, inter-node (local rank 1)") == 1  # rank 0's tables only
    assert "[intra-node node 0" in stdout  # the summary line per communicator


COMM_SWEEP = ["comm", "--backend", "torch", "--ops", "allreduce", "--sizes", "1K-128M", "--timeout", "20"]


def _two_ranks_then_signal(tmp_path, sig, command=COMM_SWEEP, victim=1, until=FIRST_SIZE):
    """Ranks 0 and 1 of `mgpu-bench command` on gloo started by hand (rank 0 serves the store);
    once both have arrived and rank 0's progress shows `until` (the first size measured; with
    `until` None, 2 s later), `sig` goes to rank `victim`. Returns (the other
    rank's exit code, its stderr, rank 0's JSON document or None, the victim's exit code, seconds
    the other rank took after the signal, over slowdown() then: as on an idle machine)."""
    import time
    from datetime import timedelta

    import torch.distributed as dist

    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, **AS_A_TERMINAL, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", *command,
                                       "--progress" if until else "--no-progress",
                                       "--no-store", "--json", str(tmp_path / f"r{rank}.json")],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path))
    try:
        deadline = time.monotonic() + scaled(DEADLINE_S)
        store = None
        while store is None:  # a client of rank 0's store, to see both ranks arrive
            try:
                store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=2))
            except Exception:  # noqa: BLE001 - not served yet
                assert time.monotonic() < deadline and procs[0].poll() is None, "rank 0 never served its store"
                time.sleep(0.1)
        store.wait([f"{launch._prefix({})}/arrived/{r}" for r in (0, 1)], timedelta(seconds=scaled(DEADLINE_S)))
        if until:
            seen = wait_for_output(procs[0], until)  # rank 0 alone shows progress
        else:
            seen = b""
            time.sleep(2.0)
        assert procs[0].poll() is None and procs[1].poll() is None, "the sweep ended before the signal"
        procs[victim].send_signal(sig)
        t0 = time.monotonic()
        load = slowdown()
        _out, err = procs[1 - victim].communicate(timeout=60 * load)
        took = (time.monotonic() - t0) / load
        err = plain(((seen if victim == 1 else b"") + err).decode(errors="replace"))
        procs[victim].communicate(timeout=scaled(60))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    path = tmp_path / "r0.json"
    doc = json.loads(path.read_text()) if path.exists() else None
    return procs[1 - victim].returncode, " ".join(err.split()), doc, procs[victim].returncode, took


@pytest.mark.parametrize("sig,word", [("SIGKILL", "is gone (no word from it"), ("SIGTERM", "left: terminated (SIGTERM)")])
def test_a_rank_that_leaves_mid_sweep_is_named_and_rank0_keeps_its_measurements(tmp_path, sig, word):
    import signal

    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    rc0, err, doc, rc1, took = _two_ranks_then_signal(tmp_path, getattr(signal, sig))
    assert rc0 == 1, err
    assert f"rank 1 (cpu on {socket.gethostname()}) {word}" in err, err
    assert "Traceback" not in err and took < 20
    assert doc["measurements"] and doc["status"]["stopped"] == "error"
    assert "rank 1" in doc["status"]["message"]
    assert rc1 == (-9 if sig == "SIGKILL" else 143)


def test_when_rank_0_dies_the_others_say_that_nothing_was_written(tmp_path):
    import signal

    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    rc1, err, doc, rc0, took = _two_ranks_then_signal(tmp_path, signal.SIGKILL, victim=0)
    assert rc1 == 1 and rc0 == -9 and doc is None, err
    assert "which serves the job's store) is gone" in err, err
    assert "; rank 0, which held the measurements, is gone: none were written" in err, err
    assert "Traceback" not in err and took < 20


def test_a_rank_killed_mid_training_is_named(tmp_path):
    import signal

    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    model = ["model", "--steps", "400", "--warmup-steps", "1", "--batch-size", "2", "--seq-len", "64"]
    # not "--progress" and its "step 1/400" to wait for: under a launcher `model --progress` stops
    # with "started with different arguments" (the progress flag, on rank 0 alone, is agreed on)
    rc0, err, _doc, rc1, took = _two_ranks_then_signal(tmp_path, signal.SIGKILL, model, until=None)
    assert rc0 == 1 and rc1 == -9, err
    assert f"rank 1 (cpu on {socket.gethostname()}) is gone (no word from it" in err, err
    assert "Traceback" not in err and took < 30


def test_roll_call_names_the_silent_rank_and_the_one_that_said_why():
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False)
    env = lambda rank: launch.LaunchEnv("torchrun", rank, 5, rank, 5, 0, 1, "127.0.0.1", store.port, "h0")
    members = [launch.Member(r, "h0", 0, r, f"cuda:{r}") for r in range(5)]
    launch.answer(store, 1)  # a survivor
    launch.leave_note(store, 2, "interrupted (Ctrl-C)")
    # rank 4 failed on its own: it leaves its error for the others, and reports it unchanged
    own = RuntimeError("DataLoader worker (pid 7) is killed by signal: Killed.")
    assert launch.account(own, store, env(4), members, 0.1) is own
    who = launch.roll_call(store, env(0), members, wait_s=0.3)
    # the ranks that said why first, then the silent ones
    assert who == ("rank 2 (cuda:2 on h0) left: interrupted (Ctrl-C); rank 4 (cuda:4 on h0) left: failed: "
                   "RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed.; "
                   "rank 3 (cuda:3 on h0) is gone (no word from it within 0.3 s: killed, crashed, or stuck)")
    # the group breaking under a rank: a roll call, and the ranks that left are named
    lost = launch.account(RuntimeError("[pair.cc:553] Connection closed by peer [10.0.0.2]:7055. This is ..."),
                          store, env(0), members, 0.1)
    assert isinstance(lost, launch.RankLost) and "rank 3" in str(lost)
    assert str(lost).endswith("[RuntimeError: Connection closed by peer [10.0.0.2]:7055]")
    # another rank's error it was told of: it answers and reports that error
    told = launch.RankLost("rank 9: x")
    assert launch.account(told, store, env(3), members, 0.1, told=(launch.RankLost,)) is told
    assert launch.roll_call(store, env(0), members, wait_s=0.3).count(";") == 1  # rank 3 answered now


def test_a_stopped_rank_0_does_not_call_busy_ranks_gone():
    """Rank 0 terminated on its own while the others are blocked in a collective: it says they
    had not answered, not that they are gone, and its own note stays readable."""
    from datetime import timedelta

    import torch.distributed as dist

    from mgpu_bench.core.errors import Terminated

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False)
    env = lambda rank: launch.LaunchEnv("torchrun", rank, 3, rank, 3, 0, 1, "127.0.0.1", store.port, "h0")
    members = [launch.Member(r, "h0", 0, r, f"cuda:{r}") for r in range(3)]
    launch.leave_note(store, 2, "terminated (SIGTERM)")  # the launcher stops every rank
    told = launch.account(Terminated(), store, env(0), members, 5.0)
    assert isinstance(told, Terminated)
    assert str(told) == "terminated (SIGTERM) [no word within 1.0 s from rank 1 (cuda:1 on h0)]"
    who = launch.roll_call(store, env(1), members, wait_s=0.2)
    assert who.startswith("rank 0 (cuda:0 on h0) left: terminated (SIGTERM)")


def test_sigterm_keeps_what_was_measured_and_exits_143(tmp_path):
    """A single-process sweep (two gloo worker processes) sent SIGTERM mid-run, as scancel or a
    job's time limit does: the JSON holds the sizes measured, the line says so, exit code 143."""
    import signal

    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    out = tmp_path / "r.json"
    # SIGTERM once the progress bar counts the first size measured (the sweep itself is far longer)
    rc, err = interrupt_cli(["comm", "--backend", "torch", "--ops", "allreduce", "--sizes", "1K-128M", "--progress",
                             "--json", str(out)], until=FIRST_SIZE, sig=signal.SIGTERM, cwd=tmp_path)
    assert rc == 143, err
    assert "terminated (SIGTERM) at allreduce" in err and "Traceback" not in err
    doc = json.loads(out.read_text())
    assert doc["measurements"] and doc["status"]["stopped"] == "interrupted"


def _sigterm_when(cmd: list[str], stream: str, words: str, tmp_path) -> tuple[int, str]:
    """Runs `mgpu-bench cmd`, sends SIGTERM as soon as `words` appear on `stream`; (exit code,
    stderr)."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    src = proc.stdout if stream == "stdout" else proc.stderr
    seen = ""
    for line in src:
        seen += line
        if words in line:
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=scaled(120))
    assert words in seen, seen + out + err
    return proc.returncode, (seen + err) if stream == "stderr" else err


def test_sigterm_while_the_results_are_written_waits_for_them(tmp_path):
    """SIGTERM (a batch job's time limit) right after the sweep, once the history row is in and while
    the files are written (the tables print last): the JSON, the report and the history entry are
    all written, then exit 143."""
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    rc, err = _sigterm_when(["comm", "--backend", "torch", "--ops", "allreduce", "--sizes", "1K-64K", "--no-progress",
                             "--db", "h.sqlite3", "--json", "r.json", "--report", "rep"], "stderr",
                            "stored as r1", tmp_path)
    assert rc == 143, err
    assert json.loads((tmp_path / "r.json").read_text())["measurements"]
    assert (tmp_path / "rep" / "report.html").exists() and "stored as r1" in err


def test_sigterm_to_model_under_its_own_launcher_is_143_with_the_configurations_kept(tmp_path):
    """`model` starts its ranks through torch's elastic agent, which takes SIGTERM over while it
    runs them: still "terminated (SIGTERM)", exit 143, the finished configuration kept."""
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("CPU only")
    rc, err = _sigterm_when(["model", "--steps", "30", "--no-exposed-comm", "--warmup-steps", "1", "--batch-size", "2", "--seq-len", "64",
                             "--data", "both", "--json", "m.json", "--no-store", "--progress"], "stderr",
                            "2 process(es), loader data", tmp_path)
    assert rc == 143, err[-2000:]
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["status"]["message"] == "terminated (SIGTERM): the configurations measured so far are kept"
    assert [r["data"] for r in doc["runs"]] == ["synthetic"]
