"""A member's row draws (``workers.horizontal.draws``): the same secret draws the same rows
(resume), another member's or another job's secret draws others, and under DP a tree takes
all of a member's dealt rows or none, by a noisy threshold of the documented epsilon."""

from __future__ import annotations

import math

import numpy as np

from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan
from workers.horizontal.draws import (COUNT_MISS, COUNT_SHARE, DEALT_ROWS_FLOOR, floor_rows,
                                      floored_plan, member_secret, private_rows)
from workers.keyed_draws import dealt_rows, in_tree_rows

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


def test_the_dealing_follows_the_shares_and_the_noisy_floor_takes_all_or_none() -> None:
    plan = floored_plan(PrivacyPlan(1.0, 12, 2, 12, 0.3, 100.0, 0.3), BoostParams())
    secret = member_secret(KEY_A, "digest-1")
    dealt = dealt_rows(secret, plan, 0, 5000)
    shares = np.bincount(dealt, minlength=12) / 5000
    np.testing.assert_allclose(shares, plan.row_shares(0), atol=0.02)
    assert not np.array_equal(dealt, dealt_rows(member_secret(KEY_B, "digest-1"), plan, 0, 5000))
    everyone = np.ones(1500, dtype=bool)
    counts = [int((dealt_rows(secret, plan, 0, 1500) == t).sum()) for t in range(12)]
    taken = [int(private_rows(secret, plan, t, everyone).sum()) for t in range(12)]
    assert all(k in (0, c) for k, c in zip(taken, counts)), (taken, counts)
    # one noisy row count per ensemble: the trees taken are the first ones, up to a share
    first_out = taken.index(0)
    assert first_out > 0 and not any(taken[first_out:]), taken
    # the same secret decides the same way (a resumed member); the noise is the member's own
    assert taken == [int(private_rows(secret, plan, t, everyone).sum()) for t in range(12)]
    assert floor_rows(BoostParams(min_samples_leaf=25)) == 25
    assert floor_rows(BoostParams()) == DEALT_ROWS_FLOOR
    assert plan.count_floor == DEALT_ROWS_FLOOR and plan.count_share == COUNT_SHARE


def test_the_floor_is_a_noisy_threshold_of_the_documented_epsilon() -> None:
    """Over many members' secrets: a tree is taken with a probability that rises by at most
    ``exp(count_epsilon)`` per row of the member (epsilon-DP in the one row), and a tree taken
    holds fewer than the floor of its rows with probability at most ``COUNT_MISS``."""
    plan = floored_plan(PrivacyPlan(4.0, 2, 2, 2, 0.3, 100.0, 0.3), BoostParams())
    eps, mu = plan.count_epsilon(), plan.expected_floor()
    assert eps == 4.0 * COUNT_SHARE / 2
    share = plan.row_shares(0)[1]
    secrets = [member_secret(KEY_A, f"job-{k}") for k in range(4000)]

    def taken(n: int) -> list[int]:
        rows = np.ones(n, dtype=bool)
        return [int(private_rows(s, plan, 1, rows).sum()) for s in secrets]

    centre = int(mu / share)  # the row count whose expectation in tree 1 is the floor's mean
    low, high = (np.mean([c > 0 for c in taken(n)]) for n in (centre - 4, centre))
    assert 0.05 < low < high < 0.95, (low, high)
    assert high / low < math.exp(4 * eps) * 1.3, (low, high)  # 4 rows: at most e^(4 eps)
    below = [0 < c < DEALT_ROWS_FLOOR for c in taken(centre)]
    assert np.mean(below) <= COUNT_MISS, np.mean(below)
    assert np.mean([c > 0 for c in taken(centre + 40)]) > 0.95
