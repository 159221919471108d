"""How the ranks of a job start: under a cluster launcher (torchrun, i.e. torch.distributed elastic,
Slurm's srun, Open MPI or another PMI launcher), or started here as local processes by torch's
elastic launcher (relaunch, run_elastic: each rank's result kept as soon as it has it, a rank's
failure said in one line). `detect()` reads the launcher's environment (one process per GPU; the
local rank picks the GPU); a half-set environment is an InputError naming the missing variable.

No home-made rendezvous: the processes meet through torch.distributed's store at MASTER_ADDR /
MASTER_PORT (`init_method="env://"`), which torchrun sets; for Slurm and MPI `export_env()`
fills those variables from the launcher's own (the first node of the job, a port derived from
the job id) unless the user set them. The first node is reached by its name where the name
resolves, else by the address Slurm itself uses for it (its NodeAddr, `scontrol show node`);
where neither works, ranks.open_store() says in one line to set MASTER_ADDR, before anyone waits.
What the started ranks do together (the store, their groups, the roll call) is ranks.py's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InputError, MgpuError
from .ranks import (  # noqa: F401 - re-exported: tests import it from here
    Member,
    RankLost,
    account,
    answer,
    disagreement,
    leave_note,
    roll_call,
)
from .ranks import key_prefix as _prefix  # noqa: F401 - re-exported: tests import it from here
from .slurm import compress_hostlist  # noqa: F401 - its home before slurm.py

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class LaunchEnv:
    launcher: str  # "torchrun", "slurm", "mpi"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str | None
    master_port: int | None
    host: str
    node_names: tuple[str, ...] = ()  # the job's nodes in node-rank order, where the launcher says (Slurm)
    rendezvous_problem: str | None = None  # why master_addr cannot be reached (open_store says it)


def _int(env: Mapping[str, str], name: str, launcher: str) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        raise InputError(f"the {launcher} environment is half-set: {name} is missing "
                         f"(run under {launcher} as documented, or unset the other variables)")
    try:
        return int(raw.strip())
    except ValueError:
        raise InputError(f"the {launcher} environment has {name}={raw!r}, not a whole number") from None


def _tasks_per_node(text: str) -> list[int]:
    """Slurm's SLURM_TASKS_PER_NODE, e.g. '4(x2)', '4,4' or '2(x3),1': the count per node, in node
    order ([2, 2, 2, 1] for the last)."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise InputError(f"SLURM_TASKS_PER_NODE={text!r} is not a task count list")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed node list: 'gpu[01-03,07],login-a' -> gpu01, gpu02, gpu03, gpu07,
    login-a (zero padding kept)."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            if part.strip():
                hosts.append(part.strip())
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            if "-" in r:
                a, b = r.split("-", 1)
                width = len(a)
                for i in range(int(a), int(b) + 1):
                    hosts.append(f"{prefix}{i:0{width}d}{suffix}")
            elif r:
                hosts.append(f"{prefix}{r}{suffix}")
    return hosts


