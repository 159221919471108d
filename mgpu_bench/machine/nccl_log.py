"""Facts NCCL states about itself in its INFO log (NCCL_DEBUG=INFO): which transport joins
each pair of ranks, and environment settings it applied.

Lines look like (NCCL 2.28, seen on 2x H200):
    host:pid:tid [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/direct pointer
    host:pid:tid [1] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
The transport word is what follows "via": P2P (NVLink or PCIe peer to peer, with its mode:
direct pointer, CUMEM, IPC, read), SHM (through host memory), NET (the network), COLLNET.
Per-call algorithm and protocol are not in the INFO log of a release build.
"""

from __future__ import annotations

import re
from collections import Counter

# "Channel 00/0 : ..." in NCCL 2.28; older releases print "Channel 00 : ...".
_CHANNEL = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? : (\d+)\[\d+\] -> (\d+)\[\d+\] via (\S+?)(?:/(.*))?$")
_ENV = re.compile(r"NCCL INFO (NCCL_\w+) set by environment to (.*?)\.?$")


def transports(log: str) -> dict[tuple[int, int], Counter]:
    """(src rank, dst rank) -> Counter of transport words over channels, e.g. {"P2P": 24}."""
    out: dict[tuple[int, int], Counter] = {}
    for line in log.splitlines():
        m = _CHANNEL.search(line.strip())
        if m:
            out.setdefault((int(m.group(1)), int(m.group(2))), Counter())[m.group(3)] += 1
    return out


def warnings_in(log: str) -> list[str]:
    """NCCL's WARN lines (they go to the log file while it is captured)."""
    return [line.split("NCCL WARN", 1)[1].strip() for line in log.splitlines() if "NCCL WARN" in line]


def env_settings(log: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in (_ENV.search(line.strip()) for line in log.splitlines()) if m}


def transport_findings(log: str, nvlink_pairs: set[tuple[int, int]]) -> list[str]:
    """A pair the topology joins by NVLink (or any pair within a node, given here) whose
    channels do not all use P2P: traffic through host memory (SHM) or the network."""
    out = []
    for (a, b), counts in sorted(transports(log).items()):
        other = {k: v for k, v in counts.items() if k != "P2P"}
        if (a, b) in nvlink_pairs and other:
            words = ", ".join(f"{k} on {v} channel(s)" for k, v in sorted(other.items()))
            out.append(f"rank {a} -> rank {b}: NCCL uses {words} where NVLink allows P2P "
                       f"(P2P disabled? NCCL_P2P_DISABLE / NCCL_P2P_LEVEL, or peer access off)")
    return out


class Capture:
    """Has NCCL write its INFO log of initialisation and transports (not of every call) to a
    temporary file, so that the transports can be read back after the run. Only when the user
    has not set NCCL_DEBUG (their settings win) and only once per process (NCCL reads its
    debug settings once). NCCL's warnings go to that file too: the caller shows them
    (warnings_in)."""

    _used = False
    SUBSYS = "INIT,P2P,SHM,NET,ENV,TUNING"  # what the log holds unless the user chose NCCL_DEBUG_SUBSYS

    def __init__(self, subsys: str = SUBSYS) -> None:
        import os
        import tempfile

        self.path: str | None = None
        self.reason: str | None = None
        if "NCCL_DEBUG" in os.environ or "NCCL_DEBUG_FILE" in os.environ:
            self.reason = "NCCL_DEBUG is set by the environment: transports not captured"
        elif Capture._used:
            self.reason = "NCCL was already initialised in this process: transports not captured"
        else:
            Capture._used = True
            from mgpu_bench.core import children

            children.clean_stale("mgpu-bench-nccl-")  # the logs of runs that were killed
            fd, self.path = tempfile.mkstemp(prefix=children.temp_name("mgpu-bench-nccl-"), suffix=".log")
            os.close(fd)
            self._set = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": self.path}
            if "NCCL_DEBUG_SUBSYS" not in os.environ:
                self._set["NCCL_DEBUG_SUBSYS"] = subsys
            os.environ.update(self._set)

    def release_environment(self) -> None:
        """Takes the variables out of os.environ again once NCCL has read them (it does at its
        first initialisation), so that child processes do not inherit them."""
        import os

        for key in getattr(self, "_set", {}):
            os.environ.pop(key, None)

    def read(self) -> str:
        if not self.path:
            return ""
        try:
            with open(self.path, errors="replace") as fh:
                return fh.read()
        except OSError:
            return ""


    def close(self) -> None:
        import os

        self.release_environment()
        if self.path:
            try:
                os.unlink(self.path)
            except OSError:
                pass


# NCCL's tuning table (NCCL_DEBUG_SUBSYS=TUNING, printed at initialisation): per collective,
# algorithm and protocol, "latency us / bandwidth GB/s" of its cost model, for example
#   NCCL INFO   Algorithm   |     Tree     |     Ring     | ...
#   NCCL INFO   Protocol    | LL | LL128 | Simple | LL | LL128 | Simple | ...
#   NCCL INFO     AllReduce | 8.0/ 61.1 | 16.5/ 180.6 | ...
_COLLS = {"allreduce": "AllReduce", "allgather": "AllGather", "reducescatter": "ReduceScatter",
          "broadcast": "Broadcast", "reduce": "Reduce"}
_ROW = re.compile(r"NCCL INFO\s+(\S[\w ]*?)\s*\|(.*)\|\s*$")


def tuning_table(log: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(collective, algorithm, protocol) -> (latency us, bandwidth GB/s), from the first rank
    that printed the table."""
    table: dict[tuple[str, str, str], tuple[float, float]] = {}
    algos: list[str] = []
    protos: list[str] = []
    rank = None
    for line in log.splitlines():
        m = _ROW.search(line)
        if not m:
            continue
        r = re.search(r"\[(\d+)\] NCCL INFO", line)
        if rank is None and r:
            rank = r.group(1)
        if r and r.group(1) != rank:
            continue
        name, cells = m.group(1).strip(), [c.strip() for c in m.group(2).split("|")]
        if name == "Algorithm":
            algos = [c for c in cells for _ in range(3)]
        elif name == "Protocol":
            protos = cells
        elif "/" in cells[0] and algos and len(cells) == len(algos):
            for algo, proto, cell in zip(algos, protos, cells):
                lat, bw = (float(x) for x in cell.split("/"))
                table[(name, algo, proto)] = (lat, bw)
    return table


def predicted_algorithm(table: dict, op: str, nbytes: int) -> str | None:
    """The algorithm/protocol NCCL's cost model rates fastest for `op` at `nbytes` (its size
    convention: the whole buffer for allgather and reducescatter, as nccl-tests' size column):
    time = latency + bytes / bandwidth over the entries with a bandwidth. A model, not a trace:
    NCCL applies further corrections, and a tuner plugin or NCCL_ALGO/NCCL_PROTO can override."""
    coll = _COLLS.get(op)
    if coll is None:
        return None
    best = None
    for (c, algo, proto), (lat, bw) in table.items():
        if c != coll or bw <= 0:
            continue
        t = lat + nbytes / (bw * 1e3)  # us: GB/s = 1e3 bytes/us
        if best is None or t < best[0]:
            best = (t, f"{algo}/{proto}")
    return best[1] if best else None


def overstating(algorithm: str | None) -> bool:
    """Algorithms whose traffic the ring busbw formula overstates (in-switch reduction)."""
    return bool(algorithm) and algorithm.split("/")[0].startswith(("NVLS", "CollNet"))
