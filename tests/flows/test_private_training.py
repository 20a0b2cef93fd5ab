"""Differential privacy end to end, with real worker processes on the embedded default
(``boosting.privacy``, docs/privacy.md):

- horizontal: the members' model is exactly the one the core's private grower releases on the
  union of their rows with the same draws (rows dealt by each member from its own secret, the
  aggregator's noise per tree), so the protocol applies the documented mechanisms and nothing
  else; ``epsilon_spent`` is the documented composition;
- vertical SecureBoost: the active party grows full private trees and reports the same
  accounting; the model scores its rows; a tree dealt no rows is grown as the core's private
  grower grows it (the same model, tree for tree).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from boosting.fixedpoint import quantize
from boosting.grow import TreeGrower
from boosting.losses import base_score, gradients
from boosting.params import BoostParams
from boosting.privacy import (PrivacyPlan, PrivateTree, clip_gradients, split_candidates,
                              tree_rng)
from boosting.train import allowed_blocks, bin_block, grow_tree
from boosting.tree import load_model, node_values
from fedboost import embedded
from fedboost.joined import join_parties, pool_members
from flows import run_charts
from tests.flows.test_horizontal import assert_same_tree, member_draws, members_model, params_of
from tests.scenarios import (active_draws, assert_same_trees, centralized_view, config_with,
                             federated_view, fixed_checkpoint_keys, horizontal_config)
from workers.data import load_party_data
from workers.horizontal.draws import floored_plan, private_rows
from workers.vertical.draws import dealt_rows

KEY_BYTE = 1
"""The active party's checkpoint key (the byte, 32 times) whose dealing leaves tree 3 of the
empty-tree test no rows."""

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_horizontal_private_model_is_the_cores_private_model(tmp_path: Path) -> None:
    """breast, two members, 6 trees in ensembles of 3, epsilon 8 with a fixed seed: the count
    floors (a split's children go deeper if both pass about 27 rows) close some splits and keep
    others; every tree expects more than the root floor of each member's rows (the members'
    root decisions are ``tests/workers/horizontal/test_draws.py``'s)."""
    config = horizontal_config(
        "homo-breast-dp", "breast",
        params={"n_trees": 6, "max_depth": 3, "learning_rate": 0.5, "reg_lambda": 10.0,
                "max_bin": 8, "seed": 3},
        # a clip below the logistic loss's bound 1: the members' clipping shows in the model
        privacy={"epsilon": 8.0, "clip": 0.3, "trees_per_ensemble": 3, "seed": 11})

    result = embedded.train_embedded(config, tmp_path)

    # two ensembles of three trees: each spends epsilon / 2, its trees in parallel
    assert result["epsilon"] == 8.0 and result["epsilon_spent"] == 8.0
    assert result["trees_per_ensemble"] == 3
    assert [h["epsilon_spent"] for h in result["history"]] == [4.0] * 3 + [8.0] * 3
    # the learning curves carry the budget; the report draws what was spent after each tree
    assert all("epsilon 8, spent 8, 3 trees per ensemble" in svg
               for svg in run_charts.learning_curves(result["history"], result).values())
    assert "privacy budget spent after each tree" in run_charts.epsilon_chart(result["history"])
    model = members_model(tmp_path, config.members)
    params = params_of(config)
    plan = floored_plan(PrivacyPlan(8.0, 6, 3, 3, 0.3, params.reg_lambda, params.learning_rate),
                        params)
    pooled = pool_members(config)
    rows = bin_block(pooled.block, params.max_bin, pooled.cuts)
    sizes = [load_party_data(m, str(config.parties[m].data), "id", "y",
                             require_label=True).x.shape[0] for m in config.members]
    draws = [member_draws(tmp_path, config, m) for m in config.members]
    margin = np.full((pooled.y.size, 1), base_score("binary", pooled.y, 2)[0])
    candidates = split_candidates([len(c) for c in pooled.cuts], params.max_bin)
    union_counts = np.stack([np.bincount(rows.bins[:, j], minlength=params.max_bin + 1)
                             for j in range(rows.bins.shape[1])])  # the set-up's, per bin
    roomy_trees = 0
    for t in range(6):
        roomy_mask = plan.roomy(t, candidates, union_counts)  # as the aggregator draws it
        roomy = None if roomy_mask is None else {0: roomy_mask}
        roomy_trees += roomy_mask is not None and roomy_mask.sum() < candidates.sum()
        # each member's rows of tree t, dealt and floored from its own secret (as it does)
        own = [private_rows(d, plan, t, np.ones(n, dtype=bool)) for d, n in zip(draws, sizes)]
        in_tree = np.concatenate(own)
        g = gradients("binary", margin, pooled.y)[0][:, 0]
        grower = TreeGrower(params, quantize(np.where(in_tree, clip_gradients(g, 0.3), 0.0),
                                             g.size),
                            quantize(np.ones(g.size), g.size), in_tree, 1,
                            PrivateTree(plan, t, {0: candidates}, tree_rng(11, t, 0), roomy))
        expected = grow_tree(params, grower, [rows], [0], 0)
        assert_same_tree(model.trees[t], expected, f"tree {t}")
        margin[:, 0] += node_values(expected)[grower.node_of_row]
    # the floors acted both ways: the comparison covers closed and open splits, and trees
    # whose upper levels drew among the roomy candidates only
    sizes_of_trees = sorted(len(tree.nodes) for tree in model.trees)
    assert sizes_of_trees[0] < 15 and sizes_of_trees[-1] > 3, sizes_of_trees
    assert roomy_trees > 0


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


def test_vertical_private_tree_of_no_rows_is_the_cores(tmp_path: Path) -> None:
    """breast, one ensemble of 4 trees with eta 0.9: the shares 0.9, 0.09, 0.009, 0.0009 of
    the 398 training rows deal tree 3 none (params.seed 0: 348 / 44 / 6 / 0 rows). The passive
    party takes its gradients in 0 chunks, its histograms are empty, and the active party
    draws a full tree among equal gains and gives its leaves the noise of empty leaves. The
    active party deals its rows from its own secret (``workers.vertical.draws``): a fixed
    checkpoint key makes the dealing known before the run."""
    config = config_with("breast.yaml", params={"n_trees": 4, "max_depth": 2,
                                                "learning_rate": 0.9, "reg_lambda": 5.0,
                                                "max_bin": 8},
                         crypto={"key_bits": 1024},
                         privacy={"epsilon": 4.0, "clip": 0.3, "trees_per_ensemble": 4,
                                  "seed": 7})
    joined = join_parties(config)
    blocks, y = joined.part(valid=False)
    params = BoostParams.from_dict(config.params.model_dump(exclude={"early_stopping_rounds"}))
    plan = PrivacyPlan(4.0, 4, 2, 4, 0.3, params.reg_lambda, params.learning_rate)
    fixed_checkpoint_keys(tmp_path, list(config.parties), KEY_BYTE)
    dealt = dealt_rows(active_draws(tmp_path, config), plan, 0, y.size)
    assert np.bincount(dealt, minlength=4)[3] == 0, "the test needs a tree of no rows"

    result = embedded.train_embedded(config, tmp_path)

    assert result["epsilon"] == 4.0 and result["epsilon_spent"] == 4.0
    assert [h["epsilon_spent"] for h in result["history"]] == [4.0] * 4
    model = load_model(tmp_path / config.active / "model.json")
    assert all(len(tree.nodes) == 7 for tree in model.trees), "a private tree is always full"
    # the core's private grower on the joined rows, with the active party's dealing and noise
    binned = [bin_block(block, params.max_bin) for block in blocks]
    candidates = {0: split_candidates([len(c) for c in binned[0].cuts], params.max_bin)}
    margin = np.full((y.size, 1), base_score("binary", y, 2)[0])
    trees = []
    for t in range(4):
        g = clip_gradients(gradients("binary", margin, y)[0][:, 0], 0.3)
        grower = TreeGrower(params, quantize(g, y.size), quantize(np.ones(y.size), y.size),
                            dealt == t, len(binned), PrivateTree(plan, t, candidates,
                                                                 tree_rng(7, t)))
        trees.append(grow_tree(params, grower, binned, allowed_blocks(params, t, 2, 1), 0))
        margin[:, 0] += node_values(trees[-1])[grower.node_of_row]
    assert_same_trees(federated_view(tmp_path, config),
                      centralized_view(replace(model, trees=tuple(trees))))
