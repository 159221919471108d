"""Output paths: checked before any measurement, and written by one function.

A run that takes an hour must not fail at its end because its file or folder cannot be written,
and writing a result must never destroy what the given path points to. Every output file (a
command's --json, --csv, --prometheus, fleet's --exclude-file, `compare --json`, `history show
--prometheus`, the files of a report folder) is written by write_output(), under one contract:

- absent, or a regular file: the data go to a new file in the same folder, fsynced, then renamed
  over the name (a reader never sees half a file; an existing file keeps its permission bits);
- a symbolic link (or a chain of them): the same, at the file it resolves to; the link stays;
- a directory, FIFO, character or block device, or socket: refused. check_writable() says so as
  bad input (exit code 2) before any measurement; write_output() raises OSError should the path
  have become one since.

"Writable" is tested by doing it (creating and removing a scratch file in the folder, opening an
existing file for append without truncating it), not by permission bits: root passes any
permission test, yet cannot create a file under /proc.

Where files may go at all: never into a folder on a device or kernel file system (devtmpfs, proc,
sysfs, cgroup, ... : SPECIAL_FS, by the mount table), nor anywhere below /dev, /proc or /sys by
the path, whatever the file system there (a container's /dev is a tmpfs; /dev/shm is shared
memory, gone at reboot and counted against RAM); root may create files there, and must not. A
name that is empty or blank (`--report ''`, `--json ' '`, a component of spaces) is refused
(check_name): it would write into the working folder, or make a folder named with a space.

This module decides every place the tool writes by itself too: the state folder where a check
stores its history when the default place cannot take it (state_folder(): $XDG_STATE_HOME/
mgpu-bench, made with its parents as the XDG Base Directory specification says, else root's
/var/lib/mgpu-bench, else a private folder under the temporary directory), each folder checked
before anything is made (make_folder()). check_distinct()
refuses, before measuring, two outputs of one command that are the same file and an output that
is the history database (or its -wal, -shm or -journal file), by resolved path (relative paths,
symbolic links) and by device and inode where the file exists (hard links); write_output() never
replaces an mgpu-bench history database, whatever it is called.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import InputError

# The files a report folder's writers put there by name or suffix: checked before measuring
# that none of them exists as something other than a regular file (or a link to one).
_REPORT_NAMES = ("report.html", "summary.md")
_REPORT_SUFFIXES = (".png", ".json", ".html", ".md")
# The files a report folder's writers may create in it: by name, and every .png (named from the
# document). check_distinct() keeps every other output and the database out of them.
_REPORT_WRITES = ("report.html", "summary.md", "suite.json")
_REPORT_WRITE_SUFFIX = ".png"
# PRAGMA application_id of an mgpu-bench history database ("mGPB"; history.store writes it).
HISTORY_APPLICATION_ID = 0x6D475042
# The history database's own files beside it (SQLite's WAL, shared memory and rollback journal).
DB_SIDECARS = ("", "-wal", "-shm", "-journal")

# File systems of devices and the kernel's state: nothing of ours is ever written there.
SPECIAL_FS = frozenset({
    "devtmpfs", "devfs", "devpts", "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
    "configfs", "pstore", "bpf", "efivarfs", "fusectl", "binfmt_misc", "mqueue", "hugetlbfs", "autofs",
    "rpc_pipefs", "nsfs", "selinuxfs", "usbfs",
})
_SPECIAL_MOUNTS = ("/dev", "/proc", "/sys")
_SPECIAL_WHAT = {"/dev": "devices and shared memory", "/proc": "devices and kernel state",
                 "/sys": "devices and kernel state"}


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def resolve(path: str | os.PathLike) -> Path:
    """The file an output path names: the path itself, or where its symbolic link(s) end (which
    may not exist yet: a dangling link's target is created)."""
    p = Path(path)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def _stat(target: Path) -> os.stat_result | None:
    """os.stat of the file, None when there is none; other OSErrors (a link loop) propagate."""
    try:
        return os.stat(target)
    except FileNotFoundError:
        return None


def _folder(target: Path) -> Path:
    return target.parent if str(target.parent) else Path(".")


def _scratch_name(folder: Path, stem: str) -> Path:
    return folder / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount this process sees (Linux' mountinfo; []
    elsewhere), longest mount point first."""
    out = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, after = left.split(), right.split()
                if len(fields) >= 5 and after:
                    point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                    out.append((point, after[0]))
    except OSError:
        return []
    return sorted(out, key=lambda m: len(m[0]), reverse=True)


def special_place(folder: str | os.PathLike) -> str | None:
    """Why files must not be written in `folder` (resolved): it lies below /dev, /proc or /sys
    (by the path, whatever the file system: /dev/shm's tmpfs included), or its file system is a
    device or kernel one (SPECIAL_FS, by the mount table); None for an ordinary folder."""
    real = os.path.realpath(os.path.abspath(folder))
    for point, fstype in _mounts():  # longest mount point first: the one the folder is on
        if real == point or real.startswith(point.rstrip("/") + "/"):
            if fstype in SPECIAL_FS:
                return f"on a {fstype} file system ({point}: devices and kernel state, not files)"
            break
    for top in _SPECIAL_MOUNTS:
        if real == top or real.startswith(top + "/"):
            return f"in {top} ({_SPECIAL_WHAT[top]}, not files)"
    return None


def _refuse_special(folder: Path, what: str) -> None:
    why = special_place(folder)
    if why:
        raise InputError(f"{what}: {folder} is {why}, where mgpu-bench writes nothing: give a folder elsewhere")


def _try_create(folder: Path, what: str) -> None:
    """Creates and removes a scratch file in `folder`; InputError naming `what` if it cannot."""
    _refuse_special(folder, what)
    scratch = _scratch_name(folder, "mgpu-bench-check")
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise InputError(f"{what}: no file can be created in {folder} ({exc.strerror or exc}): "
                         "give a path in a writable folder") from None
    os.close(fd)
    os.unlink(scratch)


def _named(path: str | os.PathLike, flag: str | None) -> str:
    return f"{flag} {path}" if flag else str(path)


def check_name(path: str | os.PathLike | None, flag: str | None = None) -> None:
    """A given output name (None: not given) that is empty, or has a component of blanks only:
    InputError naming the fix. `--report ''` would write into the working folder, `--report ' '`
    make a folder named with a space."""
    if path is None:
        return
    text = os.fspath(path)
    text = text.decode("utf-8", "backslashreplace") if isinstance(text, bytes) else text
    what = f"{flag} {text!r}" if flag else repr(text)
    if not text.strip():
        raise InputError(f"{what} is blank: give a name of visible characters" + (
            f", or omit {flag}" if flag else ""))
    if any(part and not part.strip() for part in text.split(os.sep)):
        raise InputError(f"{what} has a folder or file name of blanks only in it: give names of visible characters")


def check_writable(path: str | os.PathLike | None, flag: str | None = None) -> None:
    """An output file (`flag` names its option in the message) must be creatable before hours of
    measurement depend on it: InputError (exit code 2) otherwise, with the fix. None: no file
    asked for; an empty or blank name is refused (check_name)."""
    check_name(path, flag)
    if path is None:
        return
    what = _named(path, flag)
    try:
        target = resolve(path)
    except OSError as exc:  # a name too long for the file system, a component that is not a folder
        raise InputError(f"{what}: {exc.strerror or exc}: give a shorter or existing path") from None
    try:
        st = _stat(target)
    except OSError as exc:
        raise InputError(f"{what} cannot be followed ({exc.strerror or exc}): give a regular file's name") from None
    if st is not None and _kind(st.st_mode):
        hint = "give a file name inside it" if stat.S_ISDIR(st.st_mode) else "give a regular file's name"
        link = f" (a link to {target})" if target != Path(path) else ""
        raise InputError(f"{what}{link} is {_kind(st.st_mode)}, which mgpu-bench does not write into: {hint}")
    folder = _folder(target)
    if not folder.is_dir():
        raise InputError(f"{what}: its folder {folder} does not exist: create it first")
    _try_create(folder, what)
    if st is not None:
        try:
            # not truncated, nothing written; O_NONBLOCK: a FIFO swapped in since the stat must not hang us
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        except OSError as exc:
            raise InputError(f"{what} cannot be written ({exc.strerror or exc}): make it writable or give "
                             "another name") from None


def check_folder(path: str | os.PathLike, flag: str) -> None:
    """An existing folder (or a link to one) where files can be created: InputError otherwise."""
    check_name(path, flag)
    p = Path(path)
    try:
        is_dir = p.is_dir()
    except OSError:  # a name too long for the file system
        is_dir = False
    if not is_dir:
        raise InputError(f"{flag} {path} is not a writable folder (none is there): give an existing folder")
    _try_create(p.resolve(), f"{flag} {path}")


def check_report_dir(path: str | os.PathLike | None, flag: str | None = "--report") -> None:
    """A report folder: an existing folder (or a link to one) where files can be created, or a new
    folder inside an existing, writable one. The report files already in it must be regular files
    (or links to them): they are replaced (but never a history database: check_distinct). None:
    no folder asked for; an empty or blank name is refused (check_name)."""
    check_name(path, flag)
    if path is None:
        return
    try:
        _check_report_dir(path, _named(path, flag))
    except OSError as exc:  # a name too long for the file system, a component that is not a folder
        raise InputError(f"{_named(path, flag)}: {exc.strerror or exc}: give a shorter or existing path") from None


def _check_report_dir(path: str | os.PathLike, what: str) -> None:
    p = Path(path)
    if p.is_symlink():
        target = Path(os.path.realpath(p))
        try:
            st = _stat(target)
        except OSError as exc:
            raise InputError(f"{what} cannot be followed ({exc.strerror or exc}): give a folder") from None
        if st is None or not stat.S_ISDIR(st.st_mode):
            now = "nothing" if st is None else _kind(st.st_mode) or "a file"
            raise InputError(f"{what} is a symbolic link to {now} ({target}): give a folder")
    st = _stat(p)  # a link's target, checked above to be a folder
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{what} is {_kind(st.st_mode) or 'a file'}: give a folder")
    if st is None:
        parent = _folder(p)
        if not parent.is_dir():
            raise InputError(f"{what}: the folder above it, {parent}, does not exist: create it first")
        _try_create(parent, what)
        return
    _try_create(p, what)
    for entry in p.iterdir():
        if entry.name in _REPORT_NAMES or entry.suffix in _REPORT_SUFFIXES:
            try:
                inner = _stat(resolve(entry))
            except OSError:
                inner = None
            if inner is not None and _kind(inner.st_mode):
                raise InputError(f"{what} holds {entry.name}, which is {_kind(inner.st_mode)}: remove it or give "
                                 "another folder")


def write_output(path: str | os.PathLike, data: str | bytes, mode: int | None = None) -> Path:
    """Writes `data` (str: UTF-8) to the output file `path` under the module's contract; returns
    the file written (the link's target for a link). `mode`: permission bits to set (e.g. 0o644
    for a collector running as another user) [default: an existing file's own, a new file's as
    the umask makes them]. OSError when it cannot be written, no temporary file left behind."""
    target = resolve(path)
    st = _stat(target)
    if st is not None and _kind(st.st_mode):
        code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
        raise OSError(code, f"it is {_kind(st.st_mode)}, which mgpu-bench does not write into: give a regular "
                            "file's name")
    if st is not None and is_history(target):
        raise OSError(errno.EEXIST, "it is an mgpu-bench history database, which an output never replaces: give "
                                    "another name")
    folder = _folder(target)
    if special_place(folder):
        raise OSError(errno.EPERM, f"its folder is {special_place(folder)}: give a folder elsewhere")
    # str: UTF-8; a lone surrogate (a stored string no renderer escaped) as its escape, not a traceback
    payload = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    tmp = _scratch_name(folder, target.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        elif st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def is_history(path: str | os.PathLike) -> bool:
    """Whether the file is an mgpu-bench history database (SQLite's header and the application
    id at byte 68, as history.store writes them)."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would wait for a writer; only a regular file is read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.pread(fd, 72, 0)
    except OSError:
        return False
    finally:
        os.close(fd)
    return len(head) == 72 and head[:16] == b"SQLite format 3\x00" and int.from_bytes(head[68:72], "big") == HISTORY_APPLICATION_ID


# -- no output over another, nor over the history ------------------------------------------------


class _Place:
    """One file or folder a command writes (or reads and must keep): its name in messages, its
    resolved path and, where it exists, its device and inode."""

    def __init__(self, what: str, path: str | os.PathLike, folder: bool = False) -> None:
        self.what, self.folder = what, folder
        self.real = os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(path))))
        try:
            st = os.stat(self.real)
            self.inode: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except (OSError, ValueError):
            self.inode = None

    def same(self, other: _Place) -> bool:
        return self.real == other.real or (self.inode is not None and self.inode == other.inode)

    def holds(self, file: _Place) -> bool:
        """A report folder and a file its writers would replace (report.html, a .png, ...)."""
        name = os.path.basename(file.real)
        mine = name in _REPORT_WRITES or name.endswith(_REPORT_WRITE_SUFFIX)
        return self.folder and not file.folder and os.path.dirname(file.real) == self.real and mine