def detect(env: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """The launcher this process runs under, or None (a plain single-process command).
    torchrun's variables win over Slurm's (srun torchrun ... is common), Slurm's over MPI's."""
    env = os.environ if env is None else env
    host = socket.gethostname()
    torchrun_keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    if any(k in env for k in torchrun_keys) or "TORCHELASTIC_RUN_ID" in env:
        rank = _int(env, "RANK", "torchrun")
        world = _int(env, "WORLD_SIZE", "torchrun")
        local = _int(env, "LOCAL_RANK", "torchrun")
        if not env.get("MASTER_ADDR"):
            raise InputError("the torchrun environment is half-set: MASTER_ADDR is missing")
        port = _int(env, "MASTER_PORT", "torchrun")
        lws = _int(env, "LOCAL_WORLD_SIZE", "torchrun") if env.get("LOCAL_WORLD_SIZE") else world
        nnodes = max(1, world // max(1, lws))
        group = _int(env, "GROUP_RANK", "torchrun") if env.get("GROUP_RANK") else rank // max(1, lws)
        le = LaunchEnv("torchrun", rank, world, local, lws, group, nnodes, env["MASTER_ADDR"], port, host)
    elif "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_NTASKS" in env):
        rank = _int(env, "SLURM_PROCID", "Slurm")
        world = _int(env, "SLURM_NTASKS", "Slurm")
        local = _int(env, "SLURM_LOCALID", "Slurm")
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                                or env.get("SLURM_NODELIST") or "")
        if not nodes:
            raise InputError("the Slurm environment is half-set: SLURM_JOB_NODELIST is missing")
        node = _int(env, "SLURM_NODEID", "Slurm") if env.get("SLURM_NODEID") else 0
        per_node = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
                                   or str(world))
        lws = per_node[node] if node < len(per_node) else per_node[-1]
        job = _int(env, "SLURM_JOB_ID", "Slurm") if env.get("SLURM_JOB_ID") else 0
        port = _int(env, "MASTER_PORT", "Slurm") if env.get("MASTER_PORT") else DEFAULT_PORT + job % 1000
        addr, problem = (env["MASTER_ADDR"], None) if env.get("MASTER_ADDR") else slurm_node_address(nodes[0])
        le = LaunchEnv("slurm", rank, world, local, lws, node, len(nodes), addr, port, host, tuple(nodes), problem)
    elif "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        ompi = "OMPI_COMM_WORLD_RANK" in env
        launcher = "Open MPI" if ompi else "PMI"
        rank = _int(env, "OMPI_COMM_WORLD_RANK" if ompi else "PMI_RANK", launcher)
        world = _int(env, "OMPI_COMM_WORLD_SIZE" if ompi else "PMI_SIZE", launcher)
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK" if ompi else "MPI_LOCALRANKID", launcher)
        size_key = "OMPI_COMM_WORLD_LOCAL_SIZE" if ompi else "MPI_LOCALNRANKS"
        lws = _int(env, size_key, launcher) if env.get(size_key) else world
        if not env.get("MASTER_ADDR"):
            raise InputError(f"under {launcher}, set MASTER_ADDR (and MASTER_PORT) to the first host: "
                             "mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ...")
        port = _int(env, "MASTER_PORT", launcher) if env.get("MASTER_PORT") else DEFAULT_PORT
        le = LaunchEnv("mpi", rank, world, local, lws, rank // max(1, lws), max(1, world // max(1, lws)),
                       env["MASTER_ADDR"], port, host)
    else:
        return None
    if not (0 <= le.rank < le.world_size):
        raise InputError(f"{le.launcher}: rank {le.rank} is outside the world of {le.world_size} processes")
    if not (0 <= le.local_rank < max(le.local_world_size, 1)):
        raise InputError(f"{le.launcher}: local rank {le.local_rank} is outside the {le.local_world_size} "
                         "processes of this node")
    return le


