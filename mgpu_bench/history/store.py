"""The run history: every result document stored in SQLite with its headline metrics, and
baselines per kind. What a run is apart from the database (its id, the rows handed back, a
document prepared for storing) is records.py's; the comparison of two runs is compare.py's.

Retention (retention.py): a document may ask that only the newest N runs of its kind and host
stay ("keep": a check's --keep, 1000 by default), applied as it is stored; `prune` removes or
thins by age and count; baselines and the runs they reference always stay.

The store is a file (never only memory): $MGPU_BENCH_DB, else
$XDG_DATA_HOME/mgpu-bench/history.sqlite3, where XDG_DATA_HOME counts only when it is an
absolute path and defaults to $HOME/.local/share (the XDG Base Directory rules); a blank
MGPU_BENCH_DB, or a HOME that is empty, relative or not a folder, is refused rather than guessed
at. The command that creates a database says where. It runs in WAL mode with a 30 s busy
timeout, so several processes (a cron job and a person) can write at once; every run is a new row
and nothing is overwritten. A read (list, show, trend, compare, report) opens the file read-only:
it never creates one, and takes no write lock (a WAL reader waits for no writer). Every stored
row is read through its declared shape, as a document is (a row changed outside mgpu-bench is
named, never a traceback). The file carries PRAGMA application_id = APPLICATION_ID and PRAGMA
user_version = the schema version; the schema is built by MIGRATIONS, applied in order inside
one transaction. A file that is not SQLite, or
belongs to another program, or was written by a newer mgpu-bench, is refused with an
InputError and left untouched.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mgpu_bench.core.errors import InputError
from mgpu_bench.core.paths import HISTORY_APPLICATION_ID, special_place
from mgpu_bench.results.document import document_kind
from mgpu_bench.results.metrics import Metric
from mgpu_bench.results.probe import names as probe_names
from mgpu_bench.results.probe import validate

from .place import _WHERE, _check_location, default_path, default_place
from .records import Prepared, RunInfo, RunRecord, TrendPoint, prepare, run_label, utc_now
from .rows import FINGERPRINT, METRIC_ROW, RUN_ROW, check_row, json_field, metric_of_row

if TYPE_CHECKING:
    from typing import Self

APPLICATION_ID = HISTORY_APPLICATION_ID  # "mGPB": marks the file as an mgpu-bench history
BUSY_TIMEOUT_S = 30.0

# Each migration is a list of SQL statements; migration i (from 1) takes user_version i-1 to i.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a run id names one run forever
            created TEXT NOT NULL,                 -- UTC ISO 8601, the document's own time
            kind TEXT NOT NULL,                    -- comm, gemm, memory, model, links, suite, ...
            command TEXT,                          -- the command line, shell-quoted
            host TEXT,
            fingerprint TEXT NOT NULL,             -- JSON: the document's environment
            document TEXT NOT NULL                 -- JSON: the whole result document
        )""",
        "CREATE INDEX runs_by_kind ON runs (kind, id)",
        """CREATE TABLE metrics (
            run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            value REAL NOT NULL,                   -- base units
            unit TEXT NOT NULL,
            better TEXT NOT NULL CHECK (better IN ('higher', 'lower')),
            samples TEXT NOT NULL,                 -- JSON list, base units
            labels TEXT NOT NULL,                  -- JSON object
            PRIMARY KEY (run, name)
        )""",
        "CREATE INDEX metrics_by_name ON metrics (name, run)",
        """CREATE TABLE baselines (
            scope TEXT PRIMARY KEY,                -- a run kind
            run INTEGER NOT NULL REFERENCES runs (id),
            set_at TEXT NOT NULL
        )""",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


def _text(value):
    """A string for a TEXT column: SQLite holds UTF-8 only, and a command line can carry a lone
    surrogate (argv keeps bytes that are not UTF-8 so): such a character is stored as its escape
    (\\udcff), not the run refused. The document column is JSON, which escapes it itself."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(value, str) else value


def files_size(path: str | os.PathLike) -> int:
    """The bytes on disk of the database at `path` with its -wal and -shm files (those present)."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            total += os.path.getsize(f"{os.fspath(path)}{suffix}")
    return total


