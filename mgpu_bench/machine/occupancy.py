"""Who else is on the GPUs: the compute processes NVML lists per GPU, told apart into ours (this
process, its children, and under a launcher the other ranks of the job: the processes that share
our parent) and the others, with their memory and the GPU's utilisation.

A probe's figures on a GPU that another job also uses are not that GPU's: every command reads
this before its run and again at its end (runner.py), prints a foreign process first, stores it in
the result document ("occupancy"), and the probes name it as the cause of a slow GPU or an
out-of-memory. A process whose pid this process cannot see (another pid namespace: a container
beside ours) is listed with its owner unknown; it counts as foreign only in the snapshot taken
before this process touched the GPU, when none of ours can be there yet.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GpuProcess:
    gpu: int  # the caller's GPU index (CUDA)
    pid: int
    name: str | None  # from /proc/PID/comm, or NVML, where visible
    used_bytes: int | None  # the GPU memory NVML says the process holds
    owner: str  # "ours", "foreign" or "unknown" (the pid is not visible from this process)
    # Whether the GPU ran kernels when the run started, before any of ours (NVML utilisation above
    # 0%): False is a process that only holds memory (an idle notebook, a test harness), which
    # lowers what fits but not the figures; None: not known (it came during the run).
    busy: bool | None = None

    def describe(self) -> str:
        held = f", {self.used_bytes / 2**30:.1f} GiB" if self.used_bytes else ""
        return f"pid {self.pid} ({self.name or 'name not visible'}{held})"


def _parent(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        return int(text.rsplit(")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def _name(pid: int, proc: str) -> str | None:
    try:
        with open(f"{proc}/{pid}/comm") as f:
            return f.read().strip() or None
    except OSError:
        return None


def owner(pid: int, proc: str = "/proc", me: int | None = None, launched: bool | None = None) -> str:
    """"ours" when `pid` is this process, one of its descendants, or (under a launcher) a
    descendant of this process's parent, the agent that started every rank of the node;
    "unknown" when /proc does not show it; else "foreign"."""
    me = os.getpid() if me is None else me
    if pid == me:
        return "ours"
    if not os.path.exists(f"{proc}/{pid}"):
        return "unknown"
    if launched is None:
        from mgpu_bench.core.launch import detect

        launched = detect() is not None
    roots = {me}
    if launched:
        parent = _parent(me, proc)
        if parent and parent > 1:
            roots.add(parent)
    seen = 0
    p: int | None = pid
    while p and p > 1 and seen < 64:
        if p in roots:
            return "ours"
        p = _parent(p, proc)
        seen += 1
    return "foreign"


def snapshot(bus_ids: Mapping[int, str], nvml=None, proc: str = "/proc") -> dict:
    """Per GPU (by the caller's index): its processes (GpuProcess as dicts), memory used and
    total (bytes) and utilisation (%). {"error": why} when NVML cannot be read; a GPU NVML does
    not find is left out with a warning."""
    from .telemetry import handle_by_bus_id
    from .topo import _open

    nv, status = _open(nvml)
    if nv is None:
        return {"error": status.get("error") or "NVML unavailable", "gpus": {}}
    out: dict = {"error": None, "gpus": {}, "warnings": []}
    try:
        for index, bus in bus_ids.items():
            handle, why = handle_by_bus_id(nv, bus)
            if handle is None:
                out["warnings"].append(f"GPU {index}: no NVML handle for bus id {bus!r}: {why}")
                continue
            errs: list[str] = []
            procs = []
            for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                for p in nv.call(errs, f"GPU {index} processes", fn, handle) or []:
                    pid = int(getattr(p, "pid", 0) or 0)
                    if not pid or any(x["pid"] == pid for x in procs):
                        continue
                    used = getattr(p, "usedGpuMemory", None)
                    name = _name(pid, proc)
                    if name is None:
                        raw = nv.call(None, "", "nvmlSystemGetProcessName", pid)
                        name = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
                    procs.append(asdict(GpuProcess(index, pid, name, int(used) if isinstance(used, int) and
                                                   used < (1 << 60) else None, owner(pid, proc))))
            mem = nv.call(errs, f"GPU {index} memory", "nvmlDeviceGetMemoryInfo", handle)
            util = nv.call(errs, f"GPU {index} utilisation", "nvmlDeviceGetUtilizationRates", handle)
            out["gpus"][str(index)] = {
                "processes": procs,
                "memory_used": getattr(mem, "used", None),
                "memory_total": getattr(mem, "total", None),
                "utilization": getattr(util, "gpu", None),
            }
            out["warnings"] += errs
    finally:
        with contextlib.suppress(Exception):  # shutting down: nothing left to report to
            nv.mod.nvmlShutdown()
    return out


class Watch:
    """The GPUs' occupancy before a run (taken at construction, before this process touches
    them) and at check(): the foreign processes seen in either."""

    def __init__(self, bus_ids: Mapping[int, str], nvml=None, proc: str = "/proc") -> None:
        self.bus_ids, self.nvml, self.proc = dict(bus_ids), nvml, proc
        self.before = snapshot(self.bus_ids, nvml, proc) if self.bus_ids else {"error": "no GPU", "gpus": {}}
        self.after: dict | None = None

    def check(self) -> list[GpuProcess]:
        """Takes the snapshot at the end (once) and returns the foreign processes."""
        if self.after is None:
            self.after = snapshot(self.bus_ids, self.nvml, self.proc) if self.bus_ids else self.before
        return foreign(self.before, self.after)

    def to_dict(self) -> dict:
        found = self.check()
        return {"before": self.before, "after": self.after, "foreign": [asdict(p) for p in found]}


def foreign(before: Mapping, after: Mapping | None = None) -> list[GpuProcess]:
    """The processes not ours: any not ours before the run (an unknown owner included: none of
    ours could be there yet), and those that came during it that are visibly someone else's; per
    GPU the one holding the most memory first (the one a one-line verdict names)."""
    out: dict[tuple[int, int], GpuProcess] = {}
    for snap, strict in ((before, False), (after or {}, True)):
        for g in (snap.get("gpus") or {}).values():
            util = g.get("utilization")
            busy = None if strict or not isinstance(util, (int, float)) else util > 0
            for p in g.get("processes") or []:
                if p["owner"] == "foreign" or (p["owner"] == "unknown" and not strict):
                    out.setdefault((p["gpu"], p["pid"]), GpuProcess(**{**p, "busy": busy}))
    return sorted(out.values(), key=lambda p: (p.gpu, -(p.used_bytes or 0), p.pid))  # the largest holder first


def from_document(doc: Mapping) -> list[GpuProcess]:
    """The foreign processes a result document recorded ([] for documents before this field)."""
    occ = doc.get("occupancy") if isinstance(doc.get("occupancy"), Mapping) else {}
    out = []
    for p in occ.get("foreign") or []:
        try:
            out.append(GpuProcess(**p))
        except TypeError:
            continue
    return out


def findings_text(found: list[GpuProcess], snap: Mapping | None = None) -> list[str]:
    """One line per GPU shared with another process: who, and how much of the GPU's memory."""
    by_gpu: dict[int, list[GpuProcess]] = {}
    for p in found:
        by_gpu.setdefault(p.gpu, []).append(p)
    lines = []
    for gpu, procs in sorted(by_gpu.items()):
        total = ((snap or {}).get("gpus") or {}).get(str(gpu), {}).get("memory_total")
        held = sum(p.used_bytes or 0 for p in procs)
        share = f"; they hold {held / 2**30:.1f} of {total / 2**30:.0f} GiB" if total and held else ""
        if all(p.busy is False for p in procs):
            lines.append(f"GPU {gpu} holds memory of {', '.join(p.describe() for p in procs)}{share}, which ran no "
                         "kernels when the run started (0% utilisation): it lowers what fits; the figures are this "
                         "GPU's")
            continue
        lines.append(f"GPU {gpu} shared with {', '.join(p.describe() for p in procs)}{share}: its figures are not "
                     "this GPU's alone, and another job's memory lowers what fits")
    return lines


def competing(found: list[GpuProcess]) -> list[GpuProcess]:
    """The foreign processes that may have run kernels beside ours (not known to be idle)."""
    return [p for p in found if p.busy is not False]


def cause(gpu: int, found: list[GpuProcess]) -> str | None:
    """The words that name another process as the cause of GPU `gpu`'s result, or None (none,
    or only processes that ran nothing when the run started)."""
    procs = [p for p in competing(found) if p.gpu == gpu]
    if not procs:
        return None
    return f"GPU {gpu} shared with {', '.join(p.describe() for p in procs)}"