def resolves(name: str) -> bool:
    """Whether `name` (a host name or an IP address) gives an address here (DNS, /etc/hosts)."""
    try:
        return bool(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        return False


@functools.lru_cache(maxsize=8)
def slurm_node_address(node: str) -> tuple[str, str | None]:
    """Where the ranks of a Slurm job meet, rank 0's node `node` (the job's first): (the address,
    None) or (the name, why it cannot be reached, in one line naming the fix).

    Slurm reaches its nodes by NodeAddr, which defaults to NodeName but on many clusters is an IP
    address or another name; NodeName need not resolve at all. So: the name where it resolves;
    else NodeAddr as `scontrol show node` gives it. (SLURM_LAUNCH_NODE_IPADDR names the host srun
    ran on, which is the job's first node only inside its batch script; no task can tell which
    case it is in, so it is not used.) Asked once per process; every task of a job asks the
    controller once, and only where the node's name does not resolve."""
    if resolves(node):
        return node, None
    from .slurm import SlurmError, show_node

    try:
        addr = show_node(node, timeout_s=5.0).addr
    except SlurmError as exc:
        why = f"and Slurm's NodeAddr for it could not be read ({exc})"
    else:
        if addr and addr != node and resolves(addr):
            return addr, None
        why = f"nor does its NodeAddr {addr!r} (scontrol show node {node})" if addr else \
            f"and scontrol show node {node} gives no NodeAddr"
    return node, (f"the job's first node {node}, where its ranks meet, has no address here: the name does not "
                  f"resolve (DNS, /etc/hosts) {why}; export MASTER_ADDR=<{node}'s IP address> before srun")


def export_env(le: LaunchEnv) -> None:
    """Sets what torch.distributed's env:// rendezvous reads (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT) from the detected launcher, keeping what is already set."""
    values = {"RANK": le.rank, "WORLD_SIZE": le.world_size, "LOCAL_RANK": le.local_rank,
              "LOCAL_WORLD_SIZE": le.local_world_size, "MASTER_ADDR": le.master_addr, "MASTER_PORT": le.master_port}
    for key, value in values.items():
        if value is not None:
            os.environ.setdefault(key, str(value))


def free_port() -> int:
    """A free localhost TCP port for a local rendezvous (closed again before the launcher binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def strip_options(argv: list[str], drop: tuple[str, ...]) -> list[str]:
    """argv without the options named in `drop` and their values (--opt VALUE or --opt=VALUE)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in drop:
            skip = True
            continue
        if arg.startswith(tuple(f"{d}=" for d in drop)):
            continue
        out.append(arg)
    return out


def relaunch(args: list[str], nprocs: int, timeout_s: float) -> int:
    """`python -m mgpu_bench.cli ARGS` again in `nprocs` local processes started by torch's elastic
    launcher on a localhost rendezvous; they join as under torchrun and rank 0 prints and writes.
    Exit code: 0; the ranks' own code when one failed (2 bad input, 143 SIGTERM, 129 SIGHUP, 130
    Ctrl-C), else 1; 130 when this process is interrupted (143 or 129 when it was terminated: cli.py)."""
    import sys
    import uuid

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig

    from .errors import interruption

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"mgpu-bench-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn", rdzv_timeout=int(max(60, timeout_s)))
    try:
        # the ranks are CLI processes in sessions of their own: the agent stops them with SIGINT
        run_elastic(lc, sys.executable, "-m", "mgpu_bench.cli", *args, children="keep")
    except ChildFailedError as exc:  # the ranks said why; their exit code is ours (2: bad input)
        codes = {f.exitcode for f in exc.failures.values()}
        return next((c for c in (2, 143, 129, 130) if c in codes), 1)
    except (KeyboardInterrupt, SignalException) as exc:  # the agent turns Ctrl-C and SIGTERM into SignalException
        print(f"mgpu-bench: {interruption(exc)}", file=sys.stderr)
        return 130
    return 0


