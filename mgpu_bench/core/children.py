"""Processes the tool starts die with it, and so do the temporary folders of dead runs.

A parent marks the children it starts with the environment variable MGPU_BENCH_PARENT
("<pid>:<mode>": its pid, and what the child does with Ctrl-C), set by child_env() for a
subprocess and by spawning() around a multiprocessing or torch elastic start. The child reads
it first thing when it imports mgpu_bench (adopt(), called by the package's __init__) and takes
it out of its environment, so that its own children are marked by it, never by its parent:

- Linux: PR_SET_PDEATHSIG, so that the kernel sends SIGKILL when the parent dies. The kernel
  sends it when the parent *thread* that forked the child ends, so it is set only when the
  parent's main thread is the one that forked (the child is listed in /proc/PPID/task/PPID/
  children); getppid() is checked right after, for a parent that died before it was set.
- Elsewhere, or when another thread of the parent forked: a watchdog thread that polls
  getppid() every WATCHDOG_S seconds and ends the child when it changes (the child was
  reparented: its parent is gone).

SIGKILL of the parent thus ends its children too (SIGKILL of `comm` on CPU left its two gloo
ranks running at 90% CPU for minutes before), and each of those ends its own.

The command the user typed travels the same way (MGPU_BENCH_COMMAND, set by child_env() and by
the CLI for the processes it starts): a run stored by a child (a suite's probe, check's measuring
process, a rank of `comm --launch processes`) records what the user typed, not the child's own
`cli.py check --json /tmp/...` (user_command()).

Every Python child imports the package its parent runs, never another copy (import_env()):
Python puts a `-m` child's working folder first on sys.path, so a child started from inside a
source checkout (after a non-editable `pip install .`) imported the checkout's uninstalled tree,
which has no native module. child_env() and spawning() (every place the tool starts a process
goes through one of them) set PYTHONSAFEPATH, so that no working folder or script folder is
put first, and put this process's package folder first on PYTHONPATH where it is not on the
path otherwise (a source tree run with `python -m` from its root). The child puts the user's
own PYTHONSAFEPATH and PYTHONPATH back when it imports mgpu_bench (adopt()), so that a program
it starts in turn (a user model's own subprocess) sees the user's environment.

Temporary folders and files are named with their owner's pid (temp_folder, temp_name); a run
that makes one first removes those of its prefix whose owner is dead and that have not changed
for STALE_S seconds (older names without a pid: STALE_UNNAMED_S), never a live run's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

ENV = "MGPU_BENCH_PARENT"
COMMAND_ENV = "MGPU_BENCH_COMMAND"  # the command the user typed, JSON: a list of strings (user_command)
# The user's own values of the variables import_env() sets, JSON {name: value or null}: put back by adopt().
PYTHON_ENV = "MGPU_BENCH_PYTHON_ENV"
_IMPORT_VARS = ("PYTHONSAFEPATH", "PYTHONPATH")
# What a child does with SIGINT (a terminal sends it to the whole foreground process group):
# "keep": its own handling (a CLI child that its parent stops with SIGINT: the suite's probes);
# "ignore": nothing (its parent stops it: comm's gloo ranks);
# "die": it ends at once, without a traceback (torch's elastic agent forwards SIGINT to its
# workers and waits for them to end: the model's ranks on CPU).
MODES = ("keep", "ignore", "die")
WATCHDOG_S = 0.5
STALE_S = 3600.0  # a dead owner's folder untouched this long is removed (a live run writes more often)
STALE_UNNAMED_S = 86400.0  # names from before the pid was in them: no owner to ask, so a day

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_folders: set[str] = set()  # this process's temporary folders, removed on abandon()
_parent_command: list[str] | None = None  # the user's command, when a tool run started this process
_path_handed = False  # this process found its package through the PYTHONPATH import_env() gave it


# -- the child side -------------------------------------------------------------------------------


def adopt(environ=None, through: int | None = None) -> str | None:
    """In a process a tool run started (MGPU_BENCH_PARENT set): takes the mark out of the
    environment, ends this process at once when its parent is already gone, arranges that it ends
    when its parent does, and sets its SIGINT handling. `through`: the pid of the rank server that
    forked this process for the marked parent (enter_rank): it ends when the server does (the
    death signal) and when the marked parent does, watched through a pidfd (the server outlives
    the parent while a rank lives: each rank holds the server's end of the parent's pipe).
    Returns how it is bound ("pdeathsig", "watchdog", "pidfd"), or None when it was not started
    by the tool (nothing is done)."""
    global _parent_command
    environ = os.environ if environ is None else environ
    _restore_import_vars(environ)
    mark = environ.pop(ENV, None)
    command = environ.pop(COMMAND_ENV, None)
    if not mark:
        return None
    try:
        pid_text, mode = mark.split(":", 1)
        parent = int(pid_text)
    except ValueError:
        return None  # not ours to read
    if through is None and os.getppid() != parent and alive(parent):
        return None  # started through another program (a shell) that keeps the mark: not its child
    _parent_command = _command_list(command)
    if mode in ("ignore", "die"):
        # SIGINT may arrive blocked (spawning(block_sigint=True)): set what it does, then let it
        # in; one that came in the meantime is dropped ("ignore") or ends us ("die")
        with contextlib.suppress(AttributeError, ValueError, OSError):  # ValueError: not the main thread
            signal.signal(signal.SIGINT, signal.SIG_IGN if mode == "ignore" else signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if through is not None:
        return _bind_through(through, parent)
    how = "watchdog"
    if _forked_by_main_thread(parent) and _set_pdeathsig(signal.SIGKILL):
        how = "pdeathsig"
    if os.getppid() != parent:  # the parent died before the death signal was set
        _die()
    if how == "watchdog":
        threading.Thread(target=_watch, args=(parent,), name="mgpu-bench-parent-watchdog", daemon=True).start()
    return how


def _restore_import_vars(environ) -> None:
    """PYTHONSAFEPATH and PYTHONPATH as the user had them before import_env() set them for this
    process's start (nothing when it did not)."""
    import json

    global _path_handed
    text = environ.pop(PYTHON_ENV, None)
    try:
        saved = json.loads(text) if text else None
    except ValueError:
        return
    if not isinstance(saved, dict):
        return
    _path_handed = environ.get("PYTHONPATH") != saved.get("PYTHONPATH")  # its own children need it too
    for name in _IMPORT_VARS:
        value = saved.get(name)
        if isinstance(value, str):
            environ[name] = value
        elif name in saved:
            environ.pop(name, None)


