"""Lossless under Okamoto-Uchiyama (``crypto: {scheme: ou}``): the same trees as the centralized
core, and predictions to 1e-6, as under Paillier (tests/flows/test_lossless.py); packing
capacities follow OU's smaller plaintexts (below p, a third of n's bits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedboost.embedded import train_embedded
from messages.transport import MemoryHub
from tests.flows.test_lossless import _check_lossless
from tests.scenarios import (assert_same_trees, centralized_view, config_with, federated_view,
                             train_centralized)

pytestmark = pytest.mark.usefixtures("prefect_harness")

OU = {"scheme": "ou", "key_bits": 1024}


def test_breast_binary_under_ou(tmp_path: Path) -> None:
    result = _check_lossless(config_with("breast.yaml", crypto=OU), tmp_path)
    assert result["n_aligned"] == 569 and result["valid_auc"] > 0.95


def test_student_regression_with_bin_sums_folded_by_the_passive_party_under_ou(
        tmp_path: Path) -> None:
    config = config_with("student.yaml", crypto={**OU, "pack_bin_sums": "passive"})
    result = _check_lossless(config, tmp_path)
    assert result["train_rmse"] < 3.5


@pytest.mark.heavy  # 30,000 rows over three parties (~4 min); breast, student and vehicle keep OU in CI
def test_three_parties_complete_secure_subsample_under_ou(tmp_path: Path) -> None:
    config = config_with("default_credit_three_party.yaml", crypto=OU,
                         params={"n_trees": 2, "complete_secure": True, "subsample": 0.8,
                                 "min_samples_leaf": 20, "gamma": 0.1})
    _check_lossless(config, tmp_path, batch_size=4096)


def test_multiclass_with_a_helper_process_under_ou(tmp_path: Path) -> None:
    """vehicle, 4 classes, the passive party's histograms summed by a helper process (its
    shards name the scheme)."""
    config = config_with("vehicle.yaml", crypto=OU, params={"n_trees": 2})
    hub = MemoryHub(["guest", "host", "flow"], helpers={"host": 1})
    result = train_embedded(config, tmp_path, hub=hub)
    assert result["n_trees"] == 8
    model, _ = train_centralized(config)
    assert_same_trees(federated_view(tmp_path, config), centralized_view(model))
