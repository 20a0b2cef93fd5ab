"""Quantile binning with a dedicated missing-value bin.

Bin ``b`` of a feature holds values ``x`` with ``cuts[b-1] < x <= cuts[b]``; the last cut is
``+inf``. NaN goes to bin ``max_bin`` whatever the feature's own bin count, so "bin <= b" and
"x <= cuts[b]" describe the same split, which lets a party store a raw threshold in its lookup
table and score new rows without the bins.
"""

from __future__ import annotations

import numpy as np

from boosting import BoostingError
from boosting._typing import BinMatrix, FloatArray, IntArray


def quantile_cuts(column: FloatArray, max_bin: int) -> FloatArray:
    """Return at most ``max_bin`` upper bin edges for one feature, the last being ``+inf``.

    Few distinct values get one bin each (cut at the midpoints); otherwise cuts are the
    ``i / max_bin`` quantiles of the non-missing values.
    """
    values = column[~np.isnan(column)]
    if values.size == 0:
        return np.array([np.inf])
    distinct = np.unique(values)
    if distinct.size <= max_bin:
        inner = (distinct[:-1] + distinct[1:]) / 2.0
    else:
        probs = np.arange(1, max_bin, dtype=np.float64) / max_bin
        inner = np.unique(np.quantile(values, probs, method="inverted_cdf"))
        inner = inner[inner < distinct[-1]]
    return np.concatenate([inner.astype(np.float64), [np.inf]])


def fit_cuts(x: FloatArray, max_bin: int) -> list[FloatArray]:
    """Compute cuts for every column of ``x`` (rows x features)."""
    if x.ndim != 2:
        raise BoostingError(f"expected a 2-d feature matrix, got {x.ndim} dimensions")
    if np.isinf(x).any():
        raise BoostingError("features contain +/-inf; replace them by NaN (missing) or values")
    return [quantile_cuts(x[:, j], max_bin) for j in range(x.shape[1])]


def check_cuts(cuts: list[FloatArray], n_features: int, max_bin: int) -> None:
    """Refuse cuts made elsewhere (e.g. merged from members' summaries) that break the rules
    :func:`quantile_cuts` keeps: one list per feature, 1..``max_bin`` strictly ascending cuts,
    the last ``+inf`` and no other infinity or NaN.

    Raises
    ------
    BoostingError
        Naming the feature and the broken rule.
    """
    if len(cuts) != n_features:
        raise BoostingError(f"{len(cuts)} cut lists for {n_features} features")
    for j, edges in enumerate(cuts):
        edges = np.asarray(edges)
        if edges.ndim != 1 or edges.size == 0:
            raise BoostingError(f"feature {j}: cuts must be a non-empty 1-d list")
        if edges.size > max_bin:
            raise BoostingError(f"feature {j}: {edges.size} cuts but max_bin is {max_bin}")
        if edges[-1] != np.inf:
            raise BoostingError(f"feature {j}: the last cut must be +inf")
        if not np.isfinite(edges[:-1]).all():
            raise BoostingError(f"feature {j}: inner cuts must be finite")
        if not (np.diff(edges) > 0).all():
            raise BoostingError(f"feature {j}: cuts must be strictly ascending")


def apply_cuts(x: FloatArray, cuts: list[FloatArray], max_bin: int) -> BinMatrix:
    """Map raw values to bin indices; NaN maps to ``max_bin``."""
    if x.shape[1] != len(cuts):
        raise BoostingError(f"{x.shape[1]} columns but {len(cuts)} fitted features")
    bins = np.empty(x.shape, dtype=np.uint8)
    for j, edges in enumerate(cuts):
        col = x[:, j]
        idx = np.searchsorted(edges, col, side="left")
        idx[np.isnan(col)] = max_bin
        bins[:, j] = idx
    return bins


def goes_left(bin_column: BinMatrix, bin_threshold: int, missing_left: bool, max_bin: int) -> np.ndarray:
    """Boolean mask of rows sent left by the split "bin <= threshold" (missing per flag)."""
    missing = bin_column == max_bin
    return np.where(missing, missing_left, bin_column <= bin_threshold)


def goes_left_raw(values: FloatArray, threshold: float | FloatArray,
                  missing_left: bool | np.ndarray) -> np.ndarray:
    """The same decision on raw values, as a party's lookup table applies it to new rows (a
    threshold and missing side per value, or one for all)."""
    missing = np.isnan(values)
    with np.errstate(invalid="ignore"):
        return np.where(missing, missing_left, values <= threshold)


def goes_left_table(x: FloatArray, features: IntArray, thresholds: FloatArray,
                    missing_left: np.ndarray) -> np.ndarray:
    """Many lookup records on many rows at once: records x rows, True where row ``i`` goes
    left at record ``r`` (feature ``features[r]`` of ``x``, rows x features)."""
    values = np.ascontiguousarray(x.T)[features]  # records x rows, each record's row contiguous
    with np.errstate(invalid="ignore"):
        left = values <= thresholds[:, None]  # a missing value compares False: right
    ask = np.flatnonzero(missing_left)
    left[ask] |= np.isnan(values[ask])
    return left


def split_threshold(cuts: FloatArray, bin_threshold: int) -> float:
    """Raw threshold equivalent to "bin <= bin_threshold" (bins past the last cut are empty)."""
    return float(cuts[min(bin_threshold, cuts.size - 1)])
