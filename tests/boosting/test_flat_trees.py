"""Routing every row through every tree at once gives exactly ``Model.raw_predict``'s margins,
for boosted models (binary, multiclass, deep trees) and forests alike."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from boosting.binning import goes_left_raw, goes_left_table
from boosting.flat_trees import OwnSplits, flatten, margins, route
from boosting.tree import Model, raw_decider
from tests.scenarios import config_with, train_centralized


def _goes_left(model: Model, columns: dict[str, np.ndarray]) -> np.ndarray:
    flat = flatten(model)
    return np.array([goes_left_raw(columns[n.owner][:, n.feature], n.threshold, n.missing_left)
                     for n in flat.internal]).reshape(len(flat.internal), -1).T


@pytest.mark.parametrize("name, params", [
    ("breast.yaml", {"n_trees": 6, "max_depth": 6}),
    ("vehicle.yaml", {"n_trees": 3, "max_depth": 4}),
])
def test_flat_routing_gives_raw_predicts_margins_exactly(name: str, params: dict) -> None:
    model, joined = train_centralized(config_with(name, params=params,
                                                  validation={"fraction": 0.0}))
    columns = {b.owner: b.x for b in joined.blocks}
    n = joined.blocks[0].x.shape[0]
    flat = flatten(model)
    assert flat.depth == max(_depths(model))
    got = margins(model, flat, route(flat, _goes_left(model, columns)))
    assert np.array_equal(got, model.raw_predict(raw_decider(columns), n))
    forest = dataclasses.replace(model, ensemble="forest")  # the same trees, summed as a forest
    assert np.array_equal(forest.finish(got), forest.raw_predict(raw_decider(columns), n))
    # a party deciding its own nodes as rows reach them: its columns are never read
    owner = joined.blocks[0].owner
    others = _goes_left(model, columns)
    mine = np.array([n.owner == owner for n in flat.internal])
    assert mine.any() and not mine.all()
    others[:, mine] = ~others[:, mine]  # wrong on purpose
    leaves = route(flat, others, OwnSplits.of(flat, owner), columns[owner])
    assert np.array_equal(margins(model, flat, leaves), got)


def _depths(model: Model) -> list[int]:
    depths = []
    for tree in model.trees:
        level = {tree.nodes[0].id: 0}
        for node in tree.nodes:
            if not node.is_leaf:
                level[node.left] = level[node.right] = level[node.id] + 1
        depths.append(max(level.values()))
    return depths


def test_a_table_of_decisions_equals_one_decision_at_a_time() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4))
    x[rng.random(x.shape) < 0.2] = np.nan
    features = np.array([0, 3, 3, 1], dtype=np.int64)
    thresholds = np.array([0.0, -0.5, 0.7, 1.2])
    missing_left = np.array([True, False, True, False])
    table = goes_left_table(x, features, thresholds, missing_left)
    for r in range(4):
        assert np.array_equal(table[r], goes_left_raw(x[:, features[r]], thresholds[r],
                                                      bool(missing_left[r])))