def _report_members(place: _Place) -> list[_Place]:
    """The files already in a report folder that its writers would replace (hard links of another
    output are found by their inode)."""
    try:
        names = [n for n in os.listdir(place.real) if n in _REPORT_WRITES or n.endswith(_REPORT_WRITE_SUFFIX)]
    except OSError:
        return []
    return [_Place(place.what + f" ({n})", os.path.join(place.real, n)) for n in names]


def check_distinct(outputs: Sequence[tuple[str, str | os.PathLike | None]], db: str | os.PathLike | None = None,
                   db_what: str = "the history database", keep: Sequence[tuple[str, str | os.PathLike]] = ()) -> None:
    """Before any measurement: InputError (exit code 2) when two of `outputs` ((flag, path); a
    flag ending in a folder option, --report or --out, names a report folder) are the same file,
    when a report folder would replace another output, or when one is the history database `db`
    (or its -wal, -shm or -journal file), any other mgpu-bench history database (by its header),
    or a file in `keep` (an input the command reads)."""
    folders = ("--report", "--out")
    places = [_Place(f"{flag} {path}", path, folder=flag in folders) for flag, path in outputs if path]
    guarded: list[_Place] = []
    if db:
        for side in DB_SIDECARS:
            guarded.append(_Place(f"{db_what} {db}" + (f" (its {side} file)" if side else ""), f"{os.fspath(db)}{side}"))
    guarded += [_Place(f"{what} {path}", path) for what, path in keep]
    for i, a in enumerate(places):
        for b in places[i + 1:]:
            if a.same(b) or a.holds(b) or b.holds(a):
                raise InputError(f"{a.what} and {b.what} are the same file: one would replace the other; give "
                                 "each output its own path")
        members = _report_members(a) if a.folder else [a]
        for g in guarded:
            if a.holds(g) or any(m.same(g) for m in members) or (a.folder and a.same(g)):
                raise InputError(f"{a.what} would replace {g.what}: give the output another path")
        if a.folder:
            for b in places:
                if b is not a and not b.folder and any(m.same(b) for m in members):
                    raise InputError(f"{a.what} and {b.what} are the same file: one would replace the other; "
                                     "give each output its own path")
        for m in members:  # any other database (write_output() would refuse it, after the measuring)
            if m.inode is not None and is_history(m.real):
                which = f"{m.real}, an mgpu-bench history database" if a.folder else "an mgpu-bench history database"
                raise InputError(f"{a.what} would replace {which}: give the output another path")


