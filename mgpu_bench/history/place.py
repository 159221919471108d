"""Where the history database is: the default place (MGPU_BENCH_DB, else the XDG data folder),
the fallback a command asks for where HOME holds no history (a health check run by a daemon), and
the checks of a database's folder and file before SQLite opens it (store.py opens it).
"""

from __future__ import annotations

import os
from pathlib import Path

from mgpu_bench.core.errors import InputError
from mgpu_bench.core.paths import special_place

_WHERE = "give --db PATH or set MGPU_BENCH_DB to the database file"


FALLBACK_ENV = "MGPU_BENCH_HISTORY_FALLBACK"  # set by a command that must store where HOME holds no history
FALLBACK_DB = "/var/lib/mgpu-bench/history.sqlite3"  # root's: the FHS place for a program's state (FHS 3.0, 5.8)


def default_path() -> Path:
    """The database a command stores in when given none: default_place()'s path."""
    return default_place()[0]


def default_place() -> tuple[Path, str | None]:
    """(the default database, None); or, where a command asked for a fallback (FALLBACK_ENV set:
    the check, as slurmd, NHC or node-problem-detector run it, with no HOME or one that holds no
    history) and the regular default cannot take a run, (fallback_path(), why, in words). The
    regular default's own refusal otherwise."""
    try:
        p = _regular_default()
        if not os.environ.get(FALLBACK_ENV) or "MGPU_BENCH_DB" in os.environ:
            return p, None
        nearest = p.parent
        while not nearest.exists() and nearest.parent != nearest:
            nearest = nearest.parent
        if special_place(nearest):
            raise InputError(f"{p} would be {special_place(nearest)}")
        if not os.access(nearest, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.R_OK | os.W_OK)):
            raise InputError(f"{p} is not writable")
        return p, None
    except InputError as exc:
        if not os.environ.get(FALLBACK_ENV) or "MGPU_BENCH_DB" in os.environ:
            raise
        place = fallback_path()
        if place is None:
            raise
        why = str(exc).split(": give --db", 1)[0].split("; give --db", 1)[0]
        return place, (f"{why}: stored in {place} instead (give --db PATH, as the shipped NHC and "
                       "node-problem-detector configurations do, to choose the place)")


def fallback_path() -> Path | None:
    """Where such a command stores: the file history.sqlite3 in paths.state_folder() (which
    decides and makes the folder: $XDG_STATE_HOME/mgpu-bench, else FALLBACK_DB's folder for root,
    else a private folder under the temporary directory). None when none can be had; InputError
    for an XDG_STATE_HOME that must not or cannot be used (nothing made there)."""
    from mgpu_bench.core.paths import state_folder

    folder = state_folder(os.path.dirname(FALLBACK_DB))
    return None if folder is None else folder / "history.sqlite3"


def _regular_default() -> Path:
    """$MGPU_BENCH_DB, else $XDG_DATA_HOME/mgpu-bench/history.sqlite3 with XDG_DATA_HOME taken
    only when absolute, else $HOME/.local/share (the XDG Base Directory specification). InputError
    for a blank MGPU_BENCH_DB, and for a HOME that is empty, relative or not an existing folder
    (nothing is created at the root of the file system or under a HOME that is not there)."""
    env = os.environ.get("MGPU_BENCH_DB")
    if env is not None:
        if not env.strip():
            raise InputError(f"MGPU_BENCH_DB is set but blank ({env!r}): set it to the history database file, or "
                             "unset it for the default ($XDG_DATA_HOME/mgpu-bench/history.sqlite3)")
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(data):  # the spec: a relative path is invalid and is ignored
        home = os.environ.get("HOME")
        if home is None:
            try:
                import pwd

                home = pwd.getpwuid(os.getuid()).pw_dir
            except (ImportError, KeyError):
                home = ""
        if not home:
            raise InputError(f"HOME is empty, so there is no default place for the history database: {_WHERE}")
        if not os.path.isabs(home):
            raise InputError(f"HOME is a relative path ({home!r}), so there is no default place for the history "
                             f"database: {_WHERE}")
        if not os.path.isdir(home):
            raise InputError(f"HOME ({home}) is not an existing folder, so there is no default place for the "
                             f"history database: {_WHERE}")
        data = os.path.join(home, ".local", "share")
    return Path(data) / "mgpu-bench" / "history.sqlite3"



def _check_location(p: Path, readonly: bool = False) -> None:
    """The folder exists and is writable (WAL mode writes two files beside the database), and is
    no device or kernel file system (paths.special_place); an existing file is SQLite (its first 16
    bytes) and writable. `readonly`: a missing file is said by the caller, and a file or folder
    that can only be read will do."""
    try:
        _check_path(p, readonly)
    except OSError as exc:  # a name too long, a folder that cannot be searched
        raise InputError(f"cannot use {p} as the history database: {exc.strerror or exc}") from None


def _check_path(p: Path, readonly: bool) -> None:
    if p.is_dir():
        raise InputError(f"{p} is a folder: give a database file name, e.g. {p / 'history.sqlite3'}")
    folder = p.parent
    if not folder.is_dir():
        if readonly:
            return  # no database there: the caller names the path
        raise InputError(f"the folder of the history database {p} does not exist: create it first")
    where = special_place(folder)
    if where:
        raise InputError(f"the history database {p} is {where}: give a --db path elsewhere")
    if readonly:
        if p.exists() and not p.is_file():
            raise InputError(f"{p} is not a regular file: give a history database file name")
        if p.exists() and not os.access(p, os.R_OK):
            raise InputError(f"the history database {p} is not readable: fix its permissions or give another --db path")
    elif not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"the folder of the history database {p} is not writable: give a --db path in a "
                         "writable folder")
    if p.exists():
        if not p.is_file():  # a FIFO or a device: reading its first bytes would wait or never end
            raise InputError(f"{p} is not a regular file: give a history database file name")
        if not readonly and not os.access(p, os.R_OK | os.W_OK):
            raise InputError(f"the history database {p} is not readable and writable: fix its permissions or give "
                             "another --db path")
        with open(p, "rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\x00":
            raise InputError(f"{p} is not an SQLite database (so not an mgpu-bench history): give another --db "
                             "path, or move this file away")
