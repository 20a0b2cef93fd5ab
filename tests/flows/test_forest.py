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

from benchmarks.forest_data import forest_job, write_vertical_adult
from boosting.binning import apply_cuts, fit_cuts
from boosting.tree import load_model
from fedboost.embedded import train_embedded
from fedboost.joined import join_parties
from flows.config import ForestJobConfig, parse_config, validate_job
from tests.scenarios import REPO

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
    for party in ("guest", "host"):  # the trees kept for recoveries go once the forest is saved
        assert not (tmp_path / party / "forest").exists()


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
