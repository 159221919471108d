"""The torch backend on CPU: real processes, real gloo, the native core's data pattern and check.

Sizes and iteration counts are small: the whole file runs in CI on 2 cores.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time

import numpy as np
import pytest
import torch
from conftest import scaled

from mgpu_bench.core.errors import CommTimeoutError, InputError
from mgpu_bench.probes.comm import torch_backend as tb
from mgpu_bench.probes.comm import torch_rank as tr
from mgpu_bench.results import ops
from mgpu_bench.results.measurement import CommMeasurement, CommRequest, CommSpec, TimingOptions

NPROC = 2
FAST = TimingOptions(warmup_iters=2, min_time_s=0.005, min_iters=5, max_iters=40)
GLOO_DTYPES = ("fp32", "fp16", "bf16", "fp64", "int32", "int8")


def _spawned_children() -> list[int]:
    """PIDs of this process's children started by multiprocessing's spawn (not its resource
    tracker), alive or not yet reaped."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != os.getpid():
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if b"spawn_main" in cmdline:
            pids.append(int(entry))
    return pids


def _assert_no_children() -> None:
    assert multiprocessing.active_children() == []
    if os.path.isdir("/proc"):
        assert _spawned_children() == []


def _check_raw(req: CommRequest, raw: dict, device: str = "cpu") -> None:
    assert raw["counts"] == ops.op_counts(req.op, req.size, req.dtype, NPROC)
    assert raw["wrong"] == [0] * NPROC, req
    assert len(raw["burst_seconds"]) == NPROC
    assert all(b > 0 for b in raw["burst_seconds"])
    samples = raw["samples"]
    assert isinstance(samples, np.ndarray)
    assert samples.shape == (NPROC, raw["iters"] // raw["batch"])
    assert samples.shape[1] >= 1
    assert (samples > 0).all()
    assert raw["warmup_seconds_per_iter"] > 0
    # The caller's path: the same as for the native core.
    c = raw["counts"]
    spec = CommSpec(op=req.op, dtype=req.dtype, redop=req.redop, size=req.size, bytes=c["bytes"],
                    count=c["count"], nranks=NPROC, inplace=req.inplace,
                    backend="torch-gloo" if device == "cpu" else "torch-nccl",
                    devices=("cpu",) * NPROC if device == "cpu" else tuple(f"cuda:{r}" for r in range(NPROC)),
                    root=req.root)
    m = CommMeasurement.from_raw(spec, raw, checked=True)
    assert m.total_wrong == 0 and m.time_s > 0 and m.nsamples == samples.shape[1]


# -- every op, both placements, on real gloo processes -------------------------------------------


def _all_op_requests() -> list[CommRequest]:
    reqs = []
    for op, info in ops.OPS.items():
        for size in (4096, 65536):
            for inplace in (False, True) if info.inplace else (False,):
                redop = "sum" if info.reduces else None
                if tb.unsupported_reason(op, "fp32", redop, "cpu"):
                    continue
                root = 1 if (info.rooted and size == 65536) else 0
                reqs.append(CommRequest(op, "fp32", redop, size, inplace, root=root))
    return reqs


@pytest.fixture(scope="module")
def all_ops():
    reqs = _all_op_requests()
    calls: list[tuple[int, dict]] = []
    sweep = tb.run_sweep(reqs, nproc=NPROC, device="cpu", timing=FAST, timeout_s=60,
                         on_result=lambda i, raw: calls.append((i, raw)))
    return reqs, sweep, calls


def test_every_supported_op_runs_and_checks_clean(all_ops):
    reqs, sweep, _ = all_ops
    assert {r.op for r in reqs} == set(ops.OPS)  # every op has a supported form on gloo
    assert sweep.error is None and not sweep.interrupted
    assert len(sweep.results) == len(reqs)
    for req, raw in zip(reqs, sweep.results):
        _check_raw(req, raw)
    _assert_no_children()


def test_on_result_once_per_request_in_order(all_ops):
    reqs, sweep, calls = all_ops
    assert [i for i, _ in calls] == list(range(len(reqs)))
    assert all(raw is sweep.results[i] for i, raw in calls)


def test_every_gloo_dtype_and_reduction():
    reqs = []
    for dtype in GLOO_DTYPES:
        for redop in ("sum", "max", "min", "avg"):
            if tb.unsupported_reason("allreduce", dtype, redop, "cpu") is None:
                reqs.append(CommRequest("allreduce", dtype, redop, 4096, inplace=False))
    reqs.append(CommRequest("reducescatter", "bf16", "avg", 4096, inplace=True))
    # fp8 travels through gloo's point-to-point path only.
    reqs += [CommRequest("sendrecv", dt, None, 4096, inplace=False) for dt in ("fp8_e4m3", "fp8_e5m2")]
    assert len(reqs) == 4 * 4 + 2 * 3 + 3
    sweep = tb.run_sweep(reqs, nproc=NPROC, device="cpu", timing=FAST, timeout_s=60)
    assert sweep.error is None
    assert len(sweep.results) == len(reqs)
    for req, raw in zip(reqs, sweep.results):
        _check_raw(req, raw)


@pytest.mark.multi_gpu(2)
def test_nccl_every_op_and_dtype_checks_clean():
    """The same sweep on GPUs through torch's nccl backend (skipped without 2 GPUs)."""
    reqs = []
    for dtype in ops.DTYPES:
        for op, info in ops.OPS.items():
            for redop in ("sum", "max", "min", "avg") if info.reduces else (None,):
                if dtype != "fp32" and op != "allreduce" and info.reduces:
                    continue  # every op on fp32; the reductions of other dtypes through allreduce
                for inplace in (False, True) if info.inplace else (False,):
                    if tb.unsupported_reason(op, dtype, redop, "cuda") is None:
                        root = 1 if info.rooted else 0
                        reqs.append(CommRequest(op, dtype, redop, 1 << 20, inplace, root=root))
    sweep = tb.run_sweep(reqs, nproc=NPROC, device="cuda", timing=FAST, timeout_s=120)
    assert sweep.error is None
    assert len(sweep.results) == len(reqs)
    for req, raw in zip(reqs, sweep.results):
        _check_raw(req, raw, device="cuda")
    _assert_no_children()


# -- what the backend refuses ---------------------------------------------------------------------


def test_unsupported_reason():
    assert tb.unsupported_reason("allreduce", "fp32", "sum", "cpu") is None
    for op in ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"):
        redop = "sum" if ops.OPS[op].reduces else None
        assert "fp8" in tb.unsupported_reason(op, "fp8_e4m3", redop, "cpu")
        assert tb.unsupported_reason(op, "fp8_e5m2", redop, "cpu")
    assert tb.unsupported_reason("sendrecv", "fp8_e4m3", None, "cpu") is None
    # gloo averages floating types (torch 2.13, tried) but not integers.
    assert tb.unsupported_reason("allreduce", "fp32", "avg", "cpu") is None
    for dtype in ("int32", "int8"):
        reason = tb.unsupported_reason("allreduce", dtype, "avg", "cpu")
        assert "avg" in reason or "average" in reason
        assert "--redop sum" in reason and "\n" not in reason
    assert tb.unsupported_reason("sendrecv", "fp32", None, "cpu") is None
    assert tb.unsupported_reason("allreduce", "fp32", "prod", "cpu")
    assert tb.unsupported_reason("allreduce", "fp32", "sum", "tpu")
    # nccl: everything, fp8 reductions where torch's NCCL has the fp8 types (>= 2.24).
    assert tb.unsupported_reason("allreduce", "int8", "avg", "cuda") is None
    assert tb.unsupported_reason("allgather", "fp8_e4m3", None, "cuda") is None
    fp8_sum = tb.unsupported_reason("allreduce", "fp8_e4m3", "sum", "cuda")
    assert (fp8_sum is None) == (tb._torch_nccl_version() >= (2, 24, 0))


@pytest.mark.parametrize(
    ("req", "kwargs"),
    [
        (CommRequest("allreduce", "fp8_e4m3", "sum", 4096, False), {}),
        (CommRequest("allreduce", "int32", "avg", 4096, False), {}),
        (CommRequest("alltoall", "fp32", None, 4096, True), {}),
        (CommRequest("sendrecv", "fp32", None, 4096, True), {}),
        (CommRequest("broadcast", "fp32", None, 4096, False, root=2), {}),
        (CommRequest("sendrecv", "fp32", None, 4096, False), {"nproc": 1}),
        (CommRequest("allreduce", "fp32", "sum", 4096, False), {"nproc": 0}),
        (CommRequest("allreduce", "fp32", "sum", 4096, False), {"device": "tpu"}),
        (CommRequest("allreduce", "fp32", "sum", 4096, False), {"timing": TimingOptions(graph=True)}),
    ],
)
def test_bad_requests_raise_before_starting_anything(req, kwargs):
    args = {"nproc": NPROC, "device": "cpu", "timing": FAST, "timeout_s": 10} | kwargs
    with pytest.raises(InputError):
        tb.run_sweep([req], **args)
    _assert_no_children()


# -- the data pattern: a port of csrc/comm_data.cu -----------------------------------------------

LIMITS = {"fp32": 2**24, "fp16": 2048, "bf16": 256, "fp64": 2**53, "int32": 2**31 - 1,
          "int8": 127, "fp8_e4m3": 16, "fp8_e5m2": 8}


@pytest.mark.parametrize(
    ("dtype", "nranks", "redop", "k", "scale"),
    [
        ("fp32", 8, "sum", 8, 1),
        ("fp16", 2, "avg", 8, 2),
        ("bf16", 8, "avg", 4, 8),  # 256 / (8 * 8)
        ("bf16", 64, "sum", 4, 1),  # 256 / 64
        ("int8", 32, "sum", 3, 1),  # floor(127 / 32)
        ("int8", 200, "max", 8, 1),  # max does not sum
        ("fp8_e4m3", 3, "sum", 5, 1),  # floor(16 / 3)
        ("fp8_e4m3", 2, "avg", 4, 2),  # 16 / (2 * 2)
        ("fp8_e4m3", 17, "sum", 0, 1),  # one-hot
        ("fp8_e5m2", 4, "avg", 0, 4),  # floor(8 / 16): one-hot, values n
        ("fp64", 1024, "avg", 8, 1024),
        ("int32", 1024, "sum", 8, 1),
    ],
)
def test_make_pattern_matches_the_native_rule(dtype, nranks, redop, k, scale):
    p = tr.make_pattern(dtype, True, redop, nranks)
    assert (p.k, p.scale, p.nranks) == (k, scale, nranks)
    summing = redop in ("sum", "avg")
    assert p.k == min(8, math.floor(LIMITS[dtype] / (nranks if summing else 1) / scale))
    # An op that does not reduce always gets the widest values, whatever the redop says.
    assert tr.make_pattern(dtype, False, redop, nranks) == tr.Pattern(min(8, LIMITS[dtype]), 1, nranks)


def _v_reference(p: tr.Pattern, r: int, i: int) -> int:
    """v(r, i) from the formula in csrc/comm_data.cuh, in Python integers."""
    def h(i: int, r: int) -> int:
        return ((i % 2**32) * 1103515245 + 12345 + r * 2246822519) % 2**32

    if p.k == 0:
        return p.scale if (h(i, 0) >> 16) % p.nranks == r else 0
    return ((h(i, r) >> 16) % (2 * p.k + 1) - p.k) * p.scale


def _v(p: tr.Pattern, r: int, i: int) -> int:
    return int(tr.pattern_values(p, r, torch.tensor([i], dtype=torch.int64))[0])


def test_pattern_values_by_hand():
    p = tr.Pattern(k=8, scale=1, nranks=2)  # values (x >> 16) mod 17 - 8
    # r=0, i=0: x = 12345, x >> 16 = 0                      -> -8
    # r=0, i=1: x = 1103527590, x >> 16 = 16838, mod 17 = 8  -> 0
    # r=1, i=0: x = 2246834864, x >> 16 = 34283, mod 17 = 11 -> 3
    assert [_v(p, 0, 0), _v(p, 0, 1), _v(p, 1, 0)] == [-8, 0, 3]
    # k=4, scale 2: 34283 mod 9 = 2 -> (2 - 4) * 2
    assert _v(tr.Pattern(k=4, scale=2, nranks=2), 1, 0) == -4
    # One-hot: the owner of i is (hash(i, 0) >> 16) mod n: 0 for i=0, 16838 mod 4 = 2 for i=1.
    one_hot = tr.Pattern(k=0, scale=4, nranks=4)
    assert [_v(one_hot, r, 0) for r in range(4)] == [4, 0, 0, 0]
    assert [_v(one_hot, r, 1) for r in range(4)] == [0, 0, 4, 0]
    # The index enters mod 2^32.
    assert _v(p, 1, 2**32 + 3) == _v(p, 1, 3) == -7


@pytest.mark.parametrize("pattern", [tr.Pattern(8, 1, 3), tr.Pattern(3, 5, 5), tr.Pattern(0, 4, 4)])
def test_pattern_values_match_the_formula_on_many_indices(pattern):
    idx = torch.cat([torch.arange(0, 300), torch.tensor([2**31 - 1, 2**32 - 1, 2**32, 5 * 2**32 + 7])])
    for r in range(pattern.nranks):
        got = tr.pattern_values(pattern, r, idx).tolist()
        assert got == [_v_reference(pattern, r, int(i)) for i in idx]


def test_expected_values_follow_the_expect_rules():
    p = tr.make_pattern("fp32", True, "max", 3)
    idx = torch.arange(0, 40)
    c = ops.op_counts("reducescatter", 3 * 40 * 4, "fp32", 3)
    e = tr.expect("reducescatter", 2, 3, 0, c)
    want = [max(_v_reference(p, r, 80 + i) for r in range(3)) for i in range(40)]
    assert tr.expected_values(e, p, "max", idx).tolist() == want
    c = ops.op_counts("alltoall", 3 * 40 * 4, "fp32", 3)
    e = tr.expect("alltoall", 1, 3, 0, c)  # block j holds rank j's block 1
    want = [_v_reference(p, i // 40, 40 + i % 40) for i in range(120)]
    assert tr.expected_values(e, p, None, torch.arange(0, 120)).tolist() == want
    assert tr.expect("sendrecv", 0, 3, 0, c).from_rank == 2
    assert not tr.expect("reduce", 1, 3, 0, c).defined


def test_count_wrong_is_exact_except_avg():
    p = tr.make_pattern("fp16", True, "avg", 2)
    c = ops.op_counts("allreduce", 64 * 2, "fp16", 2)
    e = tr.expect("allreduce", 0, 2, 0, c)
    want = tr.expected_values(e, p, "avg", torch.arange(0, 64))
    out = want.to(torch.float16)
    assert tr.count_wrong(out, e, p, "avg", "fp16") == 0
    out[3] = float("nan")
    out[5] = want[5] + 0.5 * max(1.0, abs(float(want[5])))
    assert tr.count_wrong(out, e, p, "avg", "fp16") == 2
    p = tr.make_pattern("int32", True, "sum", 2)
    ints = tr.expected_values(e, p, "sum", torch.arange(0, 64)).to(torch.int32)
    assert tr.count_wrong(ints, e, p, "sum", "int32") == 0
    ints[7] += 1
    assert tr.count_wrong(ints, e, p, "sum", "int32") == 1


# -- faults: reported, never hung, nothing left running -------------------------------------------


def test_timeout_stops_the_sweep_and_keeps_earlier_results():
    reqs = [
        CommRequest("allreduce", "fp32", "sum", 4096, inplace=True),
        # 512 MiB, the first of its series (nothing to project it from, so the sweep does not leave it
        # out): its least work, 2 warm-up, 3 + 3 timed and the check, is seconds of gloo anywhere.
        CommRequest("allreduce", "fp32", "sum", 512 << 20, inplace=False),
        CommRequest("allreduce", "fp32", "sum", 4096, inplace=False),
    ]
    calls = []
    # 2 s on an idle host, longer by the slowdown measured now: beside 8 busy processes 200 iterations
    # of 4 KiB took more than 2 s; 512 MiB's least work grows by as much
    timeout = scaled(2.0)
    t0 = time.monotonic()
    sweep = tb.run_sweep(reqs, nproc=NPROC, device="cpu", timeout_s=timeout,
                         timing=TimingOptions(warmup_iters=2, iters=200),
                         on_result=lambda i, raw: calls.append(i))
    elapsed = time.monotonic() - t0
    assert isinstance(sweep.error, CommTimeoutError)
    assert "allreduce" in str(sweep.error) and str(512 << 20) in str(sweep.error)
    assert not sweep.interrupted
    assert len(sweep.results) == 1 and calls == [0]
    _check_raw(reqs[0], sweep.results[0])
    assert elapsed < 30 * timeout
    _assert_no_children()


def test_interrupt_returns_what_completed():
    reqs = [CommRequest("allgather", "fp32", None, 4096, inplace=False)] * 4

    def stop(index, raw):
        raise KeyboardInterrupt

    sweep = tb.run_sweep(reqs, nproc=NPROC, device="cpu", timing=FAST, timeout_s=60, on_result=stop)
    assert sweep.interrupted and sweep.error is None
    assert len(sweep.results) == 1
    _check_raw(reqs[0], sweep.results[0])
    _assert_no_children()
