"""A horizontal member's refusals, against an attacker holding the aggregator's and the flow's
keys (docs/horizontal.md, "Refusals").

One real member worker (``a``, breast_homo_guest.csv) with real signing keys; the test plays the
flow, the aggregator and the two other members (their real X25519 mask keys). The member's
masked histogram only opens in the sum with the other members' masks of the same round (and,
at the root, with the round key it releases); a second vector under one mask, a round for
fewer than ``min_members``, the root of a tree opened again for another member set (also
after a restart), splits of nodes that are not open, leaf values for other leaves, and cuts
that are not edges of the set-up grid are refused in one line, and the worker goes on.
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
from messages.bodies import Checkpoint, ErrorReply, PartyInfo, ResumeJob
from messages.envelope import Envelope, Kind, MsgType
from messages.horizontal import (GradientRange, GradientScale, HorizontalSpec, LeafValues,
                                 LevelSplits, MaskedVector, MaskPublicKey, MemberColumns,
                                 NodeSplit, OpenHorizontal, RefineCells, Round, RoundKey,
                                 SealShare, SharedCuts)
from messages.signing import federation_sealers
from messages.transport import MemoryHub
from messages.params import TreeParams
from workers import checkpoint
from workers.data import load_party_data
from workers.horizontal.grid import GridRounds, count_columns
from workers.pairwise_masks import (MaskKey, MaskRound, mask_vector, open_seal_share,
                                        pair_secret, round_seal_key, seal_share, seal_vector,
                                        unmask_sum, unseal_sum)
from workers.party import PartySpec
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "breast_homo_guest.csv"
MEMBERS = ["a", "b", "c"]
SEALERS = federation_sealers([*MEMBERS, "agg"])
SPEC = HorizontalSpec([*(PartyInfo(m, "member") for m in MEMBERS), PartyInfo("agg", "aggregator")],
                      TreeParams(n_trees=2, max_depth=3), 2, 256, 0.0, 0.0, -1)
KEYS = {m: MaskKey.generate() for m in ("b", "c")}
SEALS = {m: bytes([ord(m)]) * 32 for m in ("b", "c")}
"""The seal contributions of the members the test plays."""


class Federation:
    """Member ``a`` in a real worker; everyone else played by the test."""

    def __init__(self, tmp_path: Path, steps: int = 0) -> None:
        self.hub = MemoryHub([*MEMBERS, "agg", "flow"])
        party = PartySpec("a", "", str(DATA), "id", "y", str(tmp_path / "a"),
                          policy=PartyPolicy(protocols=("horizontal",)))
        self.worker = Worker(party, self.hub.endpoint("a"), PROTOCOLS, SEALERS["a"])
        self.steps = steps

    def command(self, kind: Kind, body: Any) -> Any:
        self.steps += 1
        self.worker.handle_bytes(SEALERS["flow"].seal(
            Envelope("job", f"s/{self.steps}", "flow", "a", kind, body)))
        data = self.hub.endpoint("flow").receive(timeout=5)
        assert data is not None, f"no reply to {kind.name}"
        return SEALERS["flow"].open(data).body

    def peer(self, sender: str, kind: Kind, body: Any) -> None:
        self.worker.handle_bytes(SEALERS[sender].seal(Envelope("job", "s/peer", sender, "a", kind,
                                                               body)))

    def received(self, who: str) -> list[Envelope]:
        out = []
        while (data := self.hub.endpoint(who).receive(timeout=0.2)) is not None:
            out.append(SEALERS[who].open(data))
        return out


class Started:
    """Member ``a`` opened and binned, with its gradients of tree 0 under the common scale."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        assert fed.command(MsgType.H_OPEN_JOB, OpenHorizontal(SPEC)).rows > 0
        assert not fed.received("b")  # its key goes out once every party has opened
        for m in ("b", "c"):
            fed.peer(m, MsgType.H_MASK_KEY, MaskPublicKey(KEYS[m].public_bytes()))
        data = load_party_data("a", DATA, "id", "y", require_label=True)
        self.cuts, self.sent = set_up(fed, data.x)
        to_b = fed.received("b")
        a_public = next(e.body.key for e in to_b if e.kind == MsgType.H_MASK_KEY)
        self.secrets = {m: pair_secret(KEYS[m], a_public, "job", m, "a") for m in ("b", "c")}
        share = next(e.body for e in to_b if e.kind == MsgType.H_SEAL_KEY)
        self.seals = {**SEALS, "a": open_seal_share(self.secrets["b"], share.nonce, share.sealed,
                                                    "job", "a", "b")}
        for m in ("b", "c"):
            nonce, sealed = seal_share(self.secrets[m], SEALS[m], "job", m, "a")
            fed.peer(m, MsgType.H_SEAL_KEY, SealShare(nonce, sealed))
        fed.command(MsgType.H_COMPUTE_GRADIENTS, Round(0, -1, 0, MEMBERS))
        peak: GradientRange = next(e.body for e in fed.received("agg")
                                   if e.kind == MsgType.H_GRADIENT_RANGE)
        rows = peak.rows * 3
        fed.peer("agg", MsgType.H_GRADIENT_SCALE, GradientScale(0, 0, peak.g_exponent,
                                                                 peak.h_exponent, rows))
        g, h = (v[:, 0] for v in gradients("binary", np.full((data.y.size, 1), -0.5), data.y))
        q_g, q_h = quantize_at(g, rows, peak_exponent(g)), quantize_at(h, rows, peak_exponent(h))
        self.plain = build_histograms(apply_cuts(data.x, self.cuts, 32),
                                      np.zeros(data.y.size, np.int64), q_g.ints, q_h.ints, 1, 32)


