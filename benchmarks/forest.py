"""Training time of the vertical random forest against SecureBoost on the same data, in the
same run (seed 002, Table 2's comparison).

    python -m benchmarks.forest [--trees 10] [--depth 5] [--bits 2048] [--json FILE]

Both train on default_credit (guest: label + 13 features, host: 10), embedded (guest and host
worker processes, ephemeral Prefect), with the same number of trees and depth, 32 bins, a third
of the rows held out. SecureBoost encrypts gradients for every tree and grows one tree at a
time (each tree needs the previous trees' margins); the forest encrypts the labels once and
grows ``--parallel`` trees side by side. Prints total and per-tree seconds, validation AUC,
and the forest's speed-up.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from fedboost import _prefect_env

REPO = Path(__file__).resolve().parents[1]


def _config(name: str, params: dict[str, Any], bits: int) -> Any:
    from flows.config import parse_config

    raw = yaml.safe_load((REPO / "configs" / name).read_text())
    raw["params"].update(params)
    raw["crypto"] = {"key_bits": bits}
    raw["validation"] = {"fraction": 0.333, "seed": 0}
    raw["job"] = f"{raw['job']}-bench"
    return parse_config(raw, base=REPO / "configs", source=name)


def _train(config: Any) -> dict[str, Any]:
    from fedboost.embedded import train_embedded

    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = train_embedded(config, Path(out))
        result["wall_seconds"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--trees", type=int, default=10)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--bits", type=int, default=2048)
    parser.add_argument("--parallel", type=int, default=2, help="forest trees grown at once")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    _prefect_env.configure()
    import logging

    for name in ("prefect", "prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).setLevel(logging.WARNING)
    shape = {"n_trees": args.trees, "max_depth": args.depth, "max_bin": 32}
    runs = {
        "secureboost": _train(_config("default_credit.yaml", shape, args.bits)),
        "forest": _train(_config("default_credit_forest.yaml",
                                 {**shape, "parallel_trees": args.parallel}, args.bits)),
    }
    numbers = {}
    print(f"default_credit, {args.trees} trees of depth {args.depth}, {args.bits}-bit keys, "
          f"1/3 held out")
    print(f"{'':12} {'total s':>9} {'s/tree':>8} {'valid AUC':>10}")
    for kind, result in runs.items():
        total = result["train_seconds"]
        numbers[kind] = {"train_seconds": total, "seconds_per_tree": total / args.trees,
                         "valid_auc": result.get("valid_auc")}
        print(f"{kind:12} {total:9.1f} {total / args.trees:8.2f} "
              f"{result.get('valid_auc', float('nan')):10.4f}")
    ratio = numbers["secureboost"]["train_seconds"] / numbers["forest"]["train_seconds"]
    numbers["forest_speedup"] = ratio
    print(f"forest speed-up over SecureBoost: {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=1))


if __name__ == "__main__":
    main()
