"""DPBoost on the plaintext core, in one process: the same mechanisms (``boosting.privacy``)
as the horizontal aggregator and the vertical active party apply, on the pooled rows, to tune
a private model's parameters in seconds before a run of the real protocol.

    python -m benchmarks.dp_core [--data homo|hetero] [--trees 50] [--per-ensemble 50]
        [--depth 3] [--lr 0.1] [--reg-lambda 100] [--max-bin 32] [--clip 1]
        [--epsilons 1 2 4 8] [--seeds 0 1 2]

Prints the test AUC per epsilon (mean over seeds). ``homo``: the three members' rows of
default_credit_homo, test on default_credit_homo_test.csv; ``hetero``: default_credit's two
vertical halves joined, the vertical benchmark's 1/3 holdout.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from boosting._typing import BinMatrix, FloatArray
from boosting.binning import apply_cuts, fit_cuts, goes_left
from boosting.fixedpoint import quantize
from boosting.hist import build_histograms
from boosting.losses import base_score, gradients, transform
from boosting.metrics import auc
from boosting.params import BoostParams
from boosting.privacy import (PrivacyPlan, deal_rows, keep_rows, private_leaves, private_split,
                              split_candidates)
from boosting.split import NodeTotals

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
GUEST_FEATURES = 13
"""default_credit_hetero_guest.csv's feature columns (the host's follow them)."""


def train_private(bins: BinMatrix, y: FloatArray, test_bins: BinMatrix, n_cuts: list[int],
                  params: BoostParams, plan: PrivacyPlan, seed: int,
                  hidden_from: int | None = None) -> FloatArray:
    """Test margins of a DPBoost model trained on ``bins``/``y`` (binary). Features from
    ``hidden_from`` on are a passive party's: every bin of theirs is a candidate, as the
    vertical active party, which does not know their cuts, draws."""
    rng = np.random.default_rng(seed)
    candidates = split_candidates(n_cuts, params.max_bin)
    if hidden_from is not None:
        candidates[hidden_from:] = True
    base = float(base_score("binary", y, 2)[0])
    margin, test_margin = np.full(y.size, base), np.full(test_bins.shape[0], base)
    dealt = np.zeros(y.size, dtype=np.int64)
    first = 2 ** params.max_depth - 1  # a private tree is full: its leaves are first .. 2 first
    for tree in range(params.n_trees):
        ensemble, position = plan.ensemble_of(tree)
        if position == 0:
            dealt = deal_rows(plan, ensemble, y.size, rng)
        g = gradients("binary", margin[:, None], y)[0][:, 0]
        in_tree = (dealt == position) & keep_rows(g, plan.bound)
        gq, hq = quantize(np.where(in_tree, g, 0.0), y.size), quantize(np.ones(y.size), y.size)
        node = np.zeros(y.size, dtype=np.int64)
        test_node = np.zeros(test_bins.shape[0], dtype=np.int64)
        for depth in range(params.max_depth):
            level = 2 ** depth - 1
            slot = np.where(in_tree, node - level, -1)
            hists = build_histograms(bins, slot, gq.ints, hq.ints, 2 ** depth, params.max_bin)
            for k, hist in enumerate(hists):
                g_sum, h_sum, count = (int(v) for v in hist[0].sum(axis=0))
                split = private_split({0: hist}, NodeTotals(g_sum, h_sum, count), gq.scale,
                                      hq.scale, params, {0: candidates}, plan.split_epsilon(),
                                      plan.gain_sensitivity(), rng)
                assert split is not None
                for nodes, b in ((node, bins), (test_node, test_bins)):
                    rows = np.flatnonzero(nodes == level + k)
                    go = goes_left(b[rows, split.feature], split.bin, split.missing_left,
                                   params.max_bin)
                    nodes[rows[go]] = 2 * (level + k) + 1
                    nodes[rows[~go]] = 2 * (level + k) + 2
        in_leaf = (node[:, None] == np.arange(first, 2 * first + 1)[None, :]) & in_tree[:, None]
        values = private_leaves((g[:, None] * in_leaf).sum(axis=0), in_leaf.sum(axis=0), plan,
                                tree, rng) * params.learning_rate
        margin += values[node - first]
        test_margin += values[test_node - first]
    return test_margin


def load(kind: str) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Train x, y and test x, y of default_credit (``homo``: the members' files; ``hetero``:
    the two halves joined on id, a seeded 1/3 holdout)."""
    def read(name: str) -> tuple[list[str], FloatArray]:
        path = DATA / name
        header = path.open().readline().strip().split(",")
        return header, np.loadtxt(path, delimiter=",", skiprows=1)

    if kind == "homo":  # noqa: SIM108
        parts = [read(f"default_credit_homo_{m}.csv")[1] for m in ("guest", "host_1", "host_2")]
        train, test = np.concatenate(parts), read("default_credit_homo_test.csv")[1]
        return train[:, 2:], train[:, 1], test[:, 2:], test[:, 1]
    (_, guest), (_, host) = (read(f"default_credit_hetero_{p}.csv") for p in ("guest", "host"))
    host = host[np.argsort(host[:, 0])][np.searchsorted(np.sort(host[:, 0]), guest[:, 0])]
    x, y = np.concatenate([guest[:, 2:], host[:, 1:]], axis=1), guest[:, 1]
    hold = np.random.default_rng(0).random(y.size) < 1 / 3
    return x[~hold], y[~hold], x[hold], y[hold]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--data", choices=("homo", "hetero"), default="homo")
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--per-ensemble", type=int, default=50)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--reg-lambda", type=float, default=100.0)
    parser.add_argument("--max-bin", type=int, default=32)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    x, y, tx, ty = load(args.data)
    cuts = fit_cuts(x, args.max_bin)
    bins, test_bins = apply_cuts(x, cuts, args.max_bin), apply_cuts(tx, cuts, args.max_bin)
    params = BoostParams(n_trees=args.trees, max_depth=args.depth, learning_rate=args.lr,
                         max_bin=args.max_bin, reg_lambda=args.reg_lambda)
    print(f"{args.data}: {args.trees} trees, {args.per_ensemble} per ensemble, depth "
          f"{args.depth}, lr {args.lr}, lambda {args.reg_lambda}, max_bin {args.max_bin}, "
          f"clip {args.clip}")
    for epsilon in args.epsilons:
        plan = PrivacyPlan(epsilon, args.trees, args.depth, args.per_ensemble, args.clip,
                           args.reg_lambda, args.lr)
        hidden = GUEST_FEATURES if args.data == "hetero" else None
        aucs = [auc(ty, transform("binary", train_private(
            bins, y, test_bins, [len(c) for c in cuts], params, plan, seed, hidden)[:, None])[:, 0])
            for seed in args.seeds]
        print(f"  epsilon {epsilon:g}: mean AUC {statistics.mean(aucs):.4f}  "
              + " ".join(f"{a:.4f}" for a in aucs), flush=True)


if __name__ == "__main__":
    main()
