"""Output paths checked before any measurement: a run that takes an hour must not fail at the
end because its file or folder cannot be written."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError


def check_report_dir(path: str | None) -> None:
    """A report folder: an existing folder, or one that can be created in an existing one."""
    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(f"--report {path} is a file: give a folder")
    parent = p if p.exists() else (p.parent if str(p.parent) else Path("."))
    if not parent.is_dir():
        raise InputError(f"the folder above {path} does not exist: create it first")
    if not os.access(parent, os.W_OK):
        raise InputError(f"{path} is not writable")


def check_writable(path: str | None) -> None:
    """An output file must be creatable before hours of measurement depend on it."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path} is a directory: give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"the folder of {path} does not exist: create it first")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InputError(f"{path} is not writable")
