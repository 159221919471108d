# Type stub of the compiled module (csrc/module.cpp). Private: import mgpu_bench instead.
from typing import Any

__version__: str
NCCL_HEADER_VERSION: int
HAVE_NCCL_FP8: bool

def ops() -> list[dict[str, Any]]: ...
def dtypes() -> list[str]: ...
def dtype_size(name: str) -> int: ...
def op_counts(op: str, bytes: int, dtype: str, nranks: int) -> dict[str, int]: ...
def device_count() -> int: ...
def device_info(index: int) -> dict[str, Any]: ...
def mem_get_info(index: int) -> tuple[int, int]: ...
def driver_version() -> int: ...
def runtime_version() -> int: ...
def nccl_version() -> int: ...
def cublaslt_version() -> int: ...
def nccl_unique_id() -> bytes: ...
def _raise_library_error(library: str) -> None: ...
def can_access_peer(a: int, b: int) -> bool: ...
def links_copy(src: int, dst: int, bytes: int, engine: str, bidirectional: bool, warmup: int, iters: int) -> dict[str, Any]: ...
def links_read_latency(reader: int, owner: int, span_bytes: int, loads: int, iters: int) -> list[float]: ...
def links_host_copy(device: int, bytes: int, to_device: bool, warmup: int, iters: int) -> list[float]: ...

class MeasureArgs:
    op: str
    dtype: str
    redop: str
    bytes: int
    inplace: bool
    root: int
    warmup_iters: int
    iters: int
    min_time_s: float
    min_iters: int
    max_iters: int
    graph: bool
    check: bool
    sample_target_s: float
    corrupt_rank: int
    fail_rank: int
    def __init__(self) -> None: ...

class CommSession:
    alive: bool
    nranks: int
    first_rank: int
    devices: list[int]
    timeout: float
    def __init__(self, devices: list[int], nranks: int, first_rank: int, unique_id: bytes, timeout_s: float) -> None: ...
    def measure(self, args: MeasureArgs) -> dict[str, Any]:
        """{counts, iters, batch, burst_seconds: [per rank], samples: ndarray[ranks, n], wrong: [per rank],
        first_wrong: [per rank: index of the first wrong element, -1 none], first_wrong_got,
        first_wrong_want: [per rank: that element as read and as expected], warmup_seconds_per_iter}"""
    def abort(self) -> None: ...

class GemmProbe:
    """cuBLASLt GEMMs on one GPU; dtype fp64/fp32/tf32/fp16/bf16/fp8, layout NN/NT/TN/TT,
    init 0 uniform [-1, 1), 1 normal, 2 uniform [0, 1)."""

    stopped: bool
    arena_bytes: int
    device: int
    def __init__(self, device: int, dtype: str, layout: str, max_m: int, max_n: int, max_k: int,
                 workspace: int, seed: int, fp8_fast_accum: bool = False, init: int = 0) -> None: ...
    def measure(self, m: int, n: int, k: int, candidates: int, samples: int, sample_s: float, warmup: int,
                check: bool) -> dict[str, Any]:
        """{candidates: [{index, algo_id, tile, stages, split_k, reduction, swizzle, custom, cluster,
        workspace, waves, seconds: [per burst], iters_per_sample, max_error, error}], buffer_sets,
        checked_elements}"""
    def sustain(self, m: int, n: int, k: int, index: int, duration_s: float,
                interval_s: float) -> list[tuple[float, float]]: ...
    def stop(self) -> None: ...

class SdcProbe:
    """Deterministic work on one GPU for `mgpu-bench sdc`: a bf16/fp16 GEMM (column-major, NN,
    inputs from `seed` by a counter-based generator) with one pinned cuBLASLt algorithm (no
    split-K, no reduction), each output hashed on the GPU; an HBM pattern check."""

    stopped: bool
    reference_hash: int
    has_reference: bool
    hbm_bytes: int
    device: int
    def __init__(self, device: int, dtype: str, m: int, n: int, k: int, seed: int) -> None: ...
    def select_algo(self) -> dict[str, Any]:
        """Pins the heuristic's first algorithm without split-K or reduction: {blob: bytes, algo_id, tile,
        stages, split_k, reduction, swizzle, custom, cluster, workspace}."""
    def set_algo(self, blob: bytes) -> dict[str, Any]:
        """Pins another probe's algorithm (checked on this GPU); the same description."""
    def gemm(self, count: int, corrupt_gemm: int = -1, corrupt_element: int = 0) -> dict[str, Any]:
        """{hashes: [per GEMM], seconds: [per GEMM], differs, made_reference}; stops after the first GEMM
        whose hash differs from the reference (the probe's first GEMM). corrupt_*: a test hook."""
    def output(self, reference: bool) -> Any:
        """D or the reference copy: numpy uint16 array of m*n raw elements, column-major."""
    def hbm_allocate(self, bytes: int) -> None: ...
    def hbm_release(self) -> None: ...
    def hbm_check(self, seed: int, corrupt_word: int = -1) -> dict[str, Any]:
        """{bytes, mismatches (8-byte words), first_word (-1 none), first_got, first_want, write_seconds,
        read_seconds}; corrupt_word: a test hook."""
    def stop(self) -> None: ...

def sdc_hash(device: int, data: bytes) -> int:
    """The sdc probe's hash of `data` (zero-padded to whole 8-byte words), computed on GPU `device`."""

def memory_allocators() -> list[str]:
    """Allocators memory_churn runs: "cudaMalloc", "async" (stream-ordered, own pool, release
    threshold UINT64_MAX), "vmm" (cuMemCreate/cuMemMap per allocation)."""
def memory_patterns() -> list[str]:
    """Churn patterns: "interleaved", "grow-shrink", "small-between-large"."""
def memory_churn(device: int, allocator: str, pattern: str, seed: int = 0,
                 budget_fraction: float = 0.9) -> dict[str, Any]:
    """Runs one churn pattern (holding at most budget_fraction of the free memory), then finds
    the largest block the same allocator can still allocate (binary search, 2 MiB steps), frees
    everything. Raw numbers, bytes and host seconds:
    {allocator, pattern, free_before, total, budget, free_after_pattern, held_bytes,
    allocations_done, allocations_failed (0, or 1 when a failed allocation ended the pattern),
    largest_block, search_seconds, search_probes, pool_reserved, pool_used (None unless
    "async"; memory free to the job is then free_after_pattern + pool_reserved - pool_used),
    events: [("alloc" | "free", bytes, seconds) per call of the pattern, in order]}.
    Unknown names raise ValueError."""
def _memory_churn_simulated(pattern: str, seed: int, budget_fraction: float,
                            capacity: int) -> dict[str, Any]:
    """memory_churn's result for a simulated first-fit arena of `capacity` bytes (allocator
    "simulated"; no CUDA call). For tests."""
def hbm_kinds() -> list[str]:
    """Measurements hbm_bandwidth runs: "copy_ce", "copy_sm", "read", "write"."""
def hbm_bandwidth(device: int, kind: str, bytes: int = 4 << 30, warmup: int = 3,
                  iters: int = 20) -> dict[str, Any]:
    """One GPU's memory bandwidth, `bytes` per buffer (rounded down to 16):
    {seconds: [per repetition, CUDA events], bytes_read, bytes_written} (per repetition; copies
    read and write `bytes`, "read" writes 4 bytes per block, "write" reads nothing)."""
