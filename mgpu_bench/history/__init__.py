"""The history: every run's result document and headline metrics in SQLite, baselines per kind,
and the comparison that gates on regressions.

    store.py               the database (WAL, application id, migrations), runs, metrics, baselines, trends
    records.py             a run apart from the database: its id, the rows read back, a document prepared
    place.py               where it is: the default place, a check's fallback, the file's checks before opening
    retention.py           what is kept: a document's own limit (a check's --keep), prune by age and count
    compare.py             change per metric against a noise-aware threshold, fingerprint differences
    rows.py                stored rows read back through their declared shapes (a row changed outside)
    side_by_side.py        N stored runs of one kind, each figure against its own machine's theory
    side_by_side_render.py `mgpu-bench side-by-side`: the terminal, Markdown, CSV, JSON and HTML views
    cli.py                 `mgpu-bench history` (add, list, prune, show, trend); every history command registered
    cli_compare.py         `mgpu-bench baseline` and `mgpu-bench compare` (the regression gate, its exit codes)
    cli_common.py          what those commands share: --db, the database opened, the console, a change in words

It reads result documents and the metrics their probes name (probe.headline); it imports no
probe backend.
"""

from __future__ import annotations

from .compare import Change, Comparison, compare, compare_runs, fingerprint_diff, noise, topology_hash
from .records import RunInfo, RunRecord, TrendPoint, run_label
from .store import History, default_path

__all__ = ["Change", "Comparison", "History", "RunInfo", "RunRecord", "TrendPoint", "compare", "compare_runs",
           "default_path", "fingerprint_diff", "noise", "run_label", "topology_hash"]
