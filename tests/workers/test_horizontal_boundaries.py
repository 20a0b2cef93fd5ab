"""A horizontal member's refusals, against an attacker holding the aggregator's and the flow's
keys (docs/horizontal.md, "Refusals").

One real member worker (``a``, breast_homo_guest.csv) with real signing keys; the test plays the
flow, the aggregator and the two other members (their real X25519 mask keys). The member's
masked histogram only opens in the sum with the other members' masks of the same round; a
second vector under one mask, a round for fewer than ``min_members``, splits of nodes that are
not open, and leaf values for other leaves are refused in one line, and the worker goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from boosting.binning import apply_cuts
from boosting.fixedpoint import peak_exponent, quantize_at
from boosting.hist import build_histograms
from boosting.losses import gradients
from messages.bodies import ErrorReply, PartyInfo
from messages.envelope import Envelope, MsgType
from messages.horizontal import (GradientRange, GradientScale, HorizontalSpec, LeafValues,
                                 LevelSplits, MaskedVector, MaskPublicKey, MemberSummaries,
                                 NodeSplit, OpenHorizontal, Round, SharedCuts)
from messages.signing import federation_sealers
from messages.transport import MemoryHub
from workers.data import load_party_data
from workers.horizontal.masking import MaskKey, MaskRound, mask_vector, pair_secret, unmask_sum
from workers.horizontal.summary import decode_summaries, merge_cuts
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import PartySpec, Worker

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "breast_homo_guest.csv"
MEMBERS = ["a", "b", "c"]
SEALERS = federation_sealers([*MEMBERS, "agg"])
SPEC = HorizontalSpec([*(PartyInfo(m, "member") for m in MEMBERS), PartyInfo("agg", "aggregator")],
                      2, 3, 0.3, 32, "binary", 1.0, 0.0, 1.0, 1, 1.0, 0, 2, 256, 0.0, 0.0, -1)
KEYS = {m: MaskKey.generate() for m in ("b", "c")}


class Federation:
    """Member ``a`` in a real worker; everyone else played by the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.hub = MemoryHub([*MEMBERS, "agg", "flow"])
        party = PartySpec("a", "", str(DATA), "id", "y", str(tmp_path / "a"),
                          policy=PartyPolicy(protocols=("horizontal",)))
        self.worker = Worker(party, self.hub.endpoint("a"), PROTOCOLS, SEALERS["a"])
        self.steps = 0

    def command(self, kind: MsgType, body: Any) -> Any:
        self.steps += 1
        self.worker.handle_bytes(SEALERS["flow"].seal(
            Envelope("job", f"s/{self.steps}", "flow", "a", kind, body)))
        data = self.hub.endpoint("flow").receive(timeout=5)
        assert data is not None, f"no reply to {kind.name}"
        return SEALERS["flow"].open(data).body

    def peer(self, sender: str, kind: MsgType, body: Any) -> None:
        self.worker.handle_bytes(SEALERS[sender].seal(Envelope("job", "s/peer", sender, "a", kind,
                                                               body)))

    def received(self, who: str) -> list[Envelope]:
        out = []
        while (data := self.hub.endpoint(who).receive(timeout=0.2)) is not None:
            out.append(SEALERS[who].open(data))
        return out


@pytest.fixture()
def started(tmp_path: Path) -> tuple[Federation, np.ndarray, list[np.ndarray], dict[str, bytes]]:
    """Member ``a`` opened, binned, with its gradients of tree 0 and the common scale."""
    fed = Federation(tmp_path)
    assert fed.command(MsgType.H_OPEN_JOB, OpenHorizontal(SPEC)).rows > 0
    a_public = [e.body.key for e in fed.received("b") if e.kind == MsgType.H_MASK_KEY][0]
    for m in ("b", "c"):
        fed.peer(m, MsgType.H_MASK_KEY, MaskPublicKey(KEYS[m].public_bytes()))
    fed.command(MsgType.H_SUMMARIZE, Round())
    sent = fed.received("agg")
    summaries: MemberSummaries = next(e.body for e in sent if e.kind == MsgType.H_SUMMARIES)
    from workers.horizontal.summary import SummaryBytes
    cuts = merge_cuts([decode_summaries([SummaryBytes(f.values, f.weights, f.exact)
                                         for f in summaries.features], 256)], 32)
    fed.peer("agg", MsgType.H_CUTS, SharedCuts(summaries.columns,
                                               [np.asarray(c, "<f8").tobytes() for c in cuts], -0.5))
    fed.command(MsgType.H_APPLY_BINS, Round())
    fed.command(MsgType.H_COMPUTE_GRADIENTS, Round(0, -1, 0, MEMBERS))
    peak: GradientRange = next(e.body for e in fed.received("agg")
                               if e.kind == MsgType.H_GRADIENT_RANGE)
    rows = peak.rows * 3
    fed.peer("agg", MsgType.H_GRADIENT_SCALE, GradientScale(0, 0, peak.g_exponent,
                                                             peak.h_exponent, rows))
    secrets = {m: pair_secret(KEYS[m], a_public, "job", m, "a") for m in ("b", "c")}
    data = load_party_data("a", DATA, "id", "y", require_label=True)
    g, h = (v[:, 0] for v in gradients("binary", np.full((data.y.size, 1), -0.5), data.y))
    q_g, q_h = quantize_at(g, rows, peak_exponent(g)), quantize_at(h, rows, peak_exponent(h))
    plain = build_histograms(apply_cuts(data.x, cuts, 32), np.zeros(data.y.size, np.int64),
                             q_g.ints, q_h.ints, 1, 32)
    return fed, plain, cuts, secrets


