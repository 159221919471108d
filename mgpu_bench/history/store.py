"""The run history: every result document stored in SQLite with its headline metrics, baselines
per kind, and the comparison of two runs that decides what regressed.

The store is a file (never only memory): $MGPU_BENCH_DB, else
$XDG_DATA_HOME/mgpu-bench/history.sqlite3 (XDG_DATA_HOME defaults to ~/.local/share). It runs
in WAL mode with a 30 s busy timeout, so several processes (a cron job and a person) can write
at once; every run is a new row and nothing is overwritten. The file carries PRAGMA
application_id = APPLICATION_ID and PRAGMA user_version = the schema version; the schema is
built by MIGRATIONS, applied in order inside one transaction. A file that is not SQLite, or
belongs to another program, or was written by a newer mgpu-bench, is refused with an
InputError and left untouched.

Comparison (`compare`): per metric, the change is signed so that a positive `gain` is better
whatever the metric's direction. A metric regresses when it is worse by more than
max(tolerance, NOISE_K x the larger of the two runs' noise); see NOISE_K for why 3.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import json
import os
import shlex
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mgpu_bench.document import RESULT_SCHEMA, document_kind
from mgpu_bench.errors import InputError
from mgpu_bench.metrics import Metric
from mgpu_bench.probe import headline as metrics_from_document
from mgpu_bench.probe import names as probe_names
from mgpu_bench.probe import validate

if TYPE_CHECKING:
    from typing import Self

APPLICATION_ID = 0x6D475042  # "mGPB": marks the file as an mgpu-bench history
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


def default_path() -> Path:
    """$MGPU_BENCH_DB, else $XDG_DATA_HOME/mgpu-bench/history.sqlite3 (~/.local/share by default)."""
    env = os.environ.get("MGPU_BENCH_DB")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser() / "mgpu-bench" / "history.sqlite3"


def _headline(doc: Mapping) -> builtins.list[Metric]:
    """The document's headline metrics; a document its probe cannot read (a shape its schema
    does not catch) is bad input, not a traceback."""
    try:
        return metrics_from_document(doc)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as exc:
        raise InputError(
            f"the {document_kind(doc)} document cannot be read ({type(exc).__name__}: {exc}): give one "
            "written by a command's --json"
        ) from None


def run_label(row_id: int) -> str:
    """The public id of a run: 'r12'."""
    return f"r{row_id}"


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RunInfo:
    """One stored run as `history list` shows it. created: UTC ISO 8601."""

    run_id: str
    created: str
    kind: str
    host: str | None
    command: str | None
    metric_count: int
    baseline: bool  # this run is the baseline of its kind


@dataclass(frozen=True)
class RunRecord:
    """One stored run in full: the fingerprint and the result document as stored."""

    run_id: str
    created: str
    kind: str
    host: str | None
    command: str | None
    fingerprint: dict
    document: dict


@dataclass(frozen=True)
class TrendPoint:
    """One run's value of one metric (base units)."""

    run_id: str
    created: str
    host: str | None
    value: float
    unit: str
    better: str