def set_up(fed: Federation, x: np.ndarray) -> tuple[list[np.ndarray], list[Envelope]]:
    """The set-up rounds with ``a``'s rows as the union's (the others count nothing): the
    test, as the aggregator, splits the cells a's counts call for and sends the cuts; returns
    them and everything ``a`` sent the aggregator."""
    sent: list[Envelope] = []
    rounds = GridRounds.start(x.shape[1], 256, 32)
    fed.command(MsgType.H_SUMMARIZE, Round(depth=0))
    while True:
        sent += fed.received("agg")
        counts = rounds.unflatten(count_columns(x, rounds.layouts))
        chosen = rounds.advance(counts)
        if chosen is None:
            break
        fed.peer("agg", MsgType.H_REFINE, RefineCells(rounds.round, [c.astype("<i4").tobytes()
                                                                     for c in chosen]))
        assert fed.command(MsgType.H_SUMMARIZE, Round(depth=rounds.round)).count == \
            sum(rounds.cells())
    cuts = rounds.cuts(counts)
    columns = next(e.body.columns for e in sent if e.kind == MsgType.H_COLUMNS)
    fed.peer("agg", MsgType.H_CUTS, SharedCuts(columns, [np.asarray(c, "<f8").tobytes()
                                                         for c in cuts], -0.5, 1))
    assert fed.command(MsgType.H_APPLY_BINS, Round()).count == x.shape[0]
    return cuts, sent


@pytest.fixture()
def started(tmp_path: Path) -> Started:
    return Started(Federation(tmp_path))


def test_set_up_sends_the_aggregator_names_and_masked_counts_only(started: Started) -> None:
    kinds = [e.kind for e in started.sent]
    assert set(kinds) == {MsgType.H_COLUMNS, MsgType.H_MASKED}
    assert [e.body.purpose for e in started.sent if e.kind == MsgType.H_MASKED] == \
        ["stats", *["grid"] * (len(kinds) - 2)]


