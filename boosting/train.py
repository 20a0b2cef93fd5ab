"""The centralized trainer: the lossless reference for every federated protocol."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from boosting import BoostingError
from boosting._typing import BinMatrix, FloatArray
from boosting.binning import apply_cuts, check_cuts, fit_cuts, goes_left, split_threshold
from boosting.fixedpoint import quantize
from boosting.grow import TreeGrower, sample_rows
from boosting.hist import build_histograms
from boosting.losses import base_score, check_labels, gradients, n_outputs, transform
from boosting.metrics import evaluate
from boosting.params import BoostParams
from boosting.tree import Model, Tree, node_values, raw_decider


@dataclass(frozen=True, slots=True)
class FeatureBlock:
    """One party's columns (rows aligned with the labels)."""

    owner: str
    names: tuple[str, ...]
    x: FloatArray


@dataclass(frozen=True, slots=True)
class TreeReport:
    """What the training loop reports after each tree."""

    tree: int
    n_trees: int
    seconds: float
    metrics: dict[str, float]


OnTree = Callable[[TreeReport], None]


@dataclass(slots=True)
class BinnedBlock:
    owner: str
    cuts: list[FloatArray]
    bins: BinMatrix


def bin_block(block: FeatureBlock, max_bin: int,
              cuts: list[FloatArray] | None = None) -> BinnedBlock:
    """Bin a block with the given cuts (checked), or with quantile cuts fitted on it.

    Given cuts let several row holders share one binning (the horizontal protocol merges
    their quantile summaries into cuts that no single member's rows would give).
    """
    if cuts is None:
        cuts = fit_cuts(block.x, max_bin)
    else:
        if block.x.ndim != 2 or np.isinf(block.x).any():
            raise BoostingError(f"block {block.owner}: expected a 2-d matrix without +/-inf")
        check_cuts(cuts, block.x.shape[1], max_bin)
        cuts = [np.asarray(edges, dtype=np.float64) for edges in cuts]
    return BinnedBlock(owner=block.owner, cuts=cuts, bins=apply_cuts(block.x, cuts, max_bin))


def allowed_blocks(params: BoostParams, tree: int, n_blocks: int, outputs: int) -> list[int]:
    """Blocks a tree may split on: block 0 (the active party) only for Completely SecureBoost's
    first round, which is ``outputs`` trees (one per class in multiclass); its gradients come
    from labels alone, so none of its instance spaces or splits may reach a passive party."""
    if first_round_is_secret(params, tree, outputs):
        return [0]
    return list(range(n_blocks))


def first_round_is_secret(params: BoostParams, tree: int, outputs: int) -> bool:
    """Completely SecureBoost: the trees of the first round grow on the active party alone."""
    return params.complete_secure and tree < outputs


def grow_tree(params: BoostParams, grower: TreeGrower, blocks: list[BinnedBlock], allowed: list[int],
              output: int) -> Tree:
    """Grow one tree level by level on binned blocks (all plaintext)."""
    max_bin = params.max_bin
    while grower.frontier:
        built = grower.nodes_to_build()
        slots = grower.slot_of_row(built)
        for b in allowed:
            hist = build_histograms(blocks[b].bins, slots, grower.grad.ints, grower.hess.ints,
                                    len(built), max_bin)
            grower.add_histograms(b, built, hist)
        grower.begin_level()
        splits = grower.find_splits(allowed)
        for node in list(grower.frontier):
            split = splits[node]
            if split is None:
                continue
            block = blocks[split.block]
            rows = grower.node_rows(node)
            mask = goes_left(block.bins[rows, split.feature], split.bin, split.missing_left, max_bin)
            grower.split_node(node, split, mask, owner=block.owner,
                              threshold=split_threshold(block.cuts[split.feature], split.bin))
        grower.next_level()
    tree, _ = grower.finish(output)
    return tree


def train(
    params: BoostParams,
    blocks: list[FeatureBlock],
    y: FloatArray,
    *,
    valid: tuple[list[FeatureBlock], FloatArray] | None = None,
    on_tree: OnTree | None = None,
    cuts: list[list[FloatArray]] | None = None,
    in_tree: Callable[[int], npt.NDArray[np.bool_]] | None = None,
) -> Model:
    """Train on joined data, one block per party in the federation's party order.

    ``cuts`` (per block, per feature) replaces the quantile cuts fitted on the data, e.g. by
    the cuts a horizontal federation merged from its members' summaries; they are checked
    like the fitted ones (BoostingError). ``in_tree`` (tree -> row mask) replaces the row
    subsample drawn from ``params.seed``, e.g. by the draws a federation's parties make from
    their own secrets (``workers.vertical.draws``, ``workers.horizontal.draws``).
    """
    n_classes = check_labels(params.objective, y)
    k = n_outputs(params.objective, n_classes)
    if cuts is not None and len(cuts) != len(blocks):
        raise BoostingError(f"{len(cuts)} cut lists for {len(blocks)} blocks")
    binned = [bin_block(b, params.max_bin, None if cuts is None else cuts[i])
              for i, b in enumerate(blocks)]
    base = base_score(params.objective, y, n_classes)
    margin = np.tile(base, (y.size, 1))
    features = {b.owner: b.names for b in blocks}
    model = Model(params, tuple(base), n_classes, (), features)
    grads: tuple[FloatArray, FloatArray] = (np.empty(0), np.empty(0))
    for t in range(params.n_trees * k):
        start = time.perf_counter()
        output = t % k
        if output == 0:  # one gradient computation per round, shared by its K trees
            grads = gradients(params.objective, margin, y)
        grower = TreeGrower(params, quantize(grads[0][:, output], y.size),
                            quantize(grads[1][:, output], y.size),
                            sample_rows(y.size, params.subsample, params.seed, t)
                            if in_tree is None else in_tree(t), len(binned))
        tree = grow_tree(params, grower, binned, allowed_blocks(params, t, len(binned), k), output)
        margin[:, output] += node_values(tree)[grower.node_of_row]
        model = dataclasses.replace(model, trees=model.trees + (tree,))
        if on_tree is not None:
            metrics = evaluate(params.objective, y, transform(params.objective, margin), "train")
            if valid is not None:
                metrics.update(evaluate(params.objective, valid[1],
                                        predict_blocks(model, valid[0]), "valid"))
            on_tree(TreeReport(t, params.n_trees * k, time.perf_counter() - start, metrics))
    return model


def predict_blocks(model: Model, blocks: list[FeatureBlock]) -> FloatArray:
    """Predictions of a model on raw columns, one block per owner party."""
    n_rows = blocks[0].x.shape[0]
    return model.predict(raw_decider({b.owner: b.x for b in blocks}), n_rows)
