"""A passive party computes at most one split per open node of the current level.

The attack: whoever holds the active party's signing key sends one SplitChoices listing every
(feature, bin) of node 0; a party that applied them all would return the left instance space of
each, which rebuilds its whole binned matrix, and plant a lookup record for each.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from boosting.binning import fit_cuts
from boosting.fixedpoint import value_bits
from crypto.paillier import PaillierPrivateKey, PaillierPublicKey, generate_keypair
from messages.bodies import ErrorReply, Step
from messages.secureboost import (NodePositions, NodeSplit, SplitChoice, SplitChoices,
                                  TreeStart)
from messages.envelope import Envelope, Kind, MsgType
from messages.instance_space import decode_mask, encode_mask
from messages.transport import MemoryHub
from tests.scenarios import TEST_POLICY
from tests.workers.test_chosen_gradients import FEATURES, Host, _chosen_gradients
from tests.workers.test_tree_start import ROWS, SEALERS, SPEC, _gradients, _host
from workers.runtime import Worker
from workers.vertical.passive import PassiveTraining


@pytest.fixture(scope="module")
def keypair() -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    return generate_keypair(1024)


def _attacker(kind: Kind, body: object) -> bytes:
    """Sealed with the active party's key: the attacker holds it."""
    return SEALERS["guest"].seal(Envelope("job", "s/find_splits", "guest", "host", kind, body))


def _apply(worker: Worker, hub: MemoryHub, choices: list[SplitChoice], task: str,
           depth: int = 0) -> Envelope:
    worker.handle_bytes(_attacker(MsgType.SPLIT_CHOICES, SplitChoices(0, depth, choices)))
    worker.handle_bytes(SEALERS["flow"].seal(Envelope(
        "job", f"s/{task}", "flow", "host", MsgType.APPLY_SPLITS, Step(0, depth))))
    data = hub.endpoint("flow").receive(timeout=5)
    assert data is not None
    return SEALERS["flow"].open(data)


def _masks_sent(hub: MemoryHub) -> list[Envelope]:
    out = []
    while (data := hub.endpoint("guest").receive(timeout=0.2)) is not None:
        out.append(SEALERS["guest"].open(data))
    return [e for e in out if e.kind == MsgType.APPLIED_SPLITS]


def _started(tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]
             ) -> tuple[Worker, MemoryHub, PassiveTraining]:
    public, private = keypair
    worker, _, hub = _host(tmp_path, public)
    start, chunks = _gradients(public, private)
    for message in (start, *chunks):
        worker.handle_bytes(message)
    state = worker.jobs["job"].state
    state.cuts = fit_cuts(np.random.default_rng(1).normal(size=(ROWS, 3)), 32)  # for thresholds
    run: PassiveTraining = state.role_state
    assert run.tree == 0 and run.depth == 0
    return worker, hub, run


def test_every_feature_and_bin_of_node_0_is_refused_and_the_worker_goes_on(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey],
        caplog: pytest.LogCaptureFixture) -> None:
    worker, hub, run = _started(tmp_path, keypair)
    everything = [SplitChoice(node=0, feature=f, bin=b, missing_left=False)
                  for f in range(3) for b in range(32)]
    refused = _apply(worker, hub, everything, "apply-all")
    assert isinstance(refused.body, ErrorReply)
    assert "refused 96 splits for nodes [0]: at most one split per node" in refused.body.message
    assert "APPLY_SPLITS failed: host: t0 d0: refused 96 splits" in caplog.text  # logged
    assert not _masks_sent(hub) and not run.records  # no instance space, no lookup record

    for bad, why in (([SplitChoice(7, 0, 3, False)], "nodes [7]: not open"),
                     ([SplitChoice(-1, 0, 3, False)], "nodes [-1]: not open"),
                     ([SplitChoice(0, 5, 3, False)], "feature 5 bin 3 is out of range")):
        reply = _apply(worker, hub, bad, f"apply-{why}")
        assert isinstance(reply.body, ErrorReply) and why in reply.body.message
        assert not _masks_sent(hub) and not run.records

    honest = _apply(worker, hub, [SplitChoice(0, 1, 16, True)], "apply-one")
    assert honest.kind == MsgType.ACK and honest.body.count == 1  # still serving
    [sent] = _masks_sent(hub)
    assert [s.node for s in sent.body.splits] == [0] and len(run.records) == 1
    again = _apply(worker, hub, [SplitChoice(0, 2, 8, False)], "apply-again")
    assert isinstance(again.body, ErrorReply) and "nodes [0]: not open" in again.body.message
    assert not _masks_sent(hub) and len(run.records) == 1


