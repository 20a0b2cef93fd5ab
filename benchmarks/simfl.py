"""SimFL on UCI Adult (a9a) against SOLO and ALL-IN: the paper's Tables 2 and 3.

    python -m benchmarks.simfl --partition unbalanced --theta 0.8 --parties 2 --seeds 3
    python -m benchmarks.simfl --dataset breast --trees 20 --depth 4 --lr 0.3 --seeds 3
    common: [--trees 500] [--depth 8] [--lr 0.05] [--max-bin 32] [--data-seed 0]
            [--no-simfl] [--keep DIR] [--json FILE]

Data (``benchmarks.simfl_data``): Adult encoded as a9a (116 binary features), a stratified
75% / 25% split and the paper's partition among the members A, B, ..., all with
``--data-seed`` (fixed across ``--seeds``: as in the paper, the repeated SimFL runs differ only
in their randomness, here ``params.seed`` = ``lsh.seed`` = 0, 1, ..., seeds - 1).

- **SimFL**: the ``simfl`` protocol on the embedded default (``fedboost.embedded``), one run per
  seed; its error is that of member A's saved model (every member keeps all trees) on the test
  rows. Its preprocessing seconds, MB per member and MB per tree are reported when the run's
  metrics carry ``preprocess_seconds``, ``preprocess_bytes`` and ``tree_bytes``.
- **SOLO** (one per member): the ``boosting`` core on that member's rows alone.
- **ALL-IN**: the core on all training rows.

All with the same parameters; SOLO and ALL-IN are deterministic (no row sampling), so they run
once. Test error: the share of test rows whose predicted probability of '>50K' is on the wrong
side of 0.5. The table prints percentages; ``--json`` writes fractions:
``{"simfl": [per seed], "solo": {"A": .., "B": ..}, "all_in": .., "unit": "fraction",
"settings": {..}, "costs": [per seed]}``.

Trees: the paper's 500 at depth 8 are the default, with learning rate 0.05 (the paper does not
give its rate). Measured with the core (data seed 0, test error %, trees 100 / 500):

    unbalanced 0.8   lr 0.3: SOLO A 19.0 / 19.2, SOLO B 22.7 / 24.2, ALL-IN 15.3 / 16.7
                     lr 0.05: SOLO A 20.0 / 19.4, SOLO B 22.5 / 22.5, ALL-IN 14.9 / 14.9
    balanced         lr 0.3: SOLO A 16.0 / 17.6, SOLO B 15.6 / 17.4
                     lr 0.05: SOLO A 15.6 / 15.8, SOLO B 15.1 / 15.0

so 500 trees at 0.3 overfit (ALL-IN 16.7 against the paper's 15.1) and 500 at 0.05 come
closest to the paper; ``configs/adult_simfl.yaml``'s 100 trees at 0.3 are the quick equivalent.
Time per depth-8 tree on one core: the core 0.03-0.06 s (ALL-IN's 24,421 rows; SOLO's 8-16k),
so 500 trees take under half a minute per SOLO/ALL-IN model. SimFL on the embedded default
(the lead's first flow, 2 members) took 0.12 s for the first trees, rising with the tree count
(0.3 s at tree 100, 0.65 s at 300, 0.9 s at 450): 334 s for 500 trees, per seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.simfl_data import (ADULT, encode_adult, member_names, partition, read_adult,
                                   split_indices, write_member_files)
from workers.model_folder import ModelPart, RunFolder

PAPER: dict[str, dict[str, Any]] = {  # a9a, test error %: Table 2 (theta = 80%, 2 parties) and Table 3 (balanced)
    "unbalanced": {"simfl": (17.0, 16.7, 17.2), "solo": {"A": 19.1, "B": 22.0}, "all_in": 15.1},
    "balanced": {"simfl": (15.1, 14.9, 15.2), "solo": {"A": 15.5, "B": 15.9}, "all_in": 15.1},
}
PAPER_COSTS = "135 s preprocessing, 10.4 MB per party, 0.28 MB per tree (Table 4: 10 parties)"
COST_KEYS = ("preprocess_seconds", "preprocess_bytes", "tree_bytes", "preprocess_reused")


@dataclass(frozen=True, slots=True)
class Federation:
    """The encoded data, split and partitioned: training rows per member and the test rows."""

    names: list[str]
    ids: np.ndarray
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    test_ids: np.ndarray
    parts: dict[str, np.ndarray]


def federation(partition_mode: str, theta: float, parties: int, seed: int,
               path: Path = ADULT) -> Federation:
    """Encode Adult, split it and partition the training rows (all with ``seed``)."""
    row_ids, _ = read_adult(path)
    names, x, y = encode_adult(path)
    train, test = split_indices(y, seed)
    parts = partition(y[train], parties, partition_mode, theta, seed)
    ids = np.array([f"adult-{r}" for r in row_ids])
    return Federation(names, ids[train], x[train], y[train], x[test], y[test], ids[test],
                      dict(zip(member_names(parties), parts)))


def breast_federation(folder: Path) -> Federation:
    """breast_homo's two hospitals as members A (guest) and B (host), and its test rows: a
    small federation (about 230 rows each) whose members hold alike rows."""
    from workers.data import load_party_data

    parts = [load_party_data(m, folder / f"breast_homo_{m}.csv", "id", "y",
                             require_label=True) for m in ("guest", "host")]
    test = load_party_data("test", folder / "breast_homo_test.csv", "id", "y",
                           require_label=True)
    ys = [p.y for p in parts if p.y is not None]
    if test.y is None or len(ys) < len(parts):
        raise ValueError(f"{folder}: breast_homo files need their label column")
    sizes = [len(p.ids) for p in parts]
    return Federation(list(parts[0].names), np.concatenate([np.asarray(p.ids) for p in parts]),
                      np.vstack([p.x for p in parts]), np.concatenate(ys), test.x, test.y,
                      np.asarray(test.ids), {"A": np.arange(sizes[0]),
                                             "B": np.arange(sizes[0], sum(sizes))})


def error_rate(y: np.ndarray, probability: np.ndarray) -> float:
    """Share of rows whose probability of class 1 lies on the wrong side of 0.5."""
    return float(np.mean((probability > 0.5) != (y == 1)))


def boost_params(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The tree parameters every approach shares."""
    return {"n_trees": args.trees, "max_depth": args.depth, "learning_rate": args.lr,
            "max_bin": args.max_bin, "objective": "binary", "seed": seed}


