"""Mergeable per-feature quantile summaries, from which the aggregator makes shared cuts.

Every member bins its rows with the same cuts, so that the histograms it sums are over the same
bins. Each member sends, per feature, a :class:`FeatureSummary`; :func:`merge_cuts` turns them
into the cuts :func:`boosting.binning.quantile_cuts` would give on the union of all rows.

A member whose column has at most ``size`` distinct values sends them all with their counts
(``exact``), and then the merged cuts equal ``quantile_cuts`` on the union exactly: both its
"few distinct values -> midpoints" branch and its ``np.quantile(..., method="inverted_cdf")``
branch, which :func:`weighted_inverted_cdf` reproduces on counts, float for float. Otherwise the
member sends ``size`` order statistics at equal rank steps, each weighted with the rows of the
step ending at it. With ``s_m = ceil(n_m / size)`` the rank step of member ``m`` (1 for an
exact member, whose term below is then 0), a merged quantile ``q`` of target rank ``k``
(0-based, the exact answer being the union's ``x_(k+1)``) satisfies ``x_(k+1) <= q`` and
``#{rows < q} <= k + sum_m (s_m - 1)``: the weight merged below ``q`` is at most ``k``, and
each member has fewer than ``s_m`` rows between its last point below ``q`` and ``q`` that no
weight below ``q`` stands for.

What a summary reveals about the member's column, and what the aggregator therefore learns:
exact summaries give the member's whole value distribution (every distinct value and its count);
others give its order statistics at ranks ``ceil(i * n / size)``, ``i = 1..size`` (its
``1 / size`` quantiles, the maximum among them). The weights sum to the member's count of
non-missing values per feature, so its row count and missing-value counts are revealed too.
Summaries travel in the clear (not under the histogram masks); a federation that cannot reveal
them should give fixed cuts instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from boosting._typing import FloatArray, IntArray
from workers import DataError, ProtocolError

# A weight is a row count; bounding it keeps every cumulative sum over members exact in int64
# (and in float64, where the quantile ranks are computed) for up to 2**10 members.
MAX_ROWS = 2**42


class SummaryError(ProtocolError, ValueError):
    """A member's summary is malformed: wrong length, unordered or non-finite, bad weights."""


@dataclass(frozen=True, slots=True)
class FeatureSummary:
    """One member's summary of one feature (NaN excluded).

    ``values`` are float64, strictly ascending and finite; ``weights`` are int64 > 0, the rows
    each value stands for (the rank range ending at it). ``exact`` says the values are every
    distinct value of the member's column and the weights their counts.
    """

    values: FloatArray
    weights: IntArray
    exact: bool

    @property
    def rows(self) -> int:
        """Non-missing rows the summary stands for."""
        return int(self.weights.sum())


@dataclass(frozen=True, slots=True)
class SummaryBytes:
    """The wire form of a :class:`FeatureSummary`: float64 and int64 little-endian bytes."""

    values: bytes
    weights: bytes
    exact: bool


def summarize_column(column: FloatArray, size: int) -> FeatureSummary:
    """Summary of one column: exact if it has at most ``size`` distinct values, else ``size``
    order statistics at equal rank steps."""
    values = np.sort(column[~np.isnan(column)])
    distinct, counts = np.unique(values, return_counts=True)
    if distinct.size <= size:
        return FeatureSummary(distinct.astype(np.float64), counts.astype(np.int64), True)
    n = values.size
    ranks = (np.arange(1, size + 1, dtype=np.int64) * n + size - 1) // size  # ceil(i n / size)
    at = values[ranks - 1]
    # Tied order statistics become one point, standing for the ranks up to the last of them.
    last = np.append(at[1:] != at[:-1], True)
    ranks = ranks[last]
    weights = np.diff(ranks, prepend=0)
    return FeatureSummary(at[last].astype(np.float64), weights.astype(np.int64), False)


def summarize(x: FloatArray, size: int) -> list[FeatureSummary]:
    """Summaries of every column of a member's rows x features matrix (NaN is missing).

    Raises
    ------
    DataError
        If ``x`` is not 2-d or holds +/-inf.
    ValueError
        If ``size < 1``.
    """
    if size < 1:
        raise ValueError(f"summary size must be >= 1, got {size}")
    if x.ndim != 2:
        raise DataError(f"expected a 2-d feature matrix, got {x.ndim} dimensions")
    if np.isinf(x).any():
        raise DataError("features contain +/-inf; replace them by NaN (missing) or values")
    return [summarize_column(x[:, j], size) for j in range(x.shape[1])]


def inverted_cdf_ranks(n: int, probs: FloatArray) -> IntArray:
    """0-based ranks that ``np.quantile(a, probs, method="inverted_cdf")`` reads from ``n``
    sorted values, with numpy's own float arithmetic (so ties at ``n * p`` integer agree)."""
    index = n * probs - 1
    previous = np.floor(index)
    ranks = np.where(index - previous == 0, previous, previous + 1).astype(np.int64)
    ranks[ranks < 0] = 0
    return ranks


