"""The active party's draws of its training rows in SecureBoost: each tree's row subsample
(``subsample < 1``) and, under differential privacy, the tree of its ensemble each row is dealt
to (DPBoost).

A passive party is sent the outcome of the trees it takes part in (``TreeStart.in_tree``, the
instance space it sums over), by design. Drawn from the job spec's ``params.seed`` (as before
issue 36), they were also its to replay before they were sent and for the trees it takes no part
in (Completely SecureBoost's first round, whose rows it is never shown), and to anyone else who
reads the spec. So they come from a secret of the active party alone, :func:`active_secret`: its
checkpoint key (``workers.checkpoint.key_of``, never sent) keyed with the job's digest (the spec
and its data, ``checkpoint.job_digest``), as a horizontal member draws its rows
(``workers.keyed_draws``' row draws, as a horizontal member's, under another secret). The same job
over the same data draws the same rows, so a resumed run grows the uninterrupted model; the
centralized core takes the same draws (``boosting.train.train(in_tree=...)``) for the lossless
tests. ``tests/privacy/test_public_seeds.py`` replays every integer of the spec and of a
passive party's messages and predicts none of its instance spaces.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from boosting.privacy import PrivacyPlan
from workers.keyed_draws import dealt_rows, derive_key, in_tree_rows

__all__ = ["active_secret", "dealt_rows", "in_tree_rows", "tree_rows"]


def active_secret(party_key: bytes, digest: str) -> bytes:
    """The active party's secret of one job: HMAC of its checkpoint key over the job's digest."""
    return derive_key(party_key, "vertical row draws v1", digest)


def tree_rows(secret: bytes, tree: int, n_rows: int, subsample: float,
              plan: PrivacyPlan | None = None) -> npt.NDArray[np.bool_]:
    """The rows of tree ``tree``: its subsample, and under ``plan`` those of them dealt to it."""
    rows = in_tree_rows(secret, tree, n_rows, subsample)
    if plan is None:
        return rows
    ensemble, position = plan.ensemble_of(tree)
    out: npt.NDArray[np.bool_] = rows & (dealt_rows(secret, plan, ensemble, n_rows) == position)
    return out