class History:
    """The history database. Open with `History.open(path)`; use as a context manager or call
    close(). Every public method raises InputError for bad input (an unknown run id, a file
    that is not a history database) with a one-line message naming the file and the fix."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike | None = None) -> History:
        """Opens (creating and migrating when needed) the database at `path`, default
        `default_path()`. The folder must exist and be writable, except the XDG default's,
        which is created. Refuses (InputError, file untouched) a file that is not SQLite, an
        SQLite file of another program, or one with a schema newer than SCHEMA_VERSION."""
        p = Path(path).expanduser() if path is not None else default_path()
        if path is None and not os.environ.get("MGPU_BENCH_DB"):
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(
                    f"cannot create {p.parent} for the history: {exc.strerror or exc}"
                ) from None
        _check_location(p)
        try:
            conn = sqlite3.connect(str(p), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the history database {p}: {exc}") from None
        try:
            _check_owner(conn, p)
            _set_wal(conn, p)
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            _migrate(conn, p)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise _db_error(p, exc) from None
        except BaseException:
            conn.close()
            raise
        return cls(conn, p)

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
        if not isinstance(doc, Mapping) or doc.get("schema") != RESULT_SCHEMA:
            raise InputError(
                "not an mgpu-bench result document: give one written by a command's --json"
            )
        if metrics is None:  # read here for its metrics: its declared shape first (mgpu_bench.schema),
            try:  # as the stored JSON holds it (a run's own document still has tuples, say)
                validate(json.loads(json.dumps(doc)))
            except (TypeError, ValueError) as exc:
                if isinstance(exc, InputError):
                    raise
                raise ValueError(f"the result document cannot be stored as JSON: {exc}") from None
        kind = document_kind(doc) or "unknown"
        metrics = _headline(doc) if metrics is None else list(metrics)
        names = [m.name for m in metrics]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise InputError(
                f"the {kind} document measures {dup} twice: give one run's document, not two joined"
            )
        environment = (
            doc.get("environment")
            if isinstance(doc.get("environment"), Mapping)
            else {}
        )
        command = doc.get("command")
        if isinstance(command, (list, tuple)):
            command = shlex.join(str(c) for c in command)
        created = doc.get("created") if isinstance(doc.get("created"), str) else _now()
        try:
            document_json = json.dumps(doc)
            fingerprint_json = json.dumps(environment)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"the result document cannot be stored as JSON: {exc}"
            ) from None
        with self._write():
            cur = self._conn.execute(
                "INSERT INTO runs (created, kind, command, host, fingerprint, document) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    created,
                    kind,
                    command,
                    environment.get("host"),
                    fingerprint_json,
                    document_json,
                ),
            )
            row = cur.lastrowid
            self._conn.executemany(
                "INSERT INTO metrics (run, name, value, unit, better, samples, labels) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        row,
                        m.name,
                        float(m.value),
                        m.unit,
                        m.better,
                        json.dumps([float(x) for x in m.samples]),
                        json.dumps(dict(m.labels)),
                    )
                    for m in metrics
                ],
            )
        return run_label(row)

    def set_baseline(self, run_id: str) -> str:
        """Makes `run_id` the baseline of its scope (replacing the previous one); returns the
        scope: the run's kind, or "kind@host" for a document that asks for one baseline per host
        (a fleet pass's per-node documents: "baseline_scope": "host")."""
        with self._write():
            row = self._resolve(run_id)
            kind, host, document = self._conn.execute(
                "SELECT kind, host, document FROM runs WHERE id = ?", (row,)
            ).fetchone()
            scope = f"{kind}@{host}" if json.loads(document).get("baseline_scope") == "host" and host else kind
            self._conn.execute(
                "INSERT INTO baselines (scope, run, set_at) VALUES (?, ?, ?) "
                "ON CONFLICT (scope) DO UPDATE SET run = excluded.run, set_at = excluded.set_at",
                (scope, row, _now()),
            )
        return scope

    # -- reading ----------------------------------------------------------------------------

    def resolve(self, run_id: str) -> str:
        """'r12', '12' or 'latest' -> the canonical run id; InputError for an unknown one."""
        with self._read():
            return run_label(self._resolve(run_id))

    def get(self, run_id: str) -> RunRecord:
        """The stored run with its fingerprint and document. A document of a kind a probe reads
        is checked against its declared shape (compare, show and report read it): a row changed
        outside mgpu-bench is InputError naming the run and the field, not a traceback later."""
        with self._read():
            row = self._resolve(run_id)
            r = self._conn.execute(
                "SELECT id, created, kind, host, command, fingerprint, document FROM runs "
                "WHERE id = ?",
                (row,),
            ).fetchone()
        label = run_label(r[0])
        try:
            fingerprint, document = json.loads(r[5]), json.loads(r[6])
        except (ValueError, RecursionError):
            raise InputError(
                f"stored run {label} in {self.path} is not JSON: the database was changed outside "
                "mgpu-bench; give another --db path"
            ) from None
        if document_kind(document) in probe_names():  # a probe reads it: its declared shape first
            validate(document, f"stored run {label} in {self.path}")
        if not isinstance(fingerprint, dict):
            raise InputError(
                f"stored run {label} in {self.path}: its fingerprint is not an object: the database "
                "was changed outside mgpu-bench"
            )
        return RunRecord(label, r[1], r[2], r[3], r[4], fingerprint, document)

    def metrics(self, run_id: str) -> builtins.list[Metric]:
        """The run's headline metrics as stored, in stored order."""
        with self._read():
            row = self._resolve(run_id)
            rows = self._conn.execute(
                "SELECT name, value, unit, better, samples, labels FROM metrics WHERE run = ? "
                "ORDER BY rowid",
                (row,),
            ).fetchall()
        return [
            Metric(n, v, u, b, tuple(json.loads(s)), json.loads(lab))
            for n, v, u, b, s, lab in rows
        ]

    def trend(self, metric_name: str, limit: int = 20, host: str | None = None) -> builtins.list[TrendPoint]:
        """The metric's value in the last `limit` runs that have it (of `host` only, when given),
        oldest first."""
        with self._read():
            rows = self._conn.execute(
                "SELECT r.id, r.created, r.host, m.value, m.unit, m.better FROM metrics m JOIN runs r ON r.id = m.run "
                "WHERE m.name = ? AND (? IS NULL OR r.host = ?) ORDER BY r.id DESC LIMIT ?",
                (metric_name, host, host, int(limit)),
            ).fetchall()
        return [
            TrendPoint(run_label(i), c, h, v, u, b)
            for i, c, h, v, u, b in reversed(rows)
        ]

    def metric_names(
        self, like: str | None = None, limit: int = 10
    ) -> builtins.list[str]:
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
            rows = self._conn.execute(
                "SELECT scope, run FROM baselines ORDER BY scope"
            ).fetchall()
        return {k: run_label(r) for k, r in rows}

    def list(self, limit: int = 20, kind: str | None = None) -> builtins.list[RunInfo]:
        """The last `limit` runs (of `kind` when given), newest first."""
        sql = (
            "SELECT r.id, r.created, r.kind, r.host, r.command, "
            "(SELECT count(*) FROM metrics m WHERE m.run = r.id), "
            "EXISTS (SELECT 1 FROM baselines b WHERE b.run = r.id AND b.scope = r.kind) FROM runs r"
        )
        args: tuple = ()
        if kind is not None:
            sql += " WHERE r.kind = ?"
            args = (kind,)
        with self._read():
            rows = self._conn.execute(
                sql + " ORDER BY r.id DESC LIMIT ?", (*args, int(limit))
            ).fetchall()
        return [
            RunInfo(run_label(i), c, k, h, cmd, n, bool(b))
            for i, c, k, h, cmd, n, b in rows
        ]

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
            raise InputError(
                f"'{run_id}' is not a run id: write r12 (as `mgpu-bench history list` prints), 12 or "
                "latest"
            )
        row = int(digits)
        if (
            self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (row,)).fetchone()
            is None
        ):
            raise InputError(
                f"no run {run_label(row)} in {self.path}: see `mgpu-bench history list`"
            )
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
    if "locked" in text or "busy" in text:
        return InputError(
            f"the history database {path} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s: "
            "try again when it has finished"
        )
    if "readonly" in text or "read-only" in text:
        return InputError(
            f"the history database {path} is read-only: give a writable --db path"
        )
    return InputError(
        f"{path} is not a usable mgpu-bench history database ({text}): give another --db path, or "
        "move this file away"
    )


