"""DP building blocks: budget split, exponential mechanism, Laplace noise, sensitivities."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from boosting.hist import build_histograms
from boosting.params import BoostParams
from boosting.split import NodeTotals, split_gains
from boosting import BoostingError
from boosting.privacy import (PrivacyPlan, PrivateTree, clip_gradients, deal_rows,
                              exponential_choice, exponential_probabilities, gain_sensitivity,
                              laplace_noise, leaf_sensitivity, private_leaves, private_split,
                              roomy_candidates, split_candidates)
from flows.config import PrivacyConfig


def plan(epsilon: float = 6.0, n_trees: int = 12, max_depth: int = 3, per: int = 4,
         bound: float = 1.0, reg_lambda: float = 10.0, lr: float = 0.5) -> PrivacyPlan:
    return PrivacyPlan(epsilon, n_trees, max_depth, per, bound, reg_lambda, lr)


def test_budget_goes_to_ensembles_then_half_to_levels_half_to_leaves() -> None:
    p = plan(epsilon=6.0, n_trees=12, max_depth=3, per=4)

    assert p.n_ensembles == 3 and p.ensemble_epsilon() == 2.0
    assert p.split_epsilon() == pytest.approx(1 / 3) and p.leaf_epsilon() == 1.0
    # one root-to-leaf path composes max_depth split choices and one leaf: the ensemble's share
    assert p.max_depth * p.split_epsilon() + p.leaf_epsilon() == pytest.approx(2.0)
    assert [p.ensemble_of(t) for t in (0, 3, 4, 11)] == [(0, 0), (0, 3), (1, 0), (2, 3)]


def test_count_floors_take_their_share_and_the_path_still_spends_the_ensembles() -> None:
    """The noisy count floors: ``count_share`` of an ensemble's epsilon over the levels, the
    splits and leaves the rest as before; the threshold passes ``floor - 1`` rows with
    probability ``count_miss`` (a Laplace tail) and an empty node almost never."""
    p = replace(plan(epsilon=6.0, n_trees=12, max_depth=3, per=4), count_floor=10,
                count_share=0.3, count_miss=0.01)
    assert p.count_epsilon() == pytest.approx(0.2)
    assert p.split_epsilon() == pytest.approx(0.7 / 3) and p.leaf_epsilon() == pytest.approx(0.7)
    path = p.max_depth * p.count_epsilon() + p.max_depth * p.split_epsilon() + p.leaf_epsilon()
    assert path == pytest.approx(p.ensemble_epsilon())
    assert p.spent(5) == plan(epsilon=6.0, n_trees=12, max_depth=3, per=4).spent(5)
    assert p.count_threshold() == pytest.approx(10 + math.log(50) / 0.2)
    rng = np.random.default_rng(3)
    passed = np.mean([p.opens(9, rng) for _ in range(20000)])
    assert 0.0065 < passed < 0.0100  # P(Laplace(5) >= threshold - 9) = 0.01 exp(-0.2): 0.0082
    assert np.mean([p.opens(0, rng) for _ in range(4000)]) < 0.003  # 0.5 exp(-0.2 T): 0.0014
    assert all(p.opens(200, rng) for _ in range(2000))
    # without floors nothing is drawn: the vertical protocol's and the core's noise as before
    free = plan()
    state = rng.bit_generator.state
    assert free.opens(0, rng) and rng.bit_generator.state == state
    with pytest.raises(BoostingError):
        replace(free, count_floor=10)
    with pytest.raises(BoostingError):
        replace(free, count_floor=10, count_share=0.1, count_miss=0.6)


@pytest.mark.parametrize(("n_trees", "per"), [(12, 4), (10, 4), (7, 7), (5, 50), (50, 1)])
def test_epsilon_spent_steps_per_started_ensemble(n_trees: int, per: int) -> None:
    """A started ensemble has spent its whole share (parallel composition inside, sequential
    across); the flow's restatement (``PrivacyConfig.spent``) agrees to the last bit."""
    p = plan(epsilon=3.0, n_trees=n_trees, per=per)
    config = PrivacyConfig(epsilon=3.0, trees_per_ensemble=per)
    ensembles = -(-n_trees // min(per, n_trees))

    for done in range(n_trees + 1):
        expected = 3.0 / ensembles * -(-done // min(per, n_trees))
        assert p.spent(done) == pytest.approx(expected, rel=1e-15)
        assert config.spent(done, n_trees) == p.spent(done)
    assert p.spent(n_trees) == pytest.approx(3.0)
    with pytest.raises(BoostingError, match=f"{n_trees + 1} trees trained"):
        p.spent(n_trees + 1)


def test_one_ensemble_by_default() -> None:
    config = PrivacyConfig(epsilon=2.0)
    assert config.per_ensemble(50) == 50
    assert config.spent(1, 50) == 2.0 and config.spent(50, 50) == 2.0


@pytest.mark.parametrize("bad", [
    {"epsilon": 0.0}, {"epsilon": -1.0}, {"epsilon": math.inf}, {"epsilon": math.nan},
    {"n_trees": 0}, {"max_depth": 0}, {"per": 0}, {"bound": 0.0}, {"reg_lambda": 0.0},
    {"lr": 0.0}, {"lr": 1.5}])
def test_bad_plans_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(BoostingError):
        plan(**bad)  # type: ignore[arg-type]


def test_row_shares_are_dpboosts_geometric_shares() -> None:
    p = plan(n_trees=10, per=4, lr=0.5)

    np.testing.assert_allclose(p.row_shares(0), np.array([8, 4, 2, 1]) / 15)
    np.testing.assert_allclose(p.row_shares(2), [2 / 3, 1 / 3])  # the last ensemble: 2 trees


def test_rows_are_dealt_with_the_shares_and_to_one_tree_each() -> None:
    p = plan(n_trees=4, per=4, lr=0.5)
    rng = np.random.default_rng(7)

    dealt = deal_rows(p, 0, 60_000, rng)

    counts = np.bincount(dealt, minlength=4)
    assert chisquare(counts, 60_000 * p.row_shares(0)).pvalue > 0.001
    # uniform shares (a wrong eta) are rejected by the same test
    assert chisquare(counts, np.full(4, 15_000)).pvalue < 1e-6


def test_geometric_leaf_clipping() -> None:
    p = plan(bound=1.0, reg_lambda=1.0, lr=0.5, per=4, n_trees=4)
    assert [p.leaf_bound(t) for t in range(4)] == [1.0, 0.5, 0.25, 0.125]
    # min(g* / (1 + lambda), 2 g* (1 - eta)^t): the clip's range takes over from tree 2
    assert [p.leaf_sensitivity(t) for t in range(4)] == [0.5, 0.5, 0.5, 0.25]


def test_clipping() -> None:
    g = np.array([-5.0, -0.5, 0.0, 0.25, 3.0])
    np.testing.assert_array_equal(clip_gradients(g, 1.0), [-1.0, -0.5, 0.0, 0.25, 1.0])
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(BoostingError, match="gradient bound"):
            clip_gradients(g, bad)


def test_sensitivities_follow_dpboost() -> None:
    assert gain_sensitivity(0.5, 1.0) == 0.375
    assert gain_sensitivity(2.0, 0.0) == 6.0
    assert leaf_sensitivity(1.0, 1.0) == 0.5
    assert leaf_sensitivity(2.0, 3.0) == 0.5
    with pytest.raises(BoostingError):
        leaf_sensitivity(1.0, -0.1)


def test_private_leaves_are_clipped_then_get_laplace_noise_of_the_documented_scale() -> None:
    """Tree 3 of an ensemble, eta 0.5, lambda 1: leaves clipped to 1/8, noise scale
    min(1/2, 2/8) / leaf_epsilon = 0.25 / 1.5; a mean |noise| off by 5% fails."""
    p = plan(epsilon=3.0, n_trees=4, per=4, max_depth=2, bound=1.0, reg_lambda=1.0, lr=0.5)
    rng = np.random.default_rng(13)
    n = 200_000
    g_sums, counts = np.full(n, -300.0), np.full(n, 99.0)  # raw value 3.0, clipped to 0.125

    noisy = private_leaves(g_sums, counts, p, 3, rng)

    noise = noisy - 0.125
    scale = 0.25 / 1.5
    assert abs(np.median(noisy) - 0.125) < 0.005
    assert np.abs(noise).mean() == pytest.approx(scale, rel=0.02)  # E|X| = b
    assert not np.abs(noise).mean() == pytest.approx(0.5 / 1.5, rel=0.05)  # the unclipped scale


GAINS = np.array([0.0, 1.0, 2.0, -np.inf, 0.5, 3.0])


def test_exponential_frequencies_match_the_mechanism() -> None:
    rng = np.random.default_rng(11)
    draws = 20_000
    eps, sensitivity = 2.0, 1.0

    picks = [exponential_choice(GAINS, eps, sensitivity, rng) for _ in range(draws)]

    counts = np.bincount(np.array(picks), minlength=GAINS.size)
    assert counts[3] == 0  # -inf is never chosen
    finite = np.isfinite(GAINS)
    theory = np.exp(eps * GAINS[finite] / (2 * sensitivity))
    expected = draws * theory / theory.sum()
    assert chisquare(counts[finite], expected).pvalue > 0.001
    # the same test rejects a mechanism that forgets the factor 2
    wrong = np.exp(eps * GAINS[finite] / sensitivity)
    assert chisquare(counts[finite], draws * wrong / wrong.sum()).pvalue < 1e-6


def test_high_epsilon_picks_the_best_and_tiny_epsilon_is_near_uniform() -> None:
    rng = np.random.default_rng(5)
    best = [exponential_choice(GAINS, 1e4, 1.0, rng) for _ in range(500)]
    assert best.count(5) == 500

    uniform = [exponential_choice(GAINS, 1e-9, 1.0, rng) for _ in range(10_000)]
    counts = np.bincount(np.array(uniform), minlength=GAINS.size)
    assert counts[3] == 0
    assert chisquare(np.delete(counts, 3)).pvalue > 0.001


def test_exponential_choice_is_stable_and_handles_no_candidates() -> None:
    rng = np.random.default_rng(0)
    huge = np.array([[1e300, -np.inf], [1e300 * 0.5, np.nan]])
    probs = exponential_probabilities(huge, 1.0, 1.0)
    assert np.isfinite(probs).all() and probs.sum() == pytest.approx(1.0)
    assert exponential_choice(huge, 1.0, 1.0, rng) == 0
    assert exponential_choice(np.full((2, 2, 3), -np.inf), 1.0, 1.0, rng) is None
    assert exponential_choice(np.empty(0), 1.0, 1.0, rng) is None
    with pytest.raises(BoostingError, match="epsilon"):
        exponential_choice(GAINS, 0.0, 1.0, rng)


@settings(max_examples=200, deadline=None)
@given(gains=st.lists(st.floats(-50, 50), min_size=1, max_size=12),
       shifts=st.lists(st.floats(-1, 1), min_size=12, max_size=12),
       eps=st.floats(0.01, 5))
def test_exponential_mechanism_is_eps_dp(gains: list[float], shifts: list[float],
                                         eps: float) -> None:
    """Utilities that differ by at most the sensitivity change no probability by more than
    e^eps (the mechanism's guarantee, McSherry & Talwar 2007)."""
    sensitivity = 1.0
    base = np.array(gains)
    neighbour = base + np.array(shifts[:base.size]) * sensitivity

    p, q = (exponential_probabilities(u, eps, sensitivity) for u in (base, neighbour))

    assert (p <= q * math.exp(eps) * (1 + 1e-9)).all()
    assert (q <= p * math.exp(eps) * (1 + 1e-9)).all()


def test_laplace_scale_is_sensitivity_over_epsilon() -> None:
    rng = np.random.default_rng(3)
    values = np.full(200_000, 0.7)

    noisy = laplace_noise(values, epsilon=0.5, sensitivity=0.25, rng=rng)

    noise = noisy - values
    scale = 0.25 / 0.5
    assert abs(noise.mean()) < 0.01
    assert np.abs(noise).mean() == pytest.approx(scale, rel=0.02)  # E|X| = b
    assert noise.std() == pytest.approx(math.sqrt(2) * scale, rel=0.02)
    assert laplace_noise(np.zeros((2, 3)), 1.0, 1.0, rng).shape == (2, 3)


SCALE = 64  # g* = 1 in fixed point: integer gradients in [-SCALE, SCALE]


def _node(g: list[int], bins: list[int], max_bin: int) -> tuple[np.ndarray, NodeTotals]:
    grad = np.array(g, dtype=np.int64)
    ones = np.ones(grad.size, dtype=np.int64)  # unit hessians, as the bound assumes
    hist = build_histograms(np.array(bins, dtype=np.uint8)[:, None],
                            np.zeros(grad.size, dtype=np.int64), grad, ones, 1, max_bin)[0]
    return hist, NodeTotals(int(grad.sum()), grad.size, grad.size)


rows = st.lists(st.tuples(st.one_of(st.integers(-SCALE, SCALE), st.sampled_from([-SCALE, SCALE])),
                          st.integers(0, 4)), min_size=1, max_size=80)


@settings(max_examples=300, deadline=None)
@given(node=rows, extra=st.tuples(st.sampled_from([-SCALE, SCALE, 0, 17]), st.integers(0, 4)),
       reg_lambda=st.sampled_from([0.0, 0.5, 1.0, 10.0]))
def test_one_row_moves_gains_and_leaf_values_within_the_sensitivities(
        node: list[tuple[int, int]], extra: tuple[int, int], reg_lambda: float) -> None:
    max_bin = 4
    params = BoostParams(max_bin=max_bin, reg_lambda=reg_lambda, min_child_weight=0.0)
    g, bins = [r[0] for r in node], [r[1] for r in node]
    before_hist, before = _node(g, bins, max_bin)
    after_hist, after = _node(g + [extra[0]], bins + [extra[1]], max_bin)

    with np.errstate(invalid="ignore", divide="ignore"):  # empty children with lambda = 0
        gains = [split_gains(h, t, SCALE, 1.0, params) for h, t in
                 ((before_hist, before), (after_hist, after))]
        change = np.abs(gains[0] - gains[1])
    values = [-(t.g / SCALE) / (t.h + reg_lambda) for t in (before, after)]

    assert np.nan_to_num(change, nan=0.0, posinf=0.0).max() <= gain_sensitivity(1.0, reg_lambda)
    assert abs(values[0] - values[1]) <= leaf_sensitivity(1.0, reg_lambda) + 1e-12


def test_the_gain_bound_is_nearly_reached() -> None:
    """Left child n rows at +g*, right child n rows at -g* (the parent sums to 0); one more
    row at -g* on the left drops the left term by about 3 g*^2 and barely moves the parent:
    our half-gain moves by about 1.5 g*^2, DPBoost's full gain by about 3 g*^2."""
    n, max_bin = 2000, 4
    params = BoostParams(max_bin=max_bin, reg_lambda=0.0, min_child_weight=0.0)
    before = _node([SCALE] * n + [-SCALE] * n, [0] * n + [3] * n, max_bin)
    after = _node([SCALE] * n + [-SCALE] * n + [-SCALE], [0] * n + [3] * n + [0], max_bin)
    with np.errstate(invalid="ignore"):
        change = np.abs(split_gains(*before, SCALE, 1.0, params)
                        - split_gains(*after, SCALE, 1.0, params))
    assert 1.49 < np.nanmax(change) <= gain_sensitivity(1.0, 0.0)


def test_private_split_draws_once_over_every_block_with_the_mechanisms_frequencies() -> None:
    """Two blocks of one feature each (4 bins, no missing values): the draw covers both
    blocks' candidates, masked ones (beyond a feature's cuts) are never chosen, and the
    frequencies match exp(eps * gain / (2 * 1.5 g*^2)) over the candidates."""
    max_bin, n = 4, 400
    rng = np.random.default_rng(21)
    params = BoostParams(max_bin=max_bin, reg_lambda=1.0)
    bins = rng.integers(0, 3, size=(n, 2)).astype(np.uint8)  # 3 bins used per feature
    g = np.where(bins[:, 0] == 0, -0.3, 0.1) + np.where(bins[:, 1] == 2, 0.05, 0.0)
    g_ints, h_ints = np.rint(g * SCALE).astype(np.int64), np.ones(n, dtype=np.int64)
    hists = {b: build_histograms(bins[:, b:b + 1], np.zeros(n, dtype=np.int64), g_ints, h_ints,
                                 1, max_bin)[0] for b in (0, 1)}
    totals = NodeTotals(int(g_ints.sum()), n, n)
    candidates = {0: split_candidates([3], max_bin), 1: split_candidates([3], max_bin)}
    eps, draws = 0.5, 8_000

    picks = [private_split(hists, totals, SCALE, 1.0, params, candidates, eps, 1.5, rng)
             for _ in range(draws)]

    seen = {(c.block, c.bin, c.missing_left) for c in picks if c is not None}
    assert {b for _, b, _ in seen} == {0, 1}  # bins 2 and 3 send every row left: masked
    keys = [(b, k, m) for b in (0, 1) for m in (False, True) for k in (0, 1)]
    counts = np.array([sum(1 for c in picks if (c.block, c.bin, c.missing_left) == key)
                       for key in keys])
    gains = np.array([split_gains(hists[b], totals, SCALE, 1.0, params,
                                  constrained=False)[0, int(m), k] for b, k, m in keys])
    weights = np.exp(eps * gains / (2 * 1.5))
    assert chisquare(counts, draws * weights / weights.sum()).pvalue > 0.001
    wrong = np.exp(eps * gains / 1.5)  # a mechanism that forgets the factor 2
    assert chisquare(counts, draws * wrong / wrong.sum()).pvalue < 1e-6


def test_roomy_candidates_drop_splits_whose_smaller_side_cannot_expect_the_rows() -> None:
    """One feature, 4 bins and missing values: 10 / 300 / 300 / 10 rows and 20 missing. With
    a tree expecting a tenth of them and 2.5 rows wanted, a side of 10 or 20 rows is too small,
    one of 30 (bin 2's right with the missing values, or bin 0's left with them) is roomy;
    bin 3 separates nothing (its cut is the last) and stays masked; a want that no candidate
    meets leaves None."""
    counts = np.array([[10, 300, 300, 10, 20]])
    every = split_candidates([4], 4)
    roomy = roomy_candidates(every, counts, 0.1, 2.5)
    assert roomy is not None
    # direction 0: missing right; 1: missing left. Bins 0..2 separate; bin 3 does not.
    assert roomy[0, 0].tolist() == [False, True, True, False]  # bin 0: left 10
    assert roomy[0, 1].tolist() == [True, True, False, False]  # bin 2: right 10
    assert roomy_candidates(every, counts, 0.1, 1000.0) is None
    assert not (roomy & ~every).any()


def test_a_private_tree_draws_among_the_roomy_candidates_above_the_last_level() -> None:
    """At depths below ``max_depth - 1`` the draw never leaves the roomy set; at the last
    level (whose children are leaves, the floor checks nothing) every candidate is drawn."""
    max_bin, n = 4, 400
    rng = np.random.default_rng(5)
    params = BoostParams(max_bin=max_bin, reg_lambda=1.0, max_depth=2)
    bins = rng.integers(0, 4, size=(n, 1)).astype(np.uint8)
    g_ints = np.rint(rng.normal(size=n) * SCALE).astype(np.int64)
    h_ints = np.ones(n, dtype=np.int64)
    hist = build_histograms(bins, np.zeros(n, dtype=np.int64), g_ints, h_ints, 1, max_bin)[0]
    totals = NodeTotals(int(g_ints.sum()), n, n)
    every = split_candidates([4], max_bin)
    roomy = np.zeros_like(every)
    roomy[0, 0, 1] = True
    plan = PrivacyPlan(1.0, 1, 2, 1, 0.3, 1.0, 0.3, 10, 0.1)
    tree = PrivateTree(plan, 0, {0: every}, rng, {0: roomy})
    at_root = {(c.bin, c.missing_left) for c in
               (tree.choose({0: hist}, totals, SCALE, 1.0, params, 0) for _ in range(200))
               if c is not None}
    at_last = {(c.bin, c.missing_left) for c in
               (tree.choose({0: hist}, totals, SCALE, 1.0, params, 1) for _ in range(400))
               if c is not None}
    assert at_root == {(1, False)}
    assert len(at_last) == 6  # bins 0..2, both directions
