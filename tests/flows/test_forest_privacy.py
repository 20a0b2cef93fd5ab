"""What a forest passive party can compute from everything it receives in a whole job.

The attack of issue 23 item 5: the passive party replays the feature draws from the job's
public seed and counts what did not arrive. A node it was drawn for but not asked about was
one the active party would not split: a pure node. And the draws that explain its requests
give away the federation's feature count and its own offset among them. Run over real
workers (embedded, every message recorded), the host's view is rebuilt from the messages it
received and attacked as the host would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import pytest

from boosting.forest import draw_features, features_per_node, node_rng
from boosting.tree import load_model
from fedboost.embedded import FLOW_ENDPOINT, train_embedded
from fedboost.joined import join_parties
from flows.config import ForestJobConfig, validate_job
from messages.envelope import MsgType, decode_envelope
from messages.forest import ForestSpec, LevelRequest
from messages.instance_space import decode_mask
from messages.transport import MemoryHub
from tests.scenarios import DATA

pytestmark = pytest.mark.usefixtures("prefect_harness")

HOST_FEATURES, GUEST_FEATURES = 20, 10


def _breast_forest() -> ForestJobConfig:
    config = validate_job({
        "job": "forest-purity", "protocol": "vertical_random_forest",
        "parties": {
            "guest": {"role": "active", "data": str(DATA / "breast_hetero_guest.csv"),
                      "id": "id", "label": "y"},
            "host": {"role": "passive", "data": str(DATA / "breast_hetero_host.csv"),
                     "id": "id"}},
        "params": {"n_trees": 4, "max_depth": 5, "max_features": "sqrt",
                   "min_samples_leaf": 2, "max_bin": 16, "objective": "binary",
                   "bootstrap": True, "seed": 3},
        "crypto": {"key_bits": 1024}}, "forest purity")
    assert isinstance(config, ForestJobConfig)
    return config


@dataclass
class Node:
    """One node as the host sees it."""

    work: int
    depth: int
    node: int
    rows: np.ndarray
    asked: list[int] | None = None
    """The host's features it was asked about (None: no request)."""
    split: bool = False
    """The next level's request split it (seen only below the last level of splits)."""


@dataclass
class HostView:
    spec: ForestSpec
    nodes: list[Node] = field(default_factory=list)


def _host_view(recorded: list[tuple[str, str, bytes]]) -> HostView:
    """Replay the host's routing over the F_REQUESTs it received, as its worker does."""
    envelopes = [decode_envelope(msgpack.unpackb(data)["envelope"])
                 for _, recipient, data in recorded if recipient == "host"]
    spec = next(e.body.spec for e in envelopes if e.kind == MsgType.F_OPEN_JOB)
    requests: dict[int, dict[int, LevelRequest]] = {}
    for env in envelopes:
        if env.kind == MsgType.F_REQUEST:
            requests.setdefault(env.body.tree, {})[env.body.depth] = env.body
    view = HostView(spec)
    for work, levels in sorted(requests.items()):
        weights = np.frombuffer(levels[0].weights, dtype="<u2")
        node_of_row = np.where(weights > 0, 0, -1)
        for depth in sorted(levels):
            request = levels[depth]
            for split in request.splits:
                rows = np.flatnonzero(node_of_row == split.node)
                left = decode_mask(split.left, rows.size)
                node_of_row[rows[left]], node_of_row[rows[~left]] = split.left_id, split.right_id
            split_now = {s.node for s in request.splits}
            for node in view.nodes:
                if node.work == work and node.depth == depth - 1 and node.node in split_now:
                    node.split = True
            level = [0] if depth == 0 else [c for s in request.splits
                                            for c in (s.left_id, s.right_id)]
            asked = {r.node: list(r.features) for r in request.requests}
            for node_id in level:
                view.nodes.append(Node(work, depth, node_id,
                                       np.flatnonzero(node_of_row == node_id),
                                       asked.get(node_id)))
    return view


