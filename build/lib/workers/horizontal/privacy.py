"""Differential privacy of the released model (the optional ``privacy:`` block), after DPBoost
(Q. Li, Z. Wu, Z. Wen, B. He, "Privacy-Preserving Gradient Boosting Decision Trees", AAAI 2020)
as FedTree (Q. Li et al., "FedTree: A Federated Learning System for Trees", MLSys 2023) applies
it to horizontal training.

Three mechanisms, each on one row-disjoint query:

* **Gradient clipping** to ``[-g*, g*]`` (:func:`clip_gradients`) bounds what one row can add to
  a node's sums; every sensitivity below is in terms of ``g*``.
* **Exponential mechanism** for each node's split (:func:`exponential_choice`): candidate ``i``
  is drawn with probability proportional to ``exp(eps * gain_i / (2 * dG))``, with
  ``dG = 1.5 g*^2``: DPBoost's sensitivity ``3 g*^2`` of its gain, halved because
  ``boosting.split.split_gains`` is half of that gain (:func:`gain_sensitivity`).
* **Laplace noise** of scale ``dV / eps`` on each leaf value, ``dV = g* / (1 + lambda)``
  (DPBoost's sensitivity of ``-G / (H + lambda)``, :func:`leaf_sensitivity`).

Where the budget goes (:class:`PrivacyBudget`): every tree reads every row, so trees compose
sequentially and each gets ``eps / n_trees``. Within a tree, half goes to the splits and is
divided over the ``max_depth`` levels (the nodes of one level hold disjoint rows: parallel
composition, so each node's choice uses the level's whole share); the other half goes to the
leaves, which hold disjoint rows too, so each leaf's noise uses all of it. :func:`spent` is
what the trees trained so far have used.

Assumptions the sensitivities rest on, which the caller must keep:

* Gains and leaf values are computed with unit hessians (``h_i = 1``, DPBoost's analysis of
  the square loss): with the logistic loss's ``h = p (1 - p)``, ``G^2 / (H + lambda)`` can grow
  with the node's size when ``H`` is near 0, and no constant bounds its change. FedTree uses
  the same constants with the loss's hessians, which these bounds do not cover.
* Leaf noise is added to ``-G / (H + lambda)`` before the learning rate (or with its scale
  multiplied by the rate).
* Our ``boosting.split.split_gains`` is half of DPBoost's gain (parent term included) minus
  ``gamma``; ``1.5 g*^2`` bounds the change of the whole expression (tested).

What is and is not protected: DP protects the released model (its splits and leaf values)
against anyone who sees it, including the members. It does not protect anything from the
aggregator, which sees the exact summed histograms of every node, nor the quantile summaries
that fix the cuts (see ``summary``), nor the node sizes: which candidates are valid
(``min_samples_leaf``, ``min_child_weight``) depends on the data and is not randomized, as in
DPBoost and FedTree. Secure aggregation hides each member's histograms from the aggregator;
DP hides each row from the model's users. Neither replaces the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from boosting._typing import FloatArray


@dataclass(frozen=True, slots=True)
class PrivacyBudget:
    """A total ``epsilon`` spread over ``n_trees`` trees (every tree grown, e.g. rounds x
    classes in multiclass) of depth at most ``max_depth``."""

    epsilon: float
    n_trees: int
    max_depth: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"privacy epsilon must be a positive number, got {self.epsilon}")
        if self.n_trees < 1 or self.max_depth < 1:
            raise ValueError(f"privacy budget needs n_trees >= 1 and max_depth >= 1, got "
                             f"{self.n_trees} and {self.max_depth}")

    def tree_epsilon(self) -> float:
        """Each tree's share (sequential composition over trees)."""
        return self.epsilon / self.n_trees

    def split_epsilon(self) -> float:
        """Epsilon of each node's split choice: half a tree's share over its levels."""
        return self.tree_epsilon() / 2 / self.max_depth

    def leaf_epsilon(self) -> float:
        """Epsilon of each leaf's noise: the other half (leaves hold disjoint rows)."""
        return self.tree_epsilon() / 2


