"""Differential privacy of a released GBDT, after DPBoost (Q. Li, Z. Wu, Z. Wen, B. He,
"Privacy-Preserving Gradient Boosting Decision Trees", AAAI 2020), FedTree's DP lineage.

Pure maths, no parties: the horizontal aggregator, the vertical active party and the
in-process benchmark all call these functions. What they protect is the released model (its
splits and leaf values) against anyone who sees it; neighbouring data sets differ by one row
(added or removed).

Mechanisms (DPBoost section 4):

* **Gradient clipping**: every row's ``g`` is clipped to ``[-g*, g*]``
  (:func:`clip_gradients`), so every sensitivity below is in terms of ``g*``; the clip depends
  on the row alone. DPBoost filters instead (GDF: a row beyond ``g*`` sits the tree out), which
  the same sensitivities allow; clipping keeps those rows in with ``g = ±g*``, so a ``g*``
  below the loss's own bound (1 for the logistic loss) is usable: the sensitivities shrink
  with ``g*^2`` and ``g*`` while a binary row's clipped gradient still says its label
  (docs/privacy.md, "Measured"). Hessians are taken as 1 (DPBoost's analysis, the square
  loss's): ``G^2 / (H + lambda)`` has no bounded sensitivity when ``H`` can be near 0.
* **Exponential mechanism** for each node's split (:func:`exponential_choice`): candidate ``i``
  is drawn with probability proportional to ``exp(eps * gain_i / (2 * dG))``, ``dG = 1.5 g*^2``
  (:func:`gain_sensitivity`; DPBoost's ``3 g*^2``, halved because ``boosting.split`` gains are
  half DPBoost's). Every (feature, bin, missing direction) is a candidate, empty children
  included, and a node above ``max_depth`` is always split: which candidates exist and whether
  a node splits are then public, not data-dependent.
* **Laplace mechanism** on each leaf value ``-G / (n + lambda)`` (:func:`laplace_noise`), after
  **geometric leaf clipping (GLC)** to ``g* (1 - eta)^t`` for the ``t``-th tree of an ensemble
  (:meth:`PrivacyPlan.leaf_bound`): the sensitivity is ``min(g* / (1 + lambda), 2 g* (1 - eta)^t)``
  (:meth:`PrivacyPlan.leaf_sensitivity`), DPBoost's Theorem 3; it holds whatever the data.

Composition (:class:`PrivacyPlan`): the trees form ensembles of ``trees_per_ensemble``; inside
one ensemble every row is dealt to one tree at random before training (shares
``eta (1 - eta)^t``, DPBoost Algorithm 2 line 8: :meth:`PrivacyPlan.row_shares`), so the trees
of an ensemble read disjoint rows and compose in parallel; ensembles read every row again and
compose sequentially. Each ensemble gets ``epsilon / n_ensembles``; in a tree half of it goes to
the leaves (disjoint rows: parallel) and half to the splits, ``/ max_depth`` per level (a
level's nodes hold disjoint rows: parallel). A root-to-leaf path thus spends ``max_depth``
split shares and one leaf share: the ensemble's epsilon.

Its lines on purpose: the plan's budget split and the mechanisms that spend it are one
accounting, read together (every share named in :class:`PrivacyPlan` is spent by a function
below).

**Count floors** (``count_floor > 0``, the horizontal protocol's; issue 36): whoever would open
the sums of a node of few rows (the horizontal aggregator reads every bin of every node it
builds) first asks a **noisy threshold** whether it holds enough rows:
``count + Laplace(1 / count_epsilon) >= count_threshold`` (:meth:`PrivacyPlan.opens`), the
count's sensitivity being 1. The children of a split are split further only if both pass
(``boosting.grow.open_children``: one open child's histograms, subtracted from its parent's,
would be the other's), else both are leaves whose histograms are never built; a horizontal
member whose rows of a tree fail it puts none of them in (the root's decision, drawn from its
own secret). ``count_share`` of each ensemble's epsilon pays for them, ``/ max_depth``
per level (the member's root decision and the aggregator's at depths 1 to ``max_depth - 1``);
splits and leaves share the rest as above, so a path still spends the ensemble's epsilon. The
threshold sits ``ln(1 / (2 count_miss)) / count_epsilon`` above the floor: a node of fewer
than ``count_floor`` rows passes with probability below ``count_miss`` (docs/privacy.md, "The
floor"). Above the last level the splits are drawn among the **roomy candidates** only
(:func:`roomy_candidates`): those whose smaller side can expect ``ROOMY_SIDE`` thresholds of
rows by the set-up's union counts per bin, so that the draw rarely picks a split the floor
would then close.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from boosting import BoostingError
from boosting._typing import FloatArray, Histogram
from boosting.params import BoostParams
from boosting.split import NodeTotals, SplitCandidate, candidate_at, split_gains


ROOMY_SIDE = 2.0
"""Under count floors, how many count thresholds a candidate's smaller side must expect in a
tree to stay a candidate at the levels whose children the floor checks
(:meth:`PrivacyPlan.roomy`, :func:`roomy_candidates`); picked on a holdout of the training
rows among 0.5, 1, 2, 3 and 4 (docs/privacy.md, "With the count floors")."""

COUNT_MISS = 0.01
"""The default ``count_miss``: the largest probability that a node (or a member's rows of a
tree) of ``count_floor - 1`` rows passes the noisy threshold (fewer rows: less; one row
``count_miss exp(-(floor - 2) count_epsilon)``)."""


@dataclass(frozen=True, slots=True)
class PrivacyPlan:
    """Where a total ``epsilon`` goes over ``n_trees`` trees of depth ``max_depth``.

    ``n_trees`` counts every tree grown (rounds x classes in multiclass); ``learning_rate``
    is DPBoost's ``eta`` (row shares and leaf clipping); ``bound`` is ``g*``;
    ``count_floor``, ``count_share`` and ``count_miss``: the noisy count floors (module
    docstring; 0: none, every node of a full tree is split).
    """

    epsilon: float
    n_trees: int
    max_depth: int
    trees_per_ensemble: int
    bound: float
    reg_lambda: float
    learning_rate: float
    count_floor: int = 0
    count_share: float = 0.0
    count_miss: float = COUNT_MISS

    def __post_init__(self) -> None:
        _positive("privacy epsilon", self.epsilon)
        _positive("gradient bound", self.bound)
        if self.count_floor < 0 or not 0 <= self.count_share < 1 or \
                (self.count_floor > 0) != (self.count_share > 0):
            raise BoostingError(f"a count floor needs count_floor >= 1 and count_share in "
                                f"(0, 1), or both 0; got {self.count_floor} and "
                                f"{self.count_share}")
        if not 0 < self.count_miss < 0.5:
            raise BoostingError(f"count_miss must be in (0, 0.5), got {self.count_miss}")

        if self.n_trees < 1 or self.max_depth < 1 or self.trees_per_ensemble < 1:
            raise BoostingError(f"a privacy plan needs n_trees, max_depth and trees_per_ensemble "
                                f">= 1, got {self.n_trees}, {self.max_depth} and "
                                f"{self.trees_per_ensemble}")
        if not (math.isfinite(self.reg_lambda) and self.reg_lambda > 0):
            # an empty leaf's -G / (n + lambda) and an empty child's gain need lambda > 0
            raise BoostingError(f"differential privacy needs reg_lambda > 0, got "
                                f"{self.reg_lambda}")
        if not 0 < self.learning_rate <= 1:
            raise BoostingError(f"learning_rate must be in (0, 1], got {self.learning_rate}")

    @property
    def n_ensembles(self) -> int:
        return -(-self.n_trees // self.trees_per_ensemble)

    def ensemble_epsilon(self) -> float:
        """Each ensemble's share (sequential composition over ensembles)."""
        return self.epsilon / self.n_ensembles

    def split_epsilon(self) -> float:
        """Epsilon of each node's split choice: half an ensemble's share (less the count
        floors') over the levels (a level's nodes hold disjoint rows)."""
        return self.ensemble_epsilon() * (1.0 - self.count_share) / 2 / self.max_depth

    def leaf_epsilon(self) -> float:
        """Epsilon of each leaf's noise: the other half (leaves hold disjoint rows)."""
        return self.ensemble_epsilon() * (1.0 - self.count_share) / 2

    def count_epsilon(self) -> float:
        """Epsilon of each count floor's decision: ``count_share`` of the ensemble's share over
        the levels (0 without floors)."""
        return self.ensemble_epsilon() * self.count_share / self.max_depth

    def count_threshold(self) -> float:
        """What a noisy count must reach: the floor plus ``ln(1 / (2 count_miss)) /
        count_epsilon``, so that ``floor - 1`` rows pass with probability ``count_miss``."""
        if self.count_floor == 0:
            return 0.0
        return self.count_floor + math.log(1.0 / (2.0 * self.count_miss)) / self.count_epsilon()

    def expected_floor(self) -> float:
        """The fewest rows a tree must *expect* of a member for it to take them: the smallest
        mean ``mu`` (to 0.01) whose Poisson count is below ``count_floor`` with probability at
        most ``count_miss``. A member's dealt count is binomial of mean ``n q share_t``, whose
        lower tail is the Poisson's or thinner: a tree taken with this expectation holds fewer
        than ``count_floor`` of its rows with probability at most ``count_miss``."""
        if self.count_floor == 0:
            return 0.0
        return _poisson_floor(self.count_floor, self.count_miss)

    def roomy(self, tree: int, candidates: npt.NDArray[np.bool_],
              bin_counts: npt.NDArray[np.int64], subsample: float = 1.0,
              side: float = ROOMY_SIDE) -> npt.NDArray[np.bool_] | None:
        """Tree ``tree``'s roomy candidates (:func:`roomy_candidates`): a smaller side must
        expect ``side`` count thresholds of the tree's ``subsample x`` dealt share of the rows.
        None without floors or with ``side`` 0 (every candidate at every level)."""
        if self.count_floor == 0 or side == 0:
            return None
        ensemble, position = self.ensemble_of(tree)
        share = subsample * float(self.row_shares(ensemble)[position])
        return roomy_candidates(candidates, bin_counts, share, side * self.count_threshold())

    def takes(self, rows: int, tree: int, subsample: float, rng: np.random.Generator) -> bool:
        """A member's root decision: whether its ``rows`` rows (all of them, before the
        subsample ``subsample`` and the dealing) go into tree ``tree``: ``rows + Laplace(1 /
        count_epsilon)`` times the tree's expected share ``subsample * share_t`` reaches
        :meth:`expected_floor` (one draw; always True, drawing nothing, without floors). One
        noisy count per member and ensemble decides all the ensemble's trees: ``rng`` is
        created afresh from the same seed (or key) of the ensemble for each of its trees."""
        if self.count_floor == 0:
            return True
        ensemble, position = self.ensemble_of(tree)
        noisy = rows + float(rng.laplace(0.0, 1.0 / self.count_epsilon()))
        return noisy * subsample * float(self.row_shares(ensemble)[position]) \
            >= self.expected_floor()

    def opens(self, count: int, rng: np.random.Generator) -> bool:
        """The noisy threshold: ``count + Laplace(1 / count_epsilon) >= count_threshold``
        (one draw from ``rng``); always True, drawing nothing, without count floors."""
        if self.count_floor == 0:
            return True
        noisy = count + float(rng.laplace(0.0, 1.0 / self.count_epsilon()))
        return noisy >= self.count_threshold()

    def ensemble_of(self, tree: int) -> tuple[int, int]:
        """(ensemble, position in it) of tree number ``tree``."""
        self._check_tree(tree)
        return divmod(tree, self.trees_per_ensemble)

    def ensemble_size(self, ensemble: int) -> int:
        """Trees in ensemble ``ensemble`` (the last may be shorter)."""
        return min(self.trees_per_ensemble, self.n_trees - ensemble * self.trees_per_ensemble)

    def row_shares(self, ensemble: int) -> FloatArray:
        """Probability that a row is dealt to each tree of ``ensemble``: ``eta (1 - eta)^t``,
        normalised (DPBoost Algorithm 2, line 8: later trees fit smaller residuals)."""
        t = np.arange(self.ensemble_size(ensemble), dtype=np.float64)
        shares = (1.0 - self.learning_rate) ** t
        if not shares.sum() > 0:  # eta = 1: DPBoost's shares vanish after the first tree
            shares = np.ones_like(t)
        normalised: FloatArray = shares / shares.sum()
        return normalised

    def leaf_bound(self, tree: int) -> float:
        """GLC: ``|-G / (n + lambda)|`` is clipped to ``g* (1 - eta)^t``, ``t`` the tree's
        position in its ensemble."""
        return self.bound * (1.0 - self.learning_rate) ** self.ensemble_of(tree)[1]

    def leaf_sensitivity(self, tree: int) -> float:
        """``min(g* / (1 + lambda), 2 g* (1 - eta)^t)``: one row changes an unclipped leaf by at
        most the first (:func:`leaf_sensitivity`), a clipped one by at most its range."""
        return min(leaf_sensitivity(self.bound, self.reg_lambda), 2.0 * self.leaf_bound(tree))

    def gain_sensitivity(self) -> float:
        return gain_sensitivity(self.bound, self.reg_lambda)

    def spent(self, trees_trained: int) -> float:
        """Epsilon used by the first ``trees_trained`` trees: a started ensemble has spent its
        whole share (its trees compose in parallel), so the spend steps per ensemble.

        Raises
        ------
        BoostingError
            If ``trees_trained`` is negative or more than ``n_trees``.
        """
        if not 0 <= trees_trained <= self.n_trees:
            raise BoostingError(f"{trees_trained} trees trained, the plan is for {self.n_trees}")
        return self.ensemble_epsilon() * -(-trees_trained // self.trees_per_ensemble)

    def _check_tree(self, tree: int) -> None:
        if not 0 <= tree < self.n_trees:
            raise BoostingError(f"tree {tree} outside the plan's {self.n_trees} trees")


def deal_rows(plan: PrivacyPlan, ensemble: int, n_rows: int,
              rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Each row's tree (position) in ``ensemble``, drawn independently of the data: a row
    added or removed changes one tree's rows only (parallel composition)."""
    shares = plan.row_shares(ensemble)
    dealt: npt.NDArray[np.int64] = rng.choice(shares.size, size=n_rows, p=shares).astype(np.int64)
    return dealt


def clip_leaf(value: float, bound: float) -> float:
    """GLC: a leaf value clipped to ``[-bound, bound]``."""
    return float(np.clip(value, -bound, bound))


def clip_gradients(g: FloatArray, bound: float) -> FloatArray:
    """Gradients clipped to ``[-bound, bound]`` (DPBoost's ``g*``).

    Raises
    ------
    BoostingError
        If ``bound`` is not a positive number.
    """
    _positive("gradient bound", bound)
    clipped: FloatArray = np.clip(g, -bound, bound)
    return clipped


def gain_sensitivity(bound: float, reg_lambda: float) -> float:
    """``1.5 g*^2``: how much one row can change a gain of ``boosting.split.split_gains``,
    with unit hessians. DPBoost bounds its gain ``GL^2/(nL+l) + GR^2/(nR+l) - G^2/(n+l)`` by
    ``3 g*^2``; ``split_gains`` is half of it (minus ``gamma``, the same for every candidate),
    so half the bound holds (tested: a large node reaches about ``1.5 g*^2``). It holds for
    every ``lambda >= 0``, so ``reg_lambda`` is only checked; it does NOT shrink with lambda.
    """
    _positive("gradient bound", bound)
    if reg_lambda < 0:
        raise BoostingError(f"reg_lambda must be >= 0, got {reg_lambda}")
    return 1.5 * bound * bound


def leaf_sensitivity(bound: float, reg_lambda: float) -> float:
    """``g* / (1 + lambda)``: how much one row can change ``-G / (n + lambda)`` (DPBoost; the
    worst case is an empty leaf gaining a row)."""
    _positive("gradient bound", bound)
    if reg_lambda < 0:
        raise BoostingError(f"reg_lambda must be >= 0, got {reg_lambda}")
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
    ``exp(epsilon * gain / (2 * sensitivity))`` among the finite entries (``-inf`` marks a
    candidate that is not one); None if there is none.

    Raises
    ------
    BoostingError
        If ``epsilon`` or ``sensitivity`` is not a positive number.
    """
    probs = exponential_probabilities(gains, epsilon, sensitivity)
    if not probs.any():
        return None
    return int(rng.choice(probs.size, p=probs))


def split_candidates(n_cuts: list[int], max_bin: int) -> npt.NDArray[np.bool_]:
    """The (features, 2, max_bin) mask of :func:`boosting.split.split_gains` candidates that
    separate two bins of the public cuts (``n_cuts[f]`` bins of feature ``f``), both missing
    directions: the same set whatever the rows."""
    bins = np.arange(max_bin)
    mask = np.stack([bins < n - 1 for n in n_cuts])[:, None, :]
    return np.repeat(mask, 2, axis=1)


def roomy_candidates(candidates: npt.NDArray[np.bool_], bin_counts: npt.NDArray[np.int64],
                     expected_share: float, least: float) -> npt.NDArray[np.bool_] | None:
    """``candidates`` less those whose smaller side cannot expect ``least`` rows in any node
    of a tree; None if that leaves none (then every candidate stays).

    ``bin_counts`` (features x ``max_bin + 1``, the last column the missing values) are the
    union's rows per bin, from the set-up's counts as the cuts are; a node's side holds at most
    the rows of its bins, of which a tree expects ``expected_share``. The count floor would
    close such a split's children (both, for the small one: issue 36 measured it costing
    epsilon 1 its goal), so the exponential mechanism's draw is kept off them. The set depends
    on the set-up's counts and public shares alone: it spends no epsilon, and is outside the
    guarantee as the cuts are (docs/privacy.md)."""
    present = bin_counts[:, :-1].cumsum(axis=1)  # rows at or below each bin, values only
    missing = bin_counts[:, -1:]
    total = present[:, -1:] + missing
    left = np.stack([present, present + missing], axis=1)  # direction 1: missing go left
    smaller = np.minimum(left, total[:, None, :] - left) * expected_share
    roomy: npt.NDArray[np.bool_] = candidates & (smaller >= least)
    return roomy if roomy.any() else None


def private_split(hists: dict[int, Histogram], totals: NodeTotals, g_scale: float,
                  h_scale: float, params: BoostParams,
                  candidates: dict[int, npt.NDArray[np.bool_] | None], epsilon: float,
                  sensitivity: float, rng: np.random.Generator) -> SplitCandidate | None:
    """A node's split by the exponential mechanism: one draw over the candidates of every
    block (``hists[block]``, masked by ``candidates.get(block)``, None: every bin), gains of
    unit hessians. None only if there is no candidate at all."""
    gains = {b: split_gains(hist, totals, g_scale, h_scale, params, constrained=False)
             for b, hist in hists.items()}
    masked = [g if (mask := candidates.get(b)) is None else np.where(mask, g, -np.inf)
              for b, g in gains.items()]
    picked = exponential_choice(np.concatenate([m.ravel() for m in masked]), epsilon,
                                sensitivity, rng)
    if picked is None:
        return None
    for block, g in gains.items():
        if picked < g.size:
            return candidate_at(picked, g, block)
        picked -= g.size
    raise AssertionError("unreachable: the pick is inside the concatenated gains")


@dataclass(slots=True)
class PrivateTree:
    """One tree's private choices: its splits (exponential mechanism) and leaves (GLC and
    Laplace), with the tree's own noise source."""

    plan: PrivacyPlan
    tree: int
    candidates: dict[int, npt.NDArray[np.bool_] | None]
    """Per feature block, :func:`split_candidates` (absent or None: every bin)."""
    rng: np.random.Generator
    roomy: dict[int, npt.NDArray[np.bool_] | None] | None = None
    """Under count floors, the candidates :func:`roomy_candidates` leaves, drawn from at the
    levels whose children the floor checks (None: ``candidates`` at every level)."""

    def choose(self, hists: dict[int, Histogram], totals: NodeTotals, g_scale: float,
               h_scale: float, params: BoostParams, depth: int = 0) -> SplitCandidate | None:
        """Node at ``depth``'s split (the roomy candidates above the last level, when any)."""
        candidates = self.candidates
        if self.roomy is not None and depth + 1 < self.plan.max_depth:
            candidates = self.roomy
        return private_split(hists, totals, g_scale, h_scale, params, candidates,
                             self.plan.split_epsilon(), self.plan.gain_sensitivity(), self.rng)

    def opens(self, count: int) -> bool:
        """Whether a child of ``count`` rows is split further (its histograms built): the
        plan's noisy count floor (:meth:`PrivacyPlan.opens`), from the tree's noise source."""
        return self.plan.opens(count, self.rng)

    def leaves(self, g_sums: FloatArray, counts: FloatArray) -> FloatArray:
        """Leaf values before the learning rate (:func:`private_leaves`)."""
        return private_leaves(g_sums, counts, self.plan, self.tree, self.rng)


