"""Multiclass in the row-partitioned protocols on the embedded default (real worker processes,
the real Prefect ephemeral server), on Statlog vehicle (4 classes) split by rows
(``benchmarks.vehicle_data``).

- horizontal, lossless: the members' model (one tree per class per round) equals the
  centralized core's on the union of their rows with the cuts the federation shares, though
  one member holds no row of the highest class (the classes come from the masked sum);
- SimFL: the members share one model of one tree per class per round, built in turns by
  rounds; its noise and its accounting hold per class;
- ``fedboost predict`` on a member's copy writes each class's probability.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.vehicle_data import prepare
from boosting.params import BoostParams
from boosting.train import predict_blocks, train
from boosting.tree import Model, load_model, raw_decider
from fedboost import embedded
from fedboost.cli import main
from fedboost.joined import pool_members
from flows.config import parse_config
from tests.flows.test_horizontal import assert_same_tree, members_model
from tests.scenarios import CONFIGS
from workers.data import load_party_data
from workers.row_partitioned import OWNER

pytestmark = pytest.mark.usefixtures("prefect_harness")

MEMBERS = ("A", "B")


def member_files(folder: Path, without_class: int | None = None) -> dict[str, Path]:
    """Vehicle's training rows dealt to A and B, the test rows; ``without_class``: B's rows of
    that class go to A, so B holds none of them."""
    files = prepare(folder, parties=2, seed=0)
    if without_class is not None:
        rows = {m: list(csv.reader(files[m].open())) for m in MEMBERS}
        moved = [r for r in rows["B"][1:] if r[1] == str(without_class)]
        kept = [r for r in rows["B"][1:] if r[1] != str(without_class)]
        for member, body in (("A", rows["A"][1:] + moved), ("B", kept)):
            with files[member].open("w", newline="") as handle:
                csv.writer(handle).writerows([rows[member][0], *body])
    return files


def job(name: str, protocol: str, files: dict[str, Path], **params: Any) -> Any:
    raw: dict[str, Any] = {
        "job": name, "protocol": protocol,
        "parties": {**{m: {"role": "member", "data": str(files[m]), "id": "id", "label": "y"}
                       for m in MEMBERS}, "aggregator": {"role": "aggregator"}},
        "params": {"n_trees": 4, "max_depth": 3, "learning_rate": 0.3, "max_bin": 32,
                   "objective": "multiclass", "seed": 0, **params}}
    return parse_config(raw, base=CONFIGS, source=name)


def scored(run: Path, member: str, test: Path, out: Path) -> np.ndarray:
    """``fedboost predict RUN/MEMBER --data TEST`` (the member's own copy, as a worker keeps
    it): the label and each class's probability."""
    assert main(["predict", str(run / member), "--data", str(test), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "id,label,score_0,score_1,score_2,score_3"
    return np.array([[float(v) for v in line.split(",")[1:]] for line in lines[1:]])


def test_horizontal_vehicle_multiclass_is_lossless_and_predict_writes_every_class(
        tmp_path: Path) -> None:
    """4 rounds of 4 trees; B holds no class-3 row, so neither member alone has the union's
    classes: the aggregator learns them from the masked rows per class."""
    files = member_files(tmp_path / "data", without_class=3)
    b_labels = load_party_data("B", files["B"], "id", "y", require_label=True).y
    assert b_labels is not None and b_labels.max() == 2
    config = job("homo-vehicle-lossless", "horizontal", files)
    result = embedded.train_embedded(config, tmp_path / "run")
    assert result["n_trees"] == 16 and result["dropped"] == []
    model = members_model(tmp_path / "run", list(MEMBERS))
    pooled = pool_members(config)
    reference = train(BoostParams.from_dict(config.params.model_dump()), [pooled.block],
                      pooled.y, cuts=[pooled.cuts])
    assert model.n_classes == reference.n_classes == 4
    assert model.base_score == reference.base_score == (0.0,) * 4
    assert len(model.trees) == len(reference.trees) == 16
    assert [t.output for t in model.trees] == [t.output for t in reference.trees] == \
        [0, 1, 2, 3] * 4
    for t, (got, expected) in enumerate(zip(model.trees, reference.trees)):
        assert_same_tree(got, expected, f"tree {t} (class {t % 4})")
    n = len(pooled.ids)
    union = predict_blocks(reference, [pooled.block])
    np.testing.assert_allclose(model.predict(raw_decider({OWNER: pooled.block.x}), n), union,
                               rtol=0, atol=1e-6)
    # the members' training accuracy (row-weighted) is the union's
    assert result["train_accuracy"] == pytest.approx(
        float(np.mean(np.argmax(union, axis=1) == pooled.y)), abs=1e-12)
    test = load_party_data("test", files["test"], "id", "y", require_label=True)
    got = scored(tmp_path / "run", "B", files["test"], tmp_path / "scores.csv")
    expected = model.predict(raw_decider({OWNER: test.x}), len(test.ids))
    np.testing.assert_allclose(got[:, 1:], expected, rtol=0, atol=1e-12)
    assert np.array_equal(got[:, 0], np.argmax(expected, axis=1))
    np.testing.assert_allclose(got[:, 1:].sum(axis=1), 1.0, atol=1e-12)


def test_simfl_vehicle_multiclass_builds_a_round_per_builder_and_scores_every_class(
        tmp_path: Path) -> None:
    """3 rounds of 4 trees: A builds round 0 (trees 0-3), B round 1, A round 2; both members
    keep the same model; the privacy accounting counts per class."""
    files = member_files(tmp_path / "data")
    config = job("simfl-vehicle", "simfl", files, n_trees=3)
    result = embedded.train_embedded(config, tmp_path / "run")
    assert result["n_trees"] == 12
    assert [h["builder"] for h in result["history"]] == ["A"] * 4 + ["B"] * 4 + ["A"] * 4
    models = [load_model(tmp_path / "run" / m / "model.json") for m in MEMBERS]
    assert models[0] == models[1]
    model: Model = models[0]
    assert model.n_classes == 4 and model.base_score == (0.0,) * 4
    assert [t.output for t in model.trees] == [0, 1, 2, 3] * 3
    assert all(len(t.nodes) > 1 for t in model.trees), "a class's tree without a split"
    privacy = result["privacy"]
    assert privacy["trees_sent"] == {"A": 4, "B": 8}  # B sends A rounds 0 and 2
    noise = config.params.privacy
    rho = 2 * 2 / (2 * (noise.tree_noise ** 2 + 2 * noise.label_noise ** 2))  # 2 classes
    assert privacy["label_epsilon"]["B"] == pytest.approx(
        rho + 2 * np.sqrt(rho * np.log(1 / noise.delta)))
    test = load_party_data("test", files["test"], "id", "y", require_label=True)
    got = scored(tmp_path / "run", "A", files["test"], tmp_path / "scores.csv")
    np.testing.assert_allclose(got[:, 1:], model.predict(raw_decider({OWNER: test.x}),
                                                         len(test.ids)), rtol=0, atol=1e-12)
    assert np.mean(got[:, 0] == test.y) > 0.6  # four classes: chance is about 0.26