def test_cuts_that_are_not_edges_of_the_grid_are_refused(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.command(MsgType.H_OPEN_JOB, OpenHorizontal(SPEC))
    for m in ("b", "c"):
        fed.peer(m, MsgType.H_MASK_KEY, MaskPublicKey(KEYS[m].public_bytes()))
    fed.command(MsgType.H_SUMMARIZE, Round(depth=0))
    data = load_party_data("a", DATA, "id", "y", require_label=True)
    raw = [np.array([np.median(data.x[:, j]), np.inf]) for j in range(data.x.shape[1])]
    fed.peer("agg", MsgType.H_CUTS, SharedCuts(list(data.names),
                                               [c.astype("<f8").tobytes() for c in raw], -0.5, 1))
    reply = fed.command(MsgType.H_APPLY_BINS, Round())
    assert isinstance(reply, ErrorReply)
    assert "the aggregator's cuts are not edges of the set-up grid" in reply.message


@pytest.mark.parametrize("classes", [0, 2, 4])
def test_classes_that_do_not_fit_the_objective_are_refused(tmp_path: Path, classes: int) -> None:
    """A binary job has one output: an aggregator that sends classes (as if multiclass) or
    none is refused before any row is binned."""
    fed = Federation(tmp_path)
    fed.command(MsgType.H_OPEN_JOB, OpenHorizontal(SPEC))
    for m in ("b", "c"):
        fed.peer(m, MsgType.H_MASK_KEY, MaskPublicKey(KEYS[m].public_bytes()))
    fed.command(MsgType.H_SUMMARIZE, Round(depth=0))
    data = load_party_data("a", DATA, "id", "y", require_label=True)
    cuts = [np.array([np.inf]) for _ in data.names]
    fed.peer("agg", MsgType.H_CUTS, SharedCuts(list(data.names),
                                               [c.astype("<f8").tobytes() for c in cuts], 0.0,
                                               classes))
    reply = fed.command(MsgType.H_APPLY_BINS, Round())
    assert isinstance(reply, ErrorReply)
    assert f"the aggregator's {classes} classes" in reply.message


def test_the_masked_histogram_opens_only_in_the_sum_with_the_other_members(
        started: Started) -> None:
    fed, plain, secrets = started.fed, started.plain, started.secrets
    assert fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS)).count == 1
    masked: MaskedVector = next(e.body for e in fed.received("agg") if e.kind == MsgType.H_MASKED)
    vector = np.frombuffer(masked.values, "<u8").astype(np.uint64)
    assert not np.array_equal(vector.view(np.int64), plain.ravel())  # masked on the wire
    round_ = MaskRound("job", "hist", 0, 0, 0)
    key = round_seal_key(started.seals, round_)
    zeros = np.zeros(plain.size, np.int64)
    others = [seal_vector(mask_vector(zeros, m, {p: secrets[m] if p == "a" else _pair(m, p)
                                                 for p in MEMBERS if p != m}, round_), key, m)
              for m in ("b", "c")]
    summed = unmask_sum([vector, *others])  # every vector of the root round is in ...
    assert not np.array_equal(summed, plain.ravel())  # ... and the sum is sealed
    assert fed.command(MsgType.H_RELEASE_ROUND, Round(0, 0, 0, MEMBERS)).count == 3
    released: RoundKey = next(e.body for e in fed.received("agg")
                              if e.kind == MsgType.H_ROUND_KEY)
    assert released == RoundKey(0, 0, 0, key)
    opened = unseal_sum(summed.view(np.uint64), released.key, MEMBERS).view(np.int64)
    assert np.array_equal(opened, plain.ravel())  # exactly the plain sum
    # without one member's masks, the sum is still noise
    assert not np.array_equal(unseal_sum(unmask_sum([vector, others[0]]).view(np.uint64), key,
                                         MEMBERS).view(np.int64), plain.ravel())


