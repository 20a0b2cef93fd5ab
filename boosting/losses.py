"""Objectives: gradients, hessians, base scores and output transforms."""

from __future__ import annotations

import numpy as np

from boosting import BoostingError
from boosting._typing import FloatArray

# Floor on hessians, as XGBoost does, so leaves of pure nodes stay finite.
_MIN_HESS = 1e-16


def n_outputs(objective: str, n_classes: int) -> int:
    """Trees per boosting round: one per class for multiclass, else one."""
    return n_classes if objective == "multiclass" else 1


def check_labels(objective: str, y: FloatArray) -> int:
    """Validate labels for the objective and return the number of classes (1 for regression)."""
    if y.size == 0:
        raise BoostingError("no labelled rows")
    if not np.isfinite(y).all():
        raise BoostingError("labels contain NaN or inf")
    if objective == "regression":
        return 1
    if not np.array_equal(y, np.round(y)) or y.min() < 0:
        raise BoostingError(f"{objective} labels must be integers 0..K-1")
    n_classes = int(y.max()) + 1
    if objective == "binary":
        if n_classes > 2:
            raise BoostingError(f"binary labels must be 0/1, found values up to {int(y.max())}")
        if np.unique(y).size < 2:
            raise BoostingError("binary labels hold a single class; nothing to learn")
        return 2
    if n_classes < 2:
        raise BoostingError("multiclass labels hold a single class; nothing to learn")
    return n_classes


def base_score(objective: str, y: FloatArray, n_classes: int) -> FloatArray:
    """Initial margin per output: logit of the mean label, mean target, or zeros."""
    if objective in ("binary", "regression"):
        return base_score_of_mean(objective, float(np.mean(y)))
    return np.zeros(n_classes)


def base_score_of_mean(objective: str, mean: float) -> FloatArray:
    """The binary or regression base score from the mean label alone (what a federation
    of row holders can add up without pooling labels)."""
    if objective == "binary":
        p = float(np.clip(mean, 1e-6, 1 - 1e-6))
        return np.array([np.log(p / (1 - p))])
    return np.array([mean])


def gradients(objective: str, margin: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray]:
    """First and second derivatives of the loss at ``margin`` (rows x outputs)."""
    if objective == "binary":
        p = transform(objective, margin)[:, 0]
        g = p - y
        h = np.maximum(p * (1 - p), _MIN_HESS)
        return g[:, None], h[:, None]
    if objective == "regression":
        return (margin[:, 0] - y)[:, None], np.ones((y.size, 1))
    p = transform(objective, margin)
    onehot = np.zeros_like(p)
    onehot[np.arange(y.size), y.astype(np.int64)] = 1.0
    return p - onehot, np.maximum(2.0 * p * (1.0 - p), _MIN_HESS)


def transform(objective: str, margin: FloatArray) -> FloatArray:
    """Margins to predictions: probabilities for classification, values for regression."""
    if objective == "binary":
        return 1.0 / (1.0 + np.exp(-margin))
    if objective == "regression":
        return margin
    shifted = margin - margin.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    probabilities: FloatArray = e / e.sum(axis=1, keepdims=True)
    return probabilities