def _could_split(spec: ForestSpec, node: Node) -> bool:
    """What the host can check itself: depth left, room for two leaves (distinct rows)."""
    return node.depth < spec.params.max_depth and node.rows.size >= 2 * spec.params.min_samples_leaf


def _replayed(spec: ForestSpec, node: Node, total: int, offset: int) -> list[int]:
    """The host's features the public seed draws for ``node``, if the federation has
    ``total`` features and the host's come after ``offset`` others."""
    k = features_per_node(spec.params.max_features, total)
    tree = node.work % 100_000
    drawn = draw_features(node_rng(spec.params.seed, tree, node.depth, int(node.rows[0])), total, k)
    return [int(f) - offset for f in drawn if offset <= f < offset + HOST_FEATURES]


def _draws_that_explain(view: HostView) -> list[tuple[int, int]]:
    """Every (total features, own offset) whose replayed draws match every request."""
    asked = [n for n in view.nodes if n.asked is not None]
    return [(total, offset)
            for total in range(HOST_FEATURES, HOST_FEATURES + 41)
            for offset in range(total - HOST_FEATURES + 1)
            if all(_replayed(view.spec, n, total, offset) == n.asked for n in asked)]


def test_a_passive_party_cannot_tell_pure_nodes_from_nodes_it_was_not_drawn_for(
        tmp_path: Path) -> None:
    config = _breast_forest()
    hub = MemoryHub(["guest", "host", FLOW_ENDPOINT], record=True)
    train_embedded(config, tmp_path, hub=hub)
    view = _host_view(hub.recorded())
    y = join_parties(config).part(valid=False)[1]
    pure = {id(n) for n in view.nodes if np.unique(y[n.rows]).size == 1}
    could = [n for n in view.nodes if _could_split(view.spec, n)]
    assert sum(id(n) in pure for n in could) >= 3, "the run must have nodes to tell apart"

    # the attack: the draws that explain every request, then the nodes they drew but no
    # request came for. Before the fix the true (30, 10) explained them, and every node the
    # attack named was pure.
    explaining = _draws_that_explain(view)
    named = [n for total, offset in explaining for n in could
             if n.asked is None and _replayed(view.spec, n, total, offset)]
    print(f"draws explaining the requests: {explaining}; nodes named pure: {len(named)}, "
          f"of which pure: {sum(id(n) in pure for n in named)}")
    assert explaining == [], "the public seed replays the feature draws"
    assert (HOST_FEATURES + GUEST_FEATURES, GUEST_FEATURES) not in explaining

    # nothing else tells a pure node: pure nodes are asked about like the others, and split
    # like the others (a node is a leaf only when no drawn feature has a threshold)
    asked_pure = [n for n in could if id(n) in pure and n.asked is not None]
    assert asked_pure, "pure nodes are never asked about"
    seen = [n for n in could if n.depth < view.spec.params.max_depth - 1
            and any(m.work == n.work and m.depth == n.depth + 1 for m in view.nodes)]
    split_pure = [n for n in seen if id(n) in pure and n.split]
    print(f"pure nodes that could split: {sum(id(n) in pure for n in could)}, asked about: "
          f"{len(asked_pure)}; split, of those the next level shows: {len(split_pure)} of "
          f"{sum(id(n) in pure for n in seen)}")
    assert split_pure, "pure nodes always show as leaves"
    # requests name only the host's own features; its splits' children came to the active
    # party in random order, and the active party's model shows them as records only
    assert all(0 <= f < HOST_FEATURES for n in view.nodes for f in n.asked or [])
    flips = [r["flip"] for r in json.loads((tmp_path / "host" / "lookup.json").read_text())
             ["records"].values()]
    assert 0 < sum(flips) < len(flips)
    host_nodes = [n for t in load_model(tmp_path / "guest" / "model.json").trees
                  for n in t.nodes if n.owner == "host"]
    assert host_nodes and all(n.feature == -1 and np.isnan(n.threshold) for n in host_nodes)
