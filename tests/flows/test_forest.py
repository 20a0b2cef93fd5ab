"""The vertical random forest (seed 002) end to end on the embedded default: quality against
scikit-learn's forest on the joined, identically binned data, Adult over three parties, what a
passive party's lookup table holds, and scoring the saved forest."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import roc_auc_score

import fedboost
from benchmarks.forest_data import forest_job, write_vertical_adult
from boosting.binning import apply_cuts, fit_cuts, goes_left_raw
from boosting.tree import TreeNode, load_model
from fedboost.embedded import train_embedded
from fedboost.joined import join_parties
from flows.config import ForestJobConfig, parse_config, validate_job
from tests.scenarios import REPO
from workers.column_partitioned.lookup import lookup_from_dict, records_go_left

pytestmark = pytest.mark.usefixtures("prefect_harness")

SETTING = {"n_trees": 12, "max_depth": 6, "max_features": "sqrt", "min_samples_leaf": 5,
           "max_bin": 32, "objective": "binary", "bootstrap": True, "seed": 0}


def _default_credit_forest(**params: object) -> ForestJobConfig:
    raw = yaml.safe_load((REPO / "configs" / "default_credit_forest.yaml").read_text())
    raw["params"] = {**SETTING, **params}
    raw["crypto"] = {"key_bits": 1024}
    config = parse_config(raw, base=REPO / "configs", source="default_credit_forest.yaml")
    assert isinstance(config, ForestJobConfig)
    return config


def _sklearn_auc(config: ForestJobConfig) -> float:
    """scikit-learn's forest on the joined data binned as the parties bin it (cuts fitted on
    the training rows), same trees, depth, features per node and leaf size."""
    joined = join_parties(config)
    (train, y_train), (test, y_test) = joined.part(valid=False), joined.part(valid=True)
    x_train = np.hstack([b.x for b in train])
    x_test = np.hstack([b.x for b in test])
    cuts = fit_cuts(x_train, config.params.max_bin)
    forest = RandomForestClassifier(
        n_estimators=config.params.n_trees, max_depth=config.params.max_depth,
        max_features=config.params.max_features, min_samples_leaf=config.params.min_samples_leaf,
        bootstrap=True, random_state=0, n_jobs=1)
    forest.fit(apply_cuts(x_train, cuts, config.params.max_bin), y_train)
    score = forest.predict_proba(apply_cuts(x_test, cuts, config.params.max_bin))[:, 1]
    return float(roc_auc_score(y_test, score))


@pytest.mark.heavy
def test_forest_matches_scikit_learn_on_default_credit(tmp_path: Path) -> None:
    config = _default_credit_forest()
    result = train_embedded(config, tmp_path)
    theirs = _sklearn_auc(config)
    print(f"default_credit, 1/3 held out: federated forest AUC {result['valid_auc']:.4f}, "
          f"scikit-learn {theirs:.4f}")
    assert result["n_trees"] == SETTING["n_trees"] and result["dropped"] == 0
    assert abs(result["valid_auc"] - theirs) <= 0.01
    model = load_model(tmp_path / "guest" / "model.json")
    assert model.ensemble == "forest" and len(model.trees) == SETTING["n_trees"]
    assert max(len(t.nodes) for t in model.trees) > 15  # deeper than a stump
    # the lender's part shows the data provider's splits only as records
    host_nodes = [n for t in model.trees for n in t.nodes if n.owner == "host"]
    assert host_nodes and all(n.feature == -1 and np.isnan(n.threshold) for n in host_nodes)
    lookup = json.loads((tmp_path / "host" / "lookup.json").read_text())
    flips = [r["flip"] for r in lookup["records"].values()]
    assert {n.record_id for n in host_nodes} == {int(k) for k in lookup["records"]}
    assert 0 < sum(flips) < len(flips)  # children shown in random order
    shown = fedboost.inspect(tmp_path, "host").text()  # the owner sees which ones
    assert shown.count("children shown swapped") == sum(flips)
    for party in ("guest", "host"):  # the trees kept for recoveries go once the forest is saved
        assert not (tmp_path / party / "forest").exists()


@pytest.mark.heavy
def test_adult_over_three_parties_reaches_the_papers_auc(tmp_path: Path) -> None:
    files = write_vertical_adult(tmp_path / "data")
    raw = forest_job(files, job="adult-forest-test", n_trees=16)
    raw["crypto"] = {"key_bits": 1024}
    config = validate_job(raw, "adult forest")
    result = train_embedded(config, tmp_path / "run")
    print(f"Adult (a9a encoding), guest + bureau + telco: valid AUC {result['valid_auc']:.4f}")
    assert result["valid_auc"] >= 0.89
    assert {p: (tmp_path / "run" / p).is_dir() for p in ("guest", "bureau", "telco")} == \
        {"guest": True, "bureau": True, "telco": True}


def test_saved_forest_scores_as_validation_did(tmp_path: Path) -> None:
    """``fedboost predict``'s path-mode scoring of the saved forest gives the validation AUC."""
    from fedboost.cli import main

    config = _default_credit_forest(n_trees=4, max_depth=4)
    result = train_embedded(config, tmp_path)
    (tmp_path / "job.json").write_text(json.dumps(config.model_dump(mode="json")))
    assert main(["predict", str(tmp_path), "--out", str(tmp_path / "scores.csv")]) == 0
    with (tmp_path / "scores.csv").open() as handle:
        scores = {row["id"]: float(row["score"]) for row in csv.DictReader(handle)}
    joined = join_parties(config)
    valid_ids = [i for i, v in zip(joined.ids, joined.valid) if v]
    y = joined.y[joined.valid]
    assert roc_auc_score(y, [scores[i] for i in valid_ids]) == pytest.approx(
        result["valid_auc"], abs=1e-9)
    assert all(0.0 <= s <= 1.0 for s in scores.values())


