"""Split gain and leaf weight (XGBoost / SecureBoost eq. 7-8) on exact histogram sums.

Gains are computed from integer sums divided by the quantization scale, element by element,
so the same sums give bit-identical gains whether the histogram was built in plaintext or
decrypted from a passive party's ciphertexts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    value_bins = hist[:, :-1, :]
    missing = hist[:, -1, :]
    cum = np.cumsum(value_bins, axis=1)  # exact int64: rows with bin <= b
    # direction 0: missing values go right; direction 1: they go left
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
    valid = (
        (left[..., 2] >= params.min_samples_leaf)
        & (right[..., 2] >= params.min_samples_leaf)
        & (hl >= params.min_child_weight)
        & (hr >= params.min_child_weight)
    )
    gain = np.where(valid, gain, -np.inf)
    flat = int(np.argmax(gain))
    best = float(gain.flat[flat])
    if not best > MIN_SPLIT_GAIN:
        return None
    feature, direction, bin_ = np.unravel_index(flat, gain.shape)
    return SplitCandidate(
        block=block,
        feature=int(feature),
        bin=int(bin_),
        missing_left=bool(direction == 1),
        gain=best,
    )


def best_split(candidates: list[SplitCandidate | None]) -> SplitCandidate | None:
    """The best of per-block candidates; earlier blocks win ties (strictly greater replaces)."""
    best: SplitCandidate | None = None
    for cand in candidates:
        if cand is not None and (best is None or cand.gain > best.gain):
            best = cand
    return best
