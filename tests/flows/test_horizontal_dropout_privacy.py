"""A dropout never hands the aggregator two sums of one tree over different members (issue 23,
item 1), and what it still learns across trees is what docs/horizontal.md says.

Three members (breast's 455 rows dealt round-robin into a, b, c), 32 bins: 30 features x 33
bins = 990 bins per root histogram. Real worker processes on the embedded hub, which records
every message; the test plays a curious aggregator that sums every round whose vectors it
holds (with any round key it was sent) and subtracts every two sums of the same tree's root.

- ``c`` frozen (SIGSTOP) right after it sent tree 0's root histograms: before the fix the flow
  regrew tree 0 with a and b, and the two roots gave c's row count and positives in all 990
  bins. Now tree 0 stops after its root split (a stump over all three) and tree 1 goes on
  without c: no two sums of one tree. The residue across trees is measured: tree 1's root over
  a, b against tree 0's over a, b, c.
- ``c`` frozen before it sent tree 0's root, thawed once a and b regrew it: its late vector
  completes the first attempt, which stays sealed (no member released that attempt's key).
"""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

import flows.horizontal
from boosting.binning import apply_cuts
from boosting.fixedpoint import quantize_at
from boosting.losses import gradients
from boosting.params import BoostParams
from boosting.train import BinnedBlock, train
from boosting.tree import load_model
from fedboost import embedded
from fedboost.embedded import FLOW_ENDPOINT, train_embedded
from fedboost.joined import pool_members
from flows.config import HorizontalJobConfig
from messages.envelope import Envelope, MsgType, decode_envelope
from messages.transport import MemoryHub
from tests.flows.test_horizontal import assert_same_tree, grow_centrally, margins_after
from tests.scenarios import DATA
from workers.data import load_party_data
from workers.pairwise_masks import unseal_sum

pytestmark = pytest.mark.usefixtures("prefect_harness")

MEMBERS = ("a", "b", "c")
VICTIM = "c"
MAX_BIN = 32
SHAPE = (30, MAX_BIN + 1, 3)
"""A root histogram: features x bins x (g, h, count)."""


def _config(tmp_path: Path, job: str) -> HorizontalJobConfig:
    """breast's rows dealt into three member files; 3 trees of depth 3; a generous timeout
    (the frozen member costs one)."""
    rows = [line for f in ("breast_homo_guest.csv", "breast_homo_host.csv")
            for line in (DATA / f).read_text().splitlines()[1:]]
    header = (DATA / "breast_homo_guest.csv").read_text().splitlines()[0]
    for k, m in enumerate(MEMBERS):
        (tmp_path / f"{m}.csv").write_text("\n".join([header, *rows[k::3]]) + "\n")
    parties: dict[str, Any] = {m: {"role": "member", "data": str(tmp_path / f"{m}.csv"),
                                   "id": "id", "label": "y"} for m in MEMBERS}
    parties["aggregator"] = {"role": "aggregator"}
    return HorizontalJobConfig.model_validate({
        "job": job, "protocol": "horizontal", "parties": parties,
        "params": {"n_trees": 3, "max_depth": 3, "learning_rate": 0.3, "max_bin": MAX_BIN,
                   "objective": "binary"},
        "min_members": 2,  # the documented opt-in to the residue this file measures
        "transport": {"kind": "memory", "step_timeout": 12}})