def test_the_masked_histogram_opens_only_in_the_sum_with_the_other_members(started: Any) -> None:
    fed, plain, _, secrets = started
    assert fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS)).count == 1
    masked: MaskedVector = next(e.body for e in fed.received("agg") if e.kind == MsgType.H_MASKED)
    vector = np.frombuffer(masked.values, "<u8").astype(np.uint64)
    assert not np.array_equal(vector.view(np.int64), plain.ravel())  # masked on the wire
    round_ = MaskRound("job", "hist", 0, 0, 0)
    zeros = np.zeros(plain.size, np.int64)
    others = [mask_vector(zeros, m, {p: secrets[m] if p == "a" else _pair(m, p)
                                     for p in MEMBERS if p != m}, round_)
              for m in ("b", "c")]
    assert np.array_equal(unmask_sum([vector, *others]), plain.ravel())  # exactly the plain sum
    # without one member's masks, the sum is still noise
    assert not np.array_equal(unmask_sum([vector, others[0]]), plain.ravel())


def _pair(me: str, peer: str) -> bytes:
    """The pair secret of two members the test plays."""
    return pair_secret(KEYS[me], KEYS[peer].public_bytes(), "job", me, peer)


def test_a_second_vector_under_the_same_masks_is_refused(started: Any) -> None:
    fed, *_ = started
    fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    fed.received("agg")
    again = fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    assert isinstance(again, ErrorReply)
    assert "already masked a vector for hist tree 0 depth 0 attempt 0: refused" in again.message
    assert not [e for e in fed.received("agg") if e.kind == MsgType.H_MASKED]


def test_a_round_for_too_few_or_foreign_members_is_refused(started: Any) -> None:
    fed, *_ = started
    for members, why in ((["a"], "1 members left, the job needs 2"),
                         (["a", "b", "mallory"], "not a set of this job's members"),
                         (["a", "a", "b"], "not a set of this job's members")):
        reply = fed.command(MsgType.H_COMPUTE_GRADIENTS, Round(0, -1, 1, members))
        assert isinstance(reply, ErrorReply) and why in reply.message, reply


def test_splits_of_nodes_that_are_not_open_are_refused(started: Any) -> None:
    fed, *_ = started
    fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    for splits, build, why in (
            ([NodeSplit(5, 0, 3, False, 1, 2)], [1], "not an open node of depth 0"),
            ([NodeSplit(0, 99, 3, False, 1, 2)], [1], "out of range"),
            ([NodeSplit(0, 0, 3, False, 7, 8)], [7], "expected 1, 2")):
        fed.peer("agg", MsgType.H_SPLITS, LevelSplits(0, 0, 0, splits, build))
        reply = fed.command(MsgType.H_APPLY_SPLITS, Round(0, 0, 0, MEMBERS))
        assert isinstance(reply, ErrorReply) and why in reply.message, reply