def run_elastic(lc, entrypoint, *args, children: str = "keep", last: bool = False):
    """elastic_launch(lc, entrypoint)(*args) with this process's signal handling kept (the first
    Ctrl-C or SIGTERM reaches the agent as its SignalException, later ones do not break its
    shutdown: errors.under_agent) and its workers bound to this process (they die with it, and
    do with SIGINT what `children` says: children.MODES); a function's ranks are forked from the
    rank server whatever lc.start_method says (children.rank_start_method: torch imported once per
    run, not once per rank), with this process's environment; torch's own log lines (tracebacks,
    "Closing process ... via signal") left out unless LOGLEVEL asks for them. For a function
    `entrypoint`, each rank keeps its result or error in a file as soon as it has it (_kept_call):
    - a rank's failure is its own error in one line (ChildFailure, or its own InputError or
      MgpuError), never torch's ChildFailedError and its traceback;
    - a stop signal once every rank has its result (the ranks tearing down, the agent shutting
      down) keeps the results: returned, the stop raised where the next launch would start
      (errors.stop_pending, which also raises a stop that came earlier, before anything starts);
    - `last`: the run's last launch: once it returns, a stop signal waits (errors.defer_sigterm)
      while the launch's files go and the caller writes what was measured."""
    import dataclasses

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from . import children as bound
    from .errors import defer_sigterm, stop_pending, under_agent

    stop = stop_pending()
    if stop is not None:
        raise stop
    with bound.temp_folder("mgpu-elastic-") as kept, _quiet_torch_logs():
        call = (entrypoint,)
        try:
            with under_agent(getattr(lc, "signals_to_handle", None)) as signals, bound.spawning(children):
                if signals is not None and hasattr(lc, "signals_to_handle"):
                    lc = dataclasses.replace(lc, signals_to_handle=signals)
                if callable(entrypoint):  # forked from the rank server, handed this environment
                    lc = dataclasses.replace(lc, start_method=bound.rank_start_method())
                    call = (_kept_call, kept, bound.launch_env(), entrypoint)
                results = elastic_launch(lc, call[0])(*call[1:], *args)
                if last:  # every rank's result is in: nothing left to measure
                    defer_sigterm()
                return results
        except ChildFailedError as exc:
            if not callable(entrypoint):
                raise  # CLI ranks print their own line; relaunch takes their exit codes
            raise _rank_failure(kept, exc) from None
        except (KeyboardInterrupt, SignalException):
            results = _kept_results(kept, lc.nproc_per_node * lc.max_nodes)
            if results is None:
                raise
            return results  # measured before the stop: kept; stop_pending() raises it at the next launch


class ChildFailure(MgpuError):
    """A rank of a run_elastic launch failed: its own error in one line."""


_KEEP_IN: list[str] = []  # in a rank of run_elastic: the folder its result is kept in (keep_result)


def keep_result(result) -> None:
    """In a rank run_elastic started, once it has measured: its result kept now, before it tears its
    group down (seconds under load), so that a stop signal then does not lose it; else nothing."""
    import pickle

    if _KEEP_IN:
        _keep(_KEEP_IN[0], f"{os.environ.get('RANK', '0')}.result", pickle.dumps(result))


def _kept_call(folder: str, env: dict, fn, *args):
    """In a rank: its environment and binding (children.enter_rank: `env`, the launching process's),
    then fn(*args), its result (or its error, in words and, where it pickles, as itself) kept in
    `folder` before the rank returns or raises (keep_result keeps it earlier)."""
    import pickle

    from . import children as bound

    bound.enter_rank(env)
    rank = os.environ.get("RANK", "0")
    _KEEP_IN[:] = [folder]
    try:
        result = fn(*args)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a rank that exits has no result
        from .errors import portable

        if isinstance(exc, SystemExit):
            exc = RuntimeError(f"the rank called sys.exit({exc.code!r}) in the middle of the run")
        error = {"exc": portable(exc), "line": _error_line(exc)}
        _keep(folder, f"{rank}.error", pickle.dumps(error))
        raise exc from None
    _keep(folder, f"{rank}.result", pickle.dumps(result))
    return result


def _keep(folder: str, name: str, data: bytes) -> None:
    with open(os.path.join(folder, f".{name}.tmp"), "wb") as f:
        f.write(data)
    os.replace(os.path.join(folder, f".{name}.tmp"), os.path.join(folder, name))


def _error_line(exc: BaseException) -> str:
    """`Type: first line of the message (at file:line, in function)`: the innermost frame outside
    mgpu-bench and torch (the user's code), else the innermost one."""
    import traceback

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    theirs = [f for f in frames if f"{os.sep}mgpu_bench{os.sep}" not in f.filename
              and f"{os.sep}torch{os.sep}" not in f.filename]
    at = (theirs or frames)[-1:]
    where = f" (at {at[0].filename}:{at[0].lineno}, in {at[0].name})" if at else ""
    return f"{type(exc).__name__}: {text[:400]}{where}"


