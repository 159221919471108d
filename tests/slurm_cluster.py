"""A real Slurm cluster on this host, for the tests: munge, one slurmctld and four slurmd
(node1..node4, NodeHostname=localhost, NodeAddr=127.0.0.1, a port each), as Debian 12's
packages run them (slurmctld slurmd slurm-client munge; .ci/run installs them).

The node names resolve nowhere (no /etc/hosts entry): what a job learns of its nodes it must learn
from Slurm. slurmd runs HEALTH_CHECK on every node every HealthCheckInterval; a node runs the test's
command only once the test arms it (arm()), as an administrator's wrapper script runs the tool.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = ("node1", "node2", "node3", "node4")
BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "srun", "sinfo")
INSTALL = "apt-get install -y slurmctld slurmd slurm-client munge"
HEALTH_CHECK = """#!/bin/sh
# slurmd runs this on every node every HealthCheckInterval with SLURMD_NODENAME set (and PWD: no
# PATH, no SLURM_CONF). A node the test armed runs the armed command once.
armed="{dir}/armed-$SLURMD_NODENAME"
mv "$armed" "$armed.running" 2>/dev/null || exit 0
. "$armed.running"
"""


def missing() -> str | None:
    """Why the cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm tests run slurmctld, slurmd and munged as root (as CI does)"
    absent = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if absent:
        return f"Slurm is not installed here (no {', '.join(absent)}): {INSTALL}"
    return None


def _free_ports(count: int) -> int:
    """The first of `count` consecutive free TCP ports."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


class Cluster:
    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.munged: int | None = None
        self.started_s = 0.0

    def run(self, *args: str, check: bool = True, timeout: float = 30.0, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=kw.pop("env", self.env), capture_output=True, text=True, errors="replace",
                              timeout=timeout, check=check, **kw)

    def reasons(self) -> dict[str, str]:
        """Every node with a reason (drained, down): node -> its reason, as `sinfo -R` shows it."""
        out = self.run("sinfo", "-R", "-h", "-N", "-o", "%N|%E").stdout
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    def reset(self) -> None:
        """Every node back in service (drained ones resumed)."""
        for node in self.reasons():
            self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        self.wait_idle()

    def wait_idle(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
            if all(line.split()[1] in ("idle", "mix", "alloc") for line in states if line.strip()) and states:
                return
            time.sleep(0.3)
        raise AssertionError("the cluster's nodes did not come back: " + self.run("sinfo", "-N").stdout)

    def arm(self, node: str, script: str) -> Path:
        """slurmd's next health check on `node` runs `script` (sh), once."""
        path = self.dir / f"armed-{node}"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(script)
        tmp.rename(path)
        return path

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scontrol", "shutdown", check=False, timeout=10)
        for pidfile in self.dir.glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
        if self.munged:
            with contextlib.suppress(OSError):
                os.kill(self.munged, signal.SIGTERM)


def _munge() -> int | None:
    """munged running (started here, as root with --force, when none answers): its pid if started here."""
    if subprocess.run(["munge", "-n"], check=False, capture_output=True, timeout=10).returncode == 0:
        return None
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    subprocess.run(["munged", "--force"], check=True, capture_output=True, timeout=30)
    deadline = time.monotonic() + 10
    while subprocess.run(["munge", "-n"], check=False, capture_output=True, timeout=10).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("munged did not start")
        time.sleep(0.1)
    pid = Path("/run/munge/munged.pid")
    return int(pid.read_text().strip()) if pid.exists() else None


def start(folder: Path, health_interval_s: int = 2) -> Cluster:
    t0 = time.monotonic()
    c = Cluster(folder)
    c.munged = _munge()
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    hc = folder / "health_check.sh"
    hc.write_text(HEALTH_CHECK.format(dir=folder))
    hc.chmod(0o755)
    ctld = _free_ports(1)
    base = _free_ports(len(NODES))
    c.conf.write_text(f"""ClusterName=mgpu
SlurmctldHost=localhost
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
HealthCheckProgram={hc}
HealthCheckInterval={health_interval_s}
HealthCheckNodeState=ANY
NodeName=node[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port={base}-{base + len(NODES) - 1} CPUs=2 RealMemory=2000
PartitionName=debug Nodes=node[1-4] Default=YES OverSubscribe=FORCE:4 MaxTime=INFINITE State=UP
""")
    c.run("slurmctld", "-f", str(c.conf))
    for node in NODES:
        c.run("slurmd", "-f", str(c.conf), "-N", node)
    deadline = time.monotonic() + 30
    while True:
        idle = c.run("sinfo", "-h", "-o", "%D %t", check=False).stdout.split()
        if idle[:2] == [str(len(NODES)), "idle"]:
            break
        if time.monotonic() > deadline:
            c.stop()
            raise RuntimeError(f"the nodes did not come up: {c.run('sinfo', check=False).stdout}")
        time.sleep(0.2)
    c.started_s = time.monotonic() - t0
    return c


# -- slowing a process from outside, as a bad node is slow ---------------------------------------------


def processes(cmd: str, env: dict[str, str] | None = None, below: int | None = None) -> list[int]:
    """The pids whose command line holds `cmd`, whose environment holds every item of `env`, and
    (given `below`) that descend from pid `below`."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            line = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if cmd not in line:
                continue
            if env:
                have = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
                if not all(f"{k}={v}".encode() in have for k, v in env.items()):
                    continue
            if below is not None and not _descends(int(name), below):
                continue
        except OSError:
            continue
        out.append(int(name))
    return out


def _descends(pid: int, root: int) -> bool:
    for _ in range(64):
        if pid == root:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


class Throttle:
    """Stops the processes `find()` names `stop_s` out of every `stop_s + run_s` (SIGSTOP, then
    SIGCONT), from the moment at least `count` of them exist until stop(): the processes slowed
    from outside, the way a bad node is slow (as tests/test_fleet.py does). The product only
    measures."""

    def __init__(self, find, count: int = 1, stop_s: float = 0.03, run_s: float = 0.01) -> None:
        import threading

        self.find, self.count, self.stop_s, self.run_s = find, count, stop_s, run_s
        self.done = threading.Event()
        self.slowed: set[int] = set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pids: list[int] = []
        while not self.done.is_set():
            if len(pids) < self.count:
                pids = self.find()
                if len(pids) < self.count:
                    time.sleep(0.02)
                    continue
                self.slowed |= set(pids)
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGSTOP)
            time.sleep(self.stop_s)
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGCONT)
            time.sleep(self.run_s)
            pids = [p for p in pids if Path(f"/proc/{p}").exists()]

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        for p in self.slowed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