# --- SOLO and ALL-IN: the boosting core ------------------------------------------------------

def run_core(fed: Federation, rows: np.ndarray, args: argparse.Namespace
             ) -> tuple[float, float]:
    """Train the core on ``rows`` of the training set; test error and seconds per tree."""
    from boosting.params import BoostParams
    from boosting.train import FeatureBlock, predict_blocks, train

    params = BoostParams.from_dict(boost_params(args, 0))
    names = tuple(fed.names)
    seconds: list[float] = []
    model = train(params, [FeatureBlock("members", names, fed.x_train[rows])], fed.y_train[rows],
                  on_tree=lambda report: seconds.append(report.seconds))
    probability = predict_blocks(model, [FeatureBlock("members", names, fed.x_test)])
    # the first tree also compiles the histogram kernel
    per_tree = statistics.mean(seconds[1:]) if len(seconds) > 1 else seconds[0]
    return error_rate(fed.y_test, probability[:, -1]), per_tree


# --- SimFL: the protocol on the embedded default ---------------------------------------------

def simfl_available() -> bool:
    """Whether this checkout has the ``simfl`` protocol: its flow and its job schema."""
    try:
        import flows.simfl  # noqa: F401
        from flows.config import SimflJobConfig  # noqa: F401
    except ImportError:
        return False
    return True