class History:
    """The history database. Open with `History.open(path)`; use as a context manager or call
    close(). Every public method raises InputError for bad input (an unknown run id, a file
    that is not a history database) with a one-line message naming the file and the fix."""

    def __init__(self, conn: sqlite3.Connection, path: Path, readonly: bool = False) -> None:
        self._conn = conn
        self.path = path
        self.readonly = readonly
        # Stored rows a listing (list, trend) left out because they were changed outside mgpu-bench:
        # one line each, which the command prints as a note.
        self.skipped: builtins.list[str] = []
        self.note: str | None = None  # why this is not the default place (default_place's fallback)

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike | None = None, readonly: bool = False, create: bool = True) -> History:
        """Opens (creating and migrating when needed) the database at `path`, default
        `default_path()`. The folder must exist and be writable, except the XDG default's,
        which is created; a new database is said on stderr, with its path. Refuses (InputError,
        file untouched) a file that is not SQLite, an SQLite file of another program, or one with
        a schema newer than SCHEMA_VERSION. `readonly` (the commands that only read): a missing
        file is an InputError naming the path, nothing is created, and no write lock is taken;
        `create` False (a write to what must be there: baseline set): a missing file the same."""
        explicit = path is not None
        if explicit and not str(path).strip():
            raise InputError(f"--db {str(path)!r} is blank: give the history database file")
        p, note = (Path(path).expanduser(), None) if explicit else default_place()
        create = create and not readonly
        if not explicit and "MGPU_BENCH_DB" not in os.environ and create:
            nearest = p.parent
            while not nearest.exists() and nearest.parent != nearest:
                nearest = nearest.parent
            if special_place(nearest):  # HOME=/dev, XDG_DATA_HOME=/proc/x: refused before anything is made there
                raise InputError(f"the history database {p} would be {special_place(nearest)}: {_WHERE}")
            try:  # the XDG folder (its HOME checked to exist by default_path)
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(f"cannot create {p.parent} for the history: {exc.strerror or exc}") from None
        _check_location(p, readonly)
        try:
            exists = p.exists()
        except OSError:
            exists = False
        if not create and not exists:
            raise InputError(f"no history database at {p}: nothing has been stored there (a measuring command, or "
                             "`mgpu-bench history add FILE`, stores runs); --db or MGPU_BENCH_DB name another")
        try:
            if readonly:
                # the path's own bytes, percent-encoded (a name that is not UTF-8 included: quote() of the str
                # would refuse its surrogates; sqlite3 decodes the escapes back to those bytes)
                uri = "file:" + urllib.parse.quote(os.fsencode(p.absolute())) + "?mode=ro"
                conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            else:
                conn = sqlite3.connect(str(p), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the history database {p}: {exc}") from None
        try:
            _check_owner(conn, p)
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            if readonly:
                version = _owner_marks(conn)[1]
                if version < SCHEMA_VERSION:  # empty, or of an older release: made current once, by a writer
                    conn.close()
                    History.open(p).close()
                    return cls.open(p, readonly=True)
            else:
                _set_wal(conn, p)
                conn.execute("PRAGMA foreign_keys = ON")
                _migrate(conn, p)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise _db_error(p, exc) from None
        except BaseException:
            conn.close()
            raise
        if not exists:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.write(f"mgpu-bench: created the history database {p}\n")
        h = cls(conn, p, readonly)
        h.note = note
        return h

    @classmethod
    def check(cls, path: str | os.PathLike | None = None) -> Path:
        """Before a run that will store: the database at `path` (default `default_path()`) can
        take it, checked without writing anything (a command that then fails on bad input leaves
        no new file): an existing one is opened read-only and refused as open() refuses it; for a
        new one, its folder (for the XDG default, the nearest folder that exists) must be
        writable. Returns the path."""
        explicit = path is not None
        if explicit and not str(path).strip():
            raise InputError(f"--db {str(path)!r} is blank: give the history database file")
        p = Path(path).expanduser() if explicit else default_path()
        try:
            exists = p.exists()
        except OSError:
            exists = False
        if exists:
            cls.open(p, readonly=True).close()
            _check_location(p)  # and writable
            return p
        folder = p.parent
        if not explicit and "MGPU_BENCH_DB" not in os.environ:  # the XDG folder is made when the run is stored
            while not folder.exists() and folder.parent != folder:
                folder = folder.parent
            if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
                raise InputError(f"cannot create {p.parent} for the history: {folder} is not a writable folder; "
                                 f"{_WHERE}")
            if special_place(folder):
                raise InputError(f"the history database {p} would be {special_place(folder)}: {_WHERE}")
            return p
        _check_location(p)
        return p

    def close(self) -> None:
        """Closes the connection (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing ----------------------------------------------------------------------------

    def save(self, doc: Mapping, metrics: Sequence[Metric] | None = None) -> str:
        """Stores a result document as a new run with its headline metrics (by default
        metrics_from_document(doc), after checking the document against its kind's declared
        shape: InputError naming the field); returns the run id ('r12'). One transaction: a run
        is stored with all its metrics or not at all."""
        prepared = prepare(doc, metrics)
        with self._write():
            return self._insert(prepared)

    def save_all(self, runs: Sequence[Prepared]) -> builtins.list[str]:
        """Stores runs prepare() has read and checked, in order, in one transaction: all of them or
        none (a fault, a full disk or Ctrl-C midway leaves the database as it was). Their run ids."""
        with self._write():
            return [self._insert(p) for p in runs]

    def _insert(self, p: Prepared) -> str:
        cur = self._conn.execute(
            "INSERT INTO runs (created, kind, command, host, fingerprint, document) VALUES (?, ?, ?, ?, ?, ?)",
            (_text(p.created), _text(p.kind), _text(p.command), _text(p.host), p.fingerprint_json, p.document_json),
        )
        row = cur.lastrowid
        self._conn.executemany(
            "INSERT INTO metrics (run, name, value, unit, better, samples, labels) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    row,
                    _text(m.name),
                    float(m.value),
                    m.unit,
                    m.better,
                    json.dumps([float(x) for x in m.samples]),
                    json.dumps(dict(m.labels)),
                )
                for m in p.metrics
            ],
        )
        if p.keep:  # a document's own limit (a check: its node's newest checks kept)
            from .retention import apply_keep

            apply_keep(self._conn, _text(p.kind), _text(p.host), p.keep)
        return run_label(row)

    def prune(self, older_than: str | None = None, keep: int | None = None, kind: str | None = None,
              host: str | None = None, drop_samples: bool = False, dry_run: bool = False):
        """retention.prune in one write transaction: removes (or thins) by age and count per kind
        and host, baselines and the runs they reference kept. -> retention.Pruned."""
        from .retention import prune

        with self._write():
            return prune(self._conn, older_than, keep, kind, host, drop_samples, dry_run, validate)

    def vacuum(self) -> None:
        """Gives the pages of removed runs back to the file system (SQLite's VACUUM: the file is
        rewritten, which needs as much free space as it holds). In WAL mode VACUUM writes the new
        pages into the write-ahead log; the checkpoint after it moves them into the file and
        truncates the log, so that the bytes on disk (size()) are the compacted file's."""
        try:
            self._conn.execute("VACUUM")
            self.checkpoint()
        except sqlite3.DatabaseError as exc:
            raise _db_error(self.path, exc) from None

    def checkpoint(self) -> None:
        """Moves the write-ahead log into the file and truncates it (PRAGMA wal_checkpoint(TRUNCATE));
        a reader holding an older snapshot keeps part of the log until it ends (then not truncated)."""
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.DatabaseError as exc:
            raise _db_error(self.path, exc) from None

    def size(self) -> int:
        """The database's bytes on disk: the file, its write-ahead log (-wal) and the log's index (-shm)."""
        return files_size(self.path)

    def set_baseline(self, run_id: str) -> str:
        """Makes `run_id` the baseline of its scope (replacing the previous one); returns the
        scope: the run's kind, or "kind@host" for a document that asks for one baseline per host
        (a fleet pass's per-node documents: "baseline_scope": "host")."""
        rec = self.get(run_id)  # read through its declared shape first
        with self._write():
            row = self._resolve(rec.run_id)
            scope = f"{rec.kind}@{rec.host}" if rec.document.get("baseline_scope") == "host" and rec.host else rec.kind
            self._conn.execute(
                "INSERT INTO baselines (scope, run, set_at) VALUES (?, ?, ?) "
                "ON CONFLICT (scope) DO UPDATE SET run = excluded.run, set_at = excluded.set_at",
                (scope, row, utc_now()),
            )
        return scope

    # -- reading ----------------------------------------------------------------------------

    def resolve(self, run_id: str) -> str:
        """'r12', '12' or 'latest' -> the canonical run id; InputError for an unknown one."""
        with self._read():
            return run_label(self._resolve(run_id))

    def get(self, run_id: str) -> RunRecord:
        """The stored run with its fingerprint and document, each read through its declared shape
        (the document's kind, schema.ENVIRONMENT, the run row's own fields): a row changed outside
        mgpu-bench is InputError naming the run and the field, not a traceback later."""
        with self._read():
            row = self._resolve(run_id)
            r = self._conn.execute(
                "SELECT id, created, kind, host, command, fingerprint, document FROM runs "
                "WHERE id = ?",
                (row,),
            ).fetchone()
        label = run_label(r[0])
        where = f"stored run {label} in {self.path}"
        check_row(RUN_ROW, {"created": r[1], "kind": r[2], "host": r[3], "command": r[4]}, where)
        fingerprint = json_field(r[5], where, "fingerprint")
        document = json_field(r[6], where, "document")
        if not isinstance(document, Mapping) or document_kind(document) in probe_names():
            validate(document, where)  # its kind's declared shape, as a file's (a list: refused as one)
        check_row(FINGERPRINT, {"fingerprint": fingerprint}, where)
        return RunRecord(label, r[1], r[2], r[3], r[4], fingerprint, document)

    def metrics(self, run_id: str) -> builtins.list[Metric]:
        """The run's headline metrics as stored, in stored order, each row read through its
        declared shape (METRIC_ROW): InputError naming the run, the metric and the field."""
        with self._read():
            row = self._resolve(run_id)
            rows = self._conn.execute(
                "SELECT name, value, unit, better, samples, labels FROM metrics WHERE run = ? "
                "ORDER BY rowid",
                (row,),
            ).fetchall()
        return [metric_of_row(r, f"stored run {run_label(row)} in {self.path}") for r in rows]

    def trend(self, metric_name: str, limit: int = 20, host: str | None = None) -> builtins.list[TrendPoint]:
        """The metric's value in the last `limit` runs that have it (of `host` only, when given),
        oldest first. A row changed outside mgpu-bench is left out, with a line in `skipped`."""
        with self._read():
            rows = self._conn.execute(
                "SELECT r.id, r.created, r.host, m.value, m.unit, m.better FROM metrics m JOIN runs r ON r.id = m.run "
                "WHERE m.name = ? AND (? IS NULL OR r.host = ?) ORDER BY m.run DESC LIMIT ?",  # the index's order: no sort
                (metric_name, host, host, int(limit)),
            ).fetchall()
        out = []
        for i, c, h, v, u, b in reversed(rows):
            try:
                where = f"stored run {run_label(i)} in {self.path}"
                check_row(RUN_ROW, {"created": c, "host": h}, where)
                check_row(METRIC_ROW, {"name": metric_name, "value": v, "unit": u, "better": b},
                           where, f"metric {metric_name}")
            except InputError as exc:
                self.skipped.append(f"left out: {exc}")
                continue
            out.append(TrendPoint(run_label(i), c, h, v, u, b))
        return out

    def statuses(self, run_ids: Sequence[str]) -> dict[str, dict | None]:
        """Each run's document status block ({} where it has none, None where its document is not
        JSON), read by
        SQLite from the stored JSON: a listing costs its length, not its documents' size."""
        out: dict[str, dict | None] = {}
        with self._read():
            for run_id in run_ids:
                try:
                    (text,) = self._conn.execute("SELECT json_extract(document, '$.status') FROM runs WHERE id = ?",
                                                 (self._resolve(run_id),)).fetchone()
                    got = json.loads(text) if isinstance(text, str) else {}  # NULL: a document with no status
                except (sqlite3.DatabaseError, ValueError, RecursionError):
                    got = None
                out[run_id] = got if isinstance(got, dict) else {} if got is not None else None
        return out

    def runs_with(self, metric_name: str, value: float, kind: str | None = None, host: str | None = None,
                  limit: int = 5) -> builtins.list[str]:
        """The newest runs (of `kind` on `host`, where given) whose metric `metric_name` is
        `value`, newest first: an index read (metrics by name, newest run first), as fast with a
        year of runs stored as with a few."""
        with self._read():
            rows = self._conn.execute(
                "SELECT r.id FROM metrics m JOIN runs r ON r.id = m.run WHERE m.name = ? AND m.value = ? "
                "AND (? IS NULL OR r.kind = ?) AND (? IS NULL OR r.host = ?) ORDER BY m.run DESC LIMIT ?",
                (metric_name, float(value), kind, kind, host, host, int(limit)),
            ).fetchall()
        return [run_label(r) for (r,) in rows]

    def hosts_of(self, metric_name: str) -> builtins.list[str]:
        """The hosts of the runs that have the metric, most recent first."""
        with self._read():
            rows = self._conn.execute(
                "SELECT r.host FROM metrics m JOIN runs r ON r.id = m.run WHERE m.name = ? AND r.host IS NOT NULL "
                "GROUP BY r.host ORDER BY max(r.id) DESC",
                (metric_name,),
            ).fetchall()
        return [h for (h,) in rows if isinstance(h, str)]

    def host_metric_names(self, host: str, like: str | None = None, limit: int = 10) -> builtins.list[str]:
        """The metric names stored for runs of `host` (containing `like`), most recent first."""
        with self._read():
            rows = self._conn.execute(
                "SELECT m.name FROM metrics m JOIN runs r ON r.id = m.run WHERE r.host = ? AND instr(m.name, ?) > 0 "
                "GROUP BY m.name ORDER BY max(m.run) DESC LIMIT ?",
                (host, like or "", int(limit)),
            ).fetchall()
        return [n for (n,) in rows if isinstance(n, str)]

    def metric_names(self, like: str | None = None, limit: int = 10) -> builtins.list[str]:
        """Stored metric names containing `like` (all when None), most recent first."""
        with self._read():
            rows = self._conn.execute(
                "SELECT name FROM metrics WHERE instr(name, ?) > 0 GROUP BY name ORDER BY max(run) DESC LIMIT ?",
                (like or "", int(limit)),
            ).fetchall()
        return [r[0] for r in rows]

    def baseline(self, kind: str, host: str | None = None) -> str | None:
        """The baseline run id of `kind`, or of `kind` on `host` (scope "kind@host") when a host
        is given; None when none is set."""
        scope = f"{kind}@{host}" if host else kind
        with self._read():
            r = self._conn.execute("SELECT run FROM baselines WHERE scope = ?", (scope,)).fetchone()
        return run_label(r[0]) if r else None

    def baseline_of(self, rec: RunRecord) -> str | None:
        """The baseline a stored run is compared with: its kind's, or its host's for a document
        with "baseline_scope": "host" (never the kind's: a node is compared with itself)."""
        per_host = rec.document.get("baseline_scope") == "host" and rec.host
        return self.baseline(rec.kind, rec.host if per_host else None)

    def baselines(self) -> dict[str, str]:
        """kind -> baseline run id, for every kind that has one."""
        with self._read():
            rows = self._conn.execute("SELECT scope, run FROM baselines ORDER BY scope").fetchall()
        return {k: run_label(r) for k, r in rows}

    def list(self, limit: int = 20, kind: str | None = None, exclude: Sequence[str] = ()) -> builtins.list[RunInfo]:
        """The last `limit` runs (of `kind` when given; not of the kinds in `exclude`), newest first."""
        sql = (
            "SELECT r.id, r.created, r.kind, r.host, r.command, "
            "(SELECT count(*) FROM metrics m WHERE m.run = r.id), "
            "EXISTS (SELECT 1 FROM baselines b WHERE b.run = r.id AND b.scope = r.kind) FROM runs r"
        )
        args: tuple = ()
        if kind is not None:
            sql += " WHERE r.kind = ?"
            args = (kind,)
        elif exclude:
            sql += f" WHERE r.kind NOT IN ({', '.join('?' * len(exclude))})"
            args = tuple(exclude)
        with self._read():
            rows = self._conn.execute(sql + " ORDER BY r.id DESC LIMIT ?", (*args, int(limit))).fetchall()
        out = []
        for i, c, k, h, cmd, n, b in rows:
            try:
                check_row(RUN_ROW, {"created": c, "kind": k, "host": h, "command": cmd},
                           f"stored run {run_label(i)} in {self.path}")
            except InputError as exc:
                self.skipped.append(f"left out: {exc}")
                continue
            out.append(RunInfo(run_label(i), c, k, h, cmd, n, bool(b)))
        return out

    def count(self, kind: str) -> int:
        """How many runs of `kind` are stored (an index read: runs_by_kind)."""
        with self._read():
            return int(self._conn.execute("SELECT count(*) FROM runs WHERE kind = ?", (kind,)).fetchone()[0])

    # -- internals --------------------------------------------------------------------------

    def _resolve(self, run_id: str) -> int:
        text = str(run_id).strip().lower()
        if text == "latest":
            r = self._conn.execute("SELECT max(id) FROM runs").fetchone()
            if r[0] is None:
                raise InputError(f"no runs stored in {self.path} yet")
            return int(r[0])
        digits = text.removeprefix("r")
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 18):
            raise InputError(f"'{run_id}' is not a run id: write r12 (as `mgpu-bench history list` prints), 12 or "
                             "latest")
        row = int(digits)
        if self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (row,)).fetchone() is None:
            raise InputError(f"no run {run_label(row)} in {self.path}: see `mgpu-bench history list`")
        return row

    def _write(self):
        return _Transaction(self._conn, self.path, "BEGIN IMMEDIATE")

    def _read(self):
        return _Transaction(self._conn, self.path, "BEGIN")


