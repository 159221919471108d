"""The collectives, their size rules and bandwidth formulas.

algbw = size / time. busbw rescales algbw by the share of the data each rank must move over its
busiest link in the bandwidth-optimal algorithm, so that one figure can be set against the link
rate whatever the op and rank count (the formulas of NVIDIA's nccl-tests, doc/PERFORMANCE.md):

    allreduce                          busbw = algbw * 2(n-1)/n
    allgather, reducescatter, alltoall busbw = algbw * (n-1)/n
    broadcast, reduce, sendrecv        busbw = algbw

`size` is what nccl-tests' size column means: the per-rank buffer for allreduce, broadcast,
reduce and sendrecv; the whole gathered output for allgather; the whole input for
reducescatter; the whole per-rank buffer for alltoall. The native core rounds it down to what
the op and rank count allow (see op_counts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mgpu_bench.core.errors import InputError

# Display order (also the order of `--ops all`).
OP_ORDER = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "sendrecv")
DEFAULT_OPS = ("allreduce", "allgather")
DTYPES = ("fp32", "fp16", "bf16", "fp64", "int32", "int8", "fp8_e4m3", "fp8_e5m2")
DTYPE_ALIASES = {
    "float": "fp32", "float32": "fp32", "half": "fp16", "float16": "fp16", "bfloat16": "bf16",
    "double": "fp64", "float64": "fp64", "int": "int32", "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "float8": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
}
REDOPS = ("sum", "max", "min", "avg")


@dataclass(frozen=True)
class OpInfo:
    name: str
    reduces: bool
    rooted: bool
    inplace: bool


@functools.cache
def _registry() -> dict[str, OpInfo]:
    """The ops the native core implements (one file each under csrc/ops/), in display order."""
    from mgpu_bench import _native

    native = {d["name"]: OpInfo(d["name"], d["reduces"], d["rooted"], d["inplace"]) for d in _native.ops()}
    return {name: native[name] for name in OP_ORDER if name in native}


def __getattr__(name: str):
    if name == "OPS":  # read from the native module on first use: the formulas below need no GPU code
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def busbw_factor(op: str, nranks: int) -> float:
    """busbw / algbw for `op` over `nranks` ranks (nccl-tests' formulas, above)."""
    n = nranks
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise InputError(f"unknown op '{op}'")


def parse_ops(text: str) -> list[str]:
    """'allreduce,allgather' or 'all' -> names, checked against the registry."""
    if text.strip().lower() == "all":
        return list(_registry())
    out = []
    for part in text.split(","):
        name = part.strip().lower().replace("_", "").replace("-", "")
        if not name:
            continue
        if name not in _registry():
            raise InputError(f"unknown op '{part.strip()}': choose from {', '.join(_registry())} or all")
        if name not in out:
            out.append(name)
    if not out:
        raise InputError("--ops is empty: name one or more of " + ", ".join(_registry()))
    return out


def parse_dtype(text: str) -> str:
    name = text.strip().lower().replace("-", "_")  # fp8-e4m3 as gemm takes it
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise InputError(f"unknown dtype '{text}': choose from {', '.join(DTYPES)}")
    return name


def dtype_size(dtype: str) -> int:
    from mgpu_bench import _native

    return int(_native.dtype_size(dtype))


def op_counts(op: str, size: int, dtype: str, nranks: int) -> dict:
    """Element counts for one measurement; ``bytes`` is the size after rounding."""
    from mgpu_bench import _native

    return dict(_native.op_counts(op, size, dtype, nranks))


def buffer_bytes(op: str, size: int, dtype: str, nranks: int, inplace: bool) -> int:
    """Device memory one rank needs for a measurement (the native core's rule): out-of-place a
    send and a receive buffer, in-place one buffer holding both regions."""
    c = op_counts(op, size, dtype, nranks)
    elems = max(c["send_count"], c["recv_count"]) if inplace else c["send_count"] + c["recv_count"]
    return elems * dtype_size(dtype)