def weighted_inverted_cdf(values: FloatArray, weights: IntArray, probs: FloatArray) -> FloatArray:
    """``np.quantile(np.repeat(values, weights), probs, method="inverted_cdf")`` without the
    repeat: ``values`` ascending, ``weights`` positive integer counts."""
    cumulative = np.cumsum(weights)
    ranks = inverted_cdf_ranks(int(cumulative[-1]), probs)
    result: FloatArray = values[np.searchsorted(cumulative, ranks, side="right")]
    return result


def merge_summaries(parts: list[FeatureSummary]) -> tuple[FloatArray, IntArray]:
    """All members' points of one feature as one ascending list, equal values' weights added
    (the same whatever the members' order)."""
    values = np.concatenate([p.values for p in parts]) if parts else np.empty(0)
    weights = np.concatenate([p.weights for p in parts]) if parts else np.empty(0, np.int64)
    merged, inverse = np.unique(values, return_inverse=True)
    totals = np.zeros(merged.size, dtype=np.int64)
    np.add.at(totals, inverse.ravel(), weights.astype(np.int64))  # exact, unlike bincount's floats
    return merged.astype(np.float64), totals


def feature_cuts(parts: list[FeatureSummary], max_bin: int) -> FloatArray:
    """Cuts of one feature from every member's summary, by the rules of ``quantile_cuts``."""
    values, weights = merge_summaries(parts)
    if values.size == 0:
        return np.array([np.inf])
    if values.size <= max_bin:
        inner = (values[:-1] + values[1:]) / 2.0
    else:
        probs = np.arange(1, max_bin, dtype=np.float64) / max_bin
        inner = np.unique(weighted_inverted_cdf(values, weights, probs))
        inner = inner[inner < values[-1]]
    return np.concatenate([inner.astype(np.float64), [np.inf]])


def merge_cuts(summaries: list[list[FeatureSummary]], max_bin: int) -> list[FloatArray]:
    """Cuts per feature from members x features summaries (independent of the members' order).

    Equal to ``quantile_cuts`` on the union of the members' rows when every summary is exact;
    otherwise at most ``max_bin`` ascending cuts ending with ``+inf``, the inner ones below the
    largest value. A feature no member has a value of gets ``[+inf]``.

    Raises
    ------
    SummaryError
        If there are no members or they summarize different numbers of features.
    """
    if not summaries:
        raise SummaryError("no member summaries to merge")
    counts = {len(member) for member in summaries}
    if len(counts) != 1:
        raise SummaryError(f"members summarize different numbers of features: {sorted(counts)}")
    n_features = counts.pop()
    return [feature_cuts([member[j] for member in summaries], max_bin)
            for j in range(n_features)]


def encode_summaries(summaries: list[FeatureSummary]) -> list[SummaryBytes]:
    """Wire form of one member's summaries (float64 / int64 little-endian)."""
    return [SummaryBytes(s.values.astype("<f8").tobytes(), s.weights.astype("<i8").tobytes(),
                         s.exact) for s in summaries]


def decode_summary(raw: SummaryBytes, size: int, feature: int) -> FeatureSummary:
    """One checked :class:`FeatureSummary` (see :func:`decode_summaries`)."""
    if len(raw.values) % 8 or len(raw.weights) % 8:
        raise SummaryError(f"feature {feature}: byte lengths must be multiples of 8 "
                           f"({len(raw.values)}, {len(raw.weights)})")
    values = np.frombuffer(raw.values, dtype="<f8").astype(np.float64)
    weights = np.frombuffer(raw.weights, dtype="<i8").astype(np.int64)
    if values.size != weights.size:
        raise SummaryError(f"feature {feature}: {values.size} values but {weights.size} weights")
    if values.size > size:
        raise SummaryError(f"feature {feature}: {values.size} points, more than size {size}")
    if not np.isfinite(values).all():
        raise SummaryError(f"feature {feature}: values must be finite")
    if not (np.diff(values) > 0).all():
        raise SummaryError(f"feature {feature}: values must be strictly ascending")
    if not (weights > 0).all():
        raise SummaryError(f"feature {feature}: weights must be positive")
    if sum(int(w) for w in weights) > MAX_ROWS:
        raise SummaryError(f"feature {feature}: weights sum past {MAX_ROWS} rows")
    return FeatureSummary(values, weights, bool(raw.exact))


def decode_summaries(encoded: list[SummaryBytes], size: int,
                     n_features: int | None = None) -> list[FeatureSummary]:
    """Checked summaries of one member.

    Raises
    ------
    SummaryError
        Naming the feature: byte lengths not a multiple of 8 or differing counts of values and
        weights, more than ``size`` points, non-finite or not strictly ascending values,
        non-positive weights or more than ``MAX_ROWS`` rows, or (if ``n_features`` is given)
        a different number of features.
    """
    if n_features is not None and len(encoded) != n_features:
        raise SummaryError(f"{len(encoded)} feature summaries, expected {n_features}")
    return [decode_summary(raw, size, j) for j, raw in enumerate(encoded)]


def rank_step(n_rows: int, size: int) -> int:
    """Largest rank step (rows between points) of a summary of ``n_rows`` values that is not
    exact: the ``s_m`` of the rank error bound in the module docstring."""
    return math.ceil(n_rows / size)
