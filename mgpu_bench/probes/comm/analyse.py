"""What a comm sweep means: busbw against the theory of the path it ran on, the summary per op,
busbw above the link rate explained, the slow rank or node of a launcher's job, and the
verdicts the suite adds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mgpu_bench.machine import nccl_log
from mgpu_bench.results.measurement import CommMeasurement
from mgpu_bench.results.probe import OK, PROBLEM, WARNING, Finding
from mgpu_bench.results.sizes import format_bytes

if TYPE_CHECKING:
    from .plan import CommRun

LARGE = 64 << 20  # the summary's "large sizes": >= 64 MiB, where busbw has settled


def gbs(bytes_per_s: float) -> str:
    """A bandwidth in GB/s (10^9 bytes/s), without the unit, as every comm medium prints it (the
    terminal's table and lines, Markdown, HTML, the findings): two decimals from 1 GB/s up, as
    nccl-tests' columns; three significant digits below, so that a CPU run's small sizes read
    0.00293, never 0.00."""
    v = bytes_per_s / 1e9
    if v >= 1 or v <= 0 or not math.isfinite(v):
        return f"{v:.2f}"
    return f"{v:.{min(12, 2 - math.floor(math.log10(v)))}f}"


def plural(n: int, word: str) -> str:
    """'1 size', '2 sizes'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def no_theory_reason(run: CommRun) -> str | None:
    """Why the sweep's busbw is set against no link theory (None when it has one): said once below
    the terminal's tables, on the HTML page and in Markdown."""
    t = theory_dict(run.theory)
    if t and t.get("bandwidth"):
        return None
    why = "the ranks are CPU processes" if run.backend == "torch-gloo" else "no GPU topology was read"
    return f"no link theory: {why}, so %theo is n/a and busbw is not set against one"


def theory_dict(theory) -> dict | None:
    """A run's theory as stored: theory.RingTheory at run time, its dict once loaded."""
    if theory is None or isinstance(theory, dict):
        return theory
    return theory.to_dict()


def theory_for(run: CommRun, m: CommMeasurement):
    """The theory of the communicator `m` ran on: its scope's under a multi-node launch."""
    scoped = run.scope_theory or {}
    return scoped.get(m.spec.scope, run.theory) if m.spec.scope != "world" else run.theory


@dataclass(frozen=True)
class Series:
    """The measurements of one op on one communicator, in run order: what one table shows."""

    op: str
    scope: str
    group: str
    measurements: tuple[CommMeasurement, ...]

    @property
    def title(self) -> str:
        return self.op if self.scope == "world" else f"{self.op}, {self.scope} ({self.group})"


def series(run: CommRun) -> list[Series]:
    """World first per op, then each intra-node and inter-node communicator."""
    keys = list(dict.fromkeys((m.spec.op, m.spec.scope, m.spec.group) for m in run.measurements))
    order = {"world": 0, "intra-node": 1, "inter-node": 2}
    ops = list(dict.fromkeys(k[0] for k in keys))
    keys.sort(key=lambda k: (ops.index(k[0]), order.get(k[1], 3)))
    return [Series(op, scope, group, tuple(m for m in run.measurements
                                           if (m.spec.op, m.spec.scope, m.spec.group) == (op, scope, group)))
            for op, scope, group in keys]


def pct_theory(m: CommMeasurement, theory) -> float | None:
    """busbw as a percentage of the ring's per-direction theory (mgpu_bench.machine.theory)."""
    t = theory_dict(theory)
    bw = t.get("bandwidth") if t else None
    return 100.0 * m.busbw / bw if bw else None


def summary(run: CommRun) -> list[dict]:
    """Per op and placement: busbw at the largest size and the mean over sizes >= 64 MiB
    (not nccl-tests' mean over all sizes, which small-message latency drags down)."""
    out = []
    for sr in series(run):
        for inplace in dict.fromkeys(m.spec.inplace for m in sr.measurements):
            ms = [m for m in sr.measurements if m.spec.inplace == inplace]
            out.append(_summary_entry(sr, inplace, ms))
    return out


def _summary_entry(sr: Series, inplace: bool, ms: list[CommMeasurement]) -> dict:
    largest = max(ms, key=lambda m: m.spec.bytes)
    large = [m.busbw for m in ms if m.spec.size >= LARGE]  # as asked: 64M stays large after rounding
    return {
            "op": sr.op,
            "scope": sr.scope,
            "group": sr.group,
            "placement": "in-place" if inplace else "out-of-place",
            "largest_bytes": largest.spec.bytes,
            "busbw_at_largest": largest.busbw,
            "mean_busbw_large": sum(large) / len(large) if large else None,
            "large_sizes": len(large),
            "wrong": sum(m.total_wrong for m in ms),
    }


def explain_above_theory(run: CommRun) -> list[str]:
    """busbw above the link theory is never printed bare: say whether NCCL's model picks an
    algorithm the ring formula overstates (NVLS, CollNet), or that the theory must be wrong."""
    t = theory_dict(run.theory)
    if not t or not t.get("bandwidth"):
        return []
    out = []
    for m in run.measurements:
        if m.busbw <= t["bandwidth"]:
            continue
        algo = (run.algorithms or {}).get(f"{m.spec.op}@{m.spec.bytes}")
        what = f"{m.spec.op} {format_bytes(m.spec.bytes)} {m.spec.placement}: busbw {gbs(m.busbw)} GB/s " \
               f"is above the link theory {t['bandwidth'] / 1e9:.0f} GB/s"
        if nccl_log.overstating(algo):
            out.append(f"{what}: NCCL's model picks {algo}, whose in-switch reduction moves less data than the "
                       f"ring busbw formula assumes")
        else:
            out.append(f"{what} with no in-switch algorithm in NCCL's model: check the theory ({t['summary']})")
    return out


# A communicator (node or rail) is named when its busbw is this far below the median of its
# peers in the same scope, op and size, in at least STRAGGLER_SHARE of the sizes measured.
GROUP_GAP = 0.10
# In a synchronising collective the rank that starts late waits least, so it measures the
# shortest time; it is named when it measures this much less than the slowest rank...
RANK_GAP = 0.10
# ... in at least this share of the measurements (and at least MIN_MEASUREMENTS of them).
STRAGGLER_SHARE = 0.75
MIN_MEASUREMENTS = 3


def stragglers(measurements: Sequence[CommMeasurement], hosts: Sequence[str] | None = None) -> list[str]:
    """Findings naming the slow node or rail (communicators of one scope compared with each other)
    and the rank that arrives late (per-rank times within the world communicator)."""
    out = []
    by_key: dict[tuple, list[CommMeasurement]] = {}
    for m in measurements:
        if m.spec.scope != "world":
            by_key.setdefault((m.spec.scope, m.spec.op, m.spec.inplace, m.spec.bytes), []).append(m)
    slow: dict[tuple[str, str], list[float]] = {}  # (scope, group) -> gaps where it stood out
    seen: dict[str, int] = {}
    for (scope, *_), ms in by_key.items():
        if len(ms) < 2:
            continue
        seen[scope] = seen.get(scope, 0) + 1
        median = float(np.median([m.busbw for m in ms]))
        for m in ms:
            gap = 1 - m.busbw / median if median > 0 else 0.0
            if gap > GROUP_GAP:
                slow.setdefault((scope, m.spec.group), []).append(gap)
    for (scope, group), gaps in sorted(slow.items()):
        total = seen[scope]
        if total >= MIN_MEASUREMENTS and len(gaps) >= STRAGGLER_SHARE * total:
            what = "NVLink/PCIe inside that node" if scope == "intra-node" else "the NIC of that local rank"
            out.append(f"{scope} {group}: busbw {100 * float(np.median(gaps)):.0f}% below its peers' median in "
                       f"{len(gaps)} of {total} measurements: check {what}")
    world = [m for m in measurements if m.spec.scope == "world" and len(m.burst_seconds) > 1]
    if len(world) >= MIN_MEASUREMENTS:
        late: dict[int, list[float]] = {}
        for m in world:
            b = np.asarray(m.burst_seconds)
            r = int(b.argmin())
            gap = 1 - float(b[r] / b.max())
            if gap > RANK_GAP:
                late.setdefault(r, []).append(gap)
        for r, gaps in sorted(late.items()):
            if len(gaps) >= STRAGGLER_SHARE * len(world):
                where = f" on {hosts[r]}" if hosts and r < len(hosts) else ""
                out.append(f"rank {r}{where} measures {100 * float(np.median(gaps)):.0f}% less time per call than "
                           f"the slowest rank in {len(gaps)} of {len(world)} measurements: it reaches each "
                           "collective late and the others wait for it (a busy host CPU, a slower GPU or "
                           "its PCIe/NIC path)")
    return out


# busbw against the ring theory of the path (theory.py), at the largest size of the sweep. A
# healthy NVLink node gives 47-82% (2x H200 at 64 MiB-1 GiB, benchmarks/RESULTS.md); NCCL over
# SHM where NVLink allowed P2P gave 6%. Under COMM_LOW a path is wrong; under COMM_WEAK at a
# size where busbw has settled (>= COMM_SETTLED bytes) it deserves a look.
COMM_LOW = 0.25
COMM_WEAK = 0.50
COMM_SETTLED = 256 << 20


def judge(run: CommRun) -> list[Finding]:
    """The suite's verdicts on a sweep beside its findings: wrong elements (problems), busbw at
    the largest size against the theory of the path (a problem under COMM_LOW, a warning under
    COMM_WEAK once settled) with the transport NCCL used as the likely cause, and the main op's
    healthy figure (ok)."""
    out: list[Finding] = []
    transport = [f for f in run.findings if "where NVLink allows P2P" in f]
    t = theory_dict(run.theory) or {}
    bw = t.get("bandwidth")
    by_op: dict[str, dict] = {}
    for s in summary(run) if run.measurements else []:
        if s["op"] not in by_op or s["placement"] == "out-of-place":
            by_op[s["op"]] = s
    main = "allreduce" if "allreduce" in by_op else next(iter(by_op), None)
    for op, s in by_op.items():
        if s["wrong"]:
            out.append(Finding(PROBLEM, f"{op}: {s['wrong']} wrong element(s): the data did not arrive intact"))
        if not bw:
            continue
        share = s["busbw_at_largest"] / bw
        text = (f"{op} busbw {gbs(s['busbw_at_largest'])} GB/s at {format_bytes(s['largest_bytes'])}, "
                f"{100 * share:.0f}% of the {bw / 1e9:.0f} GB/s theory ({t.get('summary')})")
        if share < COMM_LOW or (share < COMM_WEAK and s["largest_bytes"] >= COMM_SETTLED):
            cause = (f": {transport[0]}" if transport else
                     ": NCCL's log names no slower transport; check mgpu-bench topo, NCCL_P2P_* / NCCL_IB_* and "
                     "NCCL_ALGO / NCCL_PROTO")
            out.append(Finding(PROBLEM if share < COMM_LOW else WARNING, text + cause))
        elif op == main:
            ceiling = f"; NCCL rings reach about {t['practical'] / 1e9:.0f} GB/s" if t.get("practical") else ""
            out.append(Finding(OK, text + ceiling))
    return out


def key_figure(run: CommRun) -> tuple[str, str]:
    """allreduce (else the first op) out-of-place at its largest size, against the theory."""
    rows = summary(run) if run.measurements else []
    if not rows:
        return "-", "-"
    ops = [s["op"] for s in rows]
    op = "allreduce" if "allreduce" in ops else ops[0]
    s = next((s for s in rows if s["op"] == op and s["placement"] == "out-of-place"),
             next(s for s in rows if s["op"] == op))
    fig = f"{op} {format_bytes(s['largest_bytes'])} busbw {gbs(s['busbw_at_largest'])} GB/s"
    t = theory_dict(run.theory) or {}
    if t.get("bandwidth"):
        return fig, f"{100 * s['busbw_at_largest'] / t['bandwidth']:.0f}% of {t['bandwidth'] / 1e9:.0f} GB/s theory"
    return fig, f"no link theory ({run.backend} ranks)"


def nvls_note(topology: dict | None, environ: dict) -> str | None:
    """When the user's environment switches NVLink SHARP off (NCCL_NVLS_ENABLE=0) on GPUs that
    reach an NVSwitch, what the figures do not show: NCCL's NVLS algorithms, which a training
    job on this node with NVLS allowed would use for allreduce and reducescatter, and whose busbw
    is above the ring's (the ring busbw formula no longer describes their traffic). The tool never
    sets the variable itself."""
    if environ.get("NCCL_NVLS_ENABLE") != "0" or not topology:
        return None
    switched = any(ln.get("remote_type") == "switch" for g in topology.get("gpus") or []
                   for ln in g.get("nvlinks") or [])
    if not switched:
        return None
    return ("NCCL_NVLS_ENABLE=0 is set in this environment: NCCL's NVLink SHARP (NVLS) algorithms are off on "
            "these NVSwitch-connected GPUs, so these figures are the ring/tree ones; a job with NVLS allowed gets "
            "NVLS for allreduce and reducescatter from NCCL's tuning, with busbw above the ring's")