def _forked_by_main_thread(parent: int) -> bool:
    """Whether this process's parent thread is its parent's main thread (Linux' /proc lists a
    thread's children; without that file: not known, False)."""
    try:
        with open(f"/proc/{parent}/task/{parent}/children") as f:
            return str(os.getpid()) in f.read().split()
    except OSError:
        return False


def _set_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _bind_through(server: int, parent: int) -> str:
    """adopt() for a rank the server forked for `parent`: the death signal for the server's end,
    and a thread that ends this process when `parent` ends (a pidfd where Linux has them, else
    the parent's pid polled every WATCHDOG_S seconds)."""
    if _forked_by_main_thread(server):
        _set_pdeathsig(signal.SIGKILL)
    if os.getppid() != server:
        _die()
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        fd = None
    if fd is None and not alive(parent):
        _die()
    threading.Thread(target=_watch_pid, args=(parent, fd), name="mgpu-bench-parent-watchdog", daemon=True).start()
    return "pidfd" if fd is not None else "watchdog"


def _watch_pid(parent: int, fd: int | None) -> None:
    if fd is not None:
        import select

        select.select([fd], [], [])  # readable once the process has ended
    else:
        while alive(parent):
            time.sleep(WATCHDOG_S)
    _die()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCHDOG_S)
    _die()


def _die() -> None:
    """Ends this process as the death signal would (its own children, bound to it, follow)."""
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


