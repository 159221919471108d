"""Every rank's figures in one place, without a collective on the training's path: each rank
puts its latest window summary into the job's store (torch.distributed's, the one the process
group was formed on) at its window edges, and its whole record at finish(); rank 0 reads the
summaries at its own window edges without waiting (a rank that has not got there yet is read
at the next edge) and waits for the records at finish() (up to a timeout, then it reports the
ranks it has). No message pairs with another, so ranks whose step counts drift apart (a step
that raised on one rank) never block each other.

The straggler rule itself is the model probe's (probes/model/straggler.py), the same for the
monitor's job and `mgpu-bench model`'s ranks.
"""

from __future__ import annotations

import json
import time

from mgpu_bench.probes.model.straggler import LATE_SHARE, STRAGGLER_LIMIT, lags, straggler, straggler_text

__all__ = ["LATE_SHARE", "STRAGGLER_LIMIT", "Exchange", "default_store", "lags", "straggler", "straggler_text"]


def default_store():
    """The store the default process group was formed on (torch.distributed keeps it in
    distributed_c10d: there is no public accessor), or None."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no group, or a torch without it: the ranks are not gathered
        return None


class Exchange:
    """Keys of one monitor in the job's store: `{prefix}/w/{rank}` (the latest window summary,
    overwritten), `{prefix}/final/{rank}` (the rank's record), `{prefix}/doc` (rank 0's result
    document for the other ranks). Values are JSON."""

    def __init__(self, store, prefix: str, rank: int, world: int) -> None:
        self.store, self.prefix, self.rank, self.world = store, prefix, rank, world

    def _keys(self, kind: str) -> list[str]:
        return [f"{self.prefix}/{kind}/{r}" for r in range(self.world)]

    def put_window(self, summary: dict) -> None:
        self.store.set(f"{self.prefix}/w/{self.rank}", json.dumps(summary))

    def windows(self) -> list[dict] | None:
        """Every rank's latest window summary, or None while some rank has none yet (two round
        trips to the store: one check of all keys, one multi_get)."""
        keys = self._keys("w")
        if not self.store.check(keys):
            return None
        return [json.loads(bytes(v)) for v in self.store.multi_get(keys)]

    def put_final(self, record: dict) -> None:
        self.store.set(f"{self.prefix}/final/{self.rank}", json.dumps(record))

    def finals(self, timeout_s: float, poll_s: float = 0.05) -> list[dict | None]:
        """Every rank's record (rank order), waiting up to timeout_s for those not there yet;
        None for a rank that never put one. The keys are deleted once read."""
        keys = self._keys("final")
        got: list[dict | None] = [None] * self.world
        deadline = time.monotonic() + timeout_s
        while True:
            for r, key in enumerate(keys):
                if got[r] is None and self.store.check([key]):
                    got[r] = json.loads(bytes(self.store.get(key)))
            if all(g is not None for g in got) or time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        for key in keys + self._keys("w"):
            try:
                self.store.delete_key(key)
            except Exception:  # noqa: BLE001 - a store without delete: the keys stay, nothing breaks
                break
        return got

    def put_doc(self, doc: dict) -> None:
        self.store.set(f"{self.prefix}/doc", json.dumps(doc))

    def doc(self, timeout_s: float, poll_s: float = 0.05) -> dict | None:
        """Rank 0's result document, waiting up to timeout_s; None when it never came."""
        key = f"{self.prefix}/doc"
        deadline = time.monotonic() + timeout_s
        while not self.store.check([key]):
            if time.monotonic() > deadline:
                return None
            time.sleep(poll_s)
        return json.loads(bytes(self.store.get(key)))
