"""DP building blocks: budget split, exponential mechanism, Laplace noise, sensitivities."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from boosting.hist import build_histograms
from boosting.params import BoostParams
from boosting.split import NodeTotals, split_gains
from workers.horizontal.privacy import (PrivacyBudget, clip_gradients, exponential_choice,
                                        exponential_probabilities, gain_sensitivity,
                                        laplace_noise, leaf_sensitivity, spent)


def test_budget_goes_half_to_levels_half_to_leaves() -> None:
    budget = PrivacyBudget(epsilon=6.0, n_trees=3, max_depth=4)

    assert budget.tree_epsilon() == 2.0
    assert budget.split_epsilon() == 0.25
    assert budget.leaf_epsilon() == 1.0
    # one root-to-leaf path composes max_depth split choices and one leaf
    assert budget.max_depth * budget.split_epsilon() + budget.leaf_epsilon() == 2.0
    assert spent(budget, 0) == 0.0 and spent(budget, 2) == 4.0 and spent(budget, 3) == 6.0


@pytest.mark.parametrize(("epsilon", "n_trees", "depth"),
                         [(0.0, 1, 1), (-1.0, 1, 1), (math.inf, 1, 1), (math.nan, 1, 1),
                          (1.0, 0, 1), (1.0, 1, 0)])
def test_bad_budgets_are_refused(epsilon: float, n_trees: int, depth: int) -> None:
    with pytest.raises(ValueError):
        PrivacyBudget(epsilon, n_trees, depth)


def test_spending_past_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="4 trees trained, budget is for 3"):
        spent(PrivacyBudget(1.0, 3, 2), 4)


def test_clipping() -> None:
    g = np.array([-5.0, -0.5, 0.0, 0.25, 3.0])
    np.testing.assert_array_equal(clip_gradients(g, 1.0), [-1.0, -0.5, 0.0, 0.25, 1.0])
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="gradient bound"):
            clip_gradients(g, bad)


def test_sensitivities_follow_dpboost() -> None:
    assert gain_sensitivity(0.5, 1.0) == 0.375
    assert gain_sensitivity(2.0, 0.0) == 6.0
    assert leaf_sensitivity(1.0, 1.0) == 0.5
    assert leaf_sensitivity(2.0, 3.0) == 0.5
    with pytest.raises(ValueError):
        leaf_sensitivity(1.0, -0.1)


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
    with pytest.raises(ValueError, match="epsilon"):
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