def write_json(path: str | os.PathLike, document: Mapping) -> Path:
    """A document as indented JSON, written by write_output()."""
    return write_output(path, json.dumps(document, indent=1))


# -- the tool's own folders -----------------------------------------------------------------------


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.lexists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def make_folder(path: str | os.PathLike, what: str, mode: int = 0o755, parents_mode: int | None = None,
                fix: str = "give a folder elsewhere") -> Path:
    """Makes the folder `path` (with the folders above it that are missing) for the tool's own
    files, after checking, before anything is made, that it would not be in a special place
    (special_place) and that the nearest folder that exists is one this process can create in;
    InputError naming `what` (the variable or option that chose the place) and ending in `fix`
    otherwise. `parents_mode`: the permission bits of the missing folders above it [default:
    `mode`]."""
    folder = os.path.abspath(os.fspath(path))
    nearest = _nearest_existing(folder)
    where = special_place(nearest)
    if where:
        raise InputError(f"{what}: {folder} would be {where}: {fix}")
    if not os.path.isdir(nearest):
        raise InputError(f"{what}: {nearest} is not a folder, so {folder} cannot be made: {fix}")
    if nearest != folder and not os.access(nearest, os.W_OK | os.X_OK):
        raise InputError(f"{what}: {folder} cannot be made ({nearest} is not writable): {fix}")
    missing = []
    p = folder
    while p != nearest:
        missing.append(p)
        p = os.path.dirname(p)
    for step in reversed(missing):
        try:
            os.mkdir(step, mode if step == folder or parents_mode is None else parents_mode)
        except FileExistsError:
            continue  # made meanwhile by another run
        except OSError as exc:
            raise InputError(f"{what}: cannot make {folder} ({exc.strerror or exc}): {fix}") from None
    return Path(folder)


