"""Horizontal privacy across jobs and on the public grid (issue 36, item 2), attacked from the
whole transcript of real jobs (``tests.privacy.harness``).

- **Across jobs**: breast's 455 rows dealt to members a, b, c; the same job run with a, b, c and
  then with a, b (the same data files, the same state folders) gave the aggregator, by
  differencing the set-up's summed cell counts and stats of the two jobs, c's count in every
  cell the two grids share (seen on 12e5b35: exact in 30/30 features, c's 4,530 values in
  intervals of median 0.0155 sd) and its rows and positives (151 and 98, exact). Now a and b
  refuse the second job by their ledgers, naming the first, and nothing of it reaches the
  aggregator (0/30 features; no stats).
- **The grid**: default_credit's three members; each member rebuilds its grid from the
  RefineCells it received: on 12e5b35 its final cells went down to 2^-20 of their power of
  two, 10,575 per member narrower than the floor, of which 421-465 held only other members'
  values (27-34 of them narrower than 2^-16, about 1.5e-5). Now no cell is narrower than the
  floor (2^-8 of its power of two, a relative width of at least 2^-9): 0 and 0.
- **Two members**: breast's two members; each learns the other's exact row count (the
  GradientScale's rows minus its own) and label sum (the base score's mean times the rows),
  as docs/horizontal.md states (228 and 137, 227 and 150: exact, on 12e5b35 as now); with
  three members (the first job above) only the two others' total. A member whose policy says
  ``horizontal_min_members: 3`` refuses a job of two (12e5b35: no such policy, the job ran).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flows.config import HorizontalJobConfig
from messages.envelope import MsgType
from tests.privacy.harness import Transcript, record_training
from tests.scenarios import DATA, horizontal_config
from workers.data import load_party_data
from workers.horizontal.grid import Layout
from workers.pairwise_masks import unmask_sum

pytestmark = pytest.mark.usefixtures("prefect_harness")

FLOOR = 2.0 ** -9
"""The public floor, as a relative width: a cell of 2^-8 of its power of two ``(2^e, 2^(e+1)]``
is ``2^(e-8)`` wide, at least ``2^-9`` of its larger edge's magnitude."""
POLICY: dict[str, Any] = {"min_key_bits": 1024, "min_ou_key_bits": 1024,
                          "protocols": ["horizontal"]}


def _dealt(tmp_path: Path, members: tuple[str, ...]) -> dict[str, Path]:
    """breast's 455 rows dealt round-robin into a file per member."""
    rows = [line for f in ("breast_homo_guest.csv", "breast_homo_host.csv")
            for line in (DATA / f).read_text().splitlines()[1:]]
    header = (DATA / "breast_homo_guest.csv").read_text().splitlines()[0]
    files = {}
    for k, m in enumerate(members):
        files[m] = tmp_path / f"{m}.csv"
        files[m].write_text("\n".join([header, *rows[k::len(members)]]) + "\n")
    return files


def _config(job: str, files: dict[str, Path], members: tuple[str, ...],
            policy: dict[str, Any] | None = None) -> HorizontalJobConfig:
    parties: dict[str, Any] = {m: {"role": "member", "data": str(files[m]), "id": "id",
                                   "label": "y", **({"policy": policy} if policy else {})}
                               for m in members}
    parties["aggregator"] = {"role": "aggregator"}
    return HorizontalJobConfig.model_validate({
        "job": job, "protocol": "horizontal", "parties": parties,
        "params": {"n_trees": 1, "max_depth": 2, "learning_rate": 0.3, "max_bin": 32,
                   "objective": "binary"},
        "transport": {"kind": "memory", "step_timeout": 60}})


# -- what the aggregator sums, what a member is told -------------------------------------------

def _summed(transcript: Transcript, purpose: str, depth: int) -> np.ndarray | None:
    """The sum the aggregator opens of one set-up round's masked vectors (None: not all in)."""
    members = transcript.config.members
    vectors = {m.sender: np.frombuffer(m.body.values, dtype="<u8").astype(np.uint64)
               for m in transcript.of_kind("aggregator", MsgType.H_MASKED)
               if m.body.purpose == purpose and m.body.tree == -1 and m.body.depth == depth}
    if sorted(vectors) != sorted(members):
        return None
    return unmask_sum(list(vectors.values()))


