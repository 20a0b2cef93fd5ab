"""Histogram kernel and subtraction against direct sums."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from boosting.hist import build_histograms


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 500), f=st.integers(1, 5))
def test_histograms_match_direct_sums_and_subtraction(seed: int, n: int, f: int) -> None:
    rng = np.random.default_rng(seed)
    max_bin = 8
    bins = rng.integers(0, max_bin + 1, size=(n, f)).astype(np.uint8)
    g = rng.integers(-2**40, 2**40, size=n)
    h = rng.integers(0, 2**40, size=n)
    node = rng.integers(-1, 2, size=n)  # -1 rows are outside the tree
    hist = build_histograms(bins, node, g, h, 2, max_bin)
    for s in range(2):
        for j in range(f):
            for b in range(max_bin + 1):
                rows = (node == s) & (bins[:, j] == b)
                assert hist[s, j, b, 0] == g[rows].sum()
                assert hist[s, j, b, 1] == h[rows].sum()
                assert hist[s, j, b, 2] == rows.sum()
    parent = build_histograms(bins, np.where(node >= 0, 0, -1), g, h, 1, max_bin)[0]
    np.testing.assert_array_equal(parent - hist[0], hist[1])