def simfl_job(files: dict[str, Path], args: argparse.Namespace, seed: int) -> Any:
    """The job of ``configs/adult_simfl.yaml`` on ``files`` with the command line's parameters."""
    from flows.config import SimflJobConfig

    parties: dict[str, Any] = {
        m: {"role": "member", "data": str(f), "id": "id", "label": "y"}
        for m, f in files.items() if m != "test"}
    parties["aggregator"] = {"role": "aggregator"}
    params = boost_params(args, seed) | {"lsh": {"r": args.lsh_r, "seed": seed}}
    raw = {"job": f"bench-simfl-s{seed}", "protocol": "simfl", "parties": parties,
           "params": params, "transport": {"kind": "memory"}}
    return SimflJobConfig.model_validate(raw)


def run_simfl(files: dict[str, Path], fed: Federation, args: argparse.Namespace, seed: int,
              out: Path) -> tuple[float, dict[str, Any]]:
    """One SimFL run: test error of member A's model, and the run's costs (``COST_KEYS``)."""
    from boosting.tree import load_model, raw_decider
    from fedboost.embedded import train_embedded
    from workers.row_partitioned import OWNER

    result = train_embedded(simfl_job(files, args, seed), out)
    metrics_file = RunFolder(out).metrics
    if metrics_file.exists():
        result = {**json.loads(metrics_file.read_text()), **result}
    model = load_model(ModelPart(out / "A").model)
    probability = model.predict(raw_decider({OWNER: fed.x_test}), fed.y_test.size)
    costs = {k: result[k] for k in COST_KEYS if k in result}
    return error_rate(fed.y_test, probability[:, -1]), costs


# --- the table -------------------------------------------------------------------------------