def state_folder(root_folder: str, environ: Mapping | None = None) -> Path | None:
    """Where a command keeps its state (the check's history) when the regular place cannot take
    it, made when missing: $XDG_STATE_HOME/mgpu-bench where XDG_STATE_HOME is an absolute path
    (the XDG Base Directory specification: made with its missing parents, they 0700 as it says;
    a relative one is ignored); else `root_folder` for root (0755); else
    <tmp>/mgpu-bench-<uid>, a folder of this user alone (0700; None when it is a link, another
    user's or open to others). InputError when XDG_STATE_HOME names a place that cannot or must
    not be used (under /dev, /proc or /sys, or not writable): refused before anything is made."""
    import tempfile

    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME") or ""
    if os.path.isabs(state):
        fix = "set XDG_STATE_HOME to a writable folder elsewhere, or give --db PATH"
        folder = make_folder(os.path.join(state, "mgpu-bench"), f"XDG_STATE_HOME={state}", 0o755, parents_mode=0o700,
                             fix=fix)
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
            raise InputError(f"XDG_STATE_HOME={state}: {folder} is not a writable folder: {fix}")
        return folder
    if os.geteuid() == 0:
        folder, mode = os.path.abspath(root_folder), 0o755
    else:
        folder, mode = os.path.join(tempfile.gettempdir(), f"mgpu-bench-{os.geteuid()}"), 0o700
    try:
        make_folder(folder, folder, mode)
        st = os.lstat(folder)
    except (InputError, OSError):
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or (mode == 0o700 and st.st_mode & 0o077) \
            or not os.access(folder, os.W_OK | os.X_OK):
        return None  # a link, another user's folder, one open to others: never used
    return Path(folder)