def _check_location(p: Path) -> None:
    """The folder exists and is writable (WAL mode writes two files beside the database); an
    existing file is SQLite (its first 16 bytes) and writable."""
    try:
        _check_path(p)
    except OSError as exc:  # a name too long, a folder that cannot be searched
        raise InputError(f"cannot use {p} as the history database: {exc.strerror or exc}") from None


def _check_path(p: Path) -> None:
    if p.is_dir():
        raise InputError(
            f"{p} is a folder: give a database file name, e.g. {p / 'history.sqlite3'}"
        )
    folder = p.parent
    if not folder.is_dir():
        raise InputError(
            f"the folder of the history database {p} does not exist: create it first"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(
            f"the folder of the history database {p} is not writable: give a --db path in a "
            "writable folder"
        )
    if p.exists():
        if not p.is_file():  # a FIFO or a device: reading its first bytes would wait or never end
            raise InputError(f"{p} is not a regular file: give a history database file name")
        if not os.access(p, os.R_OK | os.W_OK):
            raise InputError(
                f"the history database {p} is not readable and writable: fix its permissions or give "
                "another --db path"
            )
        with open(p, "rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\x00":
            raise InputError(
                f"{p} is not an SQLite database (so not an mgpu-bench history): give another --db "
                "path, or move this file away"
            )


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
            raise InputError(
                f"{p} is an SQLite database of another program (application_id 0, {objects} "
                "tables and indexes): give another --db path"
            )
    elif app != APPLICATION_ID:
        raise InputError(
            f"{p} is an SQLite database of another program (application_id {app:#x}): give another "
            "--db path"
        )
    elif version > SCHEMA_VERSION:
        raise InputError(
            f"{p} was written by a newer mgpu-bench (history schema {version}, this one knows "
            f"{SCHEMA_VERSION}): upgrade mgpu-bench or give another --db path"
        )


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
        raise InputError(
            f"the history database {p} cannot use WAL mode (journal mode stays {mode}): put it on a "
            "local file system"
        )


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
