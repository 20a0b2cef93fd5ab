"""A horizontal member's draws of its own rows: the rows of each tree (``subsample < 1``) and,
under differential privacy, the tree of its ensemble each row is dealt to (DPBoost).

The aggregator sees their outcome: every root it opens counts the in-tree rows of all members.
Drawn from a seed in the job spec (as before issue 36) they were its to replay: each member's
mask of every tree, hence which row position is in which sum, and from the root counts each
row's bins by linear programming. So they come from a secret of the member's alone,
:func:`member_secret`: its checkpoint key (``workers.checkpoint.key_of``, never sent) keyed
with the job's digest (the spec and this member's data, ``checkpoint.job_digest``). The same
job over the same data draws the same rows: a resumed run grows the uninterrupted model, and a
job run again (under any name) shows the aggregator the sums it already had; any other spec
or data draws afresh. ``tests/privacy/test_horizontal_seeds.py`` replays every integer of the
spec and of the aggregator's messages against the root counts and predicts nothing.

Under DP a member takes its dealt rows of a tree only if the tree expects at least the floor
of them (``boosting.privacy.PrivacyPlan.takes``): its row count plus Laplace noise drawn from
its own secret (one draw per ensemble), times the tree's share, must reach the smallest mean
whose Poisson count falls below :func:`floor_rows` with probability ``COUNT_MISS`` at most;
otherwise they sit the tree out (as DPBoost's gradient filter has rows sit a tree out). The
decision is epsilon-DP in the one row it may gain or lose and is paid from the ensemble's share
(``count_share``), so the released model keeps its epsilon across the floor (docs/privacy.md,
"The floor"), and the aggregator sees a root over 1 to ``floor - 1`` rows of one member with
probability below about ``COUNT_MISS`` per tree.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt

from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan
from workers.keyed_draws import dealt_rows, derive_key, keyed_generator

DEALT_ROWS_FLOOR = 10
"""Fewest rows of one member a private tree or node shows the aggregator (but with probability
``COUNT_MISS``): a sum over one row shows it that row's bin in every feature and its label
(issue 36: trees of one row under the tuned settings). The noisy threshold that enforces it
sits above it (``PrivacyPlan.count_threshold``, docs/privacy.md)."""

COUNT_MISS = 0.05
"""The floors' ``count_miss`` (``boosting.privacy.PrivacyPlan``): the largest probability that
``floor - 1`` rows pass."""

COUNT_SHARE = 0.1
"""Share of each ensemble's epsilon that pays for the count floors of a horizontal job (the
members' root decisions and the aggregator's at deeper nodes); tuned with
``benchmarks.dp_core --count-share`` (docs/privacy.md, "Measured")."""


def member_secret(party_key: bytes, digest: str) -> bytes:
    """This member's secret of one job: HMAC of its checkpoint key over the job's digest."""
    return derive_key(party_key, "horizontal row draws v1", digest)


def floor_rows(params: BoostParams) -> int:
    """The floor of a private tree's or node's rows: :data:`DEALT_ROWS_FLOOR`, or the job's
    ``min_samples_leaf`` if larger (under DP it cannot act on the splits)."""
    return max(DEALT_ROWS_FLOOR, params.min_samples_leaf)


def floored_plan(plan: PrivacyPlan, params: BoostParams) -> PrivacyPlan:
    """``plan`` with the horizontal protocol's count floors: :func:`floor_rows` at
    :data:`COUNT_SHARE` of each ensemble's epsilon, missed with probability :data:`COUNT_MISS`."""
    return replace(plan, count_floor=floor_rows(params), count_share=COUNT_SHARE,
                   count_miss=COUNT_MISS)


def private_rows(secret: bytes, plan: PrivacyPlan, tree: int, in_tree: npt.NDArray[np.bool_],
                 subsample: float = 1.0) -> npt.NDArray[np.bool_]:
    """Tree ``tree``'s rows under DP: those of ``in_tree`` (the member's ``subsample``) dealt to
    it, or none if the member's noisy row count of the ensemble does not expect the floor in
    it (``PrivacyPlan.takes``; the noise from ``secret``: the aggregator cannot replay it)."""
    ensemble, position = plan.ensemble_of(tree)
    rows = in_tree & (dealt_rows(secret, plan, ensemble, in_tree.size) == position)
    noise = keyed_generator(derive_key(secret, "floor", str(ensemble)))
    if not plan.takes(in_tree.size, tree, subsample, noise):
        return np.zeros_like(rows)
    # and never fewer than the floor itself: the noisy decision expects the floor, and a
    # dealing that falls short (at most COUNT_MISS of the time) would show the aggregator a
    # root of 1 to floor - 1 of this member's rows (the exact check of the dealt count costs
    # group privacy over the floor's rows in that tail only; docs/privacy.md, "The floor")
    if int(rows.sum()) < DEALT_ROWS_FLOOR:
        return np.zeros_like(rows)
    return rows
