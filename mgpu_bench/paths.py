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
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from .errors import InputError

# The files a report folder's writers put there by name or suffix: checked before measuring
# that none of them exists as something other than a regular file (or a link to one).
_REPORT_NAMES = ("report.html", "summary.md")
_REPORT_SUFFIXES = (".png", ".json", ".html", ".md")


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


def _try_create(folder: Path, what: str) -> None:
    """Creates and removes a scratch file in `folder`; InputError naming `what` if it cannot."""
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


def check_writable(path: str | os.PathLike | None, flag: str | None = None) -> None:
    """An output file (`flag` names its option in the message) must be creatable before hours of
    measurement depend on it: InputError (exit code 2) otherwise, with the fix."""
    if not path:
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
    p = Path(path)
    try:
        is_dir = p.is_dir()
    except OSError:  # a name too long for the file system
        is_dir = False
    if not is_dir:
        raise InputError(f"{flag} {path} is not a writable folder (none is there): give an existing folder")
    _try_create(p, f"{flag} {path}")


def check_report_dir(path: str | os.PathLike | None, flag: str | None = "--report") -> None:
    """A report folder: an existing folder (or a link to one) where files can be created, or a new
    folder inside an existing, writable one. The report files already in it must be regular files
    (or links to them): they are replaced."""
    if not path:
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
    folder = _folder(target)
    payload = data.encode("utf-8") if isinstance(data, str) else data
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


def write_json(path: str | os.PathLike, document: Mapping) -> Path:
    """A document as indented JSON, written by write_output()."""
    return write_output(path, json.dumps(document, indent=1))