class _Transaction:
    """BEGIN ... COMMIT (ROLLBACK on an exception); SQLite errors become InputErrors naming the file."""

    def __init__(self, conn: sqlite3.Connection, path: Path, begin: str) -> None:
        if conn is None:
            raise ValueError("the history database is closed")
        self.conn, self.path, self.begin = conn, path, begin

    def __enter__(self) -> None:
        try:
            self.conn.execute(self.begin)
        except sqlite3.DatabaseError as exc:
            raise _db_error(self.path, exc) from None

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
        except sqlite3.DatabaseError as e:
            if exc_type is None:
                raise _db_error(self.path, e) from None
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, _BUGS):
            raise _db_error(self.path, exc) from None
        if isinstance(exc, UnicodeEncodeError):  # a name typed with bytes that are not UTF-8 (argv keeps them)
            raise InputError(
                f"{exc.object!r} is not text SQLite can hold (it has bytes that are not UTF-8): type it again"
            ) from None
        return False


# Errors of this code, not of the file: they stay what they are.
_BUGS = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)


def _db_error(path: Path, exc: sqlite3.DatabaseError) -> InputError:
    text = str(exc)
    if _full(path, exc):
        return InputError(
            f"the disk of the history database {path} is full ({text}): nothing was stored and the database is as "
            "it was; free space there (`mgpu-bench history prune` thins the history), or give --db on another "
            "file system"
        )
    if "locked" in text or "busy" in text:
        return InputError(f"the history database {path} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s: "
                          "try again when it has finished")
    if "readonly" in text or "read-only" in text:
        return InputError(f"the history database {path} is read-only: give a writable --db path")
    return InputError(f"{path} is not a usable mgpu-bench history database ({text}): give another --db path, or "
                      "move this file away")


