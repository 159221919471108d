"""Slurm's own contract, spoken through `scontrol`: this node's name, what Slurm knows of a node
(its state, reason and NodeAddr), drain with a reason, and resume only what mgpu-bench drained.

Slurm acts on nothing a health check prints: "any action to be taken must be explicitly performed
by the program" (slurm.conf(5), HealthCheckProgram), and the action is `scontrol update
NodeName=<node> State=DRAIN Reason=<text>`. mgpu-bench's reasons start with REASON_PREFIX, so that
a resume touches only nodes it drained itself, never a reason another tool or a person wrote (as
LBNL NHC does with its "NHC:" prefix).

Every failure is a SlurmError whose message is one line naming the fix: scontrol missing from
PATH, a controller that does not answer, a node Slurm does not know, a caller Slurm refuses (not
root or SlurmUser). Nothing here raises anything else for Slurm's answers.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from . import children

REASON_PREFIX = "mgpu-bench:"
# Slurm keeps a node's reason as one string; a short single line reads in `sinfo -R` (its REASON
# column is 20 wide, `sinfo -R -o %E` shows it whole).
MAX_REASON = 160
DEFAULT_TIMEOUT_S = 10.0  # one scontrol call: it answers in well under a second from a live controller


class SlurmError(Exception):
    """scontrol could not do what was asked; the message is one line naming the fix."""


@dataclass(frozen=True)
class Node:
    """A node as `scontrol show node` shows it: state words (IDLE, ALLOCATED, DRAIN, ...), the
    reason without Slurm's "[user@time]" tail ("" when none), NodeAddr."""

    name: str
    state: tuple[str, ...]
    reason: str
    addr: str | None

    @property
    def drained(self) -> bool:
        return any(s.startswith("DRAIN") for s in self.state)

    @property
    def ours(self) -> bool:
        """Whether mgpu-bench wrote the node's current reason."""
        return self.reason.startswith(REASON_PREFIX)


def this_node(env: Mapping[str, str] | None = None) -> str:
    """This node's name as Slurm knows it: SLURMD_NODENAME (slurmd sets it for HealthCheckProgram,
    Prolog and every job step), else the short host name (Slurm's NodeName default)."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def scontrol(env: Mapping[str, str] | None = None) -> str:
    """The scontrol executable on PATH (or, with PATH unset as slurmd leaves it for a
    HealthCheckProgram, the system's default path); SlurmError naming the fix when there is none."""
    env = os.environ if env is None else env
    path = env.get("PATH") or os.defpath
    found = shutil.which("scontrol", path=path)
    if found is None:
        raise SlurmError(f"scontrol is not on PATH ({path}): install Slurm's client (apt-get install slurm-client) "
                         "or put its folder on PATH")
    return found


def run(args: list[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """`scontrol ARGS`; its stdout, or SlurmError with Slurm's own words and the fix."""
    exe = scontrol()
    try:
        done = subprocess.run([exe, *args], check=False, capture_output=True, text=True, timeout=max(0.1, timeout_s),
                              stdin=subprocess.DEVNULL, env=children.child_env(),
                              preexec_fn=children.die_with_parent)  # scontrol cannot read the mark: bound here
    except subprocess.TimeoutExpired as exc:
        said = _first_line(exc.stderr)  # scontrol retries a missing slurm.conf for 60 s, saying so at once
        if "s_p_parse_file" in said or "slurm.conf" in said:
            raise SlurmError(f"scontrol cannot read Slurm's configuration ({said}): set SLURM_CONF to slurm.conf's "
                             "path") from None
        raise SlurmError(f"scontrol {args[0]} did not answer within {timeout_s:.0f} s: is slurmctld up "
                         "(scontrol ping)?") from None
    except OSError as exc:
        raise SlurmError(f"cannot run {exe}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
        raise SlurmError(_explain(said, args))
    return done.stdout


def _explain(said: str, args: list[str]) -> str:
    """scontrol's error in one line, with what to do about it."""
    node = next((a.split("=", 1)[1] for a in args if a.startswith("NodeName=")), args[-1] if args else "")
    low = said.lower()
    if "invalid node name" in low or "not found" in low:
        return (f"Slurm knows no node {node!r} ({said}): set SLURMD_NODENAME to this node's NodeName in slurm.conf "
                "(scontrol show node lists them)")
    if "permission denied" in low or "invalid user id" in low or "not authorized" in low:
        return (f"Slurm refused to change node {node!r} ({said}): run as root or SlurmUser, as slurmd runs "
                "HealthCheckProgram and Prolog")
    if "unable to contact" in low or "connection refused" in low or "zero bytes" in low:
        return f"Slurm's controller did not answer ({said}): is slurmctld up (scontrol ping)?"
    return f"scontrol {' '.join(args[:2])} failed: {said}"


def _first_line(text) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return next((" ".join(line.split()) for line in (text or "").splitlines() if line.strip()), "")


def show_node(name: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Node:
    """What Slurm knows of node `name` (`scontrol show node NAME`)."""
    text = run(["show", "node", name], timeout_s)
    return parse_node(text, name)


def parse_node(text: str, name: str) -> Node:
    """`scontrol show node` output -> Node. Fields are KEY=VALUE words, except Reason, which
    runs to the end of its line ("Reason=mgpu-bench: GPU 1 slow [root@2026-12-01T11:34:56]")."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Reason="):
            fields["Reason"] = stripped[len("Reason="):]
            continue
        for key, value in re.findall(r"(\w+)=(\S*)", stripped):
            fields.setdefault(key, value)
    reason = re.sub(r"\s*\[[^\]@]*@[^\]]*\]$", "", fields.get("Reason", "")).strip()
    if reason == "(null)":
        reason = ""
    state = tuple(s for s in re.split(r"[+]", fields.get("State", "")) if s)
    return Node(fields.get("NodeName", name), state, reason, fields.get("NodeAddr") or None)


def reason(text: str) -> str:
    """A drain reason: "mgpu-bench: <text>", one line, at most MAX_REASON characters."""
    line = " ".join(str(text).split())
    if line.startswith(REASON_PREFIX):
        line = line[len(REASON_PREFIX):].strip()
    full = f"{REASON_PREFIX} {line}"
    return full if len(full) <= MAX_REASON else full[:MAX_REASON - 3].rstrip() + "..."


def drain(node: str, text: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Drains `node` with the reason "mgpu-bench: <text>"; returns the reason written."""
    why = reason(text)
    run(["update", f"NodeName={node}", "State=DRAIN", f"Reason={why}"], timeout_s)
    return why


def resume(node: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Resumes `node` only when it is drained with a reason mgpu-bench wrote; returns what was
    done, in words: "resumed (it was drained: <reason>)", "not drained", or "left drained: <its
    reason> was not written by mgpu-bench"."""
    n = show_node(node, timeout_s / 2)
    if not n.drained:
        return "not drained"
    if not n.ours:
        return f"left drained: its reason {n.reason!r} was not written by mgpu-bench"
    run(["update", f"NodeName={node}", "State=RESUME"], timeout_s / 2)
    return f"resumed (it was drained: {n.reason})"
