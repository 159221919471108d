"""Slurm's own contract, spoken through `scontrol`: this node's name, what Slurm knows of a node
(its state, reason and NodeAddr), drain with a reason, and resume only what mgpu-bench drained.

Slurm acts on nothing a health check prints: "any action to be taken must be explicitly performed
by the program" (slurm.conf(5), HealthCheckProgram), and the action is `scontrol update
NodeName=<node> State=DRAIN Reason=<text>`. mgpu-bench's reasons start with REASON_PREFIX, so that
a resume touches only nodes it drained itself, never a reason another tool or a person wrote (as
LBNL NHC does with its "NHC:" prefix).

Every failure is a SlurmError whose message is one line naming the fix: scontrol missing from
PATH, a controller that does not answer, a node Slurm does not know, a caller Slurm refuses (not
root or SlurmUser), a node name that is not one node. Nothing here raises anything else for
Slurm's answers: its output is read as UTF-8 with undecodable bytes replaced, and parsed in one
pass (a `scontrol show node` line of any length costs its length).

What mgpu-bench writes into Slurm and prints of it carries no control character: a reason is
one line of printable text (console.safe_text's escapes for the rest), so `sinfo -R` and a
terminal show it as written.
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


def printable(text: str) -> str:
    """Text with every character that is not printable (ESC, OSC 8's bytes, a newline, U+202E)
    written as its escape (\\x1b): what Slurm keeps and a terminal shows is the text, never obeyed.
    (console.safe_text's rule; this module needs the standard library alone: it is copied and run
    as another user by the tests.)"""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def this_node(env: Mapping[str, str] | None = None) -> str:
    """This node's name as Slurm knows it: SLURMD_NODENAME (slurmd sets it for HealthCheckProgram,
    Prolog and every job step), else the short host name (Slurm's NodeName default)."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


# What scontrol reads as more than one node, or as something else than a name: a hostlist
# ("node[1-100]", "node1,node2": slurm.conf(5), NodeName "can be expressed as a hostlist"), words
# split on white space, the KEY=VALUE syntax of `scontrol update`, quotes, and any byte that is not
# printable ASCII (a host name is letters, digits, '-' and '.': RFC 1123 2.1; Slurm's own names add '_').
_NOT_ONE_NODE = re.compile(r"[\[\],=\s\"'\\]|[^\x21-\x7e]")
MAX_NODE_NAME = 255  # a host name's length (RFC 1123 2.1; Linux HOST_NAME_MAX is 64)


def one_node(name: str, where: str = "SLURMD_NODENAME") -> str:
    """`name` when it names exactly one node; SlurmError naming the fix otherwise. `ALL` is
    refused too: scontrol's node updates take it for every node of the cluster."""
    text = str(name)
    bad = _NOT_ONE_NODE.search(text)
    if not text or bad or len(text) > MAX_NODE_NAME or text.upper() == "ALL":
        what = (f"has {bad.group()!r}" if bad and bad.group().isprintable() and not bad.group().isspace()
                else "has a character that is not printable ASCII" if bad else
                "is empty" if not text else "is ALL, every node" if text.upper() == "ALL" else "is too long")
        raise SlurmError(f"{where} {printable(repr(text)[:80])} is not one node's name (it {what}): a health check "
                         "acts on its own node only; set it to this node's NodeName in slurm.conf (scontrol show node "
                         "lists them)")
    return text


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
        done = subprocess.run([exe, *args], check=False, capture_output=True, encoding="utf-8", errors="replace",
                              timeout=max(0.1, timeout_s),
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
    runs to the end of its line ("Reason=mgpu-bench: GPU 1 slow [root@2026-12-01T11:34:56]").
    One pass over the text, split and partitioned (no pattern that backtracks: a 50 MB line
    costs its length)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Reason="):
            fields["Reason"] = stripped[len("Reason="):]
            continue
        for word in stripped.split():
            key, eq, value = word.partition("=")
            if eq and key and (key.isascii() and key.replace("_", "a").isalnum()):
                fields.setdefault(key, value)
    reason = _without_stamp(fields.get("Reason", "")).strip()
    if reason == "(null)":
        reason = ""
    state = tuple(s for s in fields.get("State", "").split("+") if s)
    return Node(fields.get("NodeName", name), state, reason, fields.get("NodeAddr") or None)


def _without_stamp(text: str) -> str:
    """A reason without Slurm's " [user@time]" tail, when it ends with one."""
    stripped = text.rstrip()
    if not stripped.endswith("]"):
        return text
    start = stripped.rfind("[")
    inner = stripped[start + 1:-1]
    if start < 0 or "@" not in inner or "]" in inner:
        return text
    return stripped[:start]


def reason(text: str) -> str:
    """A drain reason: "mgpu-bench: <text>", one line of printable text (control characters as
    their escapes), at most MAX_REASON characters."""
    line = printable(" ".join(str(text).split()))
    if line.startswith(REASON_PREFIX):
        line = line[len(REASON_PREFIX):].strip()
    full = f"{REASON_PREFIX} {line}"
    return full if len(full) <= MAX_REASON else full[:MAX_REASON - 3].rstrip() + "..."


def drain(node: str, text: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Drains `node` with the reason "mgpu-bench: <text>"; returns the reason written."""
    why = reason(text)
    run(["update", f"NodeName={one_node(node)}", "State=DRAIN", f"Reason={why}"], timeout_s)
    return why


def resume(node: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Resumes `node` only when it is drained with a reason mgpu-bench wrote; returns what was
    done, in words: "resumed (it was drained: <reason>)", "not drained", or "left drained: <its
    reason> was not written by mgpu-bench"."""
    n = show_node(one_node(node), timeout_s / 2)
    if not n.drained:
        return "not drained"
    if not n.ours:
        return f"left drained: its reason {printable(repr(n.reason))} was not written by mgpu-bench"
    run(["update", f"NodeName={node}", "State=RESUME"], timeout_s / 2)
    return f"resumed (it was drained: {n.reason})"


def compress_hostlist(names: list[str]) -> str:
    """Host names in Slurm's hostlist syntax, as `scontrol show hostlist` writes them:
    gpu01,gpu02,gpu03,gpu07 -> gpu[01-03,07]; names without a trailing number stay as they are.
    launch.expand_hostlist() reads it back."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m and "[" not in name and "," not in name:
            groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
        else:
            plain.append(name)
    parts = []
    for (prefix, width), nums in groups.items():
        nums = sorted(set(nums))
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        spans, lo, hi = [], nums[0], nums[0]
        for x in nums[1:]:
            if x == hi + 1:
                hi = x
                continue
            spans.append((lo, hi))
            lo = hi = x
        spans.append((lo, hi))
        parts.append(prefix + "[" + ",".join(f"{a:0{width}d}" + (f"-{b:0{width}d}" if b != a else "")
                                             for a, b in spans) + "]")
    return ",".join(parts + plain)
