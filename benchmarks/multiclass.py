"""Multiclass in the row-partitioned protocols: test accuracy on Statlog vehicle (4 classes)
split by rows between members, against XGBoost on the pooled rows and SOLO.

    python -m benchmarks.multiclass [--seeds 3] [--parties 2] [--trees 30] [--depth 3]
        [--lr 0.3] [--max-bin 32] [--no-simfl] [--keep DIR] [--json FILE]

Per data seed (``benchmarks.vehicle_data``: a stratified 75% / 25% split and a balanced
partition of the training rows, both with that seed):

- **horizontal**, **SimFL**: ``fedboost train`` of the job (``configs/vehicle_homo.yaml`` and
  ``configs/vehicle_simfl.yaml``'s parameters) on the embedded default, then
  ``fedboost predict RUN --data A=test.csv``; accuracy of the scores file's ``label`` column;
- **XGBoost**: ``xgboost.train`` (``hist``, ``multi:softprob``) with the same parameters on
  the pooled training rows;
- **XGBoost, same bins**: the same on the pooled rows binned with the cuts the horizontal
  federation agrees on (``workers.horizontal.grid.union_cuts``; each bin index a value of its
  own, so XGBoost's candidate splits are the federation's) and a constant ``base_score`` (0.5
  for every class; XGBoost 3.x otherwise fits an intercept per class, where the core starts
  every class at 0). Measured: its probabilities equal the horizontal model's within 2e-7
  after 30 rounds, so a gap to plain XGBoost is its quantile sketch and intercept;
- **SOLO**: XGBoost the same way on each member's rows alone (the paper's SOLO).

Prints a table (mean over seeds and each seed's) and, with ``--json``, writes
``{"horizontal": [per seed], "simfl": [...], "xgboost": [...], "solo": {"A": [...], ...},
"settings": {...}}`` (accuracies as fractions).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.simfl_data import member_names
from benchmarks.vehicle_data import prepare


def _job(protocol: str, name: str, files: dict[str, Path], args: argparse.Namespace,
         seed: int) -> dict[str, Any]:
    members = member_names(args.parties)
    params: dict[str, Any] = {"n_trees": args.trees, "max_depth": args.depth,
                              "learning_rate": args.lr, "max_bin": args.max_bin,
                              "objective": "multiclass", "seed": seed}
    if protocol == "simfl":
        params["lsh"] = {"r": 4.0, "seed": seed}
    return {"job": name, "protocol": protocol,
            "parties": {**{m: {"role": "member", "data": str(files[m].resolve()), "id": "id",
                               "label": "y"} for m in members},
                        "aggregator": {"role": "aggregator"}},
            "params": params, "transport": {"kind": "memory"}}


def federated_accuracy(protocol: str, files: dict[str, Path], folder: Path,
                       args: argparse.Namespace, seed: int) -> float:
    """``fedboost train`` then ``fedboost predict`` on the test rows; the labels' accuracy."""
    from fedboost.cli import main

    name = f"vehicle-{protocol}-{seed}"
    job_file = folder / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(_job(protocol, name, files, args, seed)))
    run = folder / name
    if main(["train", str(job_file), "--out", str(run)]) != 0:
        raise RuntimeError(f"fedboost train {job_file} failed")
    scores = folder / f"{name}-scores.csv"
    if main(["predict", str(run), "--data", f"A={files['test']}", "--out", str(scores)]) != 0:
        raise RuntimeError(f"fedboost predict {run} failed")
    with scores.open() as handle:
        predicted = {row["id"]: int(row["label"]) for row in csv.DictReader(handle)}
    ids, y, _ = _rows(files["test"])
    return float(np.mean([predicted[i] == label for i, label in zip(ids, y)]))


def _rows(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    with path.open() as handle:
        rows = list(csv.reader(handle))[1:]
    return ([r[0] for r in rows], np.array([float(r[1]) for r in rows]),
            np.array([[float(v) for v in r[2:]] for r in rows]))


def xgboost_accuracy(train: list[Path], test: Path, args: argparse.Namespace,
                     seed: int, same_bins: bool = False) -> float:
    """XGBoost ``hist`` with the same parameters on the rows of ``train`` pooled (with
    ``same_bins``, both files binned with the horizontal federation's cuts and a constant base
    score, as the core's)."""
    import xgboost

    parts = [_rows(p) for p in train]
    x, y = np.vstack([p[2] for p in parts]), np.concatenate([p[1] for p in parts])
    _, y_test, x_test = _rows(test)
    if same_bins:
        from boosting.binning import apply_cuts
        from flows.horizontal import summary_size
        from workers.horizontal.grid import union_cuts

        cuts = union_cuts(x, summary_size(args.max_bin), args.max_bin)
        x, x_test = (apply_cuts(v, cuts, args.max_bin).astype(np.float64) for v in (x, x_test))
    intercept = {"base_score": 0.5} if same_bins else {}
    booster = xgboost.train({
        "tree_method": "hist", "max_depth": args.depth, "learning_rate": args.lr,
        "max_bin": args.max_bin, "reg_lambda": 1.0, "gamma": 0.0, "min_child_weight": 1.0,
        "objective": "multi:softprob", "num_class": 4, "seed": seed, "nthread": 1,
        **intercept},
        xgboost.DMatrix(x, label=y), num_boost_round=args.trees)
    return float(np.mean(np.argmax(booster.predict(xgboost.DMatrix(x_test)), axis=1) == y_test))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--trees", type=int, default=30)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--max-bin", type=int, default=32)
    parser.add_argument("--no-simfl", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    members = member_names(args.parties)
    results: dict[str, Any] = {"horizontal": [], "simfl": [], "xgboost": [], "xgboost_same_bins": [],
                               "solo": {m: [] for m in members}, "settings": vars(args) | {
                                   "keep": str(args.keep), "json": str(args.json)}}
    with tempfile.TemporaryDirectory(prefix="fedboost-multiclass-") as scratch:
        root = args.keep or Path(scratch)
        for seed in range(args.seeds):
            folder = root / f"seed-{seed}"
            files = prepare(folder / "data", parties=args.parties, seed=seed)
            train = [files[m] for m in members]
            results["xgboost"].append(xgboost_accuracy(train, files["test"], args, seed))
            results["xgboost_same_bins"].append(xgboost_accuracy(train, files["test"], args,
                                                                 seed, same_bins=True))
            for m in members:
                results["solo"][m].append(xgboost_accuracy([files[m]], files["test"], args,
                                                           seed))
            results["horizontal"].append(federated_accuracy("horizontal", files, folder, args,
                                                            seed))
            if not args.no_simfl:
                results["simfl"].append(federated_accuracy("simfl", files, folder, args, seed))
            print(f"seed {seed}: " + ", ".join(
                f"{k} {v[-1]:.4f}" for k, v in results.items() if isinstance(v, list) and v))
    print(f"\nvehicle, {args.parties} members, {args.trees} rounds x 4 classes, depth "
          f"{args.depth}, lr {args.lr}; test accuracy over {args.seeds} data seed(s)")
    print(f"{'':<22}{'mean':>8}  per seed")
    table = [("horizontal", results["horizontal"]), ("SimFL", results["simfl"]),
             ("XGBoost (pooled)", results["xgboost"]),
             ("XGBoost, same bins", results["xgboost_same_bins"]),
             *((f"SOLO {m} (XGBoost)", results["solo"][m]) for m in members)]
    for label, values in table:
        if values:
            print(f"{label:<22}{statistics.mean(values):>8.4f}  "
                  + " ".join(f"{v:.4f}" for v in values))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
