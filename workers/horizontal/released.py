"""Which member set a member opened each tree's root for, kept on its disk for the whole job.

A member releases the round key of a tree's root histograms (``masking``) at most for one set
of members per tree, where a tree is named by everything that fixes its rows' gradients: the
run (cuts and base score) and the trees before it (:func:`tree_prefix`). Releasing it for
another set would give the aggregator two root sums over the same rows and gradients whose
difference is the members in one set and not the other. The record survives the member's
restarts and later runs of the job (a re-run that brings a dropped member back to a tree the
others grew without it is refused), and goes with the job's checkpoints when it completes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgpack

from boosting.tree import Tree, open_private
from messages.codec import to_wire

FILE = "released-roots.json"


def tree_prefix(run: str, trees: list[Tree]) -> str:
    """The name of the next tree: a digest of the run and the trees before it."""
    digest = hashlib.sha256(run.encode())
    digest.update(msgpack.packb(to_wire(trees), use_bin_type=True))
    return digest.hexdigest()[:32]


def load(folder: Path) -> dict[str, list[str]]:
    """The member's record (empty when there is none)."""
    path = folder / FILE
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    if not (isinstance(record, dict) and all(isinstance(v, list) for v in record.values())):
        raise ValueError(f"{path} is not a record of released roots")
    return {str(k): [str(m) for m in v] for k, v in record.items()}


def save(folder: Path, record: dict[str, list[str]]) -> None:
    """Write the record durably (fsync, then rename) before a key leaves the member."""
    folder.mkdir(parents=True, exist_ok=True)
    with open_private(folder / FILE) as handle:
        handle.write(json.dumps(record, sort_keys=True))


def discard(folder: Path) -> None:
    """The job is complete: its record goes with its checkpoints."""
    (folder / FILE).unlink(missing_ok=True)
