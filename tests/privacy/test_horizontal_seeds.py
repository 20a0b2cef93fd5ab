"""Public-seed replay against a horizontal member's row draws (issue 36, items 1, 2 and 5).

The aggregator opens every tree's root and so counts the rows in it: the sum over the members
of their in-tree rows. Drawn from the job's ``params.seed`` (mixed with the tree and the
member's index, or, for the DP dealing, the member's index and the ensemble), every member's
rows were the aggregator's to replay (the review: 60/60 roots matched, then each row's bins by
linear programming). Now each member draws them from its own secret
(``workers.horizontal.draws``). These checks record a whole job on the embedded hub, take the
roots the aggregator can open (``opened_roots``: the masks cancel in the sum, the seals open
with the round keys it was sent) and replay every integer the aggregator can see (the job
spec and every message it received, ``harness.public_seeds``), in every way a draw can mix it
with the tree, member and ensemble numbers, against those root counts, and against each
member's own count of its rows in every tree (which the test reads from the member's secret):

- ``subsample < 1``: no candidate predicts more than chance (on 12e5b35: ``params.seed`` 0
  mixed as ``[seed, tree, member]`` predicted 12/12 roots, with 2 and with 3 members; now at
  most 2/12);
- ``privacy:`` (lr 0.3, one ensemble of 12 trees): no candidate predicts the dealing (on
  12e5b35: ``[seed, member, ensemble]`` predicted 11/11 opened roots with two members, 12/12
  with three; now at most 2 of 5-7), no opened root holds 1 to ``floor - 1`` rows and no tree
  takes 1 to ``floor - 1`` of a member's rows (on 12e5b35 with three members: roots of 6, 1
  and 2 rows, trees 9-11; with two a root of 4), and ``epsilon_spent`` is the job's epsilon.

Each runs with two and with three members (breast's 455 rows dealt into member files).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan, deal_rows
from flows.config import HorizontalJobConfig
from messages.envelope import MsgType
from tests.flows.test_horizontal import member_draws
from tests.flows.test_horizontal_dropout_privacy import MAX_BIN, opened_roots
from tests.privacy.harness import Transcript, public_seeds, record_training
from tests.scenarios import DATA
from workers.horizontal.draws import DEALT_ROWS_FLOOR, floored_plan, private_rows
from workers.keyed_draws import in_tree_rows

pytestmark = pytest.mark.usefixtures("prefect_harness")

N_TREES = 12
MIXES: dict[str, Callable[[int, int, int], list[int]]] = {
    "seed, tree, member": lambda s, t, m: [s, t, m],
    "seed, member, tree": lambda s, t, m: [s, m, t],
    "seed, tree": lambda s, t, m: [s, t],
    "seed, member": lambda s, t, m: [s, m],
    "seed": lambda s, t, m: [s],
}
"""How a draw can mix a public seed with a tree (or ensemble) number ``t`` and a member's
index ``m`` in the job's order."""


def _config(tmp_path: Path, members: int, job: str, **sections: Any) -> HorizontalJobConfig:
    """breast's rows dealt into ``members`` member files; ``sections`` replace the job's."""
    rows = [line for f in ("breast_homo_guest.csv", "breast_homo_host.csv")
            for line in (DATA / f).read_text().splitlines()[1:]]
    header = (DATA / "breast_homo_guest.csv").read_text().splitlines()[0]
    names = "abc"[:members]
    for k, m in enumerate(names):
        (tmp_path / f"{m}.csv").write_text("\n".join([header, *rows[k::members]]) + "\n")
    parties: dict[str, Any] = {m: {"role": "member", "data": str(tmp_path / f"{m}.csv"),
                                   "id": "id", "label": "y"} for m in names}
    parties["aggregator"] = {"role": "aggregator"}
    return HorizontalJobConfig.model_validate({
        "job": job, "protocol": "horizontal", "parties": parties,
        "params": {"n_trees": N_TREES, "max_depth": 1, "learning_rate": 0.3,
                   "max_bin": MAX_BIN, "objective": "binary", "seed": 0},
        "transport": {"kind": "memory"}, **sections})


def _root_counts(transcript: Transcript) -> dict[int, int]:
    """Tree -> the rows in its root, as the aggregator opens it."""
    opened = opened_roots(transcript.received_by("aggregator"))  # type: ignore[arg-type]
    return {tree: int(hist[0, :, 2].sum()) for (tree, _), (_, hist) in opened.items()}


def _sizes(transcript: Transcript, members: list[str]) -> list[int]:
    """Each member's row count, as the aggregator is told it."""
    rows = {m.sender: m.body.rows for m in transcript.of_kind("aggregator",
                                                              MsgType.H_GRADIENT_RANGE)}
    return [rows[m] for m in members]


Count = Callable[[np.random.Generator, int, int], int]
"""A member's rows in tree ``t`` drawn from a generator: ``count(rng, t, n_rows)``."""


def _best_replay(seeds: Iterable[int], truth: dict[int, int], members: list[int],
                 sizes: list[int], count: Count,
                 number: Callable[[int], int] = lambda t: t) -> tuple[int, Any]:
    """The most of ``truth``'s trees any (public seed, mix) predicts exactly, and that
    candidate. The prediction for tree ``t`` is the sum over ``members`` (indices in the job's
    order) of ``count`` under the generator of the mix of the seed, ``number(t)`` (the tree's
    number, or its ensemble's) and the member's index. Candidates that predict neither of the
    first two trees are not followed further (a true replay predicts them all).

    Use it on a dozen trees: a mix without ``number`` predicts one count for every tree, so
    equal counts by chance are matched together (four trees: 2 of 200 null draws, counts drawn
    independently, had three of four matched by one of 10 public seeds)."""
    trees = sorted(truth)
    best: tuple[int, Any] = (0, None)
    for seed in sorted(seeds):
        for name, mix in MIXES.items():
            def predicted(t: int) -> int:
                return sum(count(np.random.default_rng(mix(seed, number(t), m)), t, sizes[m])
                           for m in members)
            if not any(predicted(t) == truth[t] for t in trees[:2]):
                continue
            hits = sum(predicted(t) == truth[t] for t in trees)
            best = max(best, (hits, (seed, name)), key=lambda b: b[0])
    return best