def _kept_results(folder: str, world: int) -> dict | None:
    """Every rank's kept result ({rank: result}), or None when any is missing."""
    import pickle

    out = {}
    for r in range(world):
        try:
            with open(os.path.join(folder, f"{r}.result"), "rb") as f:
                out[r] = pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError):
            return None
    return out


def _rank_failure(folder: str, exc) -> BaseException:
    """What a failed launch raises: the lowest rank's error of its own (a peer's closed connection is
    a consequence), InputError and MgpuError kinds as they are; else how the first rank ended."""
    import pickle

    from .errors import InputError, OutOfMemoryError, signal_name
    from .ranks import group_failure

    errors = {}
    for name in os.listdir(folder):
        if name.endswith(".error") and name.split(".")[0].isdigit():
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    errors[int(name.split(".")[0])] = pickle.load(f)
            except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
                continue
    if errors:
        own = [r for r, e in sorted(errors.items()) if not group_failure(e["exc"])]
        rank = (own or sorted(errors))[0]
        err, line = errors[rank]["exc"], errors[rank]["line"]
        if isinstance(err, InputError):
            return err
        if isinstance(err, MgpuError) and type(err) is not MgpuError:  # a plain MgpuError: portable()'s wrap
            with contextlib.suppress(TypeError):  # a subclass of another signature: as it is
                err = err if str(err).startswith("rank ") else type(err)(f"rank {rank}: {err}", err.code)
            return err
        if "OutOfMemoryError" in line.split(":")[0] or "out of memory" in line.lower():
            return OutOfMemoryError(f"rank {rank}: out of memory: {line.partition(': ')[2]}")
        return ChildFailure(f"rank {rank} failed: {line}")
    failures = sorted(getattr(exc, "failures", {}).items())
    if not failures:
        return ChildFailure("a rank failed without saying why")
    rank, f = failures[0]
    code = getattr(f, "exitcode", None)
    how = (f"was ended by {signal_name(-code)}" if isinstance(code, int) and code < 0
           else f"exited with code {code}")
    return ChildFailure(f"rank {rank} {how} before it said why (killed from outside, out of host memory, or "
                        "crashed)")


@contextlib.contextmanager
def _quiet_torch_logs():
    """torch's elastic agent and its process starter log every worker's traceback and every stop
    ("Closing process ... via signal SIGINT") on stderr; run_elastic says what happened in one
    line instead. Left as they are when the user set LOGLEVEL (torch's own switch for them)."""
    import importlib
    import logging

    if os.environ.get("LOGLEVEL"):
        yield
        return
    importlib.import_module("torch.distributed.elastic.agent.server.local_elastic_agent")  # its loggers made
    names = [n for n in list(logging.root.manager.loggerDict)
             if n.startswith(("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing"))]
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was


def parse_hostlist(text: str, what: str = "--expect") -> list[str]:
    """expand_hostlist() for a hostlist a user typed: InputError (exit 2) naming what does not
    parse (unbalanced brackets, a range that is not low-high of digits)."""
    if text.count("[") != text.count("]") or re.search(r"\[[^\]]*\[|\][^,\[]*\]", text):
        raise InputError(f"{what} '{text}' does not parse: brackets must pair, as in gpu[01-04,07]")
    for body in re.findall(r"\[([^\]]*)\]", text):
        for r in body.split(","):
            if not re.fullmatch(r"\d+(-\d+)?", r) or ("-" in r and int(r.split("-")[0]) > int(r.split("-")[1])):
                raise InputError(f"{what} '{text}' does not parse: '{r}' is not a number or a low-high range")
    hosts = expand_hostlist(text)
    if not hosts:
        raise InputError(f"{what} '{text}' names no host")
    return hosts