def tree_rng(seed: int | None, tree: int, attempt: int = 0) -> np.random.Generator:
    """A tree's noise source: from the job's ``privacy.seed`` (experiments only: who knows it
    can remove the noise; a resumed job then draws the same noise) or fresh from the OS."""
    return np.random.default_rng(None if seed is None else [seed, tree, attempt])


def laplace_noise(values: FloatArray, epsilon: float, sensitivity: float,
                  rng: np.random.Generator) -> FloatArray:
    """``values`` plus independent Laplace noise of scale ``sensitivity / epsilon``.

    Raises
    ------
    BoostingError
        If ``epsilon`` or ``sensitivity`` is not a positive number.
    """
    _positive("epsilon", epsilon)
    _positive("sensitivity", sensitivity)
    values = np.asarray(values, dtype=np.float64)
    noisy: FloatArray = values + rng.laplace(0.0, sensitivity / epsilon, size=values.shape)
    return noisy


def private_leaves(g_sums: FloatArray, counts: FloatArray, plan: PrivacyPlan, tree: int,
                   rng: np.random.Generator) -> FloatArray:
    """Leaf values of tree ``tree`` before the learning rate: ``-G / (n + lambda)`` (unit
    hessians), clipped (GLC) and with Laplace noise of scale
    ``leaf_sensitivity(tree) / leaf_epsilon``."""
    raw = -np.asarray(g_sums, dtype=np.float64) / (
        np.asarray(counts, dtype=np.float64) + plan.reg_lambda)  # lambda > 0: planned
    bound = plan.leaf_bound(tree)
    return laplace_noise(np.clip(raw, -bound, bound), plan.leaf_epsilon(),
                         plan.leaf_sensitivity(tree), rng)


@functools.lru_cache(maxsize=64)
def _poisson_floor(floor: int, miss: float) -> float:
    """The smallest mean (a multiple of 0.01) whose Poisson count is below ``floor`` with
    probability at most ``miss``."""
    steps = 100 * floor
    while _poisson_below(steps / 100, floor) > miss:
        steps += 1
    return steps / 100


def _poisson_below(mu: float, k: int) -> float:
    """``P(X < k)`` for ``X ~ Poisson(mu)``."""
    term, total = math.exp(-mu), 0.0
    for j in range(k):
        total += term
        term *= mu / (j + 1)
    return total


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise BoostingError(f"{name} must be a positive number, got {value}")
