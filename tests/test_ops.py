from __future__ import annotations

import pytest

from mgpu_bench.core.errors import InputError
from mgpu_bench.results import ops


def test_registry_holds_every_op_in_display_order():
    assert tuple(ops.OPS) == ops.OP_ORDER
    assert ops.OPS["allreduce"].reduces and not ops.OPS["allgather"].reduces
    assert ops.OPS["broadcast"].rooted and ops.OPS["reduce"].rooted
    assert not ops.OPS["alltoall"].inplace and not ops.OPS["sendrecv"].inplace
    assert all(ops.OPS[o].inplace for o in ("allreduce", "allgather", "reducescatter", "broadcast", "reduce"))


@pytest.mark.parametrize(
    "op, n, factor",
    [("allreduce", 2, 1.0), ("allreduce", 8, 1.75), ("allreduce", 4, 1.5), ("allgather", 8, 0.875),
     ("reducescatter", 2, 0.5), ("alltoall", 4, 0.75), ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
     ("sendrecv", 8, 1.0)],
)
def test_busbw_factor_hand_computed(op, n, factor):
    assert ops.busbw_factor(op, n) == pytest.approx(factor)


# Hand-computed from nccl-tests' getCollByteCount rules.
@pytest.mark.parametrize(
    "op, size, dtype, n, expect",
    [
        ("allreduce", 1000, "fp32", 3, {"bytes": 1000, "count": 250, "send_count": 250, "recv_count": 250}),
        ("allreduce", 1001, "fp32", 3, {"bytes": 1000, "count": 250, "send_count": 250, "recv_count": 250}),
        ("allgather", 1000, "fp32", 3, {"bytes": 996, "count": 83, "send_count": 83, "recv_count": 249,
                                            "send_inplace_offset": 83, "recv_inplace_offset": 0}),
        ("reducescatter", 1000, "fp32", 3, {"bytes": 996, "count": 83, "send_count": 249, "recv_count": 83,
                                                "send_inplace_offset": 0, "recv_inplace_offset": 83}),
        ("alltoall", 1 << 20, "fp16", 3, {"bytes": 1048572, "count": 174762, "send_count": 524286,
                                              "recv_count": 524286}),
        ("broadcast", 7, "fp64", 2, {"bytes": 0, "count": 0}),
        ("sendrecv", 64, "int8", 8, {"bytes": 64, "count": 64}),
    ],
)
def test_op_counts(op, size, dtype, n, expect):
    c = ops.op_counts(op, size, dtype, n)
    for k, v in expect.items():
        assert c[k] == v, k


def test_buffer_bytes_follow_the_placement():
    # allgather 1 MiB fp32 over 2 ranks: 128K-element input, 256K-element output.
    assert ops.buffer_bytes("allgather", 1 << 20, "fp32", 2, inplace=False) == (1 << 19) + (1 << 20)
    assert ops.buffer_bytes("allgather", 1 << 20, "fp32", 2, inplace=True) == 1 << 20
    # reducescatter 1 MiB over 4 ranks out-of-place: the whole input plus a quarter of it.
    assert ops.buffer_bytes("reducescatter", 1 << 20, "fp32", 4, inplace=False) == (1 << 20) + (1 << 18)


def test_parse_ops():
    assert ops.parse_ops("all") == list(ops.OP_ORDER)
    assert ops.parse_ops("allreduce, all_gather,allreduce") == ["allreduce", "allgather"]
    with pytest.raises(InputError, match="unknown op 'allsum'"):
        ops.parse_ops("allsum")
    with pytest.raises(InputError):
        ops.parse_ops(",")


def test_parse_dtype():
    assert ops.parse_dtype("BF16") == "bf16"
    assert ops.parse_dtype("float") == "fp32"
    assert ops.parse_dtype("e5m2") == "fp8_e5m2"
    with pytest.raises(InputError, match="unknown dtype"):
        ops.parse_dtype("fp12")