def test_positions_must_split_each_open_node_once_into_new_children(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    worker, hub, run = _started(tmp_path, keypair)
    left = encode_mask(np.arange(ROWS) < ROWS // 2)
    for task, splits in (("twice", [NodeSplit(0, 1, 2, left), NodeSplit(0, 3, 4, left)]),
                         ("reused", [NodeSplit(0, 0, 2, left)])):
        worker.handle_bytes(_attacker(MsgType.NODE_POSITIONS, NodePositions(0, 0, splits)))
        worker.handle_bytes(SEALERS["flow"].seal(Envelope(
            "job", f"s/{task}", "flow", "host", MsgType.BUILD_HISTOGRAMS, Step(0, 1))))
        data = hub.endpoint("flow").receive(timeout=5)
        assert data is not None
        reply = SEALERS["flow"].open(data)
        assert isinstance(reply.body, ErrorReply) and "positions" in reply.body.message
    assert run.depth == 0 and run.level_nodes == {0}


def test_positions_must_leave_the_jobs_min_samples_leaf_in_each_child(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    """A malicious active party's positions could put one chosen row in a node: the node's
    bin sums (its count slot alone) would show that row's bin of every feature."""
    host = Host(tmp_path, keypair[0], TEST_POLICY, replace(SPEC, params=replace(SPEC.params, min_samples_leaf=5)))
    refused = _split_off_one_row(host, keypair)
    assert "node 0 split into 1 and 39 rows; the job's min_samples_leaf is 5" in refused.message
    assert host.hub.endpoint("guest").receive(timeout=0.2) is None  # no sums of that node
    halves = encode_mask(np.arange(ROWS) < ROWS // 2)
    host.from_guest(MsgType.NODE_POSITIONS, NodePositions(0, 0, [NodeSplit(0, 1, 2, halves)]))
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 1)).kind == MsgType.ACK  # goes on


def _split_off_one_row(host: Host,
                       keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> ErrorReply:
    """Tree 0's root summed, then positions that put row 7 alone in a child: the refusal."""
    _chosen_gradients(host, keypair, tree=0, per_ciphertext=1)
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 0)).kind == MsgType.ACK
    host.histograms()
    one_row = np.zeros(ROWS, dtype=bool)
    one_row[7] = True
    host.from_guest(MsgType.NODE_POSITIONS,
                    NodePositions(0, 0, [NodeSplit(0, 1, 2, encode_mask(one_row))]))
    refused = host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 1))
    assert isinstance(refused.body, ErrorReply)
    return refused.body


def test_under_dp_an_empty_child_is_allowed_and_a_small_one_still_refused(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    """Under DP the active party draws among all of this party's bins, past its last cut
    too: a child of no rows is an honest split and shows nothing; one chosen row still is not."""
    spec = replace(SPEC, dp_epsilon=1.0, params=replace(SPEC.params, min_samples_leaf=5))
    host = Host(tmp_path, keypair[0], TEST_POLICY, spec)
    assert "node 0 split into 1 and 39 rows" in _split_off_one_row(host, keypair).message
    everything_right = encode_mask(np.zeros(ROWS, dtype=bool))
    host.from_guest(MsgType.NODE_POSITIONS,
                    NodePositions(0, 0, [NodeSplit(0, 1, 2, everything_right)]))
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 1)).kind == MsgType.ACK


def test_gradients_in_no_chunk_only_for_a_private_tree_of_no_rows(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    """Under DP the last trees of an ensemble may be dealt no rows: their gradients come in no
    chunk and their histograms are empty. Without DP no honest job starts such a tree, and
    under DP no chunk with rows in the tree is still refused."""
    none = TreeStart(tree=0, in_tree=encode_mask(np.zeros(ROWS, dtype=bool)), n_chunks=0,
                     value_bits=value_bits(ROWS), max_rows=ROWS, per_ciphertext=1)
    private = replace(SPEC, dp_epsilon=1.0)
    for k, (spec, start, refusal) in enumerate((
            (SPEC, none, "gradients in 0 chunks; only a job under differential privacy"),
            (private, replace(none, in_tree=encode_mask(np.ones(ROWS, dtype=bool))),
             f"gradients in 0 chunks for {ROWS} in-tree rows"))):
        folder = tmp_path / f"refused{k}"
        folder.mkdir()
        host = Host(folder, keypair[0], TEST_POLICY, spec)
        host.from_guest(MsgType.TREE_START, start)
        refused = host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 0))
        assert isinstance(refused.body, ErrorReply) and refusal in refused.body.message
    host = Host(tmp_path, keypair[0], TEST_POLICY, private)
    host.from_guest(MsgType.TREE_START, none)
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 0)).kind == MsgType.ACK
    empty = host.histograms()
    assert empty.n_features == FEATURES and empty.ciphertexts == b""
    assert not decode_mask(empty.filled, FEATURES * empty.n_bins).any()
