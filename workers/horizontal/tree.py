"""One tree of the horizontal protocol, as each side holds it.

The aggregator's :class:`SummedTree` grows the tree from summed histograms alone: node totals
are sums over a histogram's bins, siblings come by subtraction, split gains and leaf weights
come from ``boosting.split``, node ids are given in the core grower's order. With the same cuts
and quantization it therefore grows exactly the tree ``boosting.grow.TreeGrower`` grows on the
union of the members' rows. A member's :class:`MemberTree` routes its own rows through the
splits it is sent and builds the histograms of the nodes it is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from boosting._typing import BinMatrix, FloatArray, Histogram, IntArray
from boosting.binning import goes_left, split_threshold
from boosting.grow import built_children, open_children
from boosting.hist import build_histograms
from boosting.params import BoostParams
from boosting.privacy import PrivateTree
from boosting.split import NodeTotals, SplitCandidate, best_split_in_block, leaf_weight
from boosting.tree import Tree, TreeNode
from messages.horizontal import NodeSplit
from workers import ProtocolError
from workers.row_partitioned import OWNER

@dataclass(slots=True)
class SplitChooser:
    """How the aggregator picks a node's split: the best gain (lossless), or, under
    differential privacy, the exponential mechanism over every candidate of the public cuts
    (``boosting.privacy.PrivateTree``: a node above ``max_depth`` always splits, unless the
    count floor closed it)."""

    private: PrivateTree | None = None

    def choose(self, hist: Histogram, totals: NodeTotals, g_scale: float, h_scale: float,
               params: BoostParams, depth: int) -> SplitCandidate | None:
        if self.private is None:
            return best_split_in_block(hist, totals, g_scale, h_scale, params, 0)
        return self.private.choose({0: hist}, totals, g_scale, h_scale, params, depth)


@dataclass(slots=True)
class _Node:
    id: int
    depth: int
    totals: NodeTotals
    split: SplitCandidate | None = None
    left: int = -1
    right: int = -1
    threshold: float = float("nan")


def histogram_totals(hist: Histogram) -> NodeTotals:
    """A node's sums of g, h and rows: any one feature's bins hold every row of the node."""
    g, h, count = (int(v) for v in hist[0].sum(axis=0))
    return NodeTotals(g=g, h=h, count=count)


@dataclass(slots=True)
class SummedTree:
    """The aggregator's tree in progress (see the module docstring)."""

    params: BoostParams
    cuts: list[FloatArray]
    g_scale: float
    h_scale: float
    nodes: list[_Node] = field(default_factory=list)
    frontier: list[int] = field(default_factory=lambda: [0])
    build: list[int] = field(default_factory=lambda: [0])
    """Nodes of the current level whose histograms the members send."""
    pairs: list[tuple[int, int, int]] = field(default_factory=list)
    hists: dict[int, Histogram] = field(default_factory=dict)
    depth: int = 0

    def add_histograms(self, summed: Histogram) -> None:
        """The level's summed histograms of ``build`` (slots, features, bins, 3); the other
        child of each pair is its parent's minus the built one."""
        for k, node in enumerate(self.build):
            self.hists[node] = summed[k]
        if not self.nodes:
            self.nodes.append(_Node(0, 0, histogram_totals(summed[0])))
        for parent, left, right in self.pairs:
            built, other = (left, right) if left in self.hists else (right, left)
            self.hists[other] = self.hists.pop(parent) - self.hists[built]

    def grow_level(self, chooser: SplitChooser) -> list[NodeSplit]:
        """Choose and apply the splits of the frontier; returns them in node order."""
        splits = []
        pairs = []
        for node_id in self.frontier:
            node, hist = self.nodes[node_id], self.hists[node_id]
            split = chooser.choose(hist, node.totals, self.g_scale, self.h_scale, self.params,
                                   node.depth)
            if split is None:
                continue
            left_totals = _left_totals(hist, split, self.params.max_bin)
            right_totals = NodeTotals(node.totals.g - left_totals.g, node.totals.h - left_totals.h,
                                      node.totals.count - left_totals.count)
            left, right = len(self.nodes), len(self.nodes) + 1
            self.nodes.append(_Node(left, node.depth + 1, left_totals))
            self.nodes.append(_Node(right, node.depth + 1, right_totals))
            node.split, node.left, node.right = split, left, right
            node.threshold = split_threshold(self.cuts[split.feature], split.bin)
            pairs.append((node_id, left, right))
            splits.append(NodeSplit(node_id, split.feature, split.bin, split.missing_left,
                                    left, right))
        self.depth += 1
        children = [c for _, left, right in pairs for c in (left, right)]
        # under DP the children of a split whose noisy counts are not both above the floor
        # stay leaves: their histograms are never built (``boosting.grow.open_children``,
        # drawn after the level's splits as the core grower draws them)
        counts = {n.id: n.totals.count for n in self.nodes}
        if self.depth >= self.params.max_depth:
            self.frontier = []
        elif chooser.private is not None:
            self.frontier = open_children(pairs, chooser.private, counts)
        else:
            self.frontier = children
        # each open split derives one child from its parent; leaves keep no histogram
        self.pairs = [p for p in pairs if p[1] in self.frontier]
        self.hists = {n: h for n, h in self.hists.items() if any(p == n for p, _, _ in self.pairs)}
        self.build = built_children(pairs, self.frontier, counts)
        return splits

    def leaf_values(self) -> dict[int, float]:
        """Each leaf's weight ``-G / (H + lambda)`` times the learning rate."""
        return {n.id: leaf_weight(n.totals, self.g_scale, self.h_scale, self.params)
                for n in self.nodes if n.split is None}

    def private_leaf_values(self, private: PrivateTree) -> dict[int, float]:
        """Each leaf's ``-G / (n + lambda)`` clipped and with Laplace noise (unit hessians:
        ``n`` is the row count), then times the learning rate."""
        leaves = [n for n in self.nodes if n.split is None]
        values = private.leaves(np.array([n.totals.g / self.g_scale for n in leaves]),
                                np.array([n.totals.count for n in leaves], dtype=np.float64))
        return {n.id: float(v * self.params.learning_rate) for n, v in zip(leaves, values)}

    def tree(self, values: dict[int, float], output: int = 0) -> Tree:
        """The finished tree with the given leaf values, for output ``output`` (its class in
        multiclass)."""
        return assemble(len(self.nodes), {n.id: (n.split.feature, n.split.bin, n.split.missing_left,
                                                 n.left, n.right)
                                          for n in self.nodes if n.split is not None},
                        values, self.cuts, output)


