"""`plan --measure`: the short measurements a plan lacks, each the tool's own command in a child
process storing into the plan's history database (as the suite runs its probes: its own session
and process group, its output to a log, SIGINT to the group on Ctrl-C or past its time limit so
that it keeps what it measured, SIGKILL after a grace period; the children get the user's
environment as it is, marked so that they die with this process)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from mgpu_bench.core import children
from mgpu_bench.core.errors import defer_sigterm

TIMEOUT_S = 900.0
GRACE_S = 60.0


def runnable(missing: list[dict]) -> list[list[str]]:
    """The distinct commands of the missing figures that can run here, comm before model (shorter)."""
    seen: dict[tuple[str, ...], list[str]] = {}
    for m in missing:
        if m.get("args"):
            seen.setdefault(tuple(m["args"]), list(m["args"]))
    return sorted(seen.values(), key=lambda a: a[0] != "comm")


def run_all(commands: list[list[str]], db: str, say=None, timeout_s: float = TIMEOUT_S) -> tuple[list[dict], bool]:
    """Runs each command with `--db db --no-progress`; (one entry per command: its command line,
    status ok / failed / interrupted / not run, seconds, the stored run id, the error; whether
    Ctrl-C or SIGTERM stopped the measuring)."""
    entries: list[dict] = []
    stopped = False
    with children.temp_folder("mgpu-bench-plan-") as tmp:
        for i, args in enumerate(commands):
            line = "mgpu-bench " + " ".join(args)
            if stopped:
                entries.append({"command": line, "status": "not run", "seconds": 0.0, "run": None,
                                "error": "not run: the measuring was interrupted"})
                continue
            if say:
                say(f"measuring {i + 1}/{len(commands)}: {line}")
            entry, stopped = _run_one(args, db, Path(tmp) / f"{i}.log", timeout_s, last=i == len(commands) - 1)
            entries.append(entry)
            if say:
                say(f"  {entry['status']} in {entry['seconds']:.1f} s"
                    + (f", stored as {entry['run']}" if entry["run"] else "")
                    + (f": {entry['error']}" if entry["error"] else ""))
    return entries, stopped


def _run_one(args: list[str], db: str, log: Path, timeout_s: float, last: bool = False) -> tuple[dict, bool]:
    """One command in a child process; `last`: the last one, after which a stop signal waits while
    the plan is built from what was stored."""
    cmd = [sys.executable, "-m", "mgpu_bench.cli", *args, "--db", db, "--no-progress"]
    t0 = time.monotonic()
    interrupted = timed_out = False
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                env=children.child_env())
        try:
            try:
                proc.wait(timeout=timeout_s)
                if last:  # measured and stored by the child: nothing left to measure
                    defer_sigterm()
            except subprocess.TimeoutExpired:
                timed_out = True
                children.stop_group(proc, GRACE_S)
            except KeyboardInterrupt:
                interrupted = True
                children.stop_group(proc, GRACE_S)
        finally:
            if proc.poll() is None:
                children.signal_group(proc, signal.SIGKILL)
                proc.wait()
            children.signal_group(proc, signal.SIGKILL)  # nothing of it outlives it to hold a GPU
    output = log.read_text(errors="replace")
    run = next((m.group(1) for ln in output.splitlines() if (m := re.match(r"stored as (r\d+) ", ln))), None)
    entry = {"command": "mgpu-bench " + " ".join(args), "status": "ok", "seconds": time.monotonic() - t0, "run": run,
             "error": None}
    if timed_out:
        entry.update(status="failed", error=f"did not finish within {timeout_s:g} s; stopped")
    elif interrupted or proc.returncode in (130, 143):
        entry.update(status="interrupted", error="interrupted; what it measured is kept")
        interrupted = True
    elif proc.returncode != 0:
        lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
        ours = [ln for ln in lines if ln.startswith("mgpu-bench:")]
        entry.update(status="failed", error=f"exit code {proc.returncode}: {(ours or lines or ['no message'])[-1][:300]}")
    return entry, interrupted