# -- ranks forked from a server that imported torch once -----------------------------------------
#
# Every rank of a run imports torch, and most torch.distributed and torch._dynamo too (DDP's
# constructor reads a dynamo setting): 4-7 s of CPU per process on a 2-core host, per rank and per
# configuration. A run's ranks are forked instead from multiprocessing's fork server, started once
# per run with those modules imported (rank_start_method): a rank starts in a fraction of a second.
# The server never touches a GPU (importing torch initialises no CUDA), and has one thread. What a
# forked rank would otherwise inherit from the server's start, it is handed explicitly
# (enter_rank): the environment this process has at the launch, and its binding to this process
# (a pidfd: the server does not end before its ranks, which hold its end of this process's pipe).

RANK_PRELOAD = ("torch", "torch.distributed", "torch._dynamo")


def rank_start_method(preload: tuple[str, ...] = RANK_PRELOAD) -> str:
    """The start method for ranks of this process: "forkserver" on Linux, its server started now
    if it is not running (it imports `preload` and mgpu_bench.core.rank_server while this process
    goes on; a server already running keeps what it imported), else "spawn". A rank it starts
    calls enter_rank() with launch_env() first."""
    import multiprocessing

    if not sys.platform.startswith("linux") or "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload([*preload, "mgpu_bench.core.rank_server"])
    # This process's package on its path, not the working folder's (import_env); no mark: the
    # server is no rank (adopted, a watchdog thread might be forked into every rank), and it ends
    # when this process closes its end of the server's pipe.
    with _environ_for_children(None):
        forkserver.ensure_running()
    if not _server_started:
        _server_started.append(time.monotonic())
    return "forkserver"


_server_started: list[float] = []  # time.monotonic() of this process's first rank_start_method()


def rank_server_age() -> float:
    """Seconds since this process started its rank server (0.0 before it did)."""
    return time.monotonic() - _server_started[0] if _server_started else 0.0


def launch_env() -> dict[str, str]:
    """This process's environment for the ranks it starts now (inside spawning(): the mark and
    the import variables in it), for enter_rank()."""
    return dict(os.environ)


