"""Native NCCL sweeps on real GPUs (run with `pytest -m gpu` on a machine with 2+ GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import interrupt_comm

from mgpu_bench import _native
from mgpu_bench.core.errors import CommTimeoutError, CudaError, NcclError, OutOfMemoryError
from mgpu_bench.probes.comm import measure as comm
from mgpu_bench.probes.comm import plan as comm_plan
from mgpu_bench.results import ops
from mgpu_bench.results.measurement import TimingOptions

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu(2)]

QUICK = TimingOptions(iters=5, warmup_iters=2)


@pytest.fixture(scope="module")
def session():
    s = _native.CommSession([0, 1], 2, 0, _native.nccl_unique_id(), 60.0)
    yield s
    del s


def measure(session, op, dtype="fp32", size=1 << 20, inplace=False, redop="sum", **kw):
    a = _native.MeasureArgs()
    a.op, a.dtype, a.bytes, a.inplace, a.redop = op, dtype, size, inplace, redop
    a.iters, a.warmup_iters = kw.pop("iters", 5), 2
    for k, v in kw.items():
        setattr(a, k, v)
    return session.measure(a)


@pytest.mark.parametrize("size", [(1 << 20) + 13, (64 << 20) + 13])
@pytest.mark.parametrize("dtype", ops.DTYPES)
@pytest.mark.parametrize("op", ops.OP_ORDER)
def test_every_op_and_dtype_is_exact(session, op, dtype, size):
    placements = (False, True) if ops.OPS[op].inplace else (False,)
    redops = ("sum", "max", "min", "avg") if ops.OPS[op].reduces else ("sum",)
    for inplace in placements:
        for redop in redops:
            # Odd sizes: rounding and tails are exercised, not only round numbers.
            r = measure(session, op, dtype, size, inplace, redop)
            assert r["wrong"] == [0, 0], (op, dtype, inplace, redop)
            assert r["counts"] == ops.op_counts(op, size, dtype, 2)
            assert all(t > 0 for t in r["burst_seconds"])
            assert r["samples"].shape[0] == 2 and r["samples"].shape[1] >= 1


@pytest.mark.parametrize("op", ["allreduce", "allgather", "sendrecv"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_corrupted_element_is_counted(session, op, rank):
    r = measure(session, op, corrupt_rank=rank)
    assert r["wrong"][rank] >= 1
    assert r["wrong"][1 - rank] == 0


def test_graph_mode_matches_stream_mode_at_64MiB(session):
    plain = measure(session, "allreduce", size=64 << 20, iters=20)
    graph = measure(session, "allreduce", size=64 << 20, iters=20, graph=True)
    assert graph["wrong"] == [0, 0]
    t_plain, t_graph = max(plain["burst_seconds"]), max(graph["burst_seconds"])
    assert abs(t_graph - t_plain) / t_plain < 0.10


def test_auto_iterations_fill_min_time(session):
    a = _native.MeasureArgs()
    a.op, a.dtype, a.bytes, a.min_time_s = "allreduce", "fp32", 1 << 20, 0.02
    r = session.measure(a)
    assert r["iters"] >= 20
    assert r["iters"] * max(r["burst_seconds"]) == pytest.approx(0.02, rel=0.5)
    assert r["batch"] >= 1 and r["samples"].shape[1] == r["iters"] // r["batch"]


def test_out_of_memory_leaves_the_session_usable(session):
    free, _ = _native.mem_get_info(0)
    with pytest.raises(OutOfMemoryError, match="out of device memory"):
        measure(session, "allreduce", size=free)  # send + work buffers: 2x free
    assert session.alive
    assert measure(session, "allreduce")["wrong"] == [0, 0]


def test_sweep_stops_at_oom_and_keeps_earlier_sizes(monkeypatch):
    monkeypatch.setattr(comm, "check_memory", lambda *a: None)  # let the run reach the device limit
    free, _ = _native.mem_get_info(0)
    cfg = comm_plan.CommConfig(ops=("allreduce",), dtype="fp32", redop="sum", sizes=(1 << 20, 4 << 20, free),
                          inplace=(False,), timing=QUICK)
    run = comm.run_comm(cfg)
    assert run.stopped == "out_of_memory"
    assert [m.spec.bytes for m in run.measurements] == [1 << 20, 4 << 20]
    assert "2 measurement(s) kept" in run.stop_message


@pytest.mark.parametrize("rank", [0, 1])
def test_one_failing_rank_stops_the_others_at_once_with_its_error(rank):
    s = _native.CommSession([0, 1], 2, 0, _native.nccl_unique_id(), 60.0)
    t0 = time.monotonic()
    with pytest.raises(CudaError, match=f"injected failure on rank {rank}"):
        measure(s, "allreduce", fail_rank=rank)
    assert time.monotonic() - t0 < 5  # not the 60 s timeout
    assert not s.alive
    with pytest.raises(NcclError, match="aborted after an earlier failure"):
        measure(s, "allreduce")
    del s
    fresh = _native.CommSession([0, 1], 2, 0, _native.nccl_unique_id(), 60.0)
    assert measure(fresh, "allreduce")["wrong"] == [0, 0]


def test_a_rank_that_never_arrives_ends_in_an_error_not_a_hang():
    # Three ranks announced, two present: initialisation can never finish. Either NCCL gives
    # up first (seen on 2x H200 with NCCL 2.28: ncclInternalError from one rank, reported at
    # once) or the session's timeout aborts (CommTimeoutError, a NcclError).
    t0 = time.monotonic()
    with pytest.raises(NcclError) as info:
        _native.CommSession([0, 1], 3, 0, _native.nccl_unique_id(), 3.0)
    assert time.monotonic() - t0 < 20
    if isinstance(info.value, CommTimeoutError):
        assert "did not finish within 3" in str(info.value)
    else:
        assert "ncclCommInitRank" in str(info.value)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "comm", *args], capture_output=True,
                          text=True, timeout=300, check=False)


def test_cli_sweep_writes_json_and_csv(tmp_path):
    j, c = tmp_path / "r.json", tmp_path / "r.csv"
    out = run_cli("--ops", "all", "--sizes", "1M,64M", "--json", str(j), "--csv", str(c))
    assert out.returncode == 0, out.stderr + out.stdout
    doc = json.loads(j.read_text())
    assert doc["backend"] == "native" and doc["status"]["completed"]
    kinds = {(m["spec"]["op"], m["spec"]["inplace"]) for m in doc["measurements"]}
    assert ("alltoall", True) not in kinds and ("sendrecv", True) not in kinds and ("allreduce", True) in kinds
    assert len(doc["measurements"]) == 2 * 12
    assert doc["environment"]["env"].get("NCCL_NVLS_ENABLE") == "0"
    # The ring's theory from the topology, and NCCL's own account of its transports.
    assert doc["theory"]["bandwidth"] > 0 and doc["theory"]["hops"][0]["kind"] == "nvlink"
    assert doc["transports"]["0->1"].get("P2P", 0) > 0 and doc["transports"]["1->0"].get("P2P", 0) > 0
    assert doc["findings"] == []
    assert doc["algorithms_modelled"]["allreduce@67108864"].startswith("Ring/")  # NCCL's model, NVLS off
    assert "%theo" in out.stdout and "NCCL transports (ranks, channels): 0->1 P2P x" in out.stdout
    assert len(c.read_text().strip().splitlines()) == 1 + 24
    assert "busbw" in out.stdout and "allreduce out-of-place: busbw" in out.stdout


@pytest.mark.parametrize(
    "args, words",
    [(["--gpus", "1"], "at least 2 ranks"), (["--gpus", "0,7"], "GPU 7 does not exist"),
     (["--sizes", "1T"], "free: lower the largest --sizes")],
)
def test_cli_bad_gpu_input_exits_2(args, words):
    out = run_cli(*args)
    assert out.returncode == 2
    assert words in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_ctrl_c_mid_sweep_writes_what_was_measured(tmp_path):
    j = tmp_path / "r.json"
    # start-up, then ~2 s per size (burst + sampled pass at 1 s each)
    rc, err = interrupt_comm(["--ops", "allreduce", "--sizes", "1M-1G", "--min-time", "1", "--json", str(j)], 8)
    assert rc == 130, err
    doc = json.loads(j.read_text())
    assert doc["status"]["stopped"] == "interrupted"
    assert 1 <= len(doc["measurements"]) < 22
    assert "interrupted at allreduce" in err


def test_torch_backend_on_gpus_is_checked_and_comparable():
    cfg = comm_plan.CommConfig(ops=("allreduce", "allgather", "sendrecv"), dtype="bf16", redop="sum",
                          sizes=(1 << 20, 64 << 20), backend="torch", timing=TimingOptions(min_time_s=0.02))
    run = comm.run_comm(cfg)
    assert run.backend == "torch-nccl" and run.stopped is None, run.stop_message
    assert len(run.measurements) == 2 * 2 + 2 * 2 + 2  # sendrecv out-of-place only
    assert run.total_wrong == 0
    big = [m for m in run.measurements if m.spec.bytes == 64 << 20 and m.spec.op == "allreduce"]
    assert all(m.busbw > 50e9 for m in big)  # NVLink, not a host path


@pytest.mark.parametrize("graph", [False, True])
def test_sample_median_agrees_with_the_burst_at_8_bytes(session, graph):
    # The distribution comes from a separate pass; its instrumentation must not move the
    # figure (events inside a captured graph once added ~3 us to a ~5.5 us allreduce).
    a = _native.MeasureArgs()
    a.op, a.dtype, a.bytes, a.min_time_s, a.graph = "allreduce", "fp32", 8, 0.02, graph
    # Stream mode: within 10%. Graph mode: each replay of a batch graph costs a few tens of us
    # (seen: median 6.2 vs 5.4 us at 8 B on H200), so within 25%. A bias of the instrumentation
    # shows in every attempt; one disturbed pass of a ~10 us operation (it failed once in
    # session 12's run) does not fail the test: up to three attempts.
    seen = []
    for _attempt in range(3):
        r = session.measure(a)
        assert r["batch"] > 1
        burst = max(r["burst_seconds"])
        median = float(np.median(r["samples"].max(axis=0)))
        seen.append((median, burst))
        if abs(median - burst) / burst < (0.25 if graph else 0.10):
            break
    else:
        pytest.fail(f"sample median vs burst (s) in three attempts: {seen}")


def test_native_under_torchrun_matches_the_single_process_sweep(tmp_path):
    """One process per GPU (torchrun), NCCL unique id through the store: busbw at >= 64 MiB within
    5% of the single-process native sweep (benchmarks/comm_joined_vs_single.py measures it closer)."""
    figures = {}
    for mode in ("single", "joined"):
        out = tmp_path / f"{mode}.json"
        args = ["-m", "mgpu_bench.cli", "comm", "--ops", "allreduce", "--sizes", "64M,256M", "--outofplace",
                "--no-progress", "--json", str(out)]
        cmd = [sys.executable, *args, "--gpus", "2"] if mode == "single" else \
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        doc = json.loads(out.read_text())
        assert doc["backend"] == "native"
        figures[mode] = {m["spec"]["bytes"]: m for m in doc["measurements"]}
        if mode == "joined":
            assert proc.stdout.count("allreduce  (2 ranks, native") == 1  # rank 0 alone prints
            assert doc["environment"]["launcher"]["kind"] == "torchrun"
            assert all(len(m["samples"]) == 2 and sum(m["wrong"]) == 0 for m in doc["measurements"])
    from mgpu_bench.results.measurement import CommMeasurement

    for size, single in figures["single"].items():
        a = CommMeasurement.from_dict(single).busbw
        b = CommMeasurement.from_dict(figures["joined"][size]).busbw
        assert abs(b / a - 1) < 0.05, (size, a / 1e9, b / 1e9)


def test_launch_processes_runs_native_ranks(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "comm", "--launch", "processes", "--ops",
                           "allreduce,sendrecv", "--sizes", "1M,16M", "--no-progress", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["backend"] == "native" and doc["environment"]["launcher"]["world_size"] == 2
    assert {m["spec"]["op"] for m in doc["measurements"]} == {"allreduce", "sendrecv"}
    assert doc["theory"]["bandwidth"] > 0 and all(sum(m["wrong"]) == 0 for m in doc["measurements"])


def test_one_visible_gpu_per_rank_as_under_srun_gpus_per_task(tmp_path):
    """Each rank sees only its own GPU (index 0), as with srun --gpus-per-task=1: the ranks still
    run, and the theory comes from the GPUs' bus ids."""
    out = tmp_path / "one.json"
    script = (f"CUDA_VISIBLE_DEVICES=$LOCAL_RANK exec {sys.executable} -m mgpu_bench.cli comm --ops allreduce "
              f"--sizes 64M --outofplace --no-progress --json {out}")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--no-python", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["backend"] == "native" and doc["theory"]["bandwidth"] == pytest.approx(450e9)
    (m,) = doc["measurements"]
    assert sum(m["wrong"]) == 0 and len(m["samples"]) == 2
