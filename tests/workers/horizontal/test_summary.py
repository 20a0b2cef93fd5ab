"""Members' quantile summaries merge into the centralized cuts (exactly when exact)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from boosting.binning import quantile_cuts
from boosting.train import FeatureBlock, bin_block
from workers import DataError, ProtocolError
from workers.horizontal.summary import (FeatureSummary, SummaryBytes, SummaryError,
                                        decode_summaries, encode_summaries, inverted_cdf_ranks,
                                        merge_cuts, merge_summaries, rank_step, summarize,
                                        weighted_inverted_cdf)

DATA = Path("/work/shared/data")
MEMBERS = ("guest", "host_1", "host_2")
EXACT = 10**6  # more points than any test column has distinct values

many_distinct = st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False)
few_distinct = st.sampled_from([-2.5, -1.0, 0.0, 0.5, 3.0, 7.25])
nan = st.just(np.nan)


def _columns(values: st.SearchStrategy[float]) -> st.SearchStrategy[list[np.ndarray]]:
    column = arrays(np.float64, st.integers(0, 120), elements=st.one_of(values, values, nan))
    return st.lists(column, min_size=1, max_size=5)


def _cuts_of_members(columns: list[np.ndarray], size: int, max_bin: int) -> np.ndarray:
    return merge_cuts([summarize(c[:, None], size) for c in columns], max_bin)[0]


@settings(max_examples=150, deadline=None)
@given(columns=st.one_of(_columns(many_distinct), _columns(few_distinct)),
       max_bin=st.integers(2, 64))
def test_exact_summaries_reproduce_centralized_cuts(columns: list[np.ndarray],
                                                    max_bin: int) -> None:
    merged = _cuts_of_members(columns, EXACT, max_bin)
    np.testing.assert_array_equal(merged, quantile_cuts(np.concatenate(columns), max_bin))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 5000), max_bin=st.integers(2, 255))
def test_weighted_inverted_cdf_is_numpys_on_counts(n: int, max_bin: int) -> None:
    rng = np.random.default_rng(n * 1000 + max_bin)
    values = np.sort(rng.choice(np.arange(40.0), size=n))
    distinct, counts = np.unique(values, return_counts=True)
    probs = np.arange(1, max_bin, dtype=np.float64) / max_bin
    np.testing.assert_array_equal(weighted_inverted_cdf(distinct, counts, probs),
                                  np.quantile(values, probs, method="inverted_cdf"))
    assert (inverted_cdf_ranks(n, probs) < n).all()


@settings(max_examples=60, deadline=None)
@given(columns=_columns(many_distinct), size=st.integers(1, 12), max_bin=st.integers(2, 40),
       seed=st.integers(0, 1000))
def test_merge_does_not_depend_on_member_order(columns: list[np.ndarray], size: int,
                                               max_bin: int, seed: int) -> None:
    summaries = [summarize(c[:, None], size) for c in columns]
    order = np.random.default_rng(seed).permutation(len(summaries))
    np.testing.assert_array_equal(merge_cuts(summaries, max_bin)[0],
                                  merge_cuts([summaries[i] for i in order], max_bin)[0])


@settings(max_examples=100, deadline=None)
@given(columns=_columns(many_distinct), size=st.integers(1, 12), max_bin=st.integers(2, 40))
def test_approximate_cuts_keep_the_cut_rules(columns: list[np.ndarray], size: int,
                                             max_bin: int) -> None:
    cuts = _cuts_of_members(columns, size, max_bin)
    union = np.concatenate(columns)
    union = union[~np.isnan(union)]
    assert 1 <= cuts.size <= max_bin and cuts[-1] == np.inf
    assert (np.diff(cuts) > 0).all()
    if union.size:
        assert (cuts[:-1] < union.max()).all()
    else:
        np.testing.assert_array_equal(cuts, [np.inf])
    # the cuts bin the union as shared cuts must: every value in a bin below the last cut
    bin_block(FeatureBlock("union", ("x",), union[:, None]), max_bin, [cuts])


@settings(max_examples=100, deadline=None)
@given(column=arrays(np.float64, st.integers(0, 300), elements=st.one_of(many_distinct, nan)),
       size=st.integers(1, 40))
def test_summary_points_are_order_statistics_at_rank_steps(column: np.ndarray, size: int) -> None:
    (summary,) = summarize(column[:, None], size)
    values = np.sort(column[~np.isnan(column)])
    assert summary.values.size <= size
    assert summary.rows == values.size
    assert (np.diff(summary.values) > 0).all() and (summary.weights > 0).all()
    if summary.exact:
        distinct, counts = np.unique(values, return_counts=True)
        np.testing.assert_array_equal(summary.values, distinct)
        np.testing.assert_array_equal(summary.weights, counts)
        return
    ranks = np.cumsum(summary.weights)
    np.testing.assert_array_equal(summary.values, values[ranks - 1])
    assert summary.values[-1] == values[-1]
    # points sit at the rank boundaries ceil(i n / size); a boundary without its own point
    # holds the same value as the next point (ties become one point)
    boundaries = -(-np.arange(1, size + 1) * values.size // size)
    assert set(ranks) <= set(boundaries)
    for r in set(boundaries) - set(ranks):
        assert values[r - 1] == summary.values[np.searchsorted(ranks, r)]


def _load(member: str) -> np.ndarray:
    path = DATA / f"default_credit_homo_{member}.csv"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    raw = np.genfromtxt(path, delimiter=",", names=True)
    return np.column_stack([raw[f"x{j}"] for j in range(23)])


@pytest.fixture(scope="module")
def members() -> list[np.ndarray]:
    return [_load(m) for m in MEMBERS]


def test_default_credit_exact_summaries_give_the_centralized_cuts(
        members: list[np.ndarray]) -> None:
    union = np.vstack(members)

    cuts = merge_cuts([summarize(x, 8000) for x in members], 32)

    assert all(s.exact for x in members for s in summarize(x, 8000))
    for j, merged in enumerate(cuts):
        np.testing.assert_array_equal(merged, quantile_cuts(union[:, j], 32))


@pytest.mark.parametrize("size", [16, 64, 256])
def test_default_credit_small_summaries_are_within_the_rank_bound(members: list[np.ndarray],
                                                                  size: int) -> None:
    union = np.vstack(members)
    probs = np.arange(1, 32, dtype=np.float64) / 32
    target = inverted_cdf_ranks(union.shape[0], probs)
    # module docstring: x_(k+1) <= q and #{rows < q} <= k + sum_m (s_m - 1)
    slack = sum(rank_step(x.shape[0], size) - 1 for x in members)
    summaries = [summarize(x, size) for x in members]
    worst = 0
    for j in range(union.shape[1]):
        column = np.sort(union[:, j])
        values, weights = merge_summaries([s[j] for s in summaries])

        merged = weighted_inverted_cdf(values, weights, probs)

        assert (merged >= column[target]).all()
        below = np.searchsorted(column, merged, side="left")
        assert (below <= target + slack).all(), (j, (below - target).max(), slack)
        worst = max(worst, int((below - target).max()))
    assert worst > 0  # the summaries are approximate here, so the bound is what is tested
    assert (sum(not s.exact for m in summaries for s in m)) > 0


def test_default_credit_small_summaries_give_valid_shared_cuts(members: list[np.ndarray]) -> None:
    cuts = merge_cuts([summarize(x, 16) for x in members], 32)
    for x in members:
        binned = bin_block(FeatureBlock("m", tuple(f"x{j}" for j in range(23)), x), 32, cuts)
        assert binned.bins.max() < 32


def test_a_feature_without_values_gets_one_infinite_cut() -> None:
    x = np.full((4, 2), np.nan)
    x[:, 1] = [1.0, 2.0, 3.0, 4.0]
    cuts = merge_cuts([summarize(x, 4), summarize(x[:0], 4)], 8)
    np.testing.assert_array_equal(cuts[0], [np.inf])
    np.testing.assert_array_equal(cuts[1], [1.5, 2.5, 3.5, np.inf])


@settings(max_examples=80, deadline=None)
@given(column=arrays(np.float64, st.integers(0, 200), elements=st.one_of(many_distinct, nan)),
       size=st.integers(1, 30))
def test_encoding_round_trips(column: np.ndarray, size: int) -> None:
    summaries = summarize(np.column_stack([column, -column]), size)
    encoded = encode_summaries(summaries)
    assert all(len(e.values) == 8 * s.values.size for e, s in zip(encoded, summaries))
    decoded = decode_summaries(encoded, size, n_features=2)
    for got, sent in zip(decoded, summaries):
        np.testing.assert_array_equal(got.values, sent.values)
        np.testing.assert_array_equal(got.weights, sent.weights)
        assert got.exact == sent.exact


def _raw(values: list[float], weights: list[int], exact: bool = False) -> SummaryBytes:
    return SummaryBytes(np.array(values, "<f8").tobytes(), np.array(weights, "<i8").tobytes(),
                        exact)


@pytest.mark.parametrize(("raw", "message"), [
    (SummaryBytes(b"\x00" * 7, b"\x01" + b"\x00" * 7, False), "multiples of 8"),
    (_raw([1.0, 2.0], [1]), "2 values but 1 weights"),
    (_raw([1.0, 2.0, 3.0, 4.0, 5.0], [1] * 5), "more than size 4"),
    (_raw([1.0, np.nan], [1, 1]), "finite"),
    (_raw([1.0, np.inf], [1, 1]), "finite"),
    (_raw([2.0, 1.0], [1, 1]), "ascending"),
    (_raw([1.0, 1.0], [1, 1]), "ascending"),
    (_raw([1.0, 2.0], [1, 0]), "positive"),
    (_raw([1.0, 2.0], [3, -1]), "positive"),
    (_raw([1.0, 2.0], [2**62, 2**62]), "rows"),
])
def test_decoder_refuses_malformed_summaries(raw: SummaryBytes, message: str) -> None:
    with pytest.raises(SummaryError, match=f"feature 1: .*{message}"):
        decode_summaries([_raw([0.5], [1]), raw], size=4)


def test_decoder_refuses_a_wrong_feature_count_and_errors_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="1 feature summaries, expected 2"):
        decode_summaries([_raw([0.5], [1])], size=4, n_features=2)
    with pytest.raises(ValueError):
        merge_cuts([[FeatureSummary(np.array([1.0]), np.array([1]), True)], []], 8)


def test_summarize_refuses_infinities_and_bad_sizes() -> None:
    with pytest.raises(DataError, match="inf"):
        summarize(np.array([[1.0], [np.inf]]), 4)
    with pytest.raises(DataError, match="2-d"):
        summarize(np.zeros(3), 4)
    with pytest.raises(ValueError, match="size"):
        summarize(np.zeros((3, 1)), 0)
