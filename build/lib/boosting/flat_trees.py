"""A model's trees as flat arrays, to route a batch of rows through every tree at once.

``Model.raw_predict`` walks node by node, one numpy call per node: fine for a scores file,
too slow for a scoring service (a forest of 50 trees of depth 10 has tens of thousands of
nodes). Here every internal node gets a column of a decision matrix (row x node, True = left),
and all (row, tree) pairs move down one level per step: ``depth`` steps in all. The margins
add the trees' leaf values in tree order onto the base score, exactly as ``raw_predict`` does,
so both give the same floats; ``Model.finish`` turns them into predictions for either ensemble.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boosting._typing import FloatArray, IntArray
from boosting.tree import Model, TreeNode


@dataclass(frozen=True, slots=True)
class FlatTrees:
    """Every node of every tree, numbered globally (tree after tree)."""

    left: IntArray
    """Global index of the left child; a leaf's children are the leaf itself, so rows that
    reached it stay whatever they read."""
    right: IntArray
    value: FloatArray
    """Leaf value (0 for internal nodes)."""
    column: IntArray
    """Column of the decision matrix the node reads (leaves: 0, read in vain)."""
    roots: IntArray
    """Global index of each tree's root."""
    outputs: IntArray
    """Which output (class) each tree adds to."""
    internal: tuple[TreeNode, ...]
    """The internal nodes in decision-matrix order."""
    depth: int
    """Edges on the longest root-to-leaf path."""


def flatten(model: Model) -> FlatTrees:
    """Number every node of ``model`` globally and give each internal node a decision row."""
    left: list[int] = []
    right: list[int] = []
    value: list[float] = []
    column: list[int] = []
    roots: list[int] = []
    internal: list[TreeNode] = []
    depth = 0
    for tree in model.trees:
        offset = len(left)
        index = {node.id: offset + k for k, node in enumerate(tree.nodes)}
        roots.append(index[tree.nodes[0].id])
        level = {tree.nodes[0].id: 0}
        for node in tree.nodes:  # parents before children
            if node.is_leaf:
                left.append(len(left))
                right.append(len(right))
                column.append(0)
            else:
                left.append(index[node.left])
                right.append(index[node.right])
                column.append(len(internal))
                internal.append(node)
                level[node.left] = level[node.right] = level[node.id] + 1
                depth = max(depth, level[node.id] + 1)
            value.append(node.value)
    return FlatTrees(left=np.array(left, dtype=np.int64), right=np.array(right, dtype=np.int64),
                     value=np.array(value, dtype=np.float64),
                     column=np.array(column, dtype=np.int64),
                     roots=np.array(roots, dtype=np.int64),
                     outputs=np.array([t.output for t in model.trees], dtype=np.int64),
                     internal=tuple(internal), depth=depth)


@dataclass(frozen=True, slots=True)
class OwnSplits:
    """The splits one party decides on its own raw rows, by global node index (feature -1:
    another party's node, or a leaf)."""

    feature: IntArray
    threshold: FloatArray
    missing_left: np.ndarray

    @classmethod
    def of(cls, flat: FlatTrees, owner: str) -> OwnSplits:
        """``owner``'s nodes of ``flat`` (none for an empty name: every decision is given)."""
        feature = np.full(flat.left.size, -1, dtype=np.int64)
        threshold = np.zeros(flat.left.size)
        missing_left = np.zeros(flat.left.size, dtype=bool)
        inner = np.flatnonzero(flat.column >= 0)
        inner = inner[flat.left[inner] != inner]  # leaves point at themselves
        for index in inner:
            node = flat.internal[flat.column[index]]
            if owner and node.owner == owner:
                feature[index] = node.feature
                threshold[index] = node.threshold
                missing_left[index] = node.missing_left
        return cls(feature, threshold, missing_left)


def route(flat: FlatTrees, goes_left: np.ndarray, own: OwnSplits | None = None,
          x: FloatArray | None = None) -> IntArray:
    """The leaf (global index) each row reaches in each tree: rows x trees.

    ``goes_left`` is rows x internal nodes (``flat.internal`` order), True where the row goes
    left at that node: each row's decisions side by side, so a row's steps through all trees
    read one small block of memory. With ``own`` and the raw rows ``x``, the nodes of ``own``
    are decided on ``x`` only where rows reach them (their columns of ``goes_left`` are not
    read): a party that walks the trees need not decide every node of its own on every row.
    """
    n_rows, n_columns = goes_left.shape
    position = np.broadcast_to(flat.roots, (n_rows, flat.roots.size)).copy()
    if n_columns == 0:  # every tree is a single leaf
        return position
    decisions = np.ascontiguousarray(goes_left).reshape(-1)
    row_start = (np.arange(n_rows, dtype=np.int64) * n_columns)[:, None]
    values = None if x is None else np.ascontiguousarray(x)
    for _ in range(flat.depth):  # flat 1-D gathers: much faster than 2-D fancy indexing
        left = decisions.take(row_start + flat.column.take(position))
        if own is not None and values is not None:
            feature = own.feature.take(position)
            mine = feature >= 0
            value = values.reshape(-1).take(
                np.arange(n_rows)[:, None] * values.shape[1] + np.maximum(feature, 0))
            with np.errstate(invalid="ignore"):
                own_left = value <= own.threshold.take(position)
            own_left |= np.isnan(value) & own.missing_left.take(position)
            left = np.where(mine, own_left, left)
        position = np.where(left, flat.left.take(position), flat.right.take(position))
    return position


def margins(model: Model, flat: FlatTrees, leaves: IntArray) -> FloatArray:
    """Rows x outputs: the base score plus each tree's leaf value, added in tree order (the
    same sums as ``Model.raw_predict``)."""
    margin = np.tile(np.array(model.base_score), (leaves.shape[0], 1))
    values = flat.value[leaves]
    for k, output in enumerate(flat.outputs.tolist()):
        margin[:, output] += values[:, k]
    return margin
