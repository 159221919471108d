"""The ranks of a job once started, together: they meet at torch.distributed's store (rank 0
serves it at MASTER_ADDR:MASTER_PORT), check that they run the same command, form their process
group, and see the node hierarchy (one intra-node group per node, one inter-node group per local
rank). When the job's group breaks under a rank, it tells the others why it stopped (a note in the
store) and calls the roll (roll_call): the ranks that left are named, with their own word where
they left one, rather than every survivor failing with a closed connection.

How the ranks were started is launch.py's: `le` here is its LaunchEnv (this rank, the world size,
where the store is), taken as it is, so that this module imports nothing of launch.py.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .errors import InputError, MgpuError


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def disagreement(values: list[str]) -> str | None:
    """None when every rank's value is the same; else which ranks differ from rank 0."""
    if all(v == values[0] for v in values):
        return None
    bad = [r for r, v in enumerate(values) if v != values[0]]
    return (f"rank(s) {', '.join(map(str, bad[:8]))}{' ...' if len(bad) > 8 else ''} were started with "
            "different arguments than rank 0: every rank must run the same command")


def agree(what: str, all_gather: Callable[[str], list[str]]) -> None:
    """Raises InputError on every rank when the ranks' `what` differ (all_gather: one string
    from each rank, in rank order)."""
    msg = disagreement(all_gather(fingerprint(what)))
    if msg:
        raise InputError(msg)


def key_prefix(env: Mapping[str, str] | None = None) -> str:
    """Keys of this job (a restarted torchrun job gets fresh ones)."""
    env = os.environ if env is None else env
    return f"mgpu_bench/{env.get('TORCHELASTIC_RUN_ID', 'run')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def open_store(le, timeout_s: float):
    """torch.distributed's TCPStore at MASTER_ADDR:MASTER_PORT: rank 0 serves it, unless
    torchrun's agent already does (TORCHELASTIC_USE_AGENT_STORE), as the env:// rendezvous does.
    A rank that cannot reach it within timeout_s gets CommTimeoutError naming rank 0."""
    from datetime import timedelta

    import torch.distributed as dist

    from .errors import CommTimeoutError

    if le.rendezvous_problem:
        raise InputError(le.rendezvous_problem)
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    master = le.rank == 0 and not agent
    try:
        return dist.TCPStore(le.master_addr, le.master_port, None, master, timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - every failure here means the meeting point is not there
        who = "this rank could not serve it" if master else "rank 0 (which serves it) never arrived"
        raise CommTimeoutError(f"rank {le.rank}: no store at {le.master_addr}:{le.master_port} within "
                               f"{timeout_s:g} s: {who} ({type(exc).__name__})") from None


def wait_for_ranks(store, le, timeout_s: float, poll_s: float = 0.05) -> None:
    """Every rank announces itself and waits for the others; after timeout_s the ranks that
    never arrived are named (CommTimeoutError), so nobody hangs in a collective."""
    import time

    from .errors import CommTimeoutError

    prefix = key_prefix()
    keys = [f"{prefix}/arrived/{r}" for r in range(le.world_size)]
    deadline = time.monotonic() + timeout_s
    missing: list[int] = []
    while True:
        try:
            if keys[le.rank] and not store.check([keys[le.rank]]):
                store.set(keys[le.rank], le.host)
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
        except Exception as exc:  # noqa: BLE001 - the store went away: rank 0 (its server) gave up or died
            still = (f"; rank(s) {', '.join(map(str, missing[:16]))} of {le.world_size} never arrived"
                     if missing else "")
            raise CommTimeoutError(f"rank {le.rank}: the store at {le.master_addr}:{le.master_port} went away "
                                   f"while waiting for the other ranks (rank 0 left; {type(exc).__name__}){still}"
                                   ) from None
        if not missing:
            return
        if time.monotonic() > deadline:
            shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
            raise CommTimeoutError(f"rank(s) {shown} of {le.world_size} never arrived at {le.master_addr}:"
                                   f"{le.master_port} within {timeout_s:g} s (--timeout): check that every node "
                                   "and process started")
        time.sleep(poll_s)


def init_group(le, backend: str, timeout_s: float, device=None):
    """Store, arrival check, then the process group on that store; returns the store."""
    from datetime import timedelta

    import torch.distributed as dist

    from .errors import CommTimeoutError

    store = open_store(le, timeout_s)
    wait_for_ranks(store, le, timeout_s)
    try:
        dist.init_process_group(backend, store=dist.PrefixStore(key_prefix() + "/pg", store), rank=le.rank,
                                world_size=le.world_size, timeout=timedelta(seconds=timeout_s), device_id=device)
    except Exception as exc:  # noqa: BLE001 - a peer left between arriving and forming the group
        raise CommTimeoutError(f"rank {le.rank}: the process group did not form ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    return store


class ControlLost(MgpuError):
    """The job's control group (the process group every rank is in) failed under this rank: a
    peer left, or the group timed out. roll_call() tells which rank."""


class RankLost(MgpuError):
    """A rank left the job; the message names it (and why, when it said)."""


def all_gatherer(world_size: int) -> Callable[[object], list]:
    """all_gather(value) -> every rank's value, over the default process group; a failure of the
    group itself is ControlLost."""

    def all_gather(value: object) -> list:
        import torch.distributed as dist

        out: list = [None] * world_size
        try:
            dist.all_gather_object(out, value)
        except Exception as exc:  # noqa: BLE001 - whatever the backend raises, the group is broken
            raise ControlLost(f"the job's process group failed ({type(exc).__name__}: {_gist(exc)})") from None
        return out

    return all_gather


def _gist(exc: BaseException) -> str:
    """The first sentence of a backend's error, without its source location: gloo's
    "[/path/pair.cc:553] Connection closed by peer [10.0.0.2]:7055. This is typically ..." ->
    "Connection closed by peer [10.0.0.2]:7055"."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text)
    return text.split(". ")[0][:200]


def group_failure(exc: BaseException) -> bool:
    """Whether `exc` says the job's process group broke under this rank (a peer's connection
    closed or reset, a collective timed out or was aborted), rather than this rank's own
    fault. torch raises most of these as plain RuntimeErrors, so the backends' words decide."""
    if isinstance(exc, ControlLost):
        return True
    try:
        from torch.distributed import DistError

        if isinstance(exc, DistError):
            return True
    except ImportError:
        pass
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in _GROUP_FAILURE_WORDS)