@pytest.mark.parametrize("members", [2, 3])
def test_no_public_seed_predicts_a_members_subsample(tmp_path: Path, members: int) -> None:
    config = _config(tmp_path, members, f"homo-seeds-subsample-{members}",
                     params={"n_trees": N_TREES, "max_depth": 1, "max_bin": MAX_BIN,
                             "subsample": 0.8, "seed": 0})
    transcript = record_training(config, tmp_path / "run")
    roots = _root_counts(transcript)
    assert sorted(roots) == list(range(N_TREES)), roots
    sizes = _sizes(transcript, config.members)
    assert sum(sizes) == 455

    def mask_count(rng: np.random.Generator, t: int, n: int) -> int:
        return int((rng.random(n) < 0.8).sum())

    seeds = public_seeds(transcript, "aggregator")
    everyone = list(range(members))
    hits, candidate = _best_replay(seeds, roots, everyone, sizes, mask_count)
    # chance: a root count is matched with probability ~1/20; half of them is not chance
    assert hits <= N_TREES // 2, f"{candidate} predicts {hits}/{N_TREES} roots"
    # nor any member's own rows in each tree (the test reads each member's secret)
    draws = [member_draws(tmp_path / "run", config, m) for m in config.members]
    own = [{t: int(in_tree_rows(d, t, n, 0.8).sum()) for t in range(N_TREES)}
           for d, n in zip(draws, sizes)]
    assert roots == {t: sum(o[t] for o in own) for t in range(N_TREES)}
    for m, truth in enumerate(own):
        hits, candidate = _best_replay(seeds, truth, [m], sizes, mask_count)
        assert hits <= N_TREES // 2, \
            f"{candidate} predicts {hits}/{N_TREES} of {config.members[m]}'s in-tree counts"


@pytest.mark.parametrize("members", [2, 3])
def test_no_public_seed_predicts_the_dp_dealing_and_no_root_is_below_the_floor(
        tmp_path: Path, members: int) -> None:
    """The docs' tuned shape (lr 0.3, one ensemble, clip 0.3, lambda 100): its later trees are
    dealt a handful of each member's rows. Epsilon 4: the floor's noise on a member's row
    count (scale 1 / (0.1 * 4)) then lets its first three trees in whatever its secret, so the
    replay always has their counts to predict."""
    config = _config(tmp_path, members, f"homo-seeds-dp-{members}",
                     params={"n_trees": N_TREES, "max_depth": 1, "max_bin": MAX_BIN,
                             "learning_rate": 0.3, "reg_lambda": 100.0, "seed": 0},
                     privacy={"epsilon": 4.0, "clip": 0.3, "trees_per_ensemble": N_TREES})
    transcript = record_training(config, tmp_path / "run")
    assert transcript.result["epsilon_spent"] == 4.0  # every tree's ensemble is counted
    roots = _root_counts(transcript)
    assert sorted(roots) == list(range(N_TREES)), roots
    sizes = _sizes(transcript, config.members)
    plan = floored_plan(PrivacyPlan(4.0, N_TREES, 1, N_TREES, 0.3, 100.0, 0.3),
                        BoostParams())

    low = {t: c for t, c in roots.items() if 0 < c < DEALT_ROWS_FLOOR}
    assert not low, f"roots the aggregator opened over fewer than {DEALT_ROWS_FLOOR} rows: {low}"
    # and at each member: a tree takes none of its rows or at least the floor (the floor is a
    # noisy threshold on the tree's expected rows: below it with probability COUNT_MISS)
    draws = [member_draws(tmp_path / "run", config, m) for m in config.members]
    own = [{t: int(private_rows(d, plan, t, np.ones(n, dtype=bool)).sum())
            for t in range(N_TREES)} for d, n in zip(draws, sizes)]
    assert all(c == 0 or c >= DEALT_ROWS_FLOOR for o in own for c in o.values()), own
    assert roots == {t: sum(o[t] for o in own) for t in range(N_TREES)}

    def floored(rng: np.random.Generator, t: int, n: int) -> int:
        # ensemble 0's dealing, with the floor applied as the members apply it
        c = int((deal_rows(plan, 0, n, rng) == t).sum())
        return c if c >= DEALT_ROWS_FLOOR else 0

    def unfloored(rng: np.random.Generator, t: int, n: int) -> int:
        return int((deal_rows(plan, 0, n, rng) == t).sum())

    # a replay predicts the dealing when it gives every opened root's count, or every tree's
    # count of a member's rows where it has some: chance gives a few (out of 5-8, floors
    # make late roots lumpy), never all
    seeds = public_seeds(transcript, "aggregator")
    truths = [(list(range(members)), {t: c for t, c in roots.items() if c > 0}, "roots"),
              *(([m], {t: c for t, c in o.items() if c > 0}, config.members[m])
                for m, o in enumerate(own))]
    for who, truth, name in truths:
        assert len(truth) >= 3, truth  # the replay has counts to predict
        for count in (floored, unfloored):
            for number in (lambda t: plan.ensemble_of(t)[0], lambda t: t):
                hits, candidate = _best_replay(seeds, truth, who, sizes, count, number)
                assert hits < len(truth), \
                    f"{candidate} predicts {hits}/{len(truth)} of {name} ({count.__name__})"
