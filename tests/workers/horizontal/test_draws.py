"""A member's row draws (``workers.horizontal.draws``): the same secret draws the same rows
(resume), another member's or another job's secret draws others, and under DP a tree takes
none of a member's rows or at least the floor."""

from __future__ import annotations

import numpy as np

from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan
from workers.horizontal.draws import (DEALT_ROWS_FLOOR, dealt_rows, floor_rows, in_tree_rows,
                                      member_secret, private_rows)

KEY_A, KEY_B = bytes(range(32)), bytes(range(1, 33))


def test_the_same_key_and_job_draw_the_same_rows_and_any_other_draws_others() -> None:
    secret = member_secret(KEY_A, "digest-1")
    assert secret == member_secret(KEY_A, "digest-1")
    rows = in_tree_rows(secret, 3, 500, 0.8)
    assert np.array_equal(rows, in_tree_rows(member_secret(KEY_A, "digest-1"), 3, 500, 0.8))
    assert 0.7 < rows.mean() < 0.9
    for other in (in_tree_rows(secret, 4, 500, 0.8),
                  in_tree_rows(member_secret(KEY_B, "digest-1"), 3, 500, 0.8),
                  in_tree_rows(member_secret(KEY_A, "digest-2"), 3, 500, 0.8)):
        assert 0.55 < (other == rows).mean() < 0.8  # independent masks agree on ~0.68 of rows
    assert in_tree_rows(secret, 3, 500, 1.0).all()


def test_the_dealing_follows_the_shares_and_a_tree_below_the_floor_takes_no_row() -> None:
    plan = PrivacyPlan(1.0, 12, 2, 12, 0.3, 100.0, 0.3)
    secret = member_secret(KEY_A, "digest-1")
    dealt = dealt_rows(secret, plan, 0, 5000)
    shares = np.bincount(dealt, minlength=12) / 5000
    np.testing.assert_allclose(shares, plan.row_shares(0), atol=0.02)
    assert not np.array_equal(dealt, dealt_rows(member_secret(KEY_B, "digest-1"), plan, 0, 5000))
    everyone = np.ones(150, dtype=bool)
    counts = [int((dealt_rows(secret, plan, 0, 150) == t).sum()) for t in range(12)]
    taken = [int(private_rows(secret, plan, t, everyone, DEALT_ROWS_FLOOR).sum())
             for t in range(12)]
    assert taken == [c if c >= DEALT_ROWS_FLOOR else 0 for c in counts]
    assert 0 in taken and any(0 < c < DEALT_ROWS_FLOOR for c in counts)
    assert floor_rows(BoostParams(min_samples_leaf=25)) == 25
    assert floor_rows(BoostParams()) == DEALT_ROWS_FLOOR
