"""What a forest party refuses, attacked by whoever holds the other side's signing key.

A passive party's histograms reveal, per bin of its features, sums over the rows of a node; a
node of one row would reveal that row's bin of every feature asked. So it accepts only the
job's own sample (drawn from its public seed), labels in the shape of the job's objective,
histograms of nodes of the current level (one request each)
holding room for two leaves, and one split per open node. The active party accepts only answers
for the splits it asked, splitting a node into two non-empty children.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from boosting.forest import bootstrap_weights, tree_rng
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.paillier import ciphertexts_from_bytes, ciphertexts_to_bytes, generate_keypair
from messages.bodies import PartyInfo
from messages.secureboost import NodeSplit
from messages.envelope import MsgType
from messages.forest import (ForestParams, EncryptedLabels, ForestApplied, ForestSpec, LevelRequest,
                             NodeRequest)
from messages.instance_space import encode_mask
from workers import ProtocolError
from workers.forest.active_state import GrowingTree
from workers.forest.growing import collect_applied
from workers.forest.passive import (PassiveForest, _check_label_shape, _histograms, _route,
                                    _start_tree)
from workers.mailbox import Mailbox

ROWS, FEATURES, MAX_BIN = 40, 3, 8


def _spec(**changes: object) -> ForestSpec:
    params = dict(n_trees=4, max_depth=4, max_features="sqrt", min_samples_leaf=3,
                  max_bin=MAX_BIN, objective="binary", bootstrap=False, seed=0,
                  complete_secure=False)
    params.update(changes)
    return ForestSpec([PartyInfo("guest", "active"), PartyInfo("host", "passive")],
                      ForestParams(**params),  # type: ignore[arg-type]
                      key_bits=1024, valid_fraction=0.0, valid_seed=0, label="y")


@pytest.fixture(scope="module")
def host() -> tuple[PassiveForest, np.ndarray]:
    """A passive party holding real encrypted labels of ROWS rows."""
    public, private = generate_keypair(1024)
    packer = GradientPacker(1, ROWS)
    labels = packer.pack([k % 2 for k in range(ROWS)], [0] * ROWS)
    encrypted = ciphertexts_from_bytes(
        ciphertexts_to_bytes(private.encrypt_batch(labels), public), public)
    run = PassiveForest(spec=_spec(), public=public, labels=[encrypted],
                        packing=BinSumPacking.for_key(packer.cell_bits, 1024))
    bins = np.random.default_rng(0).integers(0, MAX_BIN, size=(ROWS, FEATURES)).astype(np.uint8)
    return run, bins


def _request(weights: np.ndarray | None = None, depth: int = 0,
             requests: list[NodeRequest] | None = None,
             splits: list[NodeSplit] | None = None, work: int = 1) -> LevelRequest:
    w = b"" if weights is None else weights.astype("<u2").tobytes()
    return LevelRequest(tree=work, depth=depth, weights=w, splits=splits or [],
                        requests=requests if requests is not None else [NodeRequest(0, [0, 1])])


def test_only_the_jobs_own_sample_is_summed(host: tuple[PassiveForest, np.ndarray]) -> None:
    run, _ = host
    run.spec = _spec(bootstrap=True)
    try:
        job_sample = bootstrap_weights(tree_rng(0, 1), ROWS, True)
        one_row = np.zeros(ROWS, dtype=np.int64)
        one_row[7] = ROWS  # the weight of the whole sample on one row: its bins would show alone
        lighter = np.ones(ROWS, dtype=np.int64)
        lighter[:30] = 0
        # every row once: a legal bootstrap draw only with probability n!/n^n, and the one
        # shape in which sums of chosen plaintexts (2^i for row i) read as bitmasks of rows
        every_row_once = np.ones(ROWS, dtype=np.int64)
        another_tree = bootstrap_weights(tree_rng(0, 2), ROWS, True)
        for weights in (one_row, lighter, every_row_once, another_tree):
            with pytest.raises(ProtocolError, match="not the job's bootstrap=True sample"):
                _start_tree(run, _request(weights), ROWS)
        with pytest.raises(ProtocolError, match="sample weights for 20 rows"):
            _start_tree(run, _request(job_sample[:20]), ROWS)
        work = _start_tree(run, _request(job_sample), ROWS)  # the job's own draw
        assert (work.weights == job_sample).all()
    finally:
        run.spec = _spec()
    twice = np.ones(ROWS, dtype=np.int64)
    twice[0], twice[1] = 2, 0
    with pytest.raises(ProtocolError, match="bootstrap=False"):
        _start_tree(run, _request(twice), ROWS)


def test_labels_only_in_the_objectives_shape() -> None:
    """The label shape sets how wide each bin sum is packed, so how many bits of each sum a
    decryption shows; chosen plaintexts in a wider declared shape would show more."""
    labels = EncryptedLabels(groups=1, value_bits=1, max_rows=ROWS, ciphertexts=b"")
    _check_label_shape(_spec(), labels, ROWS)
    _check_label_shape(_spec(objective="regression"), replace(labels, value_bits=40), ROWS)
    _check_label_shape(_spec(objective="multiclass"), replace(labels, groups=5), ROWS)
    for spec, shape in ((_spec(), replace(labels, value_bits=64)),
                        (_spec(), replace(labels, groups=64)),
                        (_spec(objective="regression"), replace(labels, value_bits=64)),
                        (_spec(objective="multiclass"), replace(labels, groups=65)),
                        (_spec(), replace(labels, max_rows=ROWS + 1))):
        with pytest.raises(ProtocolError, match="labels of"):
            _check_label_shape(spec, shape, ROWS)


def test_histograms_only_of_the_levels_nodes_with_room_for_two_leaves(
        host: tuple[PassiveForest, np.ndarray]) -> None:
    run, bins = host
    work = _start_tree(run, _request(np.ones(ROWS, dtype=np.int64)), ROWS)
    for requests, why in (([NodeRequest(5, [0])], "the level has \\[0\\]"),
                          ([NodeRequest(0, [0]), NodeRequest(0, [1])], "one request each"),
                          ([NodeRequest(0, [FEATURES])], "out of range"),
                          ([NodeRequest(0, [1, 1])], "out of range or repeated")):
        with pytest.raises(ProtocolError, match=why):
            _histograms("host", run, work, _request(requests=requests), bins)
    # a split that leaves 2 rows on one side: that child cannot be asked for
    left = np.zeros(ROWS, dtype=bool)
    left[:2] = True
    _route("host", work, _request(depth=1, requests=[], splits=[
        NodeSplit(0, 1, 2, encode_mask(left))]))
    with pytest.raises(ProtocolError, match="fewer than two leaves' 3 rows: refused"):
        _histograms("host", run, work, _request(depth=1, requests=[NodeRequest(1, [0, 1, 2])]),
                    bins)
    answer = _histograms("host", run, work, _request(depth=1, requests=[NodeRequest(2, [0])]),
                         bins)
    assert len(answer.ciphertexts) == 1  # the larger child is answered


def test_routing_reuses_no_node_and_splits_each_once(
        host: tuple[PassiveForest, np.ndarray]) -> None:
    run, _ = host
    work = _start_tree(run, _request(np.ones(ROWS, dtype=np.int64)), ROWS)
    half = encode_mask(np.arange(ROWS) < ROWS // 2)
    with pytest.raises(ProtocolError, match="not all new and distinct"):
        _route("host", work, _request(depth=1, splits=[NodeSplit(0, 0, 1, half)]))
    with pytest.raises(ProtocolError, match="the level has"):
        _route("host", work, _request(depth=1, splits=[NodeSplit(3, 4, 5, half)]))
    with pytest.raises(ProtocolError, match="the level has"):
        _route("host", work, _request(depth=1, splits=[NodeSplit(0, 1, 2, half),
                                                       NodeSplit(0, 3, 4, half)]))


def _active_ctx(applied: ForestApplied) -> SimpleNamespace:
    mailbox = Mailbox()
    mailbox.put((MsgType.F_APPLIED, "host", applied.tree, applied.depth), applied)
    return SimpleNamespace(mailbox=mailbox)


def _grown() -> GrowingTree:
    grown = GrowingTree(tree=0, work=0, weights=np.ones(ROWS, dtype=np.int64),
                        node_of_row=np.zeros(ROWS, dtype=np.int64))
    grown.waiting = {"host": {0}}
    return grown


def test_the_active_party_takes_only_the_splits_it_asked_for() -> None:
    state = SimpleNamespace()
    half = np.packbits(np.arange(ROWS) < ROWS // 2).tobytes()
    for applied, why in (
            (ForestApplied(0, 0, [0, 1], [5, 6], [half, half]), "asked \\[0\\]"),
            (ForestApplied(0, 0, [0], [5], [np.packbits(np.ones(ROWS, bool)).tobytes()]),
             "leaves a child empty"),
            (ForestApplied(0, 0, [0], [5], [half[:2]]), "the wrong rows")):
        with pytest.raises(ProtocolError, match=why):
            collect_applied(_active_ctx(applied), state, _grown())  # type: ignore[arg-type]
    grown = _grown()
    collect_applied(_active_ctx(ForestApplied(0, 0, [0], [5], [half])), state,  # type: ignore[arg-type]
                    grown)
    assert grown.nodes[0] == {"owner": "host", "record_id": 5, "left": 1, "right": 2}
    assert (grown.node_of_row == 1).sum() == ROWS // 2