# -- the libraries' own files under HOME ---------------------------------------------------------

# What the libraries mgpu-bench loads write under HOME by themselves: matplotlib's font cache and
# config (MPLCONFIGDIR, else $XDG_CACHE_HOME and $XDG_CONFIG_HOME, ~/.cache and ~/.config), torch's
# and Hugging Face's caches ($XDG_CACHE_HOME/torch, /huggingface), Triton's kernel cache (~/.triton).
_HOME_DIRS = (("XDG_CACHE_HOME", ".cache"), ("XDG_CONFIG_HOME", ".config"))


def _unusable(folder: str) -> bool:
    """Whether files could not, or must not, be made in `folder` (existing or not): it lies on a
    device or kernel file system, or the nearest folder of it that exists cannot be written."""
    p = Path(folder)
    while not p.exists() and p.parent != p:
        p = p.parent
    return not p.is_dir() or special_place(p) is not None or not os.access(p, os.W_OK | os.X_OK)


def private_caches(environ: dict | None = None) -> str | None:
    """In the CLI, first thing: where HOME (or XDG_CACHE_HOME / XDG_CONFIG_HOME) is a place files
    must not or cannot go (HOME=/dev or /proc; a read-only, missing or relative folder; none), the
    libraries' caches go to a private temporary folder instead (the variables above set for this
    process and its children; the folder removed at exit), so that no library writes into /dev,
    makes a HOME that is not there, or warns about its cache. The history's own place is not
    moved: that is refused, or stored where --db says. Returns the folder, or None when every
    place was usable."""
    import atexit
    import shutil
    import tempfile

    from . import children

    environ = os.environ if environ is None else environ
    home = environ.get("HOME") or ""
    bad_home = not os.path.isabs(home) or not os.path.isdir(home) or _unusable(home)  # nothing made where none is
    moved = []
    for var, below in _HOME_DIRS:
        value = environ.get(var, "")
        if _unusable(value) if os.path.isabs(value) else bad_home or _unusable(os.path.join(home, below)):
            moved.append(var)
    triton = not environ.get("TRITON_CACHE_DIR") and bad_home
    if not moved and not triton:
        return None
    children.clean_stale("mgpu-bench-home-")
    folder = tempfile.mkdtemp(prefix=children.temp_name("mgpu-bench-home-"))
    children._folders.add(folder)  # removed on abandon() as well
    atexit.register(shutil.rmtree, folder, True)
    for var in moved:
        environ[var] = os.path.join(folder, var.removeprefix("XDG_").removesuffix("_HOME").lower())
    if triton:
        environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
    return folder
