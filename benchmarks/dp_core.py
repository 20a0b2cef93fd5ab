"""DPBoost on the plaintext core, in one process: what the horizontal aggregator and members
(``--data homo``) or the vertical active party (``--data hetero``) compute under ``privacy:``,
on the pooled rows, to tune a private model's parameters in seconds before a run of the real
protocol.

    python -m benchmarks.dp_core [--data homo|hetero] [--valid FRACTION] [--trees 50]
        [--per-ensemble N] [--depth 3] [--lr 0.3] [--reg-lambda 100] [--max-bin 16]
        [--clip 0.3] [--count-share 0.1] [--count-miss 0.01] [--roomy-side 2]
        [--epsilons 1 2 4 8] [--seeds 0 1 2]

Prints the AUC per epsilon (mean over seeds, then each seed's). ``homo``: the three members'
files of default_credit_homo, test on default_credit_homo_test.csv. It draws what the real
protocol draws for a job with ``params.seed`` = ``privacy.seed`` = the seed: the set-up's cuts
(``workers.horizontal.grid.union_cuts``), each member's dealing of its rows, each tree's noise
source, the same quantized sums, the count floors (``--count-share``, homo only: the
members' root decisions and the aggregator's deeper ones, as ``workers.horizontal.draws``):
its test AUC is what ``python -m benchmarks.horizontal --dp`` measures (in distribution: the
members now deal and floor from their own secrets, drawn here from the seed). ``hetero``: default_credit's two vertical halves joined in the active party's row
order, its 1/3 holdout (``vertical_dp``'s), the host's columns with every bin a candidate.

``--valid FRACTION`` tunes without the test rows: a seeded FRACTION of each member's (or the
training) rows is held out (a fresh draw per seed), the model trains on the rest and the
held-out rows are scored instead of the test file.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import numpy.typing as npt

from boosting._typing import BinMatrix, FloatArray
from boosting.binning import apply_cuts, fit_cuts, goes_left
from boosting.fixedpoint import quantize
from boosting.hist import build_histograms
from boosting.losses import base_score, gradients, transform
from boosting.metrics import auc
from boosting.params import BoostParams
from boosting.privacy import (ROOMY_SIDE, PrivacyPlan, clip_gradients, deal_rows, private_leaves,
                              private_split, split_candidates, tree_rng)
from boosting.split import NodeTotals
from workers.horizontal.draws import COUNT_MISS, COUNT_SHARE, floor_rows

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
GUEST_FEATURES = 13
"""default_credit_hetero_guest.csv's feature columns (the host's follow them)."""
MEMBERS = ("guest", "host_1", "host_2")
VALID_SEED = 1000
"""Offset of the --valid holdout's seed from the training seed."""
EPSILON_PER_ENSEMBLE = 1.0
"""The benchmarks' default: about this much epsilon per ensemble (``--per-ensemble 0``)."""


