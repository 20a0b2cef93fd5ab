"""Evaluation metrics: AUC, logloss, accuracy, RMSE."""

from __future__ import annotations

import numpy as np

from boosting._typing import FloatArray


def auc(y: FloatArray, score: FloatArray) -> float:
    """Area under the ROC curve (ties get the average rank)."""
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(s.size, dtype=np.float64)
    # average ranks over runs of equal scores
    boundaries = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [s.size]])
    for a, b in zip(starts, ends):
        ranks[a:b] = (a + b + 1) / 2.0
    full = np.empty_like(ranks)
    full[order] = ranks
    pos = y == 1
    n_pos = int(pos.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((full[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(y: FloatArray, prob: FloatArray) -> float:
    """Binary cross-entropy."""
    p = np.clip(prob, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def accuracy(y: FloatArray, prob: FloatArray) -> float:
    """Share of rows whose most probable class is the label."""
    return float(np.mean(np.argmax(prob, axis=1) == y.astype(np.int64)))


def rmse(y: FloatArray, pred: FloatArray) -> float:
    """Root mean squared error."""
    return float(np.sqrt(np.mean((y - pred) ** 2)))


def evaluate(objective: str, y: FloatArray, pred: FloatArray, prefix: str) -> dict[str, float]:
    """The metrics reported for an objective, keyed ``{prefix}_{name}``."""
    if objective == "binary":
        p = pred[:, 0]
        return {f"{prefix}_auc": auc(y, p), f"{prefix}_logloss": logloss(y, p)}
    if objective == "multiclass":
        return {f"{prefix}_accuracy": accuracy(y, pred)}
    return {f"{prefix}_rmse": rmse(y, pred[:, 0])}
