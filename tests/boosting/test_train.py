"""The centralized core against XGBoost hist on the shipped data (the reference numbers)."""

from __future__ import annotations

import numpy as np
import pytest
import xgboost as xgb

from boosting.params import BoostParams
from boosting.train import predict_blocks, train
from boosting.metrics import auc, rmse
from tests.scenarios import config_with, train_centralized


def _xgb(x: np.ndarray, y: np.ndarray, objective: str, **extra: object) -> xgb.Booster:
    params = {"max_depth": 3, "eta": 0.3, "max_bin": 32, "objective": objective,
              "tree_method": "hist", "lambda": 1.0, "min_child_weight": 1.0, "nthread": 2, **extra}
    return xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=30)


def test_default_credit_auc_matches_xgboost() -> None:
    config = config_with("default_credit.yaml")
    model, joined = train_centralized(config)
    ours = auc(joined.y, predict_blocks(model, joined.blocks)[:, 0])
    x = np.hstack([b.x for b in joined.blocks])
    theirs = auc(joined.y, _xgb(x, joined.y, "binary:logistic").predict(xgb.DMatrix(x)))
    assert abs(ours - theirs) < 0.005, (ours, theirs)
    assert ours == pytest.approx(0.7957, abs=0.005)


def test_default_credit_holdout_auc() -> None:
    config = config_with("default_credit.yaml", validation={"fraction": 0.333, "seed": 0})
    model, joined = train_centralized(config)
    blocks, y = joined.part(valid=True)
    assert auc(y, predict_blocks(model, blocks)[:, 0]) >= 0.77


def test_student_regression_close_to_xgboost() -> None:
    config = config_with("student.yaml", params={"n_trees": 30}, validation={"fraction": 0.0})
    model, joined = train_centralized(config)
    x = np.hstack([b.x for b in joined.blocks])
    ours = rmse(joined.y, predict_blocks(model, joined.blocks)[:, 0])
    theirs = rmse(joined.y, _xgb(x, joined.y, "reg:squarederror").predict(xgb.DMatrix(x)))
    assert ours < theirs * 1.15, (ours, theirs)


def test_params_round_trip_and_reject_unknown() -> None:
    params = BoostParams(n_trees=5, objective="multiclass")
    assert BoostParams.from_dict(params.to_dict()) == params
    with pytest.raises(ValueError, match="unknown parameter"):
        BoostParams.from_dict({"n_tree": 5})
    with pytest.raises(ValueError, match="max_bin"):
        BoostParams(max_bin=1000)


def test_single_class_labels_are_rejected() -> None:
    from boosting.train import FeatureBlock

    with pytest.raises(ValueError, match="single class"):
        train(BoostParams(n_trees=1), [FeatureBlock("a", ("x",), np.zeros((5, 1)))], np.zeros(5))