def _left_totals(hist: Histogram, split: SplitCandidate, max_bin: int) -> NodeTotals:
    """Sums of the rows a split sends left: bins <= ``split.bin``, and missing if it says so."""
    column = hist[split.feature]
    left = column[:split.bin + 1].sum(axis=0)
    if split.missing_left:
        left = left + column[max_bin]
    g, h, count = (int(v) for v in left)
    return NodeTotals(g=g, h=h, count=count)


def assemble(n_nodes: int, splits: dict[int, tuple[int, int, bool, int, int]],
             values: dict[int, float], cuts: list[FloatArray], output: int = 0) -> Tree:
    """A tree of ``n_nodes`` nodes (ids 0..n-1) from its splits (node -> feature, bin,
    missing_left, left, right) and leaf values, thresholds from the shared cuts; ``output`` is
    the margin column it adds to (its class in multiclass)."""
    nodes = []
    for node in range(n_nodes):
        if node in splits:
            feature, bin_, missing_left, left, right = splits[node]
            nodes.append(TreeNode(id=node, left=left, right=right, owner=OWNER, feature=feature,
                                  bin=bin_, threshold=split_threshold(cuts[feature], bin_),
                                  missing_left=missing_left))
        else:
            nodes.append(TreeNode(id=node, value=values[node]))
    return Tree(nodes=tuple(nodes), output=output)


@dataclass(slots=True)
class MemberTree:
    """A member's own rows routed through the tree in progress."""

    n_features: int
    max_bin: int
    max_depth: int
    node_of_row: IntArray
    in_tree: np.ndarray
    frontier: list[int] = field(default_factory=lambda: [0])
    build: list[int] = field(default_factory=lambda: [0])
    splits: dict[int, tuple[int, int, bool, int, int]] = field(default_factory=dict)
    n_nodes: int = 1
    depth: int = 0

    @classmethod
    def start(cls, n_rows: int, in_tree: np.ndarray, n_features: int, max_bin: int,
              max_depth: int) -> MemberTree:
        return cls(n_features, max_bin, max_depth, np.zeros(n_rows, dtype=np.int64), in_tree)

    def histograms(self, bins: BinMatrix, g: IntArray, h: IntArray) -> Histogram:
        """Histograms of the level's ``build`` nodes over this member's rows in the tree."""
        slot = np.full(self.node_of_row.size, -1, dtype=np.int64)
        for k, node in enumerate(self.build):
            slot[(self.node_of_row == node) & self.in_tree] = k
        return build_histograms(bins, slot, g, h, len(self.build), self.max_bin)

    def apply(self, splits: list[NodeSplit], build: list[int], bins: BinMatrix,
              who: str) -> None:
        """Route the rows through one level's splits, after checking that they split open
        nodes of this level into the next ids, on features and bins that exist."""
        children: list[int] = []
        seen: set[int] = set()
        for s in splits:
            if s.node not in self.frontier or s.node in seen:
                raise ProtocolError(f"{who}: split of node {s.node}, which is not an open node of "
                                    f"depth {self.depth} (or split twice)")
            if not (0 <= s.feature < self.n_features and 0 <= s.bin < self.max_bin):
                raise ProtocolError(f"{who}: split on feature {s.feature}, bin {s.bin}: out of "
                                    f"range ({self.n_features} features, {self.max_bin} bins)")
            if (s.left, s.right) != (self.n_nodes, self.n_nodes + 1):
                raise ProtocolError(f"{who}: split of node {s.node} names children {s.left}, "
                                    f"{s.right}; expected {self.n_nodes}, {self.n_nodes + 1}")
            seen.add(s.node)
            rows = np.flatnonzero(self.node_of_row == s.node)
            left = goes_left(bins[rows, s.feature], s.bin, s.missing_left, self.max_bin)
            self.node_of_row[rows[left]] = s.left
            self.node_of_row[rows[~left]] = s.right
            self.splits[s.node] = (s.feature, s.bin, s.missing_left, s.left, s.right)
            self.n_nodes += 2
            children += [s.left, s.right]
        self.depth += 1
        self.frontier = children if self.depth < self.max_depth else []
        pairs = [(children[k], children[k + 1]) for k in range(0, len(children), 2)]
        if self.frontier and not _one_child_per_split(build, pairs):
            raise ProtocolError(f"{who}: nodes to build {build} are not at most one child of "
                                f"each split of depth {self.depth - 1}, in order")
        self.build = list(build) if self.frontier else []

    def leaves(self) -> list[int]:
        return [n for n in range(self.n_nodes) if n not in self.splits]


def _one_child_per_split(build: list[int], pairs: list[tuple[int, int]]) -> bool:
    """``build`` holds at most one child of each split, in the splits' order (every split's
    without DP; under DP none of a split whose children the count floor closed)."""
    k = 0
    for pair in pairs:
        if k < len(build) and build[k] in pair:
            k += 1
    return k == len(build)