def trees_per_ensemble(epsilon: float, n_trees: int) -> int:
    """Ensembles of about epsilon 1 each: ``ceil(n_trees / max(1, round(epsilon)))`` (50 trees:
    one ensemble at epsilon 1, 25 at 2, 13 at 4, 7 at 8). Tuned on a holdout of the training
    rows (docs/privacy.md): more ensembles let more trees read each row, but each gets less
    epsilon; the best count rose with epsilon, about one per unit. A function of the public
    epsilon and tree count alone: it spends nothing."""
    return -(-n_trees // max(1, round(epsilon / EPSILON_PER_ENSEMBLE)))


def train_private(bins: BinMatrix, y: FloatArray, test_bins: BinMatrix, n_cuts: list[int],
                  params: BoostParams, plan: PrivacyPlan, seed: int,
                  members: list[int] | None = None, hidden_from: int | None = None,
                  roomy_side: float = ROOMY_SIDE) -> FloatArray:
    """Test margins of a DPBoost model trained on ``bins``/``y`` (binary), ``seed`` being the
    job's ``params.seed`` and ``privacy.seed``.

    ``members``: the horizontal members' row counts, in order (their rows follow each other in
    ``bins``): each member deals its own rows, as ``workers.horizontal.member`` does; None: the
    vertical active party deals all rows. Features from ``hidden_from`` on are a passive
    party's: every bin of theirs is a candidate, as the active party, which does not know their
    cuts, draws. ``roomy_side``: the roomy candidates' factor (``boosting.privacy.ROOMY_SIDE``;
    0: every candidate at every level)."""
    candidates = split_candidates(n_cuts, params.max_bin)
    if hidden_from is not None:
        candidates[hidden_from:] = True
    bin_counts = np.stack([np.bincount(bins[:, f], minlength=params.max_bin + 1)
                           for f in range(bins.shape[1])])  # the set-up's union counts
    every = candidates
    base = float(base_score("binary", y, 2)[0])
    margin, test_margin = np.full(y.size, base), np.full(test_bins.shape[0], base)
    dealt = np.zeros(y.size, dtype=np.int64)
    for tree in range(params.n_trees):
        ensemble, position = plan.ensemble_of(tree)
        if position == 0:
            dealt = deal(plan, ensemble, y.size, seed, members)
        rng = tree_rng(seed, tree)  # the aggregator's (active party's) noise of this tree
        # the aggregator's roomy candidates (workers.horizontal.aggregator); none vertically
        roomy = None if members is None else plan.roomy(tree, every, bin_counts,
                                                        side=roomy_side)
        g = gradients("binary", margin[:, None], y)[0][:, 0]
        in_tree = floored(plan, dealt == position, seed, tree, members)
        g = np.where(in_tree, clip_gradients(g, plan.bound), 0.0)
        gq, hq = quantize(g, y.size), quantize(np.ones(y.size), y.size)
        # nodes numbered as a heap (children of k: 2k + 1, 2k + 2), which is the protocol's
        # order of creation level by level; a node the count floor closes is a leaf
        node = np.zeros(y.size, dtype=np.int64)
        test_node = np.zeros(test_bins.shape[0], dtype=np.int64)
        frontier, leaves = [0], []
        for depth in range(params.max_depth):
            slot = np.full(y.size, -1, dtype=np.int64)
            for k, n in enumerate(frontier):
                slot[(node == n) & in_tree] = k
            hists = build_histograms(bins, slot, gq.ints, hq.ints, len(frontier), params.max_bin)
            children = []
            candidates = every if roomy is None or depth + 1 == params.max_depth else roomy
            for n, hist in zip(frontier, hists):
                g_sum, h_sum, count = (int(v) for v in hist[0].sum(axis=0))
                split = private_split({0: hist}, NodeTotals(g_sum, h_sum, count), gq.scale,
                                      hq.scale, params, {0: candidates}, plan.split_epsilon(),
                                      plan.gain_sensitivity(), rng)
                assert split is not None
                for nodes, b in ((node, bins), (test_node, test_bins)):
                    rows = np.flatnonzero(nodes == n)
                    go = goes_left(b[rows, split.feature], split.bin, split.missing_left,
                                   params.max_bin)
                    nodes[rows[go]] = 2 * n + 1
                    nodes[rows[~go]] = 2 * n + 2
                children += [2 * n + 1, 2 * n + 2]
            frontier = []
            if depth + 1 < params.max_depth:  # the count floor: a split's two children or none
                passed = [plan.opens(int((in_tree & (node == c)).sum()), rng) for c in children]
                frontier = [c for k in range(0, len(children), 2) if passed[k] and passed[k + 1]
                            for c in children[k:k + 2]]
            leaves += [c for c in children if c not in frontier]
        leaves.sort()
        in_leaf = (node[:, None] == np.array(leaves)[None, :]) & in_tree[:, None]
        # the leaves' sums as the aggregator reads them off the summed (quantized) histograms
        g_sums = (gq.ints[:, None] * in_leaf).sum(axis=0) / gq.scale
        values = private_leaves(g_sums, in_leaf.sum(axis=0), plan, tree, rng) \
            * params.learning_rate
        position_of = np.full(2 ** (params.max_depth + 1), -1)
        position_of[leaves] = np.arange(len(leaves))
        margin += values[position_of[node]]
        test_margin += values[position_of[test_node]]
    return test_margin


def floored(plan: PrivacyPlan, dealt: npt.NDArray[np.bool_], seed: int, tree: int,
            members: list[int] | None) -> npt.NDArray[np.bool_]:
    """Each member's dealt rows of ``tree``, or none if its noisy row count does not expect the
    floor there (``workers.horizontal.draws.private_rows``; its noise here from the seed)."""
    if members is None or plan.count_floor == 0:
        return dealt
    ensemble = plan.ensemble_of(tree)[0]
    out, start = dealt.copy(), 0
    for m, n in enumerate(members):
        part = out[start:start + n]
        if not plan.takes(n, tree, 1.0, np.random.default_rng([seed, m, ensemble, 1])):
            part[:] = False
        start += n
    return out


def deal(plan: PrivacyPlan, ensemble: int, n_rows: int, seed: int,
         members: list[int] | None) -> npt.NDArray[np.int64]:
    """Each row's tree in ``ensemble``, drawn as the real protocol draws it."""
    if members is None:  # workers.vertical.encryption
        return deal_rows(plan, ensemble, n_rows, np.random.default_rng([seed, ensemble]))
    return np.concatenate([deal_rows(plan, ensemble, n, np.random.default_rng([seed, m, ensemble]))
                           for m, n in enumerate(members)])  # workers.horizontal.member


def read(name: str) -> FloatArray:
    return np.loadtxt(DATA / name, delimiter=",", skiprows=1)


def load_homo() -> tuple[list[FloatArray], FloatArray]:
    """The members' files (columns id, y, features) and the test file."""
    return ([read(f"default_credit_homo_{m}.csv") for m in MEMBERS],
            read("default_credit_homo_test.csv"))


def load_hetero() -> tuple[FloatArray, FloatArray]:
    """default_credit's halves joined in the active party's order (ids sorted as text), split
    by the vertical benchmark's holdout (1/3, seed 0): training and holdout rows (y, features)."""
    from workers.column_partitioned.alignment import holdout_mask

    guest, host = read("default_credit_hetero_guest.csv"), read("default_credit_hetero_host.csv")
    host = host[np.argsort(host[:, 0])][np.searchsorted(np.sort(host[:, 0]), guest[:, 0])]
    rows = np.concatenate([guest[:, 1:], host[:, 1:]], axis=1)
    rows = rows[np.argsort(np.array([_id_text(v) for v in guest[:, 0]]), kind="stable")]
    hold = holdout_mask(rows.shape[0], 0.333, 0)
    return rows[~hold], rows[hold]


def _id_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def one_run(args: argparse.Namespace, epsilon: float, seed: int) -> float:
    """AUC of one private model (test rows, or the --valid holdout)."""
    if args.data == "homo":
        parts, test = load_homo()
        hidden = None
    else:
        train, test = load_hetero()
        parts, hidden = [train], GUEST_FEATURES
    if args.valid:
        rng = np.random.default_rng(VALID_SEED + seed)
        holds = [rng.random(p.shape[0]) < args.valid for p in parts]
        test = np.concatenate([p[h] for p, h in zip(parts, holds)])
        parts = [p[~h] for p, h in zip(parts, holds)]
    lead = 2 if args.data == "homo" else 1  # homo rows: id, y, features; hetero: y, features
    x, y = np.concatenate([p[:, lead:] for p in parts]), np.concatenate([p[:, lead - 1]
                                                                         for p in parts])
    tx, ty = test[:, lead:], test[:, lead - 1]
    if args.data == "homo":  # the set-up's cuts from the union's counts
        from flows.horizontal import summary_size
        from workers.horizontal.grid import union_cuts

        cuts = union_cuts(x, summary_size(args.max_bin), args.max_bin)
    else:  # each party's quantiles of its training rows
        cuts = fit_cuts(x, args.max_bin)
    bins, test_bins = apply_cuts(x, cuts, args.max_bin), apply_cuts(tx, cuts, args.max_bin)
    params = BoostParams(n_trees=args.trees, max_depth=args.depth, learning_rate=args.lr,
                         max_bin=args.max_bin, reg_lambda=args.reg_lambda, seed=seed)
    per = args.per_ensemble or trees_per_ensemble(epsilon, args.trees)
    share = args.count_share if args.data == "homo" else 0.0
    plan = PrivacyPlan(epsilon, args.trees, args.depth, per, args.clip, args.reg_lambda, args.lr,
                       floor_rows(params) if share > 0 else 0, share, args.count_miss)
    margin = train_private(bins, y, test_bins, [len(c) for c in cuts], params, plan, seed,
                           [p.shape[0] for p in parts] if args.data == "homo" else None, hidden,
                           args.roomy_side)
    return auc(ty, transform("binary", margin[:, None])[:, 0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--data", choices=("homo", "hetero"), default="homo")
    parser.add_argument("--valid", type=float, default=0.0,
                        help="hold out this fraction of the training rows and score them")
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--per-ensemble", type=int, default=0,
                        help="trees per ensemble; 0 (default): ensembles of about epsilon 1")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--reg-lambda", type=float, default=100.0)
    parser.add_argument("--max-bin", type=int, default=16)
    parser.add_argument("--clip", type=float, default=0.3)
    parser.add_argument("--count-share", type=float, default=COUNT_SHARE,
                        help="homo: share of each ensemble's epsilon for the count floors")
    parser.add_argument("--count-miss", type=float, default=COUNT_MISS,
                        help="homo: the floors' probability of passing floor - 1 rows")
    parser.add_argument("--roomy-side", type=float, default=ROOMY_SIDE,
                        help="homo: under floors, a candidate's smaller side must expect this "
                             "many count thresholds of rows above the last level (0: off)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    scored = f"a {args.valid:g} holdout of the training rows" if args.valid else "test rows"
    per = args.per_ensemble or "ceil(trees / round(epsilon))"
    print(f"{args.data}: {args.trees} trees, {per} per ensemble, "
          f"depth {args.depth}, lr {args.lr}, lambda {args.reg_lambda}, max_bin "
          f"{args.max_bin}, clip {args.clip}, count share {args.count_share}, miss {args.count_miss}; AUC on {scored}")
    for epsilon in args.epsilons:
        aucs = [one_run(args, epsilon, seed) for seed in args.seeds]
        print(f"  epsilon {epsilon:g}: mean AUC {statistics.mean(aucs):.4f}  "
              + " ".join(f"{a:.4f}" for a in aucs), flush=True)


if __name__ == "__main__":
    main()