def enter_rank(env: dict[str, str] | None) -> str | None:
    """First thing in a rank: where it was forked by the rank server, its environment becomes
    `env` (the launching process's, launch_env()) plus what its launcher set for it since the fork
    (RANK, MASTER_ADDR, ...: the variables that differ from the server's own), and it is bound to
    the launching process (adopt(through=server): it ends when that process or the server ends).
    A spawned rank has its parent's environment and was adopted at import: nothing to do.
    Returns how it is bound, as adopt()."""
    server = os.getppid()
    if env is None or not forked_by_server(server):
        return None
    try:
        with open(f"/proc/{server}/environ", "rb") as f:  # the server's environment, as it started
            base = dict(item.decode(errors="surrogateescape").split("=", 1)
                        for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        base = {}
    since = {k: v for k, v in os.environ.items() if base.get(k) != v}
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(since)
    return adopt(through=server)


def forked_by_server(pid: int) -> bool:
    """Whether process `pid` is multiprocessing's fork server (its command line names it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"multiprocessing.forkserver" in f.read()
    except OSError:
        return False


# -- the parent side ------------------------------------------------------------------------------


def mark(mode: str = "keep") -> str:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    return f"{os.getpid()}:{mode}"


def child_env(env: dict[str, str] | None = None, mode: str = "keep") -> dict[str, str]:
    """The environment for a subprocess (default: this process's) with the mark that binds it to
    this process, and the command the user typed (user_command()). The child binds itself when it
    imports mgpu_bench (adopt()): a program that never imports the package (scontrol) ignores the
    mark, and would outlive a parent that dies without its orderly stop (abandon() still kills
    it), so it is also given preexec_fn=die_with_parent."""
    import json

    base = import_env(os.environ if env is None else env)
    return {**base, ENV: mark(mode), COMMAND_ENV: json.dumps(user_command())}


def package_folder() -> str:
    """The folder holding the mgpu_bench package this process runs (site-packages for an
    installed one, the checkout for a source tree): the folder above mgpu_bench/ (this file is
    mgpu_bench/core/children.py), read without importing the package from below."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _on_path(folder: str) -> bool:
    """Whether a Python child started with PYTHONSAFEPATH finds `folder` on its sys.path as this
    process does: on sys.path other than as the first entry Python put there for the script or
    the working folder (none with safe_path). Its PYTHONPATH, .pth files and the site folders
    are the same in the child."""
    entries = sys.path if sys.flags.safe_path else sys.path[1:]
    real = os.path.realpath(folder)
    return any(os.path.realpath(e or os.curdir) == real for e in entries if isinstance(e, str))


def import_env(env) -> dict[str, str]:
    """`env` for a Python child that must import this process's mgpu_bench, whatever its working
    folder holds: PYTHONSAFEPATH=1 (Python 3.11+: no working or script folder first on sys.path),
    and package_folder() first on PYTHONPATH where the child would not find it otherwise. The
    user's own values travel in PYTHON_ENV; the child puts them back (adopt())."""
    import json

    out = dict(env)
    if PYTHON_ENV not in out:  # once: an environment made from one of these keeps the user's values
        out[PYTHON_ENV] = json.dumps({name: env.get(name) for name in _IMPORT_VARS})
    out["PYTHONSAFEPATH"] = "1"
    folder = package_folder()
    if _path_handed or not _on_path(folder):
        before = env.get("PYTHONPATH")
        if folder not in (before or "").split(os.pathsep):
            out["PYTHONPATH"] = folder + (os.pathsep + before if before else "")
    return out


def _command_list(text: str | None) -> list[str] | None:
    """MGPU_BENCH_COMMAND read back: a JSON list of strings, else None (not ours)."""
    import json

    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, list) and value and all(isinstance(v, str) for v in value) else None


def user_command() -> list[str]:
    """The command line the user typed for this run: the one handed down by the tool run that
    started this process (adopt()), else this process's own. `python -m mgpu_bench.cli ARGS` is
    recorded as typed (sys.orig_argv), not as the module's path; the `mgpu-bench` script as
    sys.argv has it."""
    if _parent_command is not None:
        return list(_parent_command)
    argv = list(sys.argv)
    orig = list(getattr(sys, "orig_argv", []) or [])
    module = "-m" in orig[1:] and argv and argv[0].endswith(os.path.join("mgpu_bench", "cli.py"))
    if module and orig[len(orig) - len(argv) + 1:] == argv[1:]:
        return [os.path.basename(orig[0]), *orig[1:]]  # python -m mgpu_bench.cli ..., the interpreter by its name
    return argv


def hand_down_command() -> None:
    """The CLI, first thing: the processes it starts (multiprocessing, torch's elastic agent, and
    child_env()'s subprocesses) record the command the user typed (user_command())."""
    import json

    os.environ[COMMAND_ENV] = json.dumps(user_command())


def die_with_parent() -> None:
    """preexec_fn for a subprocess that is not mgpu_bench (scontrol, a shell), which cannot read the
    mark of child_env(): in the child, between fork and exec, PR_SET_PDEATHSIG so that the kernel
    sends it SIGKILL when the thread that started it ends (the death signal survives exec; a
    set-uid program drops it), and an exit at once if that parent is already gone. Only for a
    child that the starting thread waits for (subprocess.run), so that the thread outlives it;
    elsewhere than Linux it does nothing. It calls only the prctl resolved beforehand."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the death signal was set
        os._exit(137)


def _resolve_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _resolve_prctl()  # resolved here, not in a forked child (no dynamic loader there)


@contextlib.contextmanager
def spawning(mode: str = "keep", block_sigint: bool = False) -> Iterator[None]:
    """Around code that starts children from this process's environment (multiprocessing,
    torch's elastic agent): they carry the mark, and import this process's package
    (import_env()). With `block_sigint`, for a short start loop in
    the main thread, SIGINT is blocked meanwhile, so that the children start with it blocked (a
    signal mask survives fork and exec) until adopt() has set what they do with it; a SIGINT for
    this process waits until the block ends, and is not lost. (Not around a whole elastic agent
    run: the threads it starts would keep the block.)"""
    value = mark(mode)
    blocked = False
    if block_sigint and threading.current_thread() is threading.main_thread():
        with contextlib.suppress(AttributeError, ValueError, OSError):
            blocked = signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _environ_for_children(value):
            yield
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _environ_for_children(mark_value: str | None) -> Iterator[None]:
    """os.environ, inside, as a child started now should inherit it: this process's package on
    the path (import_env()) and the mark `mark_value` (None: no mark); as it was, after."""
    names = (ENV, PYTHON_ENV, *_IMPORT_VARS)
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(import_env(os.environ))
    if mark_value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = mark_value
    try:
        yield
    finally:
        for name, old in before.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def descendants(pid: int | None = None) -> list[int]:
    """Every process below `pid` (default: this one), parents before their children, from
    /proc/PID/task/*/children (Linux; [] elsewhere)."""
    out: list[int] = []
    todo = [os.getpid() if pid is None else pid]
    while todo:
        p = todo.pop(0)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            out += [k for k in kids if k not in out]
            todo += kids
    return out


def abandon() -> None:
    """This process is about to end without its orderly stop: SIGKILL to every process below it
    (bound to it, they would follow anyway; this does not wait for the kernel or a watchdog),
    and its temporary folders removed. Best effort."""
    for pid in descendants():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for folder in list(_folders):
        shutil.rmtree(folder, ignore_errors=True)


# -- temporary folders ----------------------------------------------------------------------------


def _owner_pattern(prefix: str) -> re.Pattern:
    # tempfile's random part: 8 of [a-z0-9_]
    return re.compile(re.escape(prefix) + r"(?:pid(?P<pid>\d+)-)?[a-z0-9_]{8}(?P<suffix>\.[A-Za-z0-9]+)?")


def temp_name(prefix: str) -> str:
    """The prefix for tempfile.mkstemp / mkdtemp that carries this process's pid, so that a later
    run can tell whether its owner still lives (clean_stale)."""
    return f"{prefix}pid{os.getpid()}-"


@contextlib.contextmanager
def temp_folder(prefix: str) -> Iterator[str]:
    """A temporary folder for this run (removed at the end, and on abandon()), made after the
    stale folders of dead runs with the same prefix are removed."""
    clean_stale(prefix)
    path = tempfile.mkdtemp(prefix=temp_name(prefix))
    _folders.add(path)
    try:
        yield path
    finally:
        _folders.discard(path)
        shutil.rmtree(path, ignore_errors=True)


def alive(pid: int) -> bool:
    """Whether a process `pid` exists and is not a zombie (one of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _newest_mtime(path: str) -> float:
    newest = os.lstat(path).st_mtime
    with contextlib.suppress(OSError), os.scandir(path) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def clean_stale(prefix: str, where: str | None = None, now: float | None = None) -> list[str]:
    """Removes from `where` (default: the temporary directory) the folders and files named
    PREFIX + "pid<PID>-" + 8 characters (temp_name) whose process PID is gone and that nothing
    changed for STALE_S seconds, and those named PREFIX + 8 characters (older releases, no pid)
    unchanged for STALE_UNNAMED_S seconds. Only this user's, never through a symbolic link; a
    live pid (even another program that reuses it) keeps its folder. Returns what was removed."""
    import stat

    where = tempfile.gettempdir() if where is None else where
    now = time.time() if now is None else now
    pattern = _owner_pattern(prefix)
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(where) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        if not m:
            continue
        path = os.path.join(where, name)
        try:
            st = os.lstat(path)
            if st.st_uid != os.getuid() or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                continue
            age = now - _newest_mtime(path) if stat.S_ISDIR(st.st_mode) else now - st.st_mtime
        except OSError:
            continue
        pid = m.group("pid")
        if (pid is None and age < STALE_UNNAMED_S) or (pid is not None and (age < STALE_S or alive(int(pid)))):
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
        except OSError:
            continue
    return removed


def signal_group(proc, sig: int) -> None:
    """`sig` to the process group of `proc` (a child started with start_new_session=True); one
    already gone, or not ours to signal, is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_group(proc, grace_s: float = 60.0) -> None:
    """Stops a child command's process group as a user's Ctrl-C would: SIGINT (it writes what it
    measured and exits), SIGKILL to the group after `grace_s`, and SIGKILL again to anything of
    the group still alive once the command itself ended (no worker of it holds a GPU after it).
    The suite's probes and plan --measure's commands are stopped this way."""
    import subprocess

    signal_group(proc, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        proc.wait()
    signal_group(proc, signal.SIGKILL)