def _full(path: Path, exc: sqlite3.DatabaseError) -> bool:
    """Whether `exc` is a write that found no room: SQLITE_FULL ("database or disk is full"), or an
    I/O error of a write while the file system has no free block left (SQLite reports a failed
    write of its journal as SQLITE_IOERR)."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    if name == "SQLITE_FULL" or "disk is full" in str(exc):
        return True
    if name.startswith("SQLITE_IOERR") or "disk I/O error" in str(exc):
        import shutil

        try:
            return shutil.disk_usage(path.parent).free < 64 * 1024
        except OSError:
            return False
    return False


def _owner_marks(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """(application_id, user_version, number of schema objects), read from one snapshot: outside
    a transaction each statement would see its own, and a database another process creates
    between the reads would look like a foreign one (ids still 0, tables already there)."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        if own:
            conn.execute("COMMIT")
    return app, version, objects


def _check_owner(conn: sqlite3.Connection, p: Path) -> None:
    """Only reads: the file is an empty database, or ours with a schema this code knows."""
    app, version, objects = _owner_marks(conn)
    if app == 0:
        if objects or version:
            raise InputError(f"{p} is an SQLite database of another program (application_id 0, {objects} "
                             "tables and indexes): give another --db path")
    elif app != APPLICATION_ID:
        raise InputError(f"{p} is an SQLite database of another program (application_id {app:#x}): give another "
                         "--db path")
    elif version > SCHEMA_VERSION:
        raise InputError(f"{p} was written by a newer mgpu-bench (history schema {version}, this one knows "
                         f"{SCHEMA_VERSION}): upgrade mgpu-bench or give another --db path")


def _set_wal(conn: sqlite3.Connection, p: Path) -> None:
    """WAL mode (persistent in the file). Switching needs a moment without other writers;
    SQLite does not always wait on its own for that, so retry within the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    if str(mode).lower() != "wal":
        raise InputError(f"the history database {p} cannot use WAL mode (journal mode stays {mode}): put it on a "
                         "local file system")


def _migrate(conn: sqlite3.Connection, p: Path) -> None:
    """Applies the missing MIGRATIONS in one write transaction, after checking again under the
    lock (another process may have created the schema meanwhile)."""
    with _Transaction(conn, p, "BEGIN IMMEDIATE"):
        _check_owner(conn, p)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        for i in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[i]:
                conn.execute(statement)
        if version < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
