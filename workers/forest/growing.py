"""One tree as the active party of a forest grows it: the rows of each node, the splits
(its own, and the owners' answers for theirs), and the finished tree per output."""

from __future__ import annotations

import numpy as np

from boosting._typing import IntArray
from boosting.forest import leaf_value
from boosting.tree import Tree, TreeNode
from messages.envelope import MsgType
from messages.forest import ForestApplied
from messages.instance_space import encode_mask
from messages.secureboost import NodeSplit
from workers import ProtocolError
from workers.forest.active_state import ActiveForest, GrowingTree
from workers.handlers import StepContext
from workers.state import JobState


def rows_of(grown: GrowingTree, node: int) -> IntArray:
    return np.flatnonzero(grown.node_of_row == node)


def split_node(grown: GrowingTree, node: int, left: np.ndarray) -> None:
    """Give ``node`` two new children; ``left`` over its sampled rows (ascending)."""
    rows = rows_of(grown, node)
    left_id, right_id = grown.next_id, grown.next_id + 1
    grown.next_id += 2
    grown.nodes[node].update(left=left_id, right=right_id)
    grown.node_of_row[rows[left]] = left_id
    grown.node_of_row[rows[~left]] = right_id
    grown.broadcast.append(NodeSplit(node, left_id, right_id, encode_mask(left)))


def collect_applied(ctx: StepContext, state: JobState, grown: GrowingTree) -> None:
    """Take the owners' answers for the previous level's passive splits."""
    ctx.mailbox.require(*[(MsgType.F_APPLIED, owner, grown.work, grown.depth)
                          for owner in grown.waiting])
    for owner, nodes in grown.waiting.items():
        msg: ForestApplied = ctx.mailbox.take(MsgType.F_APPLIED, owner, grown.work, grown.depth)
        if set(msg.nodes) != nodes or len(msg.nodes) != len(set(msg.nodes)) \
                or not len(msg.nodes) == len(msg.records) == len(msg.first):
            raise ProtocolError(f"{owner} applied splits of nodes {sorted(msg.nodes)}, asked "
                                f"{sorted(nodes)}")
        for node, record, first in zip(msg.nodes, msg.records, msg.first):
            size = rows_of(grown, node).size
            if len(first) != (size + 7) // 8:
                raise ProtocolError(f"{owner}: node {node}'s children cover the wrong rows")
            left = np.unpackbits(np.frombuffer(first, dtype=np.uint8), count=size).astype(bool)
            if left.all() or not left.any():
                raise ProtocolError(f"{owner}: node {node}'s split leaves a child empty")
            grown.nodes[node] = {"owner": owner, "record_id": int(record)}
            split_node(grown, node, left)
    grown.waiting = {}


def assemble(run: ActiveForest, grown: GrowingTree) -> list[Tree]:
    """The tree per output, nodes parents-first, leaves with undivided values."""
    leaves = {}
    children = [0]
    order = []
    while children:
        node = children.pop(0)
        order.append(node)
        inner = grown.nodes.get(node)
        if inner is not None and "left" in inner:
            children += [inner["left"], inner["right"]]
        else:
            rows = rows_of(grown, node)
            leaves[node] = leaf_value(run.params.objective, run.y[rows],
                                      grown.weights[rows].astype(np.float64), run.n_classes, 1)
    trees = []
    for output in range(run.outputs):
        nodes = []
        for node in sorted(order):
            inner = grown.nodes.get(node)
            if node in leaves:
                nodes.append(TreeNode(id=node, value=float(leaves[node][output])))
            else:
                assert inner is not None
                nodes.append(TreeNode(id=node, left=inner["left"], right=inner["right"],
                                      owner=inner["owner"], feature=inner.get("feature", -1),
                                      bin=inner.get("bin", -1),
                                      threshold=inner.get("threshold", float("nan")),
                                      missing_left=inner.get("missing_left", False),
                                      record_id=inner.get("record_id", -1)))
        trees.append(Tree(nodes=tuple(nodes), output=output))
    return trees
