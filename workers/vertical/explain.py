"""What the active party records about its training for the run report (``fedboost report``).

Per split node: its owner, the owner's column index, the split's gain and the rows it split;
per tree: the leaf purity (SecureBoost sec. 6, Table 2). All of it is known to the active
party when it grows the tree; none of it leaves the party except as aggregate numbers (leaf
purity per tree, validation metrics per tree) in the flow's metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from boosting.grow import TreeGrower
from boosting.tree import write_json_atomic
from workers.model_folder import ModelPart

SPLITS_FORMAT = "fedboost-splits"


@dataclass(frozen=True, slots=True)
class SplitRecord:
    """One split of a finished tree, as the active party chose it.

    ``feature`` is the owner's column index: for a passive party's split it is the index the
    active party picked from that party's histograms (SecureBoost Alg. 2), while the model file
    keeps only the record id; the column's name stays with its owner.
    """

    tree: int
    node: int
    owner: str
    feature: int
    record_id: int
    gain: float
    rows: int


def tree_splits(tree: int, grower: TreeGrower, party: str,
                passives: list[str]) -> list[SplitRecord]:
    """The split nodes of the tree ``grower`` holds (before it is finished)."""
    owners = [party, *passives]
    return [SplitRecord(tree=tree, node=n.id, owner=owners[n.split.block],
                        feature=int(n.split.feature), record_id=int(n.record_id),
                        gain=float(n.split.gain), rows=int(n.totals.count))
            for n in grower.nodes if n.split is not None]


def leaf_purity(node_of_row: np.ndarray, y: np.ndarray) -> float:
    """SecureBoost Table 2: the mean over a tree's leaves, weighted by their rows, of the share
    of a leaf's rows in its majority class: what a party that saw the leaves' instance spaces
    could guess of the labels (1.0: every leaf is one class)."""
    labels = y.astype(np.int64)
    counts = np.zeros((int(node_of_row.max()) + 1, int(labels.max()) + 1), dtype=np.int64)
    np.add.at(counts, (node_of_row, labels), 1)
    return float(counts.max(axis=1).sum() / max(1, labels.size))


def write_splits(directory: Path, job: str, party: str, splits: list[SplitRecord]) -> None:
    """Write ``splits.json`` beside the active party's model part."""
    write_json_atomic(ModelPart(directory).splits, {
        "format": SPLITS_FORMAT, "version": 1, "job": job, "party": party,
        "saved_at": time.time(),
        "splits": [{"tree": s.tree, "node": s.node, "owner": s.owner, "feature": s.feature,
                    "record_id": s.record_id, "gain": s.gain, "rows": s.rows} for s in splits]})
