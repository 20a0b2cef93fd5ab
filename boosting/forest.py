"""Random-forest pieces of seed 002 (vertically federated random forest), in plaintext.

A tree grows on a bootstrap sample (row multiplicities), each node on a random subset of the
features, and splits where the weighted impurity drops most: Gini for classification,
variance for regression (seed 002, Eq. 2). Both drops have one form in the per-class (or
per-target) sums ``S_c`` and the count ``n`` of a node:

    drop = sum_c S_cL^2 / n_L + sum_c S_cR^2 / n_R - sum_c S_c^2 / n

(for Gini ``n * gini = n - sum_c S_c^2 / n``; for variance ``n * var = sum y^2 - S^2 / n``, and
the ``n`` and ``sum y^2`` terms cancel between a node and its children). So the active party
needs, per bin, only the encrypted sums of the label channels and a plaintext count.

Leaves hold class frequencies (or means) divided by the number of trees, so the sum over the
trees is the forest's average (``boosting.tree.Model`` with ``ensemble="forest"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from boosting._typing import FloatArray, IntArray



def features_per_node(rule: str | float, n_features: int) -> int:
    """How many features a node draws: ``sqrt``, ``log2`` or a fraction of all (at least 1)."""
    if rule == "sqrt":
        k = math.isqrt(n_features)
    elif rule == "log2":
        k = int(math.log2(n_features)) if n_features > 1 else 1
    else:
        k = int(float(rule) * n_features)
    return max(1, min(n_features, k))


def tree_rng(seed: int, tree: int) -> np.random.Generator:
    """The generator of one tree: its sample and its feature draws do not depend on which
    trees were grown before or beside it (a retried tree is the same tree)."""
    return np.random.default_rng([seed, tree])


def node_rng(seed: int, tree: int, depth: int, first_row: int,
             secret: int | None = None) -> np.random.Generator:
    """The generator of one node's feature draw, named by its first row: nodes of a level are
    disjoint, and which child a passive party showed first (at random) does not change it.
    With ``secret`` (a non-negative integer only the drawing party knows), nobody else can
    replay the draw from the job's public seed."""
    entropy = [seed, tree, depth, first_row] + ([] if secret is None else [secret])
    return np.random.default_rng(entropy)


def bootstrap_weights(rng: np.random.Generator, n_rows: int, bootstrap: bool) -> IntArray:
    """How often each training row is in the tree's sample (n draws with replacement), or
    every row once."""
    if not bootstrap:
        return np.ones(n_rows, dtype=np.int64)
    return np.bincount(rng.integers(0, n_rows, n_rows), minlength=n_rows).astype(np.int64)


def draw_features(rng: np.random.Generator, n_features: int, k: int) -> IntArray:
    """``k`` distinct global feature indices, sorted."""
    return np.sort(rng.choice(n_features, size=k, replace=False)).astype(np.int64)


def label_channels(objective: str, y: FloatArray, n_classes: int) -> FloatArray:
    """Rows x channels whose per-node sums the split needs: y (binary; class 0 is n - S),
    one-hot classes (multiclass), or y itself (regression)."""
    if objective == "multiclass":
        return np.eye(n_classes)[y.astype(np.int64)]
    return y.reshape(-1, 1).astype(np.float64)


def node_sums(objective: str, channels: FloatArray, count: FloatArray) -> FloatArray:
    """Channels used in the drop formula from the carried ones: binary adds class 0."""
    if objective == "binary":
        return np.concatenate([count[..., None] - channels, channels], axis=-1)
    return channels


@dataclass(frozen=True, slots=True)
class ForestSplit:
    """The best split of one node on one feature."""

    drop: float
    feature: int
    bin: int
    missing_left: bool
    n_left: float
    n_right: float


def _allowed(count: FloatArray, min_samples_leaf: int,
             missing_left: bool) -> tuple[FloatArray, FloatArray, np.ndarray]:
    """Per threshold bin of one feature: the weighted rows left and right, and whether the
    split leaves ``min_samples_leaf`` on each side (labels play no part)."""
    n_bins = count.size - 1
    left_n = np.cumsum(count[:n_bins]) + (count[n_bins] if missing_left else 0.0)
    right_n = count.sum() - left_n
    ok = (left_n >= min_samples_leaf) & (right_n >= min_samples_leaf)
    ok[n_bins - 1] = False  # everything non-missing left: not a split
    return left_n, right_n, ok


def allowed_splits(count: FloatArray, feature: int,
                   min_samples_leaf: int) -> list[ForestSplit]:
    """Every threshold of one feature that leaves ``min_samples_leaf`` on each side, with a
    drop of 0: the splits a node may take whatever its labels (missing values on the right,
    and on the left too when there are any)."""
    out = []
    for missing_left in (False, True) if count[-1] > 0 else (False,):
        left_n, right_n, ok = _allowed(count, min_samples_leaf, missing_left)
        out += [ForestSplit(0.0, feature, int(k), missing_left, float(left_n[k]),
                            float(right_n[k])) for k in np.flatnonzero(ok)]
    return out


def best_bin_split(objective: str, count: FloatArray, sums: FloatArray, feature: int,
                   min_samples_leaf: int) -> ForestSplit | None:
    """Best threshold of one feature from its per-bin weighted counts and channel sums
    (``count``: bins, the last bin holds missing values; ``sums``: bins x channels), trying
    missing values on either side; None if no split leaves ``min_samples_leaf`` on each side
    and lowers the impurity."""
    n_bins = count.size - 1
    stats = node_sums(objective, sums, count)
    total_n, total_s = count.sum(), stats.sum(axis=0)
    if total_n <= 0:
        return None
    parent = float((total_s ** 2).sum() / total_n)
    cum_s = np.cumsum(stats[:n_bins], axis=0)
    best: ForestSplit | None = None
    for missing_left in (False, True):
        left_n, right_n, ok = _allowed(count, min_samples_leaf, missing_left)
        left_s = cum_s + (stats[n_bins] if missing_left else 0.0)
        right_s = total_s - left_s
        if not ok.any():
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            score = ((left_s ** 2).sum(axis=1) / left_n + (right_s ** 2).sum(axis=1) / right_n
                     - parent)
        score = np.where(ok, score, -np.inf)
        k = int(np.argmax(score))
        if score[k] > 1e-12 and (best is None or score[k] > best.drop):
            best = ForestSplit(float(score[k]), feature, k, missing_left, float(left_n[k]),
                               float(right_n[k]))
    return best


def leaf_value(objective: str, y: FloatArray, weights: FloatArray, n_classes: int,
               n_trees: int) -> FloatArray:
    """A leaf's prediction per output (class frequencies or the mean), divided by the trees."""
    total = float(weights.sum())
    if objective == "multiclass":
        freq = np.bincount(y.astype(np.int64), weights=weights, minlength=n_classes) / total
        return freq / n_trees
    return np.array([float((y * weights).sum()) / total / n_trees])