def _layouts(transcript: Transcript, member: str, features: int) -> list[list[Layout]]:
    """Every set-up round's layouts, as the cells to split that ``member`` received make them
    (the aggregator, which chose them, holds the same)."""
    rounds = [[Layout.coarse() for _ in range(features)]]
    refines = sorted((m.body for m in transcript.of_kind(member, MsgType.H_REFINE)),
                     key=lambda b: b.round)
    for body in refines:
        rounds.append([layout.split(np.frombuffer(raw, "<i4").astype(np.int64), body.round)
                       for layout, raw in zip(rounds[-1], body.cells)])
    return rounds


def _coarsened(layout: Layout, counts: np.ndarray, common: np.ndarray) -> np.ndarray:
    """Counts of ``layout``'s cells summed into the cells whose upper edges are ``common``."""
    return np.bincount(np.searchsorted(common, layout.edges, side="left"), weights=counts,
                       minlength=common.size)


def _feature_counts(summed: np.ndarray, layouts: list[Layout]) -> list[np.ndarray]:
    return np.split(summed, np.cumsum([layout.size for layout in layouts])[:-1])


def _relative_widths(layout: Layout) -> np.ndarray:
    lower = np.concatenate([[-np.inf], layout.edges[:-1]])
    upper = layout.edges
    with np.errstate(invalid="ignore"):
        width = (upper - lower) / np.maximum(np.abs(lower), np.abs(upper))
    return np.where(np.isfinite(width), width, np.inf)


# -- (a) across jobs ---------------------------------------------------------------------------

def test_a_second_job_without_a_member_is_refused_and_shows_nothing_of_it(
        tmp_path: Path) -> None:
    members = ("a", "b", "c")
    files = _dealt(tmp_path, members)
    out = tmp_path / "run"  # one operator's folders: every party keeps its state across jobs
    first = record_training(_config("breast-abc", files, members), out)
    try:
        second = record_training(_config("breast-ab", files, ("a", "b")), out)
        error = ""
    except Exception as exc:  # the flow's failure names the refusing member and the first job
        second, error = None, str(exc)
    victim = load_party_data("c", str(files["c"]), "id", "y", require_label=True)
    features = victim.x.shape[1]

    # the attack: every set-up sum of the second job minus the first's, on their common cells
    exact, widths = 0, []
    stats = None
    if second is not None and (s2 := _summed(second, "stats", -1)) is not None:
        stats = _summed(first, "stats", -1) - s2  # type: ignore[operator]
    if second is not None:
        l1, l2 = _layouts(first, "a", features)[-1], _layouts(second, "a", features)[-1]
        r1, r2 = len(_layouts(first, "a", features)) - 1, len(_layouts(second, "a", features)) - 1
        s1, s2 = _summed(first, "grid", r1), _summed(second, "grid", r2)
        if s1 is not None and s2 is not None:
            sd = np.nanstd(victim.x, axis=0)
            for j, (a, b, c1, c2) in enumerate(zip(l1, l2, _feature_counts(s1, l1),
                                                  _feature_counts(s2, l2))):
                common = np.intersect1d(a.edges, b.edges)
                guessed = _coarsened(a, c1, common) - _coarsened(b, c2, common)
                truth = Layout(common, np.zeros(common.size, np.int64)).count(victim.x[:, j])
                if np.array_equal(guessed, truth):
                    exact += 1
                    lower = np.concatenate([[np.nan], common[:-1]])
                    held = truth > 0
                    widths += list(((common - lower)[held] / sd[j]).repeat(truth[held]))
    median = float(np.nanmedian(widths)) if widths else float("nan")
    print(f"across jobs: c's cell counts exact in {exact}/{features} features, its values in "
          f"intervals of median {median:.4f} sd; its rows and positives "
          f"{None if stats is None else stats.tolist()}")
    assert stats is None and exact == 0, (exact, median)
    assert "refuses job 'breast-ab'" in error and "'breast-abc'" in error, error
    # (c, three members) what a member derives from the scale and the base score is the two
    # others' total, neither one's
    ys = {m: load_party_data(m, str(f), "id", "y", require_label=True).y
          for m, f in files.items()}
    rows, label_sum = _what_a_member_derives(first, "a", files)
    assert rows == ys["b"].size + ys["c"].size and rows not in (ys["b"].size, ys["c"].size)
    assert abs(label_sum - ys["b"].sum() - ys["c"].sum()) < 1e-6


