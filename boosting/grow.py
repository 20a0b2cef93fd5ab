"""Level-wise growth of one tree from per-block histograms (SecureBoost Alg. 1-2).

A *block* is a group of feature columns whose histograms arrive together: in the centralized
trainer one block per party's columns, in the federated trainer the active party's own block
plus one decrypted block per passive party. The grower owns node membership, histogram
subtraction and split choice; it never sees where a block's histograms came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from boosting._typing import Histogram, IntArray
from boosting.fixedpoint import Quantized
from boosting.params import BoostParams
from boosting.privacy import PrivateTree
from boosting.split import NodeTotals, SplitCandidate, best_split, best_split_in_block, leaf_weight
from boosting.tree import Tree, TreeNode


def sample_rows(n_rows: int, subsample: float, seed: int, tree: int) -> np.ndarray:
    """Seeded row subsample for one tree (boolean mask); all rows when subsample is 1."""
    if subsample >= 1.0:
        return np.ones(n_rows, dtype=bool)
    rng = np.random.default_rng([seed, tree])
    return rng.random(n_rows) < subsample


@dataclass(slots=True)
class _Node:
    id: int
    depth: int
    totals: NodeTotals
    split: SplitCandidate | None = None
    left: int = -1
    right: int = -1
    owner: str = ""
    feature: int = -1
    bin: int = -1
    threshold: float = float("nan")
    record_id: int = -1


@dataclass(slots=True)
class TreeGrower:
    """State of one tree under construction.

    Parameters
    ----------
    params : training parameters
    grad, hess : quantized g and h of every row (rows outside the tree are ignored)
    in_tree : mask of rows used by this tree (subsample)
    n_blocks : number of feature blocks whose histograms will be supplied
    private : under differential privacy, the tree's mechanisms (``boosting.privacy``): splits
        by the exponential mechanism over every block, clipped noisy leaves of unit hessians
    """

    params: BoostParams
    grad: Quantized
    hess: Quantized
    in_tree: np.ndarray
    n_blocks: int
    private: PrivateTree | None = None
    node_of_row: IntArray = field(init=False)
    nodes: list[_Node] = field(init=False)
    frontier: list[int] = field(init=False)
    depth: int = field(init=False, default=0)
    _pairs: list[tuple[int, int, int]] = field(init=False)
    _hist: dict[tuple[int, int], Histogram] = field(init=False)

    def __post_init__(self) -> None:
        # every row is routed (its leaf updates its prediction); only in-tree rows are summed
        self.node_of_row = np.zeros(self.in_tree.size, dtype=np.int64)
        self.nodes = [_Node(id=0, depth=0, totals=self._totals(np.arange(self.in_tree.size)))]
        self.frontier = [0]
        self._pairs = []
        self._hist = {}

    def _totals(self, rows: IntArray) -> NodeTotals:
        rows = rows[self.in_tree[rows]]
        return NodeTotals(
            g=int(self.grad.ints[rows].sum()), h=int(self.hess.ints[rows].sum()), count=int(rows.size)
        )

    def node_rows(self, node: int) -> IntArray:
        """Row indices currently at ``node`` (sampled or not), ascending."""
        return np.flatnonzero(self.node_of_row == node)

    def nodes_to_build(self) -> list[int]:
        """Frontier nodes whose histograms must be built; their siblings come by subtraction."""
        if self.depth == 0:
            return [0]
        return built_children(self._pairs, self.frontier,
                              {n.id: n.totals.count for n in self.nodes})

    def slot_of_row(self, built: list[int]) -> IntArray:
        """Per row, the index in ``built`` of its node, or -1."""
        slot = np.full(self.node_of_row.size, -1, dtype=np.int64)
        for k, node in enumerate(built):
            slot[(self.node_of_row == node) & self.in_tree] = k
        return slot

    def add_histograms(self, block: int, built: list[int], hist: Histogram) -> None:
        """Record one block's histograms of the built nodes and derive their siblings."""
        for k, node in enumerate(built):
            self._hist[(block, node)] = hist[k]
        for parent, left, right in self._pairs:
            parent_hist = self._hist.pop((block, parent))
            if left not in self.frontier:
                continue  # children closed by a count floor: neither is built
            if (block, left) in self._hist:
                self._hist[(block, right)] = parent_hist - self._hist[(block, left)]
            else:
                self._hist[(block, left)] = parent_hist - self._hist[(block, right)]

    def find_splits(self, blocks: list[int]) -> dict[int, SplitCandidate | None]:
        """Best split of every frontier node over the given blocks (earlier blocks win ties)."""
        result: dict[int, SplitCandidate | None] = {}
        for node in self.frontier:
            totals = self.nodes[node].totals
            if self.private is not None:
                result[node] = self.private.choose({b: self._hist[(b, node)] for b in blocks},
                                                   totals, self.grad.scale, self.hess.scale,
                                                   self.params, self.nodes[node].depth)
                continue
            result[node] = best_split([
                best_split_in_block(self._hist[(b, node)], totals, self.grad.scale,
                                    self.hess.scale, self.params, b)
                for b in blocks
            ])
        return result

    def split_node(self, node: int, split: SplitCandidate, left_mask: np.ndarray, *,
                   owner: str, threshold: float = float("nan"), record_id: int = -1,
                   hide_feature: bool = False) -> tuple[int, int]:
        """Split ``node``: ``left_mask`` is over :meth:`node_rows` in ascending order."""
        rows = self.node_rows(node)
        left_rows, right_rows = rows[left_mask], rows[~left_mask]
        left_id, right_id = len(self.nodes), len(self.nodes) + 1
        depth = self.nodes[node].depth + 1
        self.nodes.append(_Node(id=left_id, depth=depth, totals=self._totals(left_rows)))
        self.nodes.append(_Node(id=right_id, depth=depth, totals=self._totals(right_rows)))
        self.node_of_row[left_rows] = left_id
        self.node_of_row[right_rows] = right_id
        parent = self.nodes[node]
        parent.split, parent.left, parent.right, parent.owner = split, left_id, right_id, owner
        parent.feature = -1 if hide_feature else split.feature
        parent.bin = -1 if hide_feature else split.bin
        parent.threshold, parent.record_id = threshold, record_id
        self._pairs.append((node, left_id, right_id))
        return left_id, right_id

    def next_level(self) -> list[int]:
        """Close the current depth: drop leaf histograms, make the children the frontier
        (under a private plan's count floors only the splits whose two children pass it:
        :func:`open_children`)."""
        children = [c for _, left, right in self._pairs for c in (left, right)]
        split_parents = {p for p, _, _ in self._pairs}
        self._hist = {k: v for k, v in self._hist.items() if k[1] in split_parents}
        self.depth += 1
        if self.depth < self.params.max_depth and self.private is not None:
            children = open_children(self._pairs, self.private,
                                     {n.id: n.totals.count for n in self.nodes})
        self.frontier = children if self.depth < self.params.max_depth else []
        if not self.frontier:
            self._pairs = []
        return self.frontier

    def begin_level(self) -> None:
        """Forget the pairs of the previous level once their histograms are derived."""
        self._pairs = []

    def finish(self, output: int) -> tuple[Tree, IntArray]:
        """Leaf weights and the finished tree; also each row's node (for prediction updates)."""
        out: list[TreeNode] = []
        values = self._private_leaves()
        for n in self.nodes:
            if n.split is None:
                value = (leaf_weight(n.totals, self.grad.scale, self.hess.scale, self.params)
                         if values is None else values[n.id])
                out.append(TreeNode(id=n.id, value=value))
            else:
                out.append(TreeNode(id=n.id, left=n.left, right=n.right, owner=n.owner,
                                    feature=n.feature, bin=n.bin, threshold=n.threshold,
                                    missing_left=n.split.missing_left, record_id=n.record_id))
        return Tree(nodes=tuple(out), output=output), self.node_of_row

    def _private_leaves(self) -> dict[int, float] | None:
        """Under differential privacy, each leaf's clipped noisy value times the learning
        rate (``PrivateTree.leaves``: the row count is the hessian sum)."""
        if self.private is None:
            return None
        leaves = [n for n in self.nodes if n.split is None]
        values = self.private.leaves(np.array([n.totals.g / self.grad.scale for n in leaves]),
                                     np.array([n.totals.count for n in leaves], dtype=np.float64))
        return {n.id: float(v) * self.params.learning_rate for n, v in zip(leaves, values)}


def open_children(pairs: list[tuple[int, int, int]], private: PrivateTree,
                  counts: dict[int, int]) -> list[int]:
    """The children that are split further under a private plan's count floors: both children
    of a split if both their noisy counts pass (``PrivateTree.opens``, drawn for every child in
    node order), else neither (both leaves). One open child would be built and its parent's
    histogram minus it is the other's: a split's children are opened together or not at all."""
    passed = [(private.opens(counts[left]), private.opens(counts[right]))
              for _, left, right in pairs]
    return [c for (_, left, right), (a, b) in zip(pairs, passed) if a and b for c in (left, right)]


def built_children(pairs: list[tuple[int, int, int]], frontier: list[int],
                   counts: dict[int, int]) -> list[int]:
    """The children of a level's splits whose histograms are built: the smaller of each split
    whose children are open (the other is its parent's minus it); none of a split whose
    children a count floor closed."""
    return [smaller_child(counts[left], counts[right], left, right)
            for _, left, right in pairs if left in frontier]


def smaller_child(left_count: int, right_count: int, left: int, right: int) -> int:
    """The child whose histogram is built directly (fewer rows; left on ties)."""
    return left if left_count <= right_count else right
