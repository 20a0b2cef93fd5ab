"""Quality of the federated model on default_credit (the SecureBoost paper's Credit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedboost.embedded import train_embedded
from tests.scenarios import config_with

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]


@pytest.mark.heavy
def test_default_credit_holdout(tmp_path: Path) -> None:
    """30 trees, depth 3, 32 bins, 1/3 held out: the paper reports 0.7701, XGBoost 0.7725."""
    config = config_with("default_credit.yaml", crypto={"key_bits": 1024},
                         validation={"fraction": 0.333, "seed": 0})
    result = train_embedded(config, tmp_path)
    assert result["n_trees"] == 30 and result["n_valid"] == 9990
    assert result["valid_auc"] >= 0.77, result["valid_auc"]
    assert len(result["tree_seconds"]) == 30
