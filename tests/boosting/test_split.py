"""Split gains as an array (for callers that choose the split themselves) and given cuts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boosting import BoostingError
from boosting.binning import fit_cuts
from boosting.hist import build_histograms
from boosting.params import BoostParams
from boosting.split import NodeTotals, best_split_in_block, candidate_at, split_gains
from boosting.train import FeatureBlock, bin_block, train


def _node(seed: int, n: int, f: int, max_bin: int) -> tuple[np.ndarray, NodeTotals]:
    rng = np.random.default_rng(seed)
    bins = rng.integers(0, max_bin + 1, size=(n, f)).astype(np.uint8)
    g = rng.integers(-2**30, 2**30, size=n)
    h = rng.integers(0, 2**30, size=n)
    hist = build_histograms(bins, np.zeros(n, dtype=np.int64), g, h, 1, max_bin)[0]
    return hist, NodeTotals(int(g.sum()), int(h.sum()), n)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 300), f=st.integers(1, 4),
       gamma=st.sampled_from([0.0, 0.5]), min_leaf=st.integers(1, 20))
def test_best_split_is_the_first_maximum_of_split_gains(seed: int, n: int, f: int, gamma: float,
                                                        min_leaf: int) -> None:
    max_bin = 8
    params = BoostParams(max_bin=max_bin, gamma=gamma, min_samples_leaf=min_leaf,
                         min_child_weight=0.0)
    hist, totals = _node(seed, n, f, max_bin)
    scale = 2.0**30

    gains = split_gains(hist, totals, scale, scale, params)
    best = best_split_in_block(hist, totals, scale, scale, params, block=2)

    assert gains.shape == (f, 2, max_bin)
    finite = gains[np.isfinite(gains)]
    if best is None:
        assert finite.size == 0 or finite.max() <= 1e-6
        return
    assert best.block == 2
    assert best.gain == finite.max()
    flat = int(np.argmax(gains))
    assert candidate_at(flat, gains, 2) == best
    direction = 1 if best.missing_left else 0
    assert gains[best.feature, direction, best.bin] == best.gain


def test_split_gains_mark_too_small_children_invalid() -> None:
    params = BoostParams(max_bin=4, min_samples_leaf=3, min_child_weight=0.0)
    bins = np.array([[0], [0], [1], [2], [2], [3]], dtype=np.uint8)
    g = np.array([1, 1, -1, -1, 1, -1])
    h = np.ones(6, dtype=np.int64)
    hist = build_histograms(bins, np.zeros(6, dtype=np.int64), g, h, 1, 4)[0]

    gains = split_gains(hist, NodeTotals(0, 6, 6), 1.0, 1.0, params)

    # only "bin <= 1" leaves 3 rows on each side (no missing values: both directions agree)
    assert np.isfinite(gains[0, :, 1]).all()
    assert np.isinf(np.delete(gains[0], 1, axis=1)).all()


def test_candidate_at_refuses_an_index_outside() -> None:
    with pytest.raises(IndexError):
        candidate_at(8, np.zeros((1, 2, 4)), 0)


def _blocks() -> tuple[list[FeatureBlock], np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 3))
    x[rng.random(x.shape) < 0.1] = np.nan
    y = (np.nan_to_num(x[:, 0]) + rng.normal(scale=0.5, size=400) > 0).astype(np.float64)
    return [FeatureBlock("a", ("x0", "x1"), x[:, :2]), FeatureBlock("b", ("x2",), x[:, 2:])], y


def test_train_with_the_fitted_cuts_gives_the_same_model() -> None:
    blocks, y = _blocks()
    params = BoostParams(n_trees=4, max_bin=16)
    cuts = [fit_cuts(b.x, params.max_bin) for b in blocks]

    assert train(params, blocks, y, cuts=cuts) == train(params, blocks, y)


def test_train_uses_given_cuts() -> None:
    blocks, y = _blocks()
    params = BoostParams(n_trees=2, max_bin=16)
    cuts = [[np.array([-0.25, np.inf]), np.array([np.inf])], [np.array([0.0, 1.0, np.inf])]]

    model = train(params, blocks, y, cuts=cuts)

    thresholds = {n.threshold for t in model.trees for n in t.nodes if n.threshold == n.threshold}
    assert thresholds <= {-0.25, 0.0, 1.0, np.inf}
    assert -0.25 in thresholds


@pytest.mark.parametrize(("edges", "message"), [
    ([np.array([np.inf])], "2 features"),
    ([np.array([]), np.array([np.inf])], "non-empty"),
    ([np.array([1.0, 0.0, np.inf]), np.array([np.inf])], "ascending"),
    ([np.array([0.0, 0.0, np.inf]), np.array([np.inf])], "ascending"),
    ([np.array([0.0, 1.0]), np.array([np.inf])], "last cut"),
    ([np.array([-np.inf, np.inf]), np.array([np.inf])], "finite"),
    ([np.array([np.nan, np.inf]), np.array([np.inf])], "finite"),
    ([np.append(np.arange(5.0), np.inf), np.array([np.inf])], "max_bin"),
])
def test_bad_given_cuts_are_refused(edges: list[np.ndarray], message: str) -> None:
    block = FeatureBlock("a", ("x0", "x1"), np.zeros((3, 2)))
    with pytest.raises(BoostingError, match=message):
        bin_block(block, 4, edges)


def test_train_refuses_a_cut_list_per_block_mismatch() -> None:
    blocks, y = _blocks()
    with pytest.raises(BoostingError, match="2 blocks"):
        train(BoostParams(n_trees=1), blocks, y, cuts=[fit_cuts(blocks[0].x, 32)])