# -- (b) the grid ------------------------------------------------------------------------------

def test_no_member_is_shown_a_cell_narrower_than_the_public_floor(tmp_path: Path) -> None:
    config = horizontal_config("homo-credit-grid", "default_credit",
                               params={"n_trees": 1, "max_depth": 1})
    transcript = record_training(config, tmp_path / "run")
    data = {m: load_party_data(m, config.parties[m].data, "id", "y", require_label=True).x
            for m in config.members}
    features = next(iter(data.values())).shape[1]
    narrow, others_only, finest = {}, {}, {}
    for member in config.members:
        final = _layouts(transcript, member, features)[-1]
        narrow[member] = others_only[member] = finest[member] = 0
        for j, layout in enumerate(final):
            width = _relative_widths(layout)
            mine = layout.count(data[member][:, j])
            theirs = sum(layout.count(x[:, j]) for m, x in data.items() if m != member)
            below = width < FLOOR
            narrow[member] += int(below.sum())
            others_only[member] += int((below & (mine == 0) & (theirs > 0)).sum())
            finest[member] += int(((width < 2.0 ** -16) & (mine == 0) & (theirs > 0)).sum())
    print(f"grid: cells below the floor {narrow}; of them holding only others' values "
          f"{others_only} (below 2^-16: {finest})")
    assert narrow == {m: 0 for m in config.members}
    assert others_only == {m: 0 for m in config.members}


# -- (c) two members ---------------------------------------------------------------------------

def _what_a_member_derives(transcript: Transcript, member: str,
                           files: dict[str, Path]) -> tuple[int, float]:
    """The rows and label sum of everyone else, from the GradientScale and the base score."""
    own = load_party_data(member, str(files[member]), "id", "y", require_label=True)
    scale = next(m.body for m in transcript.of_kind(member, MsgType.H_GRADIENT_SCALE))
    cuts = next(m.body for m in transcript.of_kind(member, MsgType.H_CUTS))
    mean = 1.0 / (1.0 + np.exp(-cuts.base_score))
    return scale.rows - own.y.size, mean * scale.rows - float(own.y.sum())


def test_two_members_learn_each_others_row_count_and_label_sum_as_the_docs_say(
        tmp_path: Path) -> None:
    files = {"guest": DATA / "breast_homo_guest.csv", "host": DATA / "breast_homo_host.csv"}
    truth = {m: load_party_data(m, str(f), "id", "y", require_label=True).y
             for m, f in files.items()}
    transcript = record_training(_config("breast-two", files, ("guest", "host")),
                                 tmp_path / "two")
    for me, other in (("guest", "host"), ("host", "guest")):
        rows, label_sum = _what_a_member_derives(transcript, me, files)
        print(f"two members: {me} derives {other}'s rows {rows} (true {truth[other].size}) and "
              f"label sum {label_sum:.6f} (true {truth[other].sum():g})")
        assert rows == truth[other].size  # docs/horizontal.md: exact with two members
        assert abs(label_sum - truth[other].sum()) < 1e-6
    # a member whose policy asks for three refuses a job of two
    strict = {**POLICY, "horizontal_min_members": 3}
    with pytest.raises(Exception, match=r"party (guest|host) refuses .*2 members.*"
                                        r"horizontal_min_members: 3"):
        record_training(_config("breast-two-strict", files, ("guest", "host"), strict),
                        tmp_path / "strict")
