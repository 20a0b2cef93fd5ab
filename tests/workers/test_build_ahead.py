"""One round trip a level: with one data provider, a level's split choices may bring the rest
of the level's positions (the active party's own splits) and every child's id, and the party
builds the next level's histograms in the same step (``SplitChoices.build_ahead``).

What it sums must be what the broadcast path sums, and whatever that path refuses, or a job
that must not build ahead (under differential privacy, below the maximum depth), is refused
before any split is recorded or any instance space sent.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from boosting.binning import fit_cuts, goes_left
from crypto.paillier import PaillierPrivateKey, PaillierPublicKey, generate_keypair
from messages.bodies import ErrorReply, Step
from messages.envelope import Envelope, MsgType
from messages.instance_space import decode_mask, encode_mask
from messages.secureboost import (AppliedSplits, EncryptedHistograms, JobSpec, NodePositions,
                                  NodeSplit, SplitChoice, SplitChoices)
from tests.scenarios import TEST_POLICY
from tests.workers.test_chosen_gradients import FEATURES, Host, _chosen_gradients, _plaintexts
from tests.workers.test_tree_start import ROWS, SEALERS, SPEC


@pytest.fixture(scope="module")
def keypair() -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    return generate_keypair(1024)


def _at_root(folder: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey],
             spec: JobSpec = SPEC) -> Host:
    """A host whose tree 0 root histograms are built and sent (row i's gradient is 2**i, so
    every bin sum names its rows)."""
    folder.mkdir(exist_ok=True)
    host = Host(folder, keypair[0], TEST_POLICY, spec)
    host.worker.jobs["job"].state.cuts = fit_cuts(
        np.random.default_rng(1).normal(size=(ROWS, FEATURES)), 32)
    _chosen_gradients(host, keypair, tree=0, per_ciphertext=1)
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 0)).kind == MsgType.ACK
    assert len(_sent(host)) == 1
    return host


def _sent(host: Host) -> list[Envelope]:
    """Everything the host sent the active party since the last look."""
    out = []
    while (data := host.hub.endpoint("guest").receive(timeout=0.3)) is not None:
        out.append(SEALERS["guest"].open(data))
    return out


def _sums(msg: EncryptedHistograms, private: PaillierPrivateKey) -> tuple[list[int], list[int]]:
    return (np.flatnonzero(decode_mask(msg.filled, len(msg.nodes) * FEATURES * msg.n_bins)
                           ).tolist(), _plaintexts(msg, private))


def test_the_level_built_ahead_is_the_level_the_broadcast_would_build(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    """Two levels: the root split by the host; then node 1 split by the host and node 2 by the
    active party. The same sums (the same rows in each bin) as apply -> positions -> build."""
    ahead, broadcast = _at_root(tmp_path / "ahead", keypair), _at_root(tmp_path / "bc", keypair)
    node_2 = ~goes_left(ahead.bins[:, 1], 16, True, SPEC.params.max_bin)  # the root's right
    guests_mask = encode_mask(np.arange(int(node_2.sum())) % 3 == 0)  # its split of node 2
    levels = [([SplitChoice(0, 1, 16, True)], [(1, 2)], []),
              ([SplitChoice(1, 0, 12, False)], [(3, 4)], [NodeSplit(2, 5, 6, guests_mask)])]
    for depth, (choices, children, own) in enumerate(levels):
        told = [replace(c, left_id=left, right_id=right)
                for c, (left, right) in zip(choices, children, strict=True)]
        ahead.from_guest(MsgType.SPLIT_CHOICES, SplitChoices(0, depth, told, True, own))
        assert ahead.command(MsgType.APPLY_SPLITS, Step(0, depth)).kind == MsgType.ACK
        applied, built = _sent(ahead)
        assert applied.kind == MsgType.APPLIED_SPLITS and built.kind == MsgType.ENCRYPTED_HISTOGRAMS
        assert built.body.depth == depth + 1

        broadcast.from_guest(MsgType.SPLIT_CHOICES, SplitChoices(0, depth, choices))
        assert broadcast.command(MsgType.APPLY_SPLITS, Step(0, depth)).kind == MsgType.ACK
        [reference_applied] = _sent(broadcast)
        assert reference_applied.body == applied.body  # the same records and instance spaces
        theirs: AppliedSplits = reference_applied.body
        positions = sorted([*own, *(NodeSplit(a.node, *ids, a.left) for a, ids
                                    in zip(theirs.splits, children, strict=True))],
                           key=lambda s: s.node)
        broadcast.from_guest(MsgType.NODE_POSITIONS, NodePositions(0, depth, positions))
        assert broadcast.command(MsgType.BUILD_HISTOGRAMS, Step(0, depth + 1)).kind == MsgType.ACK
        [reference] = _sent(broadcast)
        assert built.body.nodes == reference.body.nodes
        assert _sums(built.body, keypair[1]) == _sums(reference.body, keypair[1])


@pytest.mark.parametrize("case", ["private", "last level", "no children", "closed node",
                                  "node twice", "old child", "chosen few rows", "nothing"])
def test_building_ahead_is_refused_before_any_split_is_recorded(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey], case: str) -> None:
    spec, choice = SPEC, SplitChoice(0, 1, 16, True, 1, 2)
    own: list[NodeSplit] = []
    halves = encode_mask(np.arange(ROWS) < ROWS // 2)
    if case == "private":
        spec, why = replace(SPEC, dp_epsilon=1.0), "ahead under differential privacy"
    elif case == "last level":
        spec = replace(SPEC, params=replace(SPEC.params, max_depth=1))
        why = "refused to build a level below the maximum depth 1"
    elif case == "no children":
        choice, why = replace(choice, right_id=-1), "children without ids"
    elif case == "closed node":  # the active party's own split of a node not at this level
        own, why = [NodeSplit(3, 5, 6, halves)], "positions split nodes [0, 3]"
    elif case == "node twice":
        own, why = [NodeSplit(0, 1, 2, halves)], "positions split nodes [0, 0]"
    elif case == "old child":
        choice, why = replace(choice, left_id=0), "children [0, 2], not all new and distinct"
    elif case == "chosen few rows":  # the next level would sum one chosen row's bins
        spec = replace(SPEC, params=replace(SPEC.params, min_samples_leaf=5))
        choice, why = replace(choice, bin=0, missing_left=False), "min_samples_leaf is 5"
    else:
        why = "no split, or children without ids"
    host = _at_root(tmp_path, keypair, spec)
    choices = [] if case == "nothing" else [choice]
    host.from_guest(MsgType.SPLIT_CHOICES, SplitChoices(0, 0, choices, True, own))
    refused = host.command(MsgType.APPLY_SPLITS, Step(0, 0))
    assert isinstance(refused.body, ErrorReply) and why in refused.body.message
    run = host.worker.jobs["job"].state.role_state
    assert not _sent(host) and not run.records and run.depth == 0  # nothing recorded or sent

    host.from_guest(MsgType.SPLIT_CHOICES, SplitChoices(0, 0, [SplitChoice(0, 1, 16, True)]))
    assert host.command(MsgType.APPLY_SPLITS, Step(0, 0)).kind == MsgType.ACK  # goes on
    [applied] = _sent(host)
    mask = goes_left(host.bins[:, 1], 16, True, SPEC.params.max_bin)
    assert decode_mask(applied.body.splits[0].left, ROWS).tolist() == mask.tolist()