_GROUP_FAILURE_WORDS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Read error",
                        "Write error", "Timed out", "timed out", "NCCL communicator was aborted",
                        "ncclRemoteError", "ncclSystemError", "remote process exited")


def account(exc: BaseException, store, le, members: list[Member] | None, wait_s: float = 5.0,
            told: tuple[type[BaseException], ...] = ()) -> BaseException:
    """What a rank reports for the fault `exc` that stopped it under a launcher, and what it
    tells the others through the store:
    - interrupted (Ctrl-C, SIGTERM): a note saying so. Rank 0, when torchrun stops the job, also
      says which ranks had not answered within a second (the likely cause; nothing more certain,
      as a rank blocked in a collective cannot answer);
    - its group broke under it (group_failure): a roll call, and RankLost naming the ranks that
      are gone or said why they left;
    - another rank's error it was told of (one of `told`): it answers the others' roll call;
    - its own error: a note with it, so that the others name it as the cause."""
    from .errors import Terminated

    if store is None:
        return exc
    if isinstance(exc, KeyboardInterrupt):
        leave_note(store, le.rank, _STOPPED_NOTES[0] if isinstance(exc, Terminated) else _STOPPED_NOTES[1])
        if isinstance(exc, Terminated) and le.rank == 0:
            who = roll_call(store, le, members, min(wait_s, 1.0), answer_it=False, certain=False)
            if who is not None:
                return Terminated(who)
        return exc
    if isinstance(exc, told):
        answer(store, le.rank)
        return exc
    if not group_failure(exc):
        leave_note(store, le.rank, f"failed: {type(exc).__name__}: {_gist(exc)}")
        return exc
    who = roll_call(store, le, members, wait_s)
    if who is None:
        return exc
    if isinstance(exc, MgpuError):
        return RankLost(f"{who} [{exc}]")
    return RankLost(f"{who} [{type(exc).__name__}: {_gist(exc)}]")


def answer(store, rank: int) -> None:
    """This rank is here (for the others' roll call). Best effort."""
    import contextlib

    with contextlib.suppress(Exception):
        store.set(f"{key_prefix()}/present/{rank}", "1")


_STOPPED_NOTES = ("terminated (SIGTERM)", "interrupted (Ctrl-C)")


def blocked_note(store, rank: int, where: str | None) -> None:
    """A rank whose main thread is held in a collective (a peer died while it was connecting)
    says so from another thread, so that the roll call does not call it gone; None clears it."""
    import contextlib

    with contextlib.suppress(Exception):
        if where is None:
            store.delete_key(f"{key_prefix()}/blocked/{rank}")
        else:
            store.set(f"{key_prefix()}/blocked/{rank}", where)


def leave_note(store, rank: int, why: str) -> None:
    """A rank that stops on its own (Ctrl-C, SIGTERM) says why in the store before it goes, for
    the other ranks' roll call. Best effort: the store may be gone already."""
    import contextlib

    with contextlib.suppress(Exception):
        store.set(f"{key_prefix()}/left/{rank}", why)


