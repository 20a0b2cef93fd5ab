"""``early_stopping_rounds``: vertical SecureBoost (and Completely SecureBoost, multiclass)
stops once the first validation metric has not improved for that many rounds, every party
keeps the trees up to the best round, ``metrics.json`` says where, the centralized reference
stops at the same round with the same trees, and ``fedboost resume`` has nothing to do.

Real workers (the embedded default), real Paillier keys (1024 bits), real data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from boosting.tree import load_model
from fedboost import api
from fedboost.cli import main
from flows.config import ConfigError, validate_job
from flows.early_stopping import stop_point
from tests.conftest import DATA


def _job(name: str, data: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"job": name, "protocol": "vertical_secureboost", "parties": {
        "guest": {"role": "active", "data": str(DATA / f"{data}_hetero_guest.csv"), "id": "id",
                  "label": "y"},
        "host": {"role": "passive", "data": str(DATA / f"{data}_hetero_host.csv"), "id": "id"}},
        "params": {"max_depth": 3, "learning_rate": 0.3, "max_bin": 16, "seed": 0, **params},
        "crypto": {"key_bits": 1024}, "validation": {"fraction": 0.3, "seed": 0},
        "transport": {"kind": "memory"}}


def test_the_stopping_rule_is_xgboosts() -> None:
    auc = [0.90, 0.93, 0.93, 0.92, 0.925]  # equal is no improvement
    assert stop_point("valid_auc", auc, 3).stop and stop_point("valid_auc", auc, 3) \
        .best_iteration == 1
    assert not stop_point("valid_auc", auc[:4], 3).stop
    rmse = [3.0, 2.0, 2.5, float("nan"), 1.9]
    point = stop_point("valid_rmse", rmse, 2)
    assert (point.best_iteration, point.best_score, point.stop) == (4, 1.9, False)


@pytest.mark.parametrize("protocol,why", [
    ("horizontal", "hold out no validation rows"), ("simfl", "hold out no validation rows"),
    ("vertical_random_forest", "a forest's trees are independent")])
def test_protocols_without_a_validation_set_refuse_the_key_saying_why(protocol: str,
                                                                      why: str) -> None:
    raw: dict[str, Any] = {"job": "j", "protocol": protocol,
                           "parties": {"a": {"role": "member", "data": "a.csv", "id": "id",
                                             "label": "y"},
                                       "b": {"role": "member", "data": "b.csv", "id": "id",
                                             "label": "y"},
                                       "agg": {"role": "aggregator"}},
                           "params": {"early_stopping_rounds": 3}}
    if protocol == "vertical_random_forest":
        raw = _job("j", "breast", {"early_stopping_rounds": 3})
        raw["protocol"] = protocol
        del raw["params"]["learning_rate"]
    with pytest.raises(ConfigError, match=f"early_stopping_rounds: not available in this "
                                          f"protocol: .*{why}"):
        validate_job(raw, "job.yaml")
    no_rows = _job("j", "breast", {"early_stopping_rounds": 3})
    no_rows["validation"]["fraction"] = 0.0
    with pytest.raises(ConfigError, match="early_stopping_rounds stops on validation rows"):
        validate_job(no_rows, "job.yaml")


def _same_trees(federated: Any, central: Any) -> None:
    assert len(federated.trees) == len(central.trees)
    for k, (got, want) in enumerate(zip(federated.trees, central.trees, strict=True)):
        assert [n.is_leaf for n in got.nodes] == [n.is_leaf for n in want.nodes], k
        np.testing.assert_allclose([n.value for n in got.nodes], [n.value for n in want.nodes],
                                   rtol=0, atol=1e-6, err_msg=f"tree {k}")


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("data,params,outputs", [
    ("breast", {"n_trees": 40, "objective": "binary", "early_stopping_rounds": 3}, 1),
    # up to 120 trees with a validation walk per round: the longest drill, out of CI
    pytest.param("vehicle_scale", {"n_trees": 30, "objective": "multiclass",
                                   "complete_secure": True, "early_stopping_rounds": 2}, 4,
                 marks=pytest.mark.heavy),
])
def test_training_stops_at_the_best_round_and_every_party_keeps_it(
        data: str, params: dict[str, Any], outputs: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    job = _job(f"es-{data.split('_')[0]}", data, params)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "job.yaml"), "--out", str(run), "--quiet"]) == 0
    said = capsys.readouterr().out
    metrics = json.loads((run / "metrics.json").read_text())
    rounds = params["early_stopping_rounds"]
    best, grown = metrics["best_iteration"], len(metrics["trees"])
    print(f"{data}: stopped after {grown} of {params['n_trees'] * outputs} trees, best round "
          f"{best} ({metrics['best_metric']}={metrics['best_score']:.4f})")
    assert metrics["stopped_early"] is True and said.startswith("stopped early after")
    assert grown == (best + 1 + rounds) * outputs < params["n_trees"] * outputs
    assert metrics["n_trees"] == (best + 1) * outputs
    metric = metrics["best_metric"]
    assert metric == ("valid_auc" if outputs == 1 else "valid_accuracy")
    curve = [t[metric] for t in metrics["trees"]][outputs - 1::outputs]
    assert metrics["best_score"] == curve[best] == metrics[metric] == max(curve)
    assert curve.index(max(curve)) == best  # the first best round, as XGBoost keeps it

    # every party's part is the kept model: the active party's trees, the passive's records
    model = load_model(run / "guest" / "model.json")
    assert len(model.trees) == metrics["n_trees"]
    lookup = json.loads((run / "host" / "lookup.json").read_text())["records"]
    assert lookup and all(r["tree"] < metrics["n_trees"] for r in lookup.values())
    used = {n.record_id for t in model.trees for n in t.nodes if n.owner == "host"}
    assert used == {int(k) for k in lookup}
    assert main(["predict", str(run), "--out", str(tmp_path / "scores.csv")]) == 0

    # lossless: the centralized reference stops at the same round with the same trees
    central = api.centralized(tmp_path / "job.yaml", tmp_path / "central")
    assert (central.metrics["best_iteration"], len(central.metrics["trees"])) == (best, grown)
    assert central.metrics[metric] == pytest.approx(metrics[metric], abs=1e-9)
    _same_trees(model, load_model(tmp_path / "central" / "model.json"))

    # nothing to resume; the report marks the stopping point
    before = (run / "metrics.json").read_bytes()
    capsys.readouterr()
    assert main(["resume", job["job"], "--out", str(run), "--quiet"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.count("\n") == 0 and "stopped early" in line and "nothing to resume" in line
    assert (run / "metrics.json").read_bytes() == before
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert f"best round {best} ({metrics['n_trees']} trees kept); stopped after {grown} " \
           f"trees" in page