class Freezer:
    """SIGSTOPs the victim's worker right after the flow's ``update_histograms`` of tree 0's
    root (``after=True``: it has sent its vector) or right before it (``after=False``: it sends
    it when thawed, which ``thaw_at_attempt`` does when that attempt of tree 0 starts); thaws
    it before the models are saved at the latest (the job's end stops every worker)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, after: bool,
                 thaw_at_attempt: int | None = None) -> None:
        self.pid, self.frozen, self.thawed = 0, False, False
        start_workers, update = embedded.start_workers, flows.horizontal.update_histograms
        start_tree, save_models = flows.horizontal.start_tree, flows.horizontal.save_models

        def recording_start(*args: Any, **kwargs: Any) -> Any:
            procs, helpers = start_workers(*args, **kwargs)
            self.pid = next(p.pid for p in procs if p.name == f"fedboost-{VICTIM}")
            return procs, helpers

        def freezing_update(job: str, members: list[str], tree: int, depth: int, attempt: int,
                            *rest: Any) -> None:
            first = (tree, depth, attempt) == (0, 0, 0) and not self.frozen
            if first and not after:
                self.freeze()
            update(job, members, tree, depth, attempt, *rest)
            if first and after:
                self.freeze()

        def thawing_start(job: str, aggregator: str, members: list[str], tree: int,
                          attempt: int) -> None:
            if self.frozen and (tree, attempt) == (0, thaw_at_attempt):
                self.thaw()
            start_tree(job, aggregator, members, tree, attempt)

        def thawing_save(*args: Any) -> None:
            self.thaw()
            save_models(*args)

        monkeypatch.setattr(flows.horizontal, "save_models", thawing_save)
        monkeypatch.setattr(embedded, "start_workers", recording_start)
        monkeypatch.setattr(flows.horizontal, "update_histograms", freezing_update)
        monkeypatch.setattr(flows.horizontal, "start_tree", thawing_start)

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen and not self.thawed:
            os.kill(self.pid, signal.SIGCONT)
            self.thawed = True


def _run(tmp_path: Path, config: HorizontalJobConfig, freezer: Freezer) -> list[Envelope]:
    hub = MemoryHub([*config.parties, FLOW_ENDPOINT], record=True)
    result = train_embedded(config, tmp_path / "run", hub=hub)
    assert freezer.frozen and result["dropped"] == [VICTIM], result["dropped"]
    return [decode_envelope(msgpack.unpackb(sealed)["envelope"])
            for _, _, sealed in hub.recorded()]


# -- the curious aggregator -----------------------------------------------------------------


def opened_roots(recorded: list[Envelope]) -> dict[tuple[int, int], tuple[frozenset[str],
                                                                          np.ndarray]]:
    """Every root round (tree, attempt) whose vectors the aggregator can sum to counts: the
    masks cancel only over a round's whole member set, and a sealed sum opens only with a round
    key it was sent."""
    vectors: dict[tuple[int, int], dict[str, np.ndarray]] = defaultdict(dict)
    keys: dict[tuple[int, int], set[bytes]] = defaultdict(set)
    for env in recorded:
        if env.recipient != "aggregator":
            continue
        if env.kind == MsgType.H_MASKED and env.body.purpose == "hist" and env.body.depth == 0:
            vectors[(env.body.tree, env.body.attempt)][env.sender] = np.frombuffer(
                env.body.values, dtype="<u8").astype(np.uint64)
        if env.kind == MsgType.H_ROUND_KEY:
            keys[(env.body.tree, env.body.attempt)].add(env.body.key)
    opened = {}
    for round_, by_member in vectors.items():
        total = np.zeros(by_member[next(iter(by_member))].size, dtype=np.uint64)
        for vector in by_member.values():
            total += vector
        for key in [None, *keys[round_]]:
            plain = total if key is None else unseal_sum(total, key, sorted(by_member))
            if _are_counts(plain.view(np.int64)):
                opened[round_] = (frozenset(by_member), plain.view(np.int64).reshape(SHAPE))
    return opened


def _are_counts(root: np.ndarray) -> bool:
    counts = root.reshape(SHAPE)[:, :, 2]
    return bool((counts >= 0).all() and (counts.sum(axis=1) == counts[0].sum()).all()
                and counts[0].sum() < 10_000)


def _scales(recorded: list[Envelope]) -> dict[tuple[int, int], tuple[float, float, int]]:
    """(tree, attempt) -> the g and h scales the aggregator set, and the rows."""
    out = {}
    for env in recorded:
        if env.kind == MsgType.H_GRADIENT_SCALE:
            s = env.body
            out[(s.tree, s.attempt)] = (quantize_at(np.ones(1), s.rows, s.g_exponent).scale,
                                        quantize_at(np.ones(1), s.rows, s.h_exponent).scale,
                                        s.rows)
    return out


def _quantized(margin: float, scale: tuple[float, float, int]) -> tuple[int, int]:
    """A y=0 row's quantized g and h at ``margin`` (a y=1 row's g is that minus the scale)."""
    g, h = gradients("binary", np.array([[margin]]), np.zeros(1))
    return (int(np.rint(g[0, 0] * scale[0])), int(np.rint(h[0, 0] * scale[1])))


def positives_at_one_margin(root: np.ndarray, margin: float,
                            scale: tuple[float, float, int]) -> np.ndarray:
    """Positives per bin of a root whose rows share one margin: G = n g0 - s * positives."""
    g0, _ = _quantized(margin, scale)
    return (root[:, :, 2] * g0 - root[:, :, 0]) / scale[0]


def positives_at_two_margins(root: np.ndarray, margins: tuple[float, float],
                             scale: tuple[float, float, int]) -> tuple[np.ndarray, np.ndarray]:
    """Rows and positives per bin of a root whose rows sit at one of two margins (after a
    stump): H and the count give how many at each, then G gives the positives."""
    (g_l, h_l), (g_r, h_r) = (_quantized(m, scale) for m in margins)
    n = root[:, :, 2]
    left = (root[:, :, 1] - n * h_r) / (h_l - h_r)
    return n, (left * g_l + (n - left) * g_r - root[:, :, 0]) / scale[0]


def _victim_truth(config: HorizontalJobConfig, recorded: list[Envelope]) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
    """The victim's rows and positives per (feature, bin), binned with the shared cuts."""
    cuts_body = next(e.body for e in recorded if e.kind == MsgType.H_CUTS)
    cuts = [np.frombuffer(c, dtype="<f8") for c in cuts_body.cuts]
    data = load_party_data(VICTIM, str(config.parties[VICTIM].data), "id", "y",
                           require_label=True)
    bins = apply_cuts(data.x, cuts, MAX_BIN)
    rows = np.stack([np.bincount(bins[:, j], minlength=MAX_BIN + 1) for j in range(30)])
    positives = np.stack([np.bincount(bins[:, j], weights=data.y, minlength=MAX_BIN + 1)
                          for j in range(30)])
    return rows, positives