def roll_call(store, le, members: list[Member] | None, wait_s: float, poll_s: float = 0.05,
              answer_it: bool = True, certain: bool = True) -> str | None:
    """After a collective failed for no fault of this rank's (a peer's connection closed, a
    timeout): every surviving rank answers here (answer_it), and the ranks that do not within
    wait_s are named, with their own word where they left one (leave_note). Returns the
    account in one line, or None when every rank answered (the failure was not a rank
    leaving). Silent ranks are called gone only when `certain` and the whole wait ran; a first
    Ctrl-C or SIGTERM during the wait does not cut it short (in the CLI later ones are only noted,
    errors.handle_stop_signals; under Python's default handler a second one cuts it short)."""
    import time

    prefix = key_prefix()
    name = (lambda r: f"rank {r} ({members[r].device} on {members[r].host})") if members else (lambda r: f"rank {r}")
    gone_store = f"rank 0 ({le.master_addr}:{le.master_port}, which serves the job's store) is gone"
    try:
        if answer_it:
            store.set(f"{prefix}/present/{le.rank}", "1")
        else:
            store.check([f"{prefix}/present/{le.rank}"])  # is the store there at all
    except Exception:  # noqa: BLE001 - no store: its server, rank 0 unless torchrun's agent serves it, is gone
        return gone_store
    t0 = time.monotonic()
    silent: list[int] = []
    notes: dict[int, str] = {}
    stops = 0
    while True:
        try:
            silent = []
            for r in range(le.world_size):
                if r == le.rank or r in notes or store.check([f"{prefix}/present/{r}"]):
                    continue
                if store.check([f"{prefix}/left/{r}"]):
                    notes[r] = bytes(store.get(f"{prefix}/left/{r}")).decode(errors="replace")
                elif store.check([f"{prefix}/blocked/{r}"]):  # alive, its main thread held in a collective
                    notes[r] = "is alive but blocked: " + bytes(store.get(f"{prefix}/blocked/{r}")).decode(
                        errors="replace")
                else:
                    silent.append(r)
            if not silent or time.monotonic() - t0 > wait_s:
                break
            time.sleep(poll_s)
        except KeyboardInterrupt:
            stops += 1
            if stops > 1:
                break  # asked twice: report what is known
        except Exception:  # noqa: BLE001 - the store went away during the wait
            return gone_store
    waited = time.monotonic() - t0
    # when this rank is being stopped too, the others' notes that they were stopped say nothing
    parts = [f"{name(r)} left: {why}" for r, why in sorted(notes.items()) if certain or why not in _STOPPED_NOTES]
    if certain and waited >= wait_s:
        parts += [f"{name(r)} is gone (no word from it within {wait_s:g} s: killed, crashed, or stuck)"
                  for r in silent]
    elif silent:
        parts.append(f"no word within {waited:.1f} s from {', '.join(name(r) for r in silent[:4])}"
                     + (f" and {len(silent) - 4} more" if len(silent) > 4 else ""))
    if not parts:
        return None
    return "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more rank(s)" if len(parts) > 4 else "")


@dataclass(frozen=True)
class Member:
    """One rank as the others see it: where it runs."""

    rank: int
    host: str
    node: int  # the launcher's node rank
    local_rank: int
    device: str  # "cuda:1", "cpu"
    bus_id: str = ""  # the GPU's PCI bus id ("" on CPU): its identity whatever CUDA_VISIBLE_DEVICES is


@dataclass(frozen=True)
class Group:
    scope: str  # "intra-node" or "inter-node"
    label: str  # "node 1 (gpu07)", "local rank 3"
    ranks: tuple[int, ...]  # global ranks, ascending; a rank's place here is its rank in the group


def nodes_by_host(members: list[Member]) -> list[Member]:
    """Members with the node numbered by host name (in order of first rank), for launchers that
    export no node index (MPI: rank // ranks per node is wrong under round-robin placement)."""
    hosts = list(dict.fromkeys(m.host for m in members))
    return [Member(m.rank, m.host, hosts.index(m.host), m.local_rank, m.device, m.bus_id) for m in members]


def scopes(members: list[Member]) -> list[Group]:
    """The communicators of the node hierarchy, one list for every backend: on more than one
    node, one intra-node group per node (its ranks) and one inter-node group per local rank
    (that local rank on every node that has it, as NCCL's rail-aligned rings cross nodes);
    [] on one node. Groups of one rank measure nothing and are left out."""
    nodes = sorted({m.node for m in members})
    if len(nodes) < 2:
        return []
    out = []
    for node in nodes:
        ranks = tuple(sorted(m.rank for m in members if m.node == node))
        host = next(m.host for m in members if m.node == node)
        if len(ranks) > 1:
            out.append(Group("intra-node", f"node {node} ({host})", ranks))
    for local in sorted({m.local_rank for m in members}):
        ranks = tuple(sorted(m.rank for m in members if m.local_rank == local))
        if len(ranks) > 1:
            out.append(Group("inter-node", f"local rank {local}", ranks))
    return out
