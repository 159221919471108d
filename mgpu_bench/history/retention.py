"""How much of the history is kept: `mgpu-bench history prune` and the limit a document asks for
as it is stored (a check's "keep": the newest checks of its node).

What is never removed: every baseline's run and the runs its document references (a check's
reference runs, a plan's source runs, a suite's probe runs: `references`). Everything else may go
by age (created before a cutoff) or by count (beyond the newest N of its kind and host), or be
thinned instead: its raw samples dropped (each metric's samples, and in the document the lists of
per-iteration numbers under "samples" and "seconds"), its headline metrics' values kept, so that
`history trend`, `show` and `compare` still read it (compare without a noise estimate).

Removing is bounded per call where it runs inside a command (KEEP_BATCH a save), so that a limit
lowered on a large history costs each later check a few milliseconds, never its budget.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

KEEP_BATCH = 200  # runs a save removes at most (the rest go with the next saves)
RAW_KEYS = ("samples", "seconds")  # document lists of raw numbers a thinned run loses
_RUN = re.compile(r"^r(\d{1,18})\b")


def references(doc: object) -> set[int]:
    """The run rows a document names as its sources: string values (or lists of strings) of its
    "run", "runs" and "source" fields, at any depth, that start with a run id (r12)."""
    out: set[int] = set()

    def walk(x: object) -> None:
        if isinstance(x, Mapping):
            for k, v in x.items():
                if k in ("run", "runs", "source"):
                    for text in (v if isinstance(v, list) else [v]):
                        m = _RUN.match(text) if isinstance(text, str) else None
                        if m:
                            out.add(int(m.group(1)))
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    return out


def protected(conn: sqlite3.Connection) -> set[int]:
    """Every baseline's run and the runs their documents reference."""
    keep: set[int] = set()
    for run, document in conn.execute("SELECT b.run, r.document FROM baselines b JOIN runs r ON r.id = b.run"):
        keep.add(int(run))
        try:
            keep |= references(json.loads(document))
        except (TypeError, ValueError, RecursionError):
            continue  # a document changed outside mgpu-bench: its own run is kept all the same
    return keep


def _delete(conn: sqlite3.Connection, rows: Iterable[int]) -> int:
    ids = [(int(r),) for r in rows]
    conn.executemany("DELETE FROM metrics WHERE run = ?", ids)  # as ON DELETE CASCADE would, without relying on it
    conn.executemany("DELETE FROM runs WHERE id = ?", ids)
    return len(ids)


def apply_keep(conn: sqlite3.Connection, kind: str, host: str | None, keep: int) -> int:
    """Inside the transaction that stored a run: the runs of `kind` on `host` beyond the newest
    `keep` removed (KEEP_BATCH at most), baselines and their references kept. The number removed."""
    if keep <= 0:
        return 0
    rows = [r for (r,) in conn.execute("SELECT id FROM runs WHERE kind = ? AND host IS ? ORDER BY id DESC "
                                       "LIMIT ? OFFSET ?", (kind, host, KEEP_BATCH, int(keep)))]
    if not rows:
        return 0
    safe = protected(conn)
    return _delete(conn, [r for r in rows if r not in safe])


@dataclass
class Pruned:
    """What a prune did (or, dry, would do). groups: (kind, host) -> runs removed or thinned."""

    considered: int = 0
    removed: int = 0
    thinned: int = 0
    kept_protected: int = 0
    groups: dict[tuple[str, str | None], int] = field(default_factory=dict)


def select(conn: sqlite3.Connection, older_than: str | None, keep: int | None, kind: str | None,
           host: str | None) -> tuple[list[tuple[int, str, str | None]], int, int]:
    """The runs a prune removes: those created before `older_than` (UTC ISO 8601), and those
    beyond the newest `keep` of their kind and host, among the runs of `kind` and `host` where
    given; never a baseline's or a run one references. -> (id, kind, host) of each, oldest first;
    how many runs were considered; how many were spared as protected."""
    where, args = [], []
    if kind is not None:
        where.append("kind = ?")
        args.append(kind)
    if host is not None:
        where.append("host IS ?")
        args.append(host)
    clause = (" WHERE " + " AND ".join(where)) if where else ""
    rows = conn.execute(f"SELECT id, kind, host, julianday(created) FROM runs{clause} ORDER BY id DESC",
                        args).fetchall()
    cutoff = None
    if older_than is not None:
        cutoff = conn.execute("SELECT julianday(?)", (older_than,)).fetchone()[0]
    seen: dict[tuple[str, str | None], int] = {}
    chosen = []
    for run, k, h, day in rows:  # newest first: the first `keep` of each group stay
        n = seen.get((k, h), 0)
        seen[(k, h)] = n + 1
        beyond = keep is not None and n >= keep
        old = cutoff is not None and day is not None and day < cutoff
        if beyond or old:
            chosen.append((run, k, h))
    safe = protected(conn)
    out = [c for c in chosen if c[0] not in safe]
    return list(reversed(out)), len(rows), len(chosen) - len(out)


def thin_document(doc: object) -> object:
    """The document with its raw numbers dropped: every list of numbers under a RAW_KEYS key
    emptied, anything else as it was."""
    if isinstance(doc, Mapping):
        return {k: ([] if k in RAW_KEYS and isinstance(v, list) and v and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v) else thin_document(v))
            for k, v in doc.items()}
    if isinstance(doc, list):
        return [thin_document(v) for v in doc]
    return doc


def thin(conn: sqlite3.Connection, run: int, validate) -> bool:
    """Run `run` without its raw samples: its metrics' samples emptied, and its document's raw
    lists where the thinned document still has its kind's declared shape (`validate(doc)` raises
    otherwise; the document is then kept whole). True when the document was thinned too."""
    conn.execute("UPDATE metrics SET samples = '[]' WHERE run = ? AND samples != '[]'", (run,))
    (text,) = conn.execute("SELECT document FROM runs WHERE id = ?", (run,)).fetchone()
    try:
        doc = json.loads(text)
        if not isinstance(doc, Mapping) or doc.get("thinned"):
            return False
        lean = dict(thin_document(doc))
        lean["thinned"] = "raw samples dropped by `mgpu-bench history prune --drop-samples`; headline metrics kept"
        validate(lean)
    except Exception:  # noqa: BLE001 - a shape the thinning breaks, or a row changed outside: the document stays
        return False
    conn.execute("UPDATE runs SET document = ? WHERE id = ?", (json.dumps(lean), run))
    return True


def remove_or_thin(conn: sqlite3.Connection, chosen: list[tuple[int, str, str | None]], drop_samples: bool,
                   validate) -> Pruned:
    done = Pruned()
    for run, k, h in chosen:
        done.groups[(k, h)] = done.groups.get((k, h), 0) + 1
    if drop_samples:
        for run, _k, _h in chosen:
            thin(conn, run, validate)
        done.thinned = len(chosen)
    else:
        done.removed = _delete(conn, [c[0] for c in chosen])
    return done


def prune(conn: sqlite3.Connection, older_than: str | None, keep: int | None, kind: str | None, host: str | None,
          drop_samples: bool, dry_run: bool, validate) -> Pruned:
    """Inside a write transaction: select(), then remove_or_thin() unless `dry_run`."""
    chosen, considered, spared = select(conn, older_than, keep, kind, host)
    if dry_run:
        done = Pruned()
        for _run, k, h in chosen:
            done.groups[(k, h)] = done.groups.get((k, h), 0) + 1
    else:
        done = remove_or_thin(conn, chosen, drop_samples, validate)
    done.considered, done.kept_protected = considered, spared
    return done