def _federated_predict(run_dir: Path, config: ForestJobConfig) -> tuple[np.ndarray, np.ndarray]:
    """The saved forest's predictions of the validation rows, traversed here with both parts
    (the lender's model and the provider's lookup table), and the rows' labels."""
    model = load_model(run_dir / config.active / "model.json")
    (passive,) = config.passives
    _, records = lookup_from_dict(json.loads((run_dir / passive / "lookup.json").read_text()))
    joined = join_parties(config)
    blocks, y = joined.part(valid=True)
    x = {b.owner: b.x for b in blocks}

    def decide(node: TreeNode, rows: np.ndarray) -> np.ndarray:
        if node.owner == config.active:
            return goes_left_raw(x[node.owner][rows, node.feature], node.threshold,
                                 node.missing_left)
        return records_go_left(x[node.owner][rows], [records[node.record_id]])[0]

    return model.predict(decide, y.size), y


@pytest.mark.parametrize("name, scheme", [("default_credit_forest", "paillier"),
                                          ("vehicle", "paillier"), ("student", "paillier"),
                                          ("vehicle", "ou")])
def test_one_tree_without_sampling_is_the_exact_cart_tree(name: str, scheme: str,
                                                          tmp_path: Path) -> None:
    """With all features at every node and no bootstrap, a one-tree forest is a CART tree:
    the same predictions as scikit-learn's DecisionTree on the identically binned joined data
    (Gini for binary and multiclass, squared error for regression), under either scheme."""
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    raw = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    objective = {"default_credit_forest": "binary", "vehicle": "multiclass",
                 "student": "regression"}[name]
    raw.update(protocol="vertical_random_forest", job=f"cart-{name.replace('_', '-')}",
               crypto={"key_bits": 1024, "scheme": scheme})
    raw["params"] = {"n_trees": 1, "max_depth": 5, "max_features": 1.0, "bootstrap": False,
                     "min_samples_leaf": 3, "objective": objective}
    config = parse_config(raw, base=REPO / "configs", source=name)
    assert isinstance(config, ForestJobConfig)
    train_embedded(config, tmp_path)
    ours, y_valid = _federated_predict(tmp_path, config)
    joined = join_parties(config)
    train_blocks, y_train = joined.part(valid=False)
    valid_blocks, _ = joined.part(valid=True)
    x_train = np.hstack([b.x for b in train_blocks])
    cuts = fit_cuts(x_train, 32)
    tree = (DecisionTreeRegressor if objective == "regression" else DecisionTreeClassifier)(
        max_depth=5, min_samples_leaf=3, random_state=0)
    tree.fit(apply_cuts(x_train, cuts, 32), y_train)
    x_valid = apply_cuts(np.hstack([b.x for b in valid_blocks]), cuts, 32)
    theirs = (tree.predict(x_valid).reshape(-1, 1) if objective == "regression"
              else tree.predict_proba(x_valid))
    if objective == "binary":
        theirs = theirs[:, 1:]
    same = np.isclose(ours, theirs, rtol=1e-6, atol=1e-9).all(axis=1)
    print(f"{name}: {same.mean():.1%} of {same.size} validation rows predicted alike")
    assert same.mean() >= 0.99  # equal gains may be broken in another order
    assert y_valid.size == same.size


def test_complete_secure_keeps_the_first_tree_with_the_lender(tmp_path: Path) -> None:
    config = _default_credit_forest(n_trees=3, max_depth=4, complete_secure=True)
    train_embedded(config, tmp_path)
    model = load_model(tmp_path / "guest" / "model.json")
    owners = [{n.owner for n in t.nodes if not n.is_leaf} for t in model.trees]
    assert owners[0] == {"guest"}  # grown on the lender's features alone
    assert any("host" in o for o in owners[1:])
    lookup = json.loads((tmp_path / "host" / "lookup.json").read_text())
    assert lookup["records"] and all(int(k) // 65_536 != 0 for k in lookup["records"])