def same_tree_attack(recorded: list[Envelope], config: HorizontalJobConfig) -> int:
    """Bins where two opened roots of one tree, with and without the victim, give the victim's
    rows and positives exactly (the issue's attack; tree 0: one margin, the base score)."""
    opened, scales = opened_roots(recorded), _scales(recorded)
    base = next(e.body.base_score for e in recorded if e.kind == MsgType.H_CUTS)
    rows, positives = _victim_truth(config, recorded)
    found = 0
    for (tree, a1), (with_, first) in opened.items():
        for (tree2, a2), (without, second) in opened.items():
            if tree2 != tree or tree != 0 or with_ - without != {VICTIM}:
                continue
            got_rows = first[:, :, 2] - second[:, :, 2]
            got_pos = (positives_at_one_margin(first, base, scales[(0, a1)])
                       - positives_at_one_margin(second, base, scales[(0, a2)]))
            found = max(found, int(((got_rows == rows) & (got_pos == positives)).sum()))
    return found


# -- the tests ------------------------------------------------------------------------------


def test_a_member_frozen_after_its_root_histograms_gives_the_aggregator_one_sum_per_tree(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, "homo-drop-after-root")
    freezer = Freezer(monkeypatch, after=True)
    recorded = _run(tmp_path, config, freezer)

    # the attack finds no two roots of one tree (it found all 990 bins)
    opened = opened_roots(recorded)
    assert {t for t, _ in opened} == {0, 1, 2}
    assert len(opened) == 3, sorted(opened)  # one opened root per tree
    assert same_tree_attack(recorded, config) == 0

    # the model: tree 0 is the core's stump on all three members' rows (c went silent before
    # the root's key was out: the tree stops after that level), trees 1-2 the survivors'
    model = load_model(tmp_path / "run" / "a" / "model.json")
    union = pool_members(config)
    params = BoostParams.from_dict({**config.params.model_dump(), "max_depth": 1,
                                    "n_trees": 1})
    assert_same_tree(model.trees[0], train(params, [union.block], union.y,
                                           cuts=[union.cuts]).trees[0], "tree 0 (stump)")
    rest = pool_members(config, members=["a", "b"])
    bins = apply_cuts(rest.block.x, rest.cuts, MAX_BIN)
    rows = BinnedBlock(rest.block.owner, rest.cuts, bins)
    margin = margins_after(model.trees[:1], model.base_score[0], bins, MAX_BIN)
    full = BoostParams.from_dict(config.params.model_dump())
    for t, expected in enumerate(grow_centrally(full, rows, rest.y, margin, range(1, 3),
                                                lambda t: np.ones(rest.y.size, bool)), start=1):
        assert_same_tree(model.trees[t], expected, f"tree {t} (a, b)")

    # the residue (docs/horizontal.md, "Dropouts"): tree 1's root over a, b against tree 0's
    # over a, b, c. Rows per bin never change between trees, and tree 0 being a stump, a, b's
    # rows sit at one of two margins: the aggregator solves them from H and the count, and
    # gets c's rows and positives per bin.
    scales = _scales(recorded)
    base = next(e.body.base_score for e in recorded if e.kind == MsgType.H_CUTS)
    leaves = next(e.body for e in recorded if e.kind == MsgType.H_LEAVES and e.body.tree == 0)
    (_, a0), (_, a1) = sorted(k for k in opened if k[0] in (0, 1))
    all3, two = opened[(0, a0)][1], opened[(1, a1)][1]
    n_two, pos_two = positives_at_two_margins(
        two, (base + leaves.values[0], base + leaves.values[1]), scales[(1, a1)])
    rows_c, positives_c = _victim_truth(config, recorded)
    exact_rows = all3[:, :, 2] - n_two == rows_c
    exact_pos = positives_at_one_margin(all3, base, scales[(0, a0)]) - pos_two == positives_c
    print(f"\nresidue: c's rows exact in {exact_rows.sum()} of 990 bins, rows and positives "
          f"in {(exact_rows & exact_pos).sum()}")
    assert exact_rows.all()  # documented: a dropped member's rows per bin (subsample 1)
    assert (exact_rows & exact_pos).sum() >= 900  # and, after a stump, its positives


