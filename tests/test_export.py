"""``fedboost export --format xgboost-json``: models trained by fedboost (embedded default, real
workers), read back by the real xgboost package, score as ``fedboost predict`` does.

Agreement is checked at 1e-6 on probabilities. Rows include missing values (the trees'
default directions) and rows placed exactly on, and one float32 step either side of, every
split's threshold.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from boosting.tree import load_model
from fedboost.cli import main
from fedboost.export import split_condition
from tests.conftest import DATA

xgboost = pytest.importorskip("xgboost")  # a test dependency (xgboost-cpu)

pytestmark = pytest.mark.usefixtures("prefect_harness")

AGREEMENT = 1e-6


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as handle:
        table = list(csv.reader(handle))
    return table[0], table[1:]


def _write(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])
    return path


def _with_missing(source: Path, target: Path, share: float, seed: int) -> Path:
    """A copy of ``source`` with about ``share`` of its feature cells blank (missing)."""
    header, rows = _rows(source)
    rng = np.random.default_rng(seed)
    features = [k for k, name in enumerate(header) if name not in ("id", "y")]
    for row in rows:
        for k in features:
            if rng.random() < share:
                row[k] = ""
    return _write(target, header, rows)


def _matrix(path: Path, names: tuple[str, ...]) -> tuple[list[str], np.ndarray]:
    header, rows = _rows(path)
    cols = [header.index(n) for n in names]
    x = np.array([[float(r[k]) if r[k] != "" else np.nan for k in cols] for r in rows])
    return [r[header.index("id")] for r in rows], x


def _scores(path: Path) -> dict[str, list[float]]:
    header, rows = _rows(path)
    first = 2 if header[1] == "label" else 1  # multiclass: id,label,score_0..
    last = len(header) - (header[-1] == "split")  # vertical: train/valid/new last
    return {r[0]: [float(v) for v in r[first:last]] for r in rows}


def _xgboost(model_file: Path, x: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    booster = xgboost.Booster(model_file=str(model_file))
    pred = booster.predict(xgboost.DMatrix(x, feature_names=list(names), missing=np.nan))
    return np.asarray(pred, dtype=np.float64).reshape(x.shape[0], -1)


def _agreement(scores: Path, ids: list[str], theirs: np.ndarray) -> float:
    ours = _scores(scores)
    mine = np.array([ours[i] for i in ids])
    assert mine.shape == theirs.shape
    return float(np.abs(mine - theirs).max())


def _boundary_rows(model_file: Path, names: tuple[str, ...], x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` with, for each split, its feature set exactly to the threshold and to the
    float32 values just below and above it (the values XGBoost's float32 ``<`` must decide
    as fedboost's float64 ``<=`` does)."""
    model = load_model(model_file)
    out = []
    for k, node in enumerate(n for t in model.trees for n in t.nodes if not n.is_leaf):
        if not np.isfinite(node.threshold):
            continue
        t32 = np.float32(node.threshold)
        below = float(np.nextafter(t32, np.float32(-np.inf)))
        above = float(split_condition(node.threshold))
        for value in (node.threshold, below, above):
            row = x[k % x.shape[0]].copy()
            row[node.feature] = value
            out.append(row)
    assert out
    return np.array(out)


def _train(tmp_path: Path, job: dict[str, Any]) -> Path:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "job.yaml"), "--out", str(run), "--quiet"]) == 0
    return run


def _export(run: Path, out: Path, *extra: str) -> int:
    return main(["export", str(run), "--format", "xgboost-json", "--out", str(out), *extra])


def _members(protocol: str, params: dict[str, Any], data: dict[str, Path]) -> dict[str, Any]:
    parties: dict[str, Any] = {m: {"role": "member", "data": str(path), "id": "id",
                                   "label": "y"} for m, path in data.items()}
    parties["aggregator"] = {"role": "aggregator"}
    return {"job": f"export-{protocol}", "protocol": protocol, "parties": parties,
            "params": params, "transport": {"kind": "memory"}}