def test_leaf_values_for_other_leaves_are_refused_and_an_old_attempt_is_ignored(
        started: Any) -> None:
    fed, *_ = started
    fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    fed.peer("agg", MsgType.H_SPLITS, LevelSplits(0, 0, 0, [NodeSplit(0, 0, 3, False, 1, 2)], [1]))
    assert fed.command(MsgType.H_APPLY_SPLITS, Round(0, 0, 0, MEMBERS)).count == 2
    fed.peer("agg", MsgType.H_LEAVES, LeafValues(0, 0, [0, 1, 2], [0.1, 0.2, 0.3]))
    reply = fed.command(MsgType.H_RECEIVE_TREE, Round(0, -1, 0, MEMBERS))
    assert isinstance(reply, ErrorReply)
    assert "leaf values for nodes [0, 1, 2]; this tree's leaves are [1, 2]" in reply.message
    # a stale attempt's leaves are dropped; the current attempt's are applied
    fed.peer("agg", MsgType.H_LEAVES, LeafValues(0, 7, [1, 2], [9.0, 9.0]))
    fed.peer("agg", MsgType.H_LEAVES, LeafValues(0, 0, [1, 2], [0.25, -0.25]))
    done = fed.command(MsgType.H_RECEIVE_TREE, Round(0, -1, 0, MEMBERS))
    assert not isinstance(done, ErrorReply), done
    tree = fed.worker.jobs["job"].state.trees[0]
    assert [n.value for n in tree.nodes if n.is_leaf] == [0.25, -0.25]


def test_the_aggregator_waits_for_every_current_message_without_consuming_any(
        tmp_path: Path) -> None:
    """After a dropout, stale messages of the abandoned attempt wait in the aggregator's
    mailbox beside the new ones; agree_scale must drop them and wait for every live member's
    new one before it takes any (it once took one member's new range, then waited for the
    other's and never saw the first again)."""
    hub = MemoryHub([*MEMBERS, "agg", "flow"])
    party = PartySpec("agg", "", "", "id", None, str(tmp_path / "agg"),
                      policy=PartyPolicy(protocols=("horizontal",)))
    agg = Worker(party, hub.endpoint("agg"), PROTOCOLS, SEALERS["agg"])
    keys = {m: MaskKey.generate() for m in MEMBERS}
    steps = iter(range(100))

    def command(kind: MsgType, body: Any) -> Envelope | None:
        agg.handle_bytes(SEALERS["flow"].seal(Envelope("job", f"s/{next(steps)}", "flow", "agg",
                                                       kind, body)))
        data = hub.endpoint("flow").receive(timeout=0.5)
        return None if data is None else SEALERS["flow"].open(data)

    def peer(sender: str, kind: MsgType, body: Any) -> None:
        agg.handle_bytes(SEALERS[sender].seal(Envelope("job", "s/peer", sender, "agg", kind,
                                                       body)))

    assert command(MsgType.H_OPEN_JOB, OpenHorizontal(SPEC)).kind == MsgType.OPENED
    data = load_party_data("a", DATA, "id", "y", require_label=True)
    from workers.horizontal.summary import encode_summaries, summarize
    from messages.horizontal import FeatureSummaryBytes
    features = [FeatureSummaryBytes(s.values, s.weights, s.exact)
                for s in encode_summaries(summarize(data.x, 256))]
    for m in MEMBERS:
        secrets = {p: pair_secret(keys[m], keys[p].public_bytes(), "job", m, p)
                   for p in MEMBERS if p != m}
        stats = mask_vector(np.array([data.y.size, int(data.y.sum())], np.int64), m, secrets,
                            MaskRound("job", "stats", -1, -1, 0))
        peer(m, MsgType.H_SUMMARIES, MemberSummaries(list(data.names), features))
        peer(m, MsgType.H_MASKED, MaskedVector("stats", -1, -1, 0, stats.astype("<u8").tobytes()))
    assert command(MsgType.H_MERGE_BINS, Round()).body.count == len(data.names)
    # attempt 0: a and c answered, b never did; the flow restarts tree 0 as attempt 1 with a, c
    for m in ("a", "c"):
        peer(m, MsgType.H_GRADIENT_RANGE, GradientRange(0, 0, 0, -2, 100))
    peer("a", MsgType.H_GRADIENT_RANGE, GradientRange(0, 1, 0, -2, 100))
    assert command(MsgType.H_AGREE_SCALE, Round(0, -1, 1, ["a", "c"])) is None  # waits for c
    peer("c", MsgType.H_GRADIENT_RANGE, GradientRange(0, 1, -1, -3, 50))
    reply = SEALERS["flow"].open(hub.endpoint("flow").receive(timeout=5))
    assert reply.kind == MsgType.ACK and reply.body.count == 150  # a's and c's rows of attempt 1
    for m in ("a", "c"):
        sent = []
        while (raw := hub.endpoint(m).receive(timeout=0.5)) is not None:
            sent.append(SEALERS[m].open(raw))
        assert [e.body for e in sent if e.kind == MsgType.H_GRADIENT_SCALE] == \
            [GradientScale(0, 1, 0, -2, 150)]
