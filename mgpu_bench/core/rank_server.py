"""Imported by the rank server only (children.rank_start_method: multiprocessing's fork server,
which imports torch once for a run's ranks): the server ends at once when its run does.

The server holds the run's standard output and error (its ranks print through them), so whoever
reads them (a pipe, a test) waits for the server's end as for the run's. On its own, the server
ends as Python does, tearing torch down: 1.5 s of CPU after every run. It has nothing to flush or
remove (its ranks are gone, the run's parent removes its socket's folder), so here it ends with
os._exit. The hook is installed in that process alone (its command line names the fork server):
imported anywhere else, this module does nothing."""

from __future__ import annotations

import atexit
import os

from . import children

if children.forked_by_server(os.getpid()):
    atexit.register(os._exit, 0)  # registered last, run first: before torch's own exit hooks