def test_a_late_root_vector_completes_a_round_that_stays_sealed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, "homo-drop-late-root")
    freezer = Freezer(monkeypatch, after=False, thaw_at_attempt=1)
    recorded = _run(tmp_path, config, freezer)

    vectors = {(e.sender, e.body.attempt) for e in recorded
               if e.kind == MsgType.H_MASKED and e.recipient == "aggregator"
               and e.body.purpose == "hist" and (e.body.tree, e.body.depth) == (0, 0)}
    assert (VICTIM, 0) in vectors, "c's late vector never arrived"  # all of attempt 0 is in
    assert {m for m, a in vectors if a == 0} == set(MEMBERS)
    keys = {(e.body.tree, e.body.attempt) for e in recorded if e.kind == MsgType.H_ROUND_KEY}
    assert (0, 0) not in keys and (0, 1) in keys
    opened = opened_roots(recorded)
    assert (0, 0) not in opened and (0, 1) in opened
    assert same_tree_attack(recorded, config) == 0

    # the model: every tree is the core's on a's and b's rows (tree 0 was regrown without c;
    # the cuts and base score are the set-up's, over all three)
    model = load_model(tmp_path / "run" / "a" / "model.json")
    rest = pool_members(config, members=["a", "b"])
    rows = BinnedBlock(rest.block.owner, rest.cuts, apply_cuts(rest.block.x, rest.cuts, MAX_BIN))
    margin = np.full((rest.y.size, 1), model.base_score[0])
    full = BoostParams.from_dict(config.params.model_dump())
    for t, expected in enumerate(grow_centrally(full, rows, rest.y, margin, range(3),
                                                lambda t: np.ones(rest.y.size, bool))):
        assert_same_tree(model.trees[t], expected, f"tree {t} (a, b)")
