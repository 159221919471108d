"""What an sdc run means, in pure Python and numpy on the records (so that tests can plant a
differing buffer or hash and see the finding): the hash the GPU computes, the first differing
element of two buffers, which GPU disagrees with its peers, the verdict per GPU, the findings.

Verdicts, per GPU:
    ok        every check agreed
    unstable  a GEMM gave another result than the GPU's own first one (the same inputs, the same
              algorithm: only faulty hardware changes it)
    mismatch  the GPU's GEMM result differs from that of the other GPUs of its model (same name
              and SM count: cuBLAS gives bitwise the same results only there); the majority is
              taken as right, and with no majority every GPU of the group is named
    wrong     an HBM word read back other than written, or an allreduce element differs from the
              exact sum (which passes every GPU and link: the GPU named is where it was read)
A GPU with several is named for each; its verdict is the first of them in this order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mgpu_bench.results.probe import OK, PROBLEM, Finding

from .result import COMM_DTYPE, Check, SdcRun, shape_text

VERDICTS = ("ok", "unstable", "mismatch", "wrong")
HASH_BLOCKS = 1024  # csrc/sdc.cu's kHashBlocks: the fixed grid the block sums are taken over
_M64 = (1 << 64) - 1


# ------------------------------------------------------------------------------------ the hash

def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic, as on the GPU)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _mix_int(x: int) -> int:
    return int(_mix(np.array([x & _M64], dtype=np.uint64))[0])


def hash_words(data: bytes | np.ndarray) -> int:
    """csrc/sdc.cu's hash of a buffer, on the host: the buffer as little-endian 8-byte words w_i
    (zero-padded), per block b of HASH_BLOCKS contiguous shares S_b = sum of mix64(w_i ^
    mix64(i)) mod 2^64, then h = mix64(nwords), h = mix64(h ^ S_b) in block order."""
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    raw += b"\0" * (-len(raw) % 8)
    words = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
    n = words.size
    chunk = -(-n // HASH_BLOCKS)
    sums = np.zeros(HASH_BLOCKS, dtype=np.uint64)
    if n:
        with np.errstate(over="ignore"):
            terms = _mix(words ^ _mix(np.arange(n, dtype=np.uint64)))
        padded = np.zeros(HASH_BLOCKS * chunk, dtype=np.uint64)
        padded[:n] = terms
        sums = padded.reshape(HASH_BLOCKS, chunk).sum(axis=1, dtype=np.uint64)
    h = _mix_int(n)
    for s in sums:
        h = _mix_int(h ^ int(s))
    return h


# ------------------------------------------------------------------------------------ locating

def bits_value(bits: int, dtype: str) -> float:
    """The number a 16-bit element of `dtype` (bf16 or fp16) holds."""
    if dtype == "fp16":
        return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])
    return float((np.array([bits], dtype=np.uint32) << np.uint32(16)).view(np.float32)[0])


def _element(bits: int, dtype: str) -> str:
    return f"{bits_value(bits, dtype):.6g} (0x{bits:04x})"


def first_difference(a: np.ndarray, b: np.ndarray) -> tuple[int, int] | None:
    """(index of the first element where a and b differ, how many differ), or None."""
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    if a.shape != b.shape:
        raise ValueError(f"buffers of {a.size} and {b.size} elements cannot be compared")
    neq = a != b
    if not neq.size:
        return None
    i = int(np.argmax(neq))
    return (i, int(np.count_nonzero(neq))) if neq[i] else None


def locate_gemm(got: np.ndarray, want: np.ndarray, m: int, dtype: str, against: str) -> dict:
    """Where two GEMM outputs (raw 16-bit elements of a column-major m-row D) first differ:
    {index, where: "D[row, column]", got, want (value and bits), against (what `want` is),
    differing, elements}; index None when no element differs (the hash, or the read of D for
    it, came out different)."""
    found = first_difference(np.asarray(got, dtype=np.uint16), np.asarray(want, dtype=np.uint16))
    size = int(np.asarray(got).size)
    if found is None:
        return {"index": None, "where": "no element of the copies read back differs", "got": None, "want": None,
                "against": against, "differing": 0, "elements": size}
    i, count = found
    return {"index": i, "where": f"D[{i % m}, {i // m}]", "got": _element(int(np.asarray(got).ravel()[i]), dtype),
            "want": _element(int(np.asarray(want).ravel()[i]), dtype), "against": against, "differing": count,
            "elements": size}


def locate_word(word: int, got: int, want: int, nbytes: int) -> dict:
    """The first HBM word that read back wrong (the GPU located it): its byte offset, both values
    and how many bits differ."""
    return {"index": int(word), "where": f"byte offset {8 * int(word):#x} of {nbytes / 2**30:.2f} GiB",
            "got": f"0x{int(got):016x}", "want": f"0x{int(want):016x}", "against": "the pattern written",
            "bits": (int(got) ^ int(want)).bit_count()}


def locate_element(index: int, got: float, want: float) -> dict:
    """The first allreduce element that differs from the exact sum (the GPU located it)."""
    return {"index": int(index), "where": f"element {int(index)}", "got": f"{got:g}", "want": f"{want:g}",
            "against": "the exact sum"}


# ------------------------------------------------------------------------------------ peers

def peer_groups(devices: Sequence[Mapping]) -> dict[tuple[str, int], list[int]]:
    """GPU indices by (model name, SM count): cuBLAS promises bitwise-equal results only between
    GPUs of one architecture and SM count."""
    groups: dict[tuple[str, int], list[int]] = {}
    for d in devices:
        groups.setdefault((str(d.get("name") or ""), int(d.get("multiprocessors") or 0)), []).append(int(d["index"]))
    return groups


def peer_mismatches(references: Mapping[int, str], devices: Sequence[Mapping]) -> list[dict]:
    """GPUs whose first GEMM hash differs from their peers': [{gpu, against (the GPU compared
    with), majority (a strict majority of the group holds against's hash), hash, expected,
    peers (the GPUs that agree with against)}]. With a majority, its lowest GPU is the one
    compared with; without one every GPU of the group is listed, each against the lowest GPU
    holding another hash."""
    out: list[dict] = []
    for gpus in peer_groups(devices).values():
        have = sorted(g for g in gpus if references.get(g))
        by_hash: dict[str, list[int]] = {}
        for g in have:
            by_hash.setdefault(references[g], []).append(g)
        if len(by_hash) < 2:
            continue
        biggest = max(by_hash.values(), key=lambda gs: (len(gs), -min(gs)))
        majority = 2 * len(biggest) > len(have)
        for g in have:
            if majority and g in biggest:
                continue
            if g in biggest:
                against = min(x for x in have if references[x] != references[g])
            else:
                against = min(biggest)
            out.append({"gpu": g, "against": against, "majority": majority, "hash": references[g],
                        "expected": references[against], "peers": by_hash[references[against]]})
    return out


# ------------------------------------------------------------------------------------ verdicts

def verdicts(run: SdcRun) -> dict[int, dict]:
    """{gpu: {verdict, issues}}: issues in VERDICTS order, the verdict the first (ok: none)."""
    peers = {pm["gpu"] for pm in peer_mismatches(run.references, run.devices)}
    out = {}
    for d in run.devices:
        g = d["index"]
        issues = []
        if any(c.wrong for c in run.checks_of(g, "gemm")):
            issues.append("unstable")
        if g in peers:
            issues.append("mismatch")
        if any(c.wrong for c in run.checks_of(g) if c.work in ("hbm", "collective")):
            issues.append("wrong")
        out[g] = {"verdict": issues[0] if issues else "ok", "issues": issues}
    return out


def _gpu(run: SdcRun, g: int) -> str:
    name = run.device(g).get("name")
    return f"GPU {g} ({name})" if name else f"GPU {g}"


def _gpus(gs: Sequence[int]) -> str:
    gs = sorted(gs)
    return f"GPU {gs[0]}" if len(gs) == 1 else "GPUs " + ", ".join(map(str, gs[:-1])) + f" and {gs[-1]}"


def _gemm_name(run: SdcRun) -> str:
    return f"{run.config.dtype} GEMM {shape_text(run.config.shape)}"


def _first_text(first: Mapping | None, here: str = "here") -> str:
    if not first:
        return "not located"
    if first.get("index") is None:
        return f"{first.get('where')} (compared with {first.get('against')})"
    text = f"{first['where']}: {first['got']} {here}, {first['want']} in {first['against']}"
    if first.get("bits"):
        text += f" ({first['bits']} bit{'s differ' if first['bits'] != 1 else ' differs'})"
    if first.get("differing"):
        text += f"; {first['differing']} of {first['elements']} elements differ"
    return text


def _unstable(run: SdcRun, g: int, bad: list[Check]) -> str:
    total = len(run.checks_of(g, "gemm"))
    c = bad[0]
    which = f"repetition {c.repetition}, GEMM {(c.first or {}).get('gemm', c.count)}"
    return (f"{_gpu(run, g)} is unstable: its {_gemm_name(run)} gave another result than its own first one in "
            f"{len(bad)} of {total} repetition(s) (first in {which}, hash {c.hash}); first differing element "
            f"{_first_text(c.first)}")


def _mismatch(run: SdcRun, pm: Mapping, located: Mapping | None) -> str:
    g = pm["gpu"]
    first = (located or {}).get("first")
    where = "first differing element " + _first_text(first)
    if pm["majority"]:
        return (f"{_gpu(run, g)} mismatches its peers: its {_gemm_name(run)} hash {pm['hash']} differs from "
                f"{_gpus(pm['peers'])} ({pm['expected']}); {where}")
    return (f"{_gpu(run, g)} disagrees with GPU {pm['against']} on the {_gemm_name(run)} ({pm['hash']} against "
            f"{pm['expected']}) and no majority of its model says which is right; {where}; run on more GPUs "
            "or compare the hashes with another node's")


def _wrong(run: SdcRun, g: int, work: str, bad: list[Check]) -> str:
    total = len(run.checks_of(g, work))
    c = bad[0]
    items = sum(x.wrong for x in bad)
    if work == "hbm":
        return (f"{_gpu(run, g)} HBM: {items} 8-byte word(s) read back other than written in {len(bad)} of {total} "
                f"repetition(s) over {c.bytes / 2**30:.2f} GiB (the first in repetition {c.repetition} at "
                f"{_first_text(c.first, 'read')})")
    n = len(run.devices)
    return (f"{_gpu(run, g)} collective: the {COMM_DTYPE} allreduce (sum of exact integers, {c.bytes / 2**20:g} MiB, "
            f"{n} GPU(s)) read back {items} wrong element(s) in {len(bad)} of {total} repetition(s) (the first in "
            f"repetition {c.repetition} at {_first_text(c.first, 'read')}); the sum passes every GPU and link, so "
            "the fault may lie on another")


def findings(run: SdcRun) -> list[Finding]:
    """Each disagreement, naming the GPU, the work and the first differing element (problems),
    then what limits the comparison (warnings)."""
    out: list[Finding] = []
    peers = {pm["gpu"]: pm for pm in peer_mismatches(run.references, run.devices)}
    located = {d["gpu"]: d for d in run.peer_differences}
    for d in run.devices:
        g = d["index"]
        bad = [c for c in run.checks_of(g, "gemm") if c.wrong]
        if bad:
            out.append(Finding(PROBLEM, _unstable(run, g, bad)))
        if g in peers:
            out.append(Finding(PROBLEM, _mismatch(run, peers[g], located.get(g))))
        for work in ("hbm", "collective"):
            bad = [c for c in run.checks_of(g, work) if c.wrong]
            if bad:
                out.append(Finding(PROBLEM, _wrong(run, g, work, bad)))
    alone = [gs[0] for gs in peer_groups(run.devices).values() if len(gs) == 1]
    if run.references and alone:
        # Information, not a warning: a one-GPU node (or a model alone in a node) is healthy as such;
        # across nodes `fleet` compares the hashes.
        out.append(Finding(OK, f"{_gpus(alone)} had no peer of its model here: its GEMM hash was compared "
                               "with its own repetitions only; compare it with another node's (the same "
                               "--dtype, --shape, --seed and cuBLASLt version)"))
    return out


def summary(run: SdcRun) -> str:
    """The run in one line: what was checked and how much, per GPU."""
    gemms = sum(c.count for c in run.checks_of(None, "gemm"))
    hbm = run.checks_of(None, "hbm")
    per_gpu = max(1, len(run.devices))
    parts = [f"{run.repetitions} repetition(s) on {per_gpu} GPU(s)",
             f"{gemms // per_gpu} {run.config.dtype} GEMMs {shape_text(run.config.shape)} per GPU hashed"]
    hashes = sorted(set(run.references.values()))
    if len(hashes) == 1:
        parts[-1] += f" (hash {hashes[0]})"
    if hbm:
        parts.append(f"HBM {max(c.bytes for c in hbm) / 2**30:.1f} GiB per GPU written and read back "
                     f"{len(hbm) // per_gpu} time(s)")
    coll = run.checks_of(None, "collective")
    if coll:
        parts.append(f"{len(coll) // per_gpu} {COMM_DTYPE} allreduce(s) of {coll[0].bytes / 2**20:g} MiB checked")
    return "; ".join(parts)


def judge(run: SdcRun) -> list[Finding]:
    """What the suite adds to the findings: one ok line saying what agreed, when nothing failed
    (the findings themselves the suite takes from findings(): not repeated here)."""
    if any(f.severity == PROBLEM for f in findings(run)) or not run.checks:
        return []
    return [Finding(OK, f"no silent data corruption: every check agreed bit for bit ({summary(run)})")]


def failure(run: SdcRun) -> str | None:
    bad = {g: v for g, v in verdicts(run).items() if v["verdict"] != "ok"}
    if not bad:
        return None
    words = {"unstable": "unstable", "mismatch": "mismatches its peers", "wrong": "wrong data"}
    return "silent data corruption: " + ", ".join(f"GPU {g} {', '.join(words[i] for i in v['issues'])}"
                                                  for g, v in sorted(bad.items())) + " (see the findings)"


def key_figure(run: SdcRun) -> tuple[str, str]:
    v = verdicts(run)
    bad = sorted(g for g, x in v.items() if x["verdict"] != "ok")
    named = ", ".join(f"GPU {g} {v[g]['verdict']}" for g in bad)
    figure = f"{len(bad)} of {len(v)} GPU(s) disagree ({named})" if bad else f"{len(run.checks)} checks, all agree"
    return figure, "bitwise agreement: across GPUs of a model, repetitions, the known pattern and the exact sum"
