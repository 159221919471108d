"""Where a plan's evidence is, found from the history's index instead of its documents.

The history (mgpu_bench/history/store.py) keeps every run's headline metrics in a table indexed by
name (metrics_by_name: name, run), and each run's kind and fingerprint beside its document. A
metric's name says what was measured ("model.350m.ddp.1gpu.synthetic.tokens_per_s",
"comm.allreduce.fp32.1GiB.out.8ranks.busbw"), the fingerprint on what device: so the plan finds
the runs it can use by index seeks, and reads (and checks against its shape, History.get) only
their documents, the newest first and a bounded number of each kind. Its cost does not grow with
the runs it has no use for: a node that runs `check` every 10 minutes stores 52,000 a year.

Read-only SQL on the file the History opened, through a connection of its own (mode=ro): nothing
is written, no schema is assumed beyond the two tables and their columns."""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from pathlib import Path

from mgpu_bench.core.errors import InputError

BUSY_TIMEOUT_S = 30.0
MAX_NAMES = 20_000  # distinct names under one prefix: beyond, the rest are not looked at


class Index:
    """The history's metric names and runs, read-only."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        uri = "file:" + urllib.parse.quote(str(self.path.absolute())) + "?mode=ro"
        try:
            self._conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise InputError(f"cannot read the history database {self.path}: {exc}") from None
        self._about: dict[int, tuple[str, dict]] = {}

    def close(self) -> None:
        self._conn.close()

    def _all(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise InputError(f"cannot read the history database {self.path}: {exc}") from None

    def names(self, prefix: str) -> list[str]:
        """The distinct metric names that start with `prefix`, in order. A skip scan: each name is
        one index seek past the one before (min(name) > last), so the cost is the names', not the
        rows' (a name stored by 20,000 runs costs what one stored once does)."""
        out: list[str] = []
        (name,) = self._all("SELECT min(name) FROM metrics WHERE name >= ?", (prefix,))[0]
        while isinstance(name, str) and name.startswith(prefix) and len(out) < MAX_NAMES:
            out.append(name)
            (name,) = self._all("SELECT min(name) FROM metrics WHERE name > ?", (name,))[0]
        return out

    def runs(self, names: list[str], limit: int) -> list[int]:
        """The newest `limit` runs that stored any of `names`, newest first (per name an index
        range read backwards, then merged)."""
        ids: set[int] = set()
        for name in names:
            ids.update(r for (r,) in self._all("SELECT run FROM metrics WHERE name = ? ORDER BY run DESC LIMIT ?",
                                                 (name, int(limit))))
        return sorted(ids, reverse=True)[:limit]

    def value(self, run: int, name: str) -> float | None:
        rows = self._all("SELECT value FROM metrics WHERE run = ? AND name = ?", (int(run), name))
        return float(rows[0][0]) if rows and isinstance(rows[0][0], (int, float)) else None

    def newest(self, limit: int = 1) -> list[int]:
        """The newest stored runs of any kind (the runs table's primary key, backwards)."""
        return [r for (r,) in self._all("SELECT id FROM runs ORDER BY id DESC LIMIT ?", (int(limit),))]

    def about(self, run: int) -> tuple[str, dict]:
        """(kind, fingerprint) of a run: its row, not its document."""
        if run not in self._about:
            rows = self._all("SELECT kind, fingerprint FROM runs WHERE id = ?", (int(run),))
            kind, fingerprint = (rows[0] if rows else ("", "{}"))
            try:
                fp = json.loads(fingerprint) if isinstance(fingerprint, str) else {}
            except ValueError:
                fp = {}
            self._about[run] = (str(kind), fp if isinstance(fp, dict) else {})
        return self._about[run]
