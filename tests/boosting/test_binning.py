"""Binning invariants: bounded bin count, NaN bin, and bin split == raw threshold split."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from boosting.binning import apply_cuts, fit_cuts, goes_left, goes_left_raw, split_threshold

values = arrays(np.float64, st.integers(1, 300),
                elements=st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.just(np.nan)))


@settings(max_examples=200, deadline=None)
@given(column=values, max_bin=st.integers(2, 64), b=st.integers(0, 63), missing_left=st.booleans())
def test_bin_split_equals_threshold_split(column: np.ndarray, max_bin: int, b: int,
                                          missing_left: bool) -> None:
    x = column[:, None]
    cuts = fit_cuts(x, max_bin)
    bins = apply_cuts(x, cuts, max_bin)
    b = min(b, max_bin - 1)
    assert cuts[0].size <= max_bin
    assert (bins[np.isnan(column), 0] == max_bin).all()
    assert (bins[~np.isnan(column), 0] < cuts[0].size).all()
    by_bin = goes_left(bins[:, 0], b, missing_left, max_bin)
    by_value = goes_left_raw(column, split_threshold(cuts[0], b), missing_left)
    np.testing.assert_array_equal(by_bin, by_value)


def test_few_distinct_values_get_one_bin_each() -> None:
    x = np.array([[3.0], [1.0], [2.0], [1.0], [3.0]])
    cuts = fit_cuts(x, 32)
    assert cuts[0].size == 3
    np.testing.assert_array_equal(apply_cuts(x, cuts, 32)[:, 0], [2, 0, 1, 0, 2])


def test_quantile_bins_are_balanced() -> None:
    x = np.random.default_rng(0).normal(size=(10_000, 1))
    bins = apply_cuts(x, fit_cuts(x, 32), 32)
    counts = np.bincount(bins[:, 0], minlength=32)
    assert counts.max() <= 2 * counts.min()
