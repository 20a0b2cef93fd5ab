"""Split gain and leaf weight (XGBoost / SecureBoost eq. 7-8) on exact histogram sums.

Gains are computed from integer sums divided by the quantization scale, element by element,
so the same sums give bit-identical gains whether the histogram was built in plaintext or
decrypted from a passive party's ciphertexts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from boosting._typing import Histogram
from boosting.params import BoostParams

# XGBoost's kRtEps: a split must reduce the loss by more than this.
MIN_SPLIT_GAIN = 1e-6


@dataclass(frozen=True, slots=True)
class NodeTotals:
    """Exact quantized sums of g and h and the row count of one node."""

    g: int
    h: int
    count: int


@dataclass(frozen=True, slots=True)
class SplitCandidate:
    """The best split of one node within one block of features."""

    block: int
    feature: int
    bin: int
    missing_left: bool
    gain: float


def leaf_weight(totals: NodeTotals, g_scale: float, h_scale: float, params: BoostParams) -> float:
    """Optimal leaf weight -G / (H + lambda), times the learning rate."""
    g = totals.g / g_scale
    h = totals.h / h_scale
    return float(-g / (h + params.reg_lambda) * params.learning_rate)


def split_gains(
    hist: Histogram,
    totals: NodeTotals,
    g_scale: float,
    h_scale: float,
    params: BoostParams,
    constrained: bool = True,
) -> npt.NDArray[np.float64]:
    """Gain of every candidate of one node's histogram (features, bins, 3), gamma subtracted.

    Returns a (features, 2, bins) array indexed by (feature, direction, bin): direction 0 sends
    missing values right, 1 sends them left; "bin" is the last bin on the left. Candidates that
    break ``min_samples_leaf`` or ``min_child_weight`` are ``-inf``. A caller that picks the
    split itself (the exponential mechanism) turns its index into a split with
    :func:`candidate_at`; under differential privacy it passes ``constrained=False``, which
    keeps every candidate (empty children too: whether one is valid would depend on the data).
    """
    value_bins = hist[:, :-1, :]
    missing = hist[:, -1, :]
    cum = np.cumsum(value_bins, axis=1)  # exact int64: rows with bin <= b
    left = np.stack([cum, cum + missing[:, None, :]], axis=1)  # (F, 2, B, 3)
    total = np.array([totals.g, totals.h, totals.count], dtype=np.int64)
    right = total - left
    gl = left[..., 0] / g_scale
    hl = left[..., 1] / h_scale
    gr = right[..., 0] / g_scale
    hr = right[..., 1] / h_scale
    lam = params.reg_lambda
    g_all = totals.g / g_scale
    h_all = totals.h / h_scale
    gain = 0.5 * (gl * gl / (hl + lam) + gr * gr / (hr + lam) - g_all * g_all / (h_all + lam))
    gain = gain - params.gamma
    if not constrained:
        return gain
    valid = (
        (left[..., 2] >= params.min_samples_leaf)
        & (right[..., 2] >= params.min_samples_leaf)
        & (hl >= params.min_child_weight)
        & (hr >= params.min_child_weight)
    )
    result: npt.NDArray[np.float64] = np.where(valid, gain, -np.inf)
    return result


def candidate_at(flat_index: int, gains: npt.NDArray[np.float64], block: int) -> SplitCandidate:
    """The split at ``gains.flat[flat_index]`` of a :func:`split_gains` array.

    Raises
    ------
    IndexError
        If ``flat_index`` is outside the array.
    """
    if not 0 <= flat_index < gains.size:
        raise IndexError(f"candidate index {flat_index} outside {gains.size} candidates")
    feature, direction, bin_ = np.unravel_index(flat_index, gains.shape)
    return SplitCandidate(
        block=block,
        feature=int(feature),
        bin=int(bin_),
        missing_left=bool(direction == 1),
        gain=float(gains.flat[flat_index]),
    )


def best_split_in_block(
    hist: Histogram,
    totals: NodeTotals,
    g_scale: float,
    h_scale: float,
    params: BoostParams,
    block: int,
) -> SplitCandidate | None:
    """Best (feature, bin, missing direction) of one node's histogram (features, bins, 3).

    Candidates are scanned in (feature, direction, bin) order and the first maximum wins, so
    ties break the same way in every trainer. Returns None if no split is valid.
    """
    gain = split_gains(hist, totals, g_scale, h_scale, params)
    flat = int(np.argmax(gain))
    if not float(gain.flat[flat]) > MIN_SPLIT_GAIN:
        return None
    return candidate_at(flat, gain, block)


def best_split(candidates: list[SplitCandidate | None]) -> SplitCandidate | None:
    """The best of per-block candidates; earlier blocks win ties (strictly greater replaces)."""
    best: SplitCandidate | None = None
    for cand in candidates:
        if cand is not None and (best is None or cand.gain > best.gain):
            best = cand
    return best
