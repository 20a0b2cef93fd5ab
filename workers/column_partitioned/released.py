"""A passive party's ledger of the path-mode decisions it has released, per model, across
prediction jobs.

Within one job a passive party answers per row at most one record of each tree per level
(``workers.column_partitioned.paths``). A modified active party that runs the flow can still
run more prediction jobs over the same rows, asking each time about another node of each level,
and so collect every decision the model holds on a row, as batched mode would (4 jobs: 3,983 of
3,983 (row, record) decisions in the attack review of issue 36). The ledger closes that: for
each (row id, tree, level) it keeps the one record it has answered, in any prediction job of
the model, and refuses a request that asks another. An honest walk asks the same path again
(the same records, whose decisions it already knows), so scoring a row again is answered; a
row's path changes only if its features changed since its first scoring (the active party's
or this party's), and that request is refused too, naming the row.

The ledger sits in the party's private folder (0700), one file per model job, written 0600
whole or not at all (``boosting.tree.open_private``) before the decisions are sent. It keys
each entry by a 64-bit BLAKE2b digest of (row id, tree, level) under a key the party draws
once and keeps with the file (no id is written in the clear); a collision (about 1 in 2**64 per
pair) would refuse an honest row, never release more.
"""

from __future__ import annotations

import hashlib
import io
import logging
import secrets
from pathlib import Path

import numpy as np

from boosting._typing import IntArray
from boosting.tree import open_private
from workers import ProtocolError

log = logging.getLogger("fedboost.worker")

LEDGER_FOLDER = "released"
"""Beside the party's checkpoint key in its private folder: one ledger per model job."""


class DecisionLedger:
    """The (row, tree, level) -> record pairs released by one model's prediction jobs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.key = secrets.token_bytes(16)
        self.slots = np.zeros(0, dtype=np.uint64)
        self.records = np.zeros(0, dtype=np.int64)
        if path.exists():
            with np.load(path) as kept:
                self.key = bytes(kept["key"].tobytes())
                self.slots, self.records = kept["slots"], kept["records"]

    @classmethod
    def of_model(cls, private_dir: Path, model_job: str) -> DecisionLedger:
        """The ledger of model ``model_job`` (a job name, checked by the caller)."""
        folder = private_dir / LEDGER_FOLDER
        folder.mkdir(mode=0o700, exist_ok=True)
        return cls(folder / f"{model_job}.npz")

    def _slots(self, ids: list[str], trees: IntArray, level: int) -> np.ndarray:
        return np.array([int.from_bytes(hashlib.blake2b(
            f"{i}\x00{t}\x00{level}".encode(), digest_size=8, key=self.key).digest(), "little")
            for i, t in zip(ids, trees.tolist())], dtype=np.uint64)

    def release(self, party: str, where: str, ids: list[str], trees: IntArray, level: int,
                records: IntArray) -> None:
        """Record the pairs about to be answered, or refuse (``ProtocolError``, logged) if a
        (row, tree, level) was answered before about another record. Pairs whose record has no
        tree (``trees < 0``: lookup files written before records kept it) are not bounded."""
        known = trees >= 0
        ids = [i for i, k in zip(ids, known.tolist()) if k]
        trees, records = trees[known], records[known]
        slots = self._slots(ids, trees, level)
        at = np.searchsorted(self.slots, slots)
        seen = at < self.slots.size
        seen[seen] = self.slots[at[seen]] == slots[seen]
        other = seen.copy()
        other[seen] = self.records[at[seen]] != records[seen]
        if other.any():
            k = int(np.flatnonzero(other)[0])
            message = (f"{where}: refused: row {ids[k]!r} was answered at tree "
                       f"{int(trees[k])} level {level} about another record in an earlier "
                       f"prediction job of this model; a path has one decision per tree and "
                       f"level ({int(other.sum())} such pairs in this request; ledger "
                       f"{self.path.name})")
            log.warning("%s: %s", party, message)
            raise ProtocolError(message)
        new = ~seen
        if not new.any():
            return
        slots, order = np.unique(slots[new], return_index=True)
        merged = np.concatenate([self.slots, slots])
        keep = np.argsort(merged, kind="stable")
        self.slots = merged[keep]
        self.records = np.concatenate([self.records, records[new][order]])[keep]
        self._save()

    def _save(self) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, key=np.frombuffer(self.key, dtype=np.uint8), slots=self.slots,
                 records=self.records)
        with open_private(self.path, "wb") as handle:
            handle.write(buffer.getvalue())