def spent(budget: PrivacyBudget, trees_trained: int) -> float:
    """Epsilon used by the first ``trees_trained`` trees.

    A tree that stops before ``max_depth`` has still been charged its levels: the unused
    split budget is not given back (it could be, but that would make the spend data-dependent).

    Raises
    ------
    ValueError
        If ``trees_trained`` is negative or more than the budget's ``n_trees``.
    """
    if not 0 <= trees_trained <= budget.n_trees:
        raise ValueError(f"{trees_trained} trees trained, budget is for {budget.n_trees}")
    return budget.tree_epsilon() * trees_trained


def clip_gradients(g: FloatArray, bound: float) -> FloatArray:
    """Gradients clipped to ``[-bound, bound]`` (DPBoost's ``g*``).

    Raises
    ------
    ValueError
        If ``bound`` is not a positive number.
    """
    _positive("gradient bound", bound)
    clipped: FloatArray = np.clip(g, -bound, bound)
    return clipped


def gain_sensitivity(bound: float, reg_lambda: float) -> float:
    """``1.5 g*^2``: how much one row can change a gain of ``boosting.split.split_gains``,
    with unit hessians. DPBoost bounds its gain ``GL^2/(HL+l) + GR^2/(HR+l) - G^2/(H+l)`` by
    ``3 g*^2``; ``split_gains`` is half of it (minus ``gamma``, the same for every candidate),
    so half the bound holds (tested: a large node reaches about ``1.5 g*^2``). It holds for
    every ``lambda >= 0``, so ``reg_lambda`` is only checked; it does NOT shrink with lambda.
    """
    _positive("gradient bound", bound)
    if reg_lambda < 0:
        raise ValueError(f"reg_lambda must be >= 0, got {reg_lambda}")
    return 1.5 * bound * bound


def leaf_sensitivity(bound: float, reg_lambda: float) -> float:
    """``g* / (1 + lambda)``: how much one row can change ``-G / (H + lambda)`` (DPBoost)."""
    _positive("gradient bound", bound)
    if reg_lambda < 0:
        raise ValueError(f"reg_lambda must be >= 0, got {reg_lambda}")
    return bound / (1.0 + reg_lambda)


def exponential_probabilities(gains: npt.NDArray[np.float64], epsilon: float,
                              sensitivity: float) -> FloatArray:
    """Probabilities of the exponential mechanism over ``gains.flat``; 0 where not finite."""
    _positive("epsilon", epsilon)
    _positive("sensitivity", sensitivity)
    flat = np.asarray(gains, dtype=np.float64).ravel()
    finite = np.isfinite(flat)
    probs = np.zeros(flat.size)
    if not finite.any():
        return probs
    scores = epsilon * flat[finite] / (2.0 * sensitivity)
    weights = np.exp(scores - scores.max())  # the best has weight 1: no overflow
    probs[finite] = weights / weights.sum()
    return probs


def exponential_choice(gains: npt.NDArray[np.float64], epsilon: float, sensitivity: float,
                       rng: np.random.Generator) -> int | None:
    """A flat index into ``gains`` drawn with probability proportional to
    ``exp(epsilon * gain / (2 * sensitivity))`` among the finite entries (``-inf`` marks an
    invalid candidate); None if there is none.

    Raises
    ------
    ValueError
        If ``epsilon`` or ``sensitivity`` is not a positive number.
    """
    probs = exponential_probabilities(gains, epsilon, sensitivity)
    if not probs.any():
        return None
    return int(rng.choice(probs.size, p=probs))


def laplace_noise(values: FloatArray, epsilon: float, sensitivity: float,
                  rng: np.random.Generator) -> FloatArray:
    """``values`` plus independent Laplace noise of scale ``sensitivity / epsilon``.

    Raises
    ------
    ValueError
        If ``epsilon`` or ``sensitivity`` is not a positive number.
    """
    _positive("epsilon", epsilon)
    _positive("sensitivity", sensitivity)
    values = np.asarray(values, dtype=np.float64)
    noisy: FloatArray = values + rng.laplace(0.0, sensitivity / epsilon, size=values.shape)
    return noisy


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value}")
