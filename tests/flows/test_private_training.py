"""Differential privacy end to end, with real worker processes on the embedded default
(``boosting.privacy``, docs/privacy.md):

- horizontal: the members' model is exactly the one the core's private grower releases on the
  union of their rows with the same seeds (rows dealt per member, the aggregator's noise per
  tree), so the protocol applies the documented mechanisms and nothing else; ``epsilon_spent``
  is the documented composition;
- vertical SecureBoost: the active party grows full private trees and reports the same
  accounting; the model scores its rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from boosting.fixedpoint import quantize
from boosting.grow import TreeGrower
from boosting.losses import base_score, gradients
from boosting.privacy import (PrivacyPlan, PrivateTree, clip_gradients, deal_rows,
                              split_candidates, tree_rng)
from boosting.train import bin_block, grow_tree
from boosting.tree import load_model, node_values
from fedboost import embedded
from fedboost.joined import pool_members
from flows import run_charts
from tests.flows.test_horizontal import assert_same_tree, members_model, params_of
from tests.scenarios import config_with, horizontal_config
from workers.data import load_party_data

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_horizontal_private_model_is_the_cores_private_model(tmp_path: Path) -> None:
    """breast, two members, 6 trees in ensembles of 3, epsilon 2 with a fixed seed."""
    config = horizontal_config(
        "homo-breast-dp", "breast",
        params={"n_trees": 6, "max_depth": 2, "learning_rate": 0.5, "reg_lambda": 10.0,
                "max_bin": 8, "seed": 3},
        # a clip below the logistic loss's bound 1: the members' clipping shows in the model
        privacy={"epsilon": 2.0, "clip": 0.3, "trees_per_ensemble": 3, "seed": 11})

    result = embedded.train_embedded(config, tmp_path)

    # two ensembles of three trees: each spends epsilon / 2, its trees in parallel
    assert result["epsilon"] == 2.0 and result["epsilon_spent"] == 2.0
    assert result["trees_per_ensemble"] == 3
    assert [h["epsilon_spent"] for h in result["history"]] == [1.0] * 3 + [2.0] * 3
    # the learning curves carry the budget; the report draws what was spent after each tree
    assert all("epsilon 2, spent 2, 3 trees per ensemble" in svg
               for svg in run_charts.learning_curves(result["history"], result).values())
    assert "privacy budget spent after each tree" in run_charts.epsilon_chart(result["history"])
    model = members_model(tmp_path, config.members)
    assert all(len(tree.nodes) == 7 for tree in model.trees), "a private tree is always full"
    params = params_of(config)
    plan = PrivacyPlan(2.0, 6, 2, 3, 0.3, params.reg_lambda, params.learning_rate)
    pooled = pool_members(config)
    rows = bin_block(pooled.block, params.max_bin, pooled.cuts)
    sizes = [load_party_data(m, str(config.parties[m].data), "id", "y",
                             require_label=True).x.shape[0] for m in config.members]
    margin = np.full((pooled.y.size, 1), base_score("binary", pooled.y, 2)[0])
    candidates = split_candidates([len(c) for c in pooled.cuts], params.max_bin)
    for t in range(6):
        ensemble, position = plan.ensemble_of(t)
        dealt = np.concatenate([deal_rows(plan, ensemble, n,
                                          np.random.default_rng([params.seed, k, ensemble]))
                                for k, n in enumerate(sizes)])
        g = gradients("binary", margin, pooled.y)[0][:, 0]
        in_tree = dealt == position
        grower = TreeGrower(params, quantize(np.where(in_tree, clip_gradients(g, 0.3), 0.0),
                                             g.size),
                            quantize(np.ones(g.size), g.size), in_tree, 1,
                            PrivateTree(plan, t, {0: candidates}, tree_rng(11, t, 0)))
        expected = grow_tree(params, grower, [rows], [0], 0)
        assert_same_tree(model.trees[t], expected, f"tree {t}")
        margin[:, 0] += node_values(expected)[grower.node_of_row]


@pytest.mark.heavy  # Paillier training with full-depth private trees: 'make test-all'
def test_vertical_private_training_reports_the_composition_and_scores(tmp_path: Path) -> None:
    """breast (guest labels, host features), 4 trees in ensembles of 2, epsilon 8."""
    config = config_with("breast.yaml", params={"n_trees": 4, "max_depth": 2,
                                                "learning_rate": 0.5, "reg_lambda": 5.0,
                                                "max_bin": 8},
                         crypto={"key_bits": 1024},
                         privacy={"epsilon": 8.0, "trees_per_ensemble": 2, "seed": 5})

    result = embedded.train_embedded(config, tmp_path)

    assert result["epsilon"] == 8.0 and result["epsilon_spent"] == 8.0
    assert result["trees_per_ensemble"] == 2
    model = load_model(tmp_path / "guest" / "model.json")
    assert len(model.trees) == 4
    assert all(len(tree.nodes) == 7 for tree in model.trees), "a private tree is always full"
    owners = {n.owner for tree in model.trees for n in tree.nodes if not n.is_leaf}
    assert owners <= {"guest", "host"}
    assert result["valid_auc"] > 0.6, result  # the flow's federated scoring of held-out rows