def _mb(value: Any) -> str:
    """Bytes as MB: a number, the mean of a list, or per key of a dict."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_mb(v)}" for k, v in value.items())
    if isinstance(value, list):
        return f"{statistics.mean(value) / 1e6:.3f} MB (mean of {len(value)})" if value else "-"
    return f"{value / 1e6:.3f} MB"


def print_table(result: dict[str, Any], args: argparse.Namespace) -> None:
    """The test errors (%) next to the paper's, then SimFL's costs."""
    paper = PAPER.get(args.partition) if args.dataset == "adult" and args.parties == 2 and (
        args.partition == "balanced" or abs(args.theta - 0.8) < 1e-9) else None
    split = (f"unbalanced theta {args.theta:g}" if args.partition == "unbalanced"
             else "balanced")
    data = (f"Adult (a9a encoding, {len(result['settings']['features'])} features), {split}, "
            f"{args.parties} members" if args.dataset == "adult" else "breast_homo, 2 members")
    print(f"\n{data}; {args.trees} trees, depth {args.depth}, lr {args.lr:g}, "
          f"max_bin {args.max_bin}; test error %")
    print(f"{'approach':<10} {'ours':>22} {'paper':>22}")
    simfl = result["simfl"]
    ours = (f"{100 * statistics.mean(simfl):.1f} ({100 * min(simfl):.1f}-{100 * max(simfl):.1f})"
            if simfl else "not run")
    theirs = "{:.1f} ({:.1f}-{:.1f})".format(*paper["simfl"]) if paper else "-"
    print(f"{'SimFL':<10} {ours:>22} {theirs:>22}   mean (min-max) over {len(simfl)} seeds")
    for member, error in result["solo"].items():
        theirs = f"{paper['solo'][member]:.1f}" if paper and member in paper["solo"] else "-"
        print(f"{'SOLO ' + member:<10} {100 * error:>22.1f} {theirs:>22}")
    theirs = f"{paper['all_in']:.1f}" if paper else "-"
    print(f"{'ALL-IN':<10} {100 * result['all_in']:>22.1f} {theirs:>22}")
    print("core seconds per tree: " + ", ".join(
        f"{k} {v:.3f}" for k, v in result["settings"]["core_seconds_per_tree"].items()))
    for seed, costs in enumerate(result["costs"]):
        if costs:
            parts = [f"preprocessing {costs['preprocess_seconds']:.1f} s"
                     if "preprocess_seconds" in costs else "",
                     f"per member {_mb(costs['preprocess_bytes'])}"
                     if "preprocess_bytes" in costs else "",
                     f"per tree {_mb(costs['tree_bytes'])}" if "tree_bytes" in costs else ""]
            print(f"SimFL seed {seed}: " + "; ".join(p for p in parts if p))
    if any(result["costs"]):
        print(f"paper (a9a): {PAPER_COSTS}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """SOLO and ALL-IN once, SimFL once per seed."""
    fed = (federation(args.partition, args.theta, args.parties, args.data_seed, args.data)
           if args.dataset == "adult" else breast_federation(args.data.parent))
    sizes = {m: int(p.size) for m, p in fed.parts.items()}
    print(f"train {fed.y_train.size} rows, test {fed.y_test.size}; members " + ", ".join(
        f"{m} {n} rows ({100 * fed.y_train[fed.parts[m]].mean():.1f}% >50K)"
        for m, n in sizes.items()), flush=True)
    solo, per_tree = {}, {}
    for member, rows in fed.parts.items():
        started = time.perf_counter()
        solo[member], per_tree[f"SOLO {member}"] = run_core(fed, rows, args)
        print(f"  SOLO {member}: {100 * solo[member]:.2f}% "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    started = time.perf_counter()
    all_in, per_tree["ALL-IN"] = run_core(fed, np.arange(fed.y_train.size), args)
    print(f"  ALL-IN: {100 * all_in:.2f}% ({time.perf_counter() - started:.0f} s)", flush=True)
    simfl: list[float] = []
    costs: list[dict[str, Any]] = []
    if not args.no_simfl:
        with tempfile.TemporaryDirectory() as scratch:
            base = args.keep or Path(scratch)
            files = write_member_files(base / "data", fed.names, fed.x_train, fed.y_train,
                                       list(fed.parts.values()), (fed.x_test, fed.y_test),
                                       ids=fed.ids, test_ids=fed.test_ids)
            for seed in range(args.seeds):
                started = time.perf_counter()
                error, cost = run_simfl(files, fed, args, seed, base / f"run-s{seed}")
                simfl.append(error)
                costs.append(cost)
                print(f"  SimFL seed {seed}: {100 * error:.2f}% "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
    settings = {"dataset": args.dataset, "partition": args.partition, "theta": args.theta,
                "parties": args.parties,
                "data_seed": args.data_seed, "seeds": list(range(len(simfl))),
                "params": boost_params(args, 0), "lsh_r": args.lsh_r, "features": fed.names,
                "rows": sizes, "test_rows": int(fed.y_test.size),
                "core_seconds_per_tree": per_tree}
    return {"simfl": simfl, "solo": solo, "all_in": all_in, "unit": "fraction",
            "settings": settings, "costs": costs}


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partition", choices=("unbalanced", "balanced"), default="unbalanced")
    parser.add_argument("--theta", type=float, default=0.8)
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3, help="SimFL runs (seeds 0..N-1)")
    parser.add_argument("--trees", type=int, default=500)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--max-bin", type=int, default=32)
    parser.add_argument("--lsh-r", type=float, default=4.0)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=ADULT)
    parser.add_argument("--dataset", choices=("adult", "breast"), default="adult",
                        help="breast: breast_homo's guest and host beside --data (no partition)")
    parser.add_argument("--no-simfl", action="store_true", help="SOLO and ALL-IN only")
    parser.add_argument("--keep", type=Path, help="keep the member files and runs here")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not args.no_simfl and not simfl_available():
        parser.exit(2, "benchmarks.simfl: this checkout has no flows.simfl (the simfl protocol) "
                       "yet; run with --no-simfl for SOLO and ALL-IN only\n")
    result = run(args)
    print_table(result, args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