@pytest.mark.parametrize("protocol", ["horizontal", "simfl"])
def test_a_members_model_scores_in_xgboost_as_in_fedboost(protocol: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    data = {m: _with_missing(DATA / f"breast_homo_{m}.csv", tmp_path / f"{m}.csv", 0.05, k)
            for k, m in enumerate(("guest", "host"))}
    params: dict[str, Any] = {"n_trees": 8, "max_depth": 3, "learning_rate": 0.3,
                              "max_bin": 16, "objective": "binary", "seed": 0}
    if protocol == "simfl":
        params["lsh"] = {"r": 4.0, "seed": 3}
    run = _train(tmp_path, _members(protocol, params, data))
    out = tmp_path / "model.xgb.json"
    capsys.readouterr()
    assert _export(run, out, "--party", "host") == 0
    line = capsys.readouterr().out
    assert f"wrote {out}: 8 trees of party host's model" in line, line

    names = load_model(run / "host" / "model.json").features["members"]
    test = _with_missing(DATA / "breast_homo_test.csv", tmp_path / "test.csv", 0.1, 7)
    ids, x = _matrix(test, names)
    assert np.isnan(x).any()
    scores = tmp_path / "scores.csv"
    assert main(["predict", str(run), "--data", f"host={test}", "--out", str(scores)]) == 0
    diff = _agreement(scores, ids, _xgboost(out, x, names))
    print(f"{protocol}: max |fedboost - xgboost| on {len(ids)} test rows: {diff:.2e}")
    assert diff <= AGREEMENT

    edge = _boundary_rows(run / "host" / "model.json", names, x)
    header = ["id", *names]
    edge_file = _write(tmp_path / "edge.csv", header, [
        [str(k), *("" if np.isnan(v) else repr(float(v)) for v in row)]
        for k, row in enumerate(edge)])
    edge_scores = tmp_path / "edge-scores.csv"
    assert main(["predict", str(run), "--data", f"host={edge_file}",
                 "--out", str(edge_scores)]) == 0
    diff = _agreement(edge_scores, [str(k) for k in range(len(edge))],
                      _xgboost(out, edge, names))
    print(f"{protocol}: max |fedboost - xgboost| on {len(edge)} rows at thresholds: {diff:.2e}")
    assert diff <= AGREEMENT


def _vertical(job: str, guest: Path, host: Path, params: dict[str, Any],
              protocol: str = "vertical_secureboost") -> dict[str, Any]:
    return {"job": job, "protocol": protocol, "parties": {
        "guest": {"role": "active", "data": str(guest), "id": "id", "label": "y"},
        "host": {"role": "passive", "data": str(host), "id": "id"}},
        "params": params, "crypto": {"key_bits": 1024}, "transport": {"kind": "memory"}}


def _constant_host(guest: Path, target: Path) -> Path:
    """A passive party whose one feature is constant: it can win no split, so the active
    party holds the whole model."""
    header, rows = _rows(guest)
    return _write(target, ["id", "c"], [[r[header.index("id")], "1"] for r in rows])


@pytest.mark.parametrize("name,protocol,objective", [
    ("breast", "vertical_secureboost", "binary"),
    ("vehicle_scale", "vertical_secureboost", "multiclass"),
    ("breast", "vertical_random_forest", "binary"),
])
def test_an_active_party_holding_every_split_exports_its_model(
        name: str, protocol: str, objective: str, tmp_path: Path) -> None:
    guest = _with_missing(DATA / f"{name}_hetero_guest.csv", tmp_path / "guest.csv", 0.05, 1)
    host = _constant_host(guest, tmp_path / "host.csv")
    if protocol == "vertical_random_forest":
        params: dict[str, Any] = {"n_trees": 6, "max_depth": 4, "max_features": "sqrt",
                                  "min_samples_leaf": 5, "max_bin": 16,
                                  "objective": objective, "seed": 0}
    else:
        params = {"n_trees": 5, "max_depth": 3, "learning_rate": 0.3, "max_bin": 16,
                  "objective": objective, "seed": 0}
    run = _train(tmp_path, _vertical(f"export-{name}-{protocol[9:]}", guest, host, params,
                                     protocol))
    out = tmp_path / "model.xgb.json"
    assert _export(run, out) == 0
    scores = tmp_path / "scores.csv"
    assert main(["predict", str(run), "--out", str(scores)]) == 0  # federated, path mode
    names = load_model(run / "guest" / "model.json").features["guest"]
    ids, x = _matrix(guest, names)
    assert np.isnan(x).any()
    theirs = _xgboost(out, x, names)
    if objective == "multiclass":
        assert theirs.shape[1] == 4
    diff = _agreement(scores, ids, theirs)
    print(f"{name} {protocol}: max |fedboost - xgboost| on {len(ids)} rows: {diff:.2e}")
    assert diff <= AGREEMENT


def test_a_model_with_passive_splits_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _train(tmp_path, _vertical("export-refused", DATA / "breast_hetero_guest.csv",
                                     DATA / "breast_hetero_host.csv",
                                     {"n_trees": 3, "max_depth": 3, "max_bin": 16,
                                      "objective": "binary", "seed": 0}))
    capsys.readouterr()
    out = tmp_path / "model.xgb.json"
    assert _export(run, out) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("fedboost: error: party guest does not hold the whole model: ")
    assert "belong to host" in err and not out.exists()
    assert _export(run, out, "--party", "host") == 1  # a lookup table is no model
    assert "holds no model.json" in capsys.readouterr().err
    assert json.loads((run / "job.json").read_text())["protocol"] == "vertical_secureboost"


def test_the_export_names_the_features_a_party_coded_from_text(tmp_path: Path) -> None:
    """``Exported.categorical`` (the CLI's "as category codes" line) comes from the party's
    own categories file: it read a key the file never had, so it was always empty."""
    from fedboost.export import _categorical
    from workers.data import save_categories

    save_categories(tmp_path, {"housing": ("own", "rent"), "purpose": ("car", "home")})
    assert _categorical(tmp_path) == {"housing", "purpose"}
    save_categories(tmp_path, {})
    assert _categorical(tmp_path) == set()