def test_a_tree_opened_for_three_members_is_not_opened_again_for_two(started: Started,
                                                                     tmp_path: Path) -> None:
    """The flow (or anyone holding its key) asks for tree 0 again without c after a released
    it for a, b, c: a refuses to release the root for another set, and to send deeper levels
    of a tree whose root it did not open, also after a restart."""
    fed = started.fed
    fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    assert fed.command(MsgType.H_RELEASE_ROUND, Round(0, 0, 0, MEMBERS)).count == 3
    fed.received("agg")
    fewer = ["a", "b"]
    fed.command(MsgType.H_COMPUTE_GRADIENTS, Round(0, -1, 1, fewer))
    peak = next(e.body for e in fed.received("agg") if e.kind == MsgType.H_GRADIENT_RANGE)
    fed.peer("agg", MsgType.H_GRADIENT_SCALE, GradientScale(0, 1, peak.g_exponent,
                                                             peak.h_exponent, 2 * peak.rows))
    assert fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 1, fewer)).count == 1
    refused = fed.command(MsgType.H_RELEASE_ROUND, Round(0, 0, 1, fewer))
    assert isinstance(refused, ErrorReply) and "\n" not in refused.message
    assert "tree 0 was opened with members ['a', 'b', 'c']; opening it with ['a', 'b'] would " \
           "show the aggregator their difference: refused" in refused.message
    assert not [e for e in fed.received("agg") if e.kind == MsgType.H_ROUND_KEY]
    # nor does it send deeper histograms of that attempt, whatever splits it is sent
    fed.peer("agg", MsgType.H_SPLITS, LevelSplits(0, 0, 1, [NodeSplit(0, 0, 3, False, 1, 2)],
                                                  [1]))
    assert fed.command(MsgType.H_APPLY_SPLITS, Round(0, 0, 1, fewer)).count == 2
    deeper = fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 1, 1, fewer))
    assert isinstance(deeper, ErrorReply)
    assert "depth 1 of tree 0 attempt 1 asked, whose root this member did not open: refused" \
        in deeper.message
    assert not [e for e in fed.received("agg") if e.kind == MsgType.H_MASKED]
    # a restarted worker, a new session of the job: the record is on a's disk
    again = Started(Federation(tmp_path, steps=fed.steps))
    again.fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    assert again.fed.command(MsgType.H_RELEASE_ROUND, Round(0, 0, 0, MEMBERS)).count == 3
    again.fed.command(MsgType.H_COMPUTE_GRADIENTS, Round(0, -1, 1, fewer))
    again.fed.received("agg")
    again.fed.peer("agg", MsgType.H_GRADIENT_SCALE, GradientScale(0, 1, peak.g_exponent,
                                                                   peak.h_exponent,
                                                                   2 * peak.rows))
    again.fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 1, fewer))
    assert "refused" in again.fed.command(MsgType.H_RELEASE_ROUND, Round(0, 0, 1, fewer)).message


def test_a_checkpoint_of_the_summaries_protocol_is_refused_by_name(started: Started,
                                                                    tmp_path: Path) -> None:
    """A checkpoint written before the set-up grid (its cuts came from quantile summaries, and
    its record has no format) is refused in one line, not resumed."""
    fed = started.fed
    job = fed.worker.jobs["job"].state
    party = PartySpec("a", "", str(DATA), "id", "y", str(tmp_path / "a"))
    checkpoint.save(tmp_path / "a", 0, job.digest, job.run,
                    {"cuts": job.cuts, "base": job.base, "margin": job.margin, "trees": [],
                     "history": []}, checkpoint.key_of(party))
    reply = fed.command(MsgType.RESUME_JOB, ResumeJob(Checkpoint(0, job.run)))
    assert isinstance(reply, ErrorReply) and "\n" not in reply.message
    assert "is of an older horizontal protocol (cuts from quantile summaries): refused" in \
        reply.message


def test_a_round_that_was_not_masked_is_not_released(started: Started) -> None:
    reply = started.fed.command(MsgType.H_RELEASE_ROUND, Round(0, 0, 0, MEMBERS))
    assert isinstance(reply, ErrorReply)
    assert "only a root round this member masked is released" in reply.message


def _pair(me: str, peer: str) -> bytes:
    """The pair secret of two members the test plays."""
    return pair_secret(KEYS[me], KEYS[peer].public_bytes(), "job", me, peer)


def test_a_second_vector_under_the_same_masks_is_refused(started: Started) -> None:
    fed = started.fed
    fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    fed.received("agg")
    again = fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    assert isinstance(again, ErrorReply)
    assert "already masked a vector for hist tree 0 depth 0 attempt 0: refused" in again.message
    assert not [e for e in fed.received("agg") if e.kind == MsgType.H_MASKED]


def test_a_round_for_too_few_or_foreign_members_is_refused(started: Started) -> None:
    fed = started.fed
    for members, why in ((["a"], "1 members left, the job needs 2"),
                         (["a", "b", "mallory"], "not a set of this job's members"),
                         (["a", "a", "b"], "not a set of this job's members")):
        reply = fed.command(MsgType.H_COMPUTE_GRADIENTS, Round(0, -1, 1, members))
        assert isinstance(reply, ErrorReply) and why in reply.message, reply


