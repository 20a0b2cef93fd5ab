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

Under DP a member also keeps every tree it takes rows into above a floor,
:func:`floor_rows`: a tree dealt fewer of its rows than that gets none of them (they sit the
tree out, as DPBoost's gradient filter has rows sit a tree out), so no root the aggregator
opens holds 1 to ``floor - 1`` rows of one member (docs/privacy.md, "The floor").
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan, deal_rows
from workers.keyed_draws import derive_key, keyed_generator, uniform

DEALT_ROWS_FLOOR = 10
"""Fewest rows of one member a private tree takes (or none): a root sum over one row shows the
aggregator that row's bin in every feature and its label (issue 36: trees of one row under the
tuned settings). Ten keeps each root count per bin a count over ten rows; with the tuned
settings the trees it empties are those whose share is below about 10 of a member's rows
(``eta (1 - eta)^t n``), whose leaves are mostly their noise (docs/privacy.md)."""


def member_secret(party_key: bytes, digest: str) -> bytes:
    """This member's secret of one job: HMAC of its checkpoint key over the job's digest."""
    return derive_key(party_key, "horizontal row draws v1", digest)


def in_tree_rows(secret: bytes, tree: int, n_rows: int, subsample: float) -> npt.NDArray[np.bool_]:
    """Tree ``tree``'s row subsample: each row in with probability ``subsample``."""
    if subsample >= 1.0:
        return np.ones(n_rows, dtype=bool)
    rows: npt.NDArray[np.bool_] = uniform(derive_key(secret, "subsample", str(tree)),
                                          n_rows) < subsample
    return rows


def dealt_rows(secret: bytes, plan: PrivacyPlan, ensemble: int,
               n_rows: int) -> npt.NDArray[np.int64]:
    """Each row's tree (position) in ``ensemble`` (``boosting.privacy.deal_rows``)."""
    return deal_rows(plan, ensemble, n_rows,
                     keyed_generator(derive_key(secret, "dealing", str(ensemble))))


def floor_rows(params: BoostParams) -> int:
    """The floor of a private tree's rows at one member: :data:`DEALT_ROWS_FLOOR`, or the
    job's ``min_samples_leaf`` if larger (under DP it cannot act on the splits)."""
    return max(DEALT_ROWS_FLOOR, params.min_samples_leaf)


def private_rows(secret: bytes, plan: PrivacyPlan, tree: int, in_tree: npt.NDArray[np.bool_],
                 floor: int) -> npt.NDArray[np.bool_]:
    """Tree ``tree``'s rows under DP: those of ``in_tree`` dealt to it, or none if fewer than
    ``floor``."""
    ensemble, position = plan.ensemble_of(tree)
    rows = in_tree & (dealt_rows(secret, plan, ensemble, in_tree.size) == position)
    if int(rows.sum()) < floor:
        return np.zeros_like(rows)
    return rows