def test_splits_of_nodes_that_are_not_open_are_refused(started: Started) -> None:
    fed = started.fed
    fed.command(MsgType.H_UPDATE_HISTOGRAMS, Round(0, 0, 0, MEMBERS))
    for splits, build, why in (
            ([NodeSplit(5, 0, 3, False, 1, 2)], [1], "not an open node of depth 0"),
            ([NodeSplit(0, 99, 3, False, 1, 2)], [1], "out of range"),
            ([NodeSplit(0, 0, 3, False, 7, 8)], [7], "expected 1, 2")):
        fed.peer("agg", MsgType.H_SPLITS, LevelSplits(0, 0, 0, splits, build))
        reply = fed.command(MsgType.H_APPLY_SPLITS, Round(0, 0, 0, MEMBERS))
        assert isinstance(reply, ErrorReply) and why in reply.message, reply


def test_leaf_values_for_other_leaves_are_refused_and_an_old_attempt_is_ignored(
        started: Started) -> None:
    fed = started.fed
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
    other's and never saw the first again). Then a member's round key that does not open the
    root is refused in one line."""
    hub = MemoryHub([*MEMBERS, "agg", "flow"])
    party = PartySpec("agg", "", "", "id", None, str(tmp_path / "agg"),
                      policy=PartyPolicy(protocols=("horizontal",)))
    agg = Worker(party, hub.endpoint("agg"), PROTOCOLS, SEALERS["agg"])
    keys = {m: MaskKey.generate() for m in MEMBERS}
    steps = iter(range(100))

    def command(kind: Kind, body: Any) -> Envelope | None:
        agg.handle_bytes(SEALERS["flow"].seal(Envelope("job", f"s/{next(steps)}", "flow", "agg",
                                                       kind, body)))
        data = hub.endpoint("flow").receive(timeout=0.5)
        return None if data is None else SEALERS["flow"].open(data)

    def peer(sender: str, kind: Kind, body: Any) -> None:
        agg.handle_bytes(SEALERS[sender].seal(Envelope("job", "s/peer", sender, "agg", kind,
                                                       body)))

    assert command(MsgType.H_OPEN_JOB, OpenHorizontal(SPEC)).kind == MsgType.OPENED
    data = load_party_data("a", DATA, "id", "y", require_label=True)
    secrets = {m: {p: pair_secret(keys[m], keys[p].public_bytes(), "job", m, p)
                   for p in MEMBERS if p != m} for m in MEMBERS}

    def masked(m: str, values: np.ndarray, purpose: str, depth: int) -> MaskedVector:
        vector = mask_vector(values.astype(np.int64), m, secrets[m],
                             MaskRound("job", purpose, -1, depth, 0))
        return MaskedVector(purpose, -1, depth, 0, vector.astype("<u8").tobytes())

    rounds = GridRounds.start(data.x.shape[1], 256, 32)  # every member holds a's rows
    for m in MEMBERS:
        peer(m, MsgType.H_COLUMNS, MemberColumns(list(data.names)))
        peer(m, MsgType.H_MASKED, masked(m, np.array([data.y.size, int(data.y.sum())]), "stats",
                                         -1))
    while True:
        counts = count_columns(data.x, rounds.layouts)
        for m in MEMBERS:
            peer(m, MsgType.H_MASKED, masked(m, counts, "grid", rounds.round))
        more = command(MsgType.H_MERGE_BINS, Round(depth=rounds.round)).body.count
        if rounds.advance(rounds.unflatten(3 * counts)) is None:
            break
        assert more > 0
    assert more == 0
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
    # the root round of attempt 1: a and c send sealed vectors, a the wrong key
    root, live = MaskRound("job", "hist", 0, 0, 1), ["a", "c"]
    key = round_seal_key({m: bytes([i + 1]) * 32 for i, m in enumerate(live)}, root)
    zeros = np.zeros(len(data.names) * 33 * 3, dtype=np.int64)
    for m in live:
        vector = seal_vector(mask_vector(zeros, m, {p: secrets[m][p] for p in live if p != m},
                                         root), key, m)
        peer(m, MsgType.H_MASKED, MaskedVector("hist", 0, 0, 1, vector.astype("<u8").tobytes()))
    peer("a", MsgType.H_ROUND_KEY, RoundKey(0, 0, 1, bytes(32)))
    refused = command(MsgType.H_SECURE_SUM, Round(0, 0, 1, live))
    assert refused is not None and isinstance(refused.body, ErrorReply)
    assert "the released round key does not open the root histograms" in refused.body.message
