"""Envelope codec round-trips every kind; malformed input is a DecodeError, never a crash."""

from __future__ import annotations

import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messages import DecodeError
from messages import bodies as b
from messages import scoring as sc
from messages import secureboost as sb
from messages import forest as f
from messages import horizontal as h
from messages import simfl as s
from messages.envelope import (WIRE_VERSION, Envelope, Kind, MsgType, decode_envelope,
                               encode_envelope)
from messages.signing import ForgedMessage, federation_sealers
from messages.instance_space import BITMAP, GAPS, InstanceSpace, decode_mask, encode_mask
from messages.codec import to_wire
from messages.params import TreeParams

SAMPLES = {
    MsgType.S_OPEN_JOB: s.OpenSimfl(s.SimflSpec(
        [b.PartyInfo("a", "member"), b.PartyInfo("agg", "aggregator")],
        TreeParams(n_trees=3, max_depth=8), 0, 4.0, 7, 2.0, 4.0, 1.0)),
    MsgType.S_HASH_ROWS: s.Prepare("ab" * 32, False),
    MsgType.S_PREPARE_REPLY: s.MemberKey("cd" * 32),
    MsgType.S_ROW_HASHES: s.RowHashes(["x0"], bytes(16), bytes(8 * 8), 4, 1.0, 1),
    MsgType.S_SIMILAR: s.SimilarRows(["x0"], ["b"], [bytes(16)], -0.5, [bytes(24)], 1),
    MsgType.S_GRADIENTS: s.SimilarGradients(2, bytes(8), 0.5),
    MsgType.S_LSH_KEY: s.LshKey(bytes(32)),
    MsgType.S_LSH_SECRET: s.LshSecret(bytes(32), bytes(60)),
    MsgType.S_TREE: s.SharedTree(2, [s.WireNode(0, 1, 2, 3, 0.5, True, 0.0),
                                     s.WireNode(1, -1, -1, -1, 0.0, False, 0.25)]),
    MsgType.H_OPEN_JOB: h.OpenHorizontal(h.HorizontalSpec(
        [b.PartyInfo("a", "member", "homo"), b.PartyInfo("agg", "aggregator")],
        TreeParams(n_trees=3, max_depth=3), 2, 1024, 0.0, 0.0, -1)),
    MsgType.H_MASK_KEY: h.MaskPublicKey(bytes(32)),
    MsgType.H_COLUMNS: h.MemberColumns(["x0"]),
    MsgType.H_SEAL_KEY: h.SealShare(bytes(12), bytes(48)),
    MsgType.H_ROUND_KEY: h.RoundKey(1, 0, 0, bytes(32)),
    MsgType.H_REFINE: h.RefineCells(2, [bytes(8)]),
    MsgType.H_MASKED: h.MaskedVector("hist", 1, 2, 0, bytes(24)),
    MsgType.H_CUTS: h.SharedCuts(["x0"], [bytes(8)], -1.25, 1),
    MsgType.H_GRADIENT_RANGE: h.GradientRange(1, 0, 0, -1, 100),
    MsgType.H_GRADIENT_SCALE: h.GradientScale(1, 0, 0, -1, 300),
    MsgType.H_SPLITS: h.LevelSplits(1, 0, 0, [h.NodeSplit(0, 3, 4, True, 1, 2)], [1]),
    MsgType.H_LEAVES: h.LeafValues(1, 0, [1, 2], [0.5, -0.25]),
    MsgType.OPEN_JOB: sb.OpenJob(sb.JobSpec([b.PartyInfo("g", "active")],
                                          TreeParams(n_trees=3, max_depth=3), False, 1024,
                                          0.0, 0, "y")),
    MsgType.OPEN_PREDICTION: sb.OpenPrediction([b.PartyInfo("g", "active")], 10, "scores.csv",
                                               "trained-job"),
    MsgType.ACK: b.Ack(3),
    MsgType.SPLITS_FOUND: sb.SplitsFound(["host"], 2, 1),
    MsgType.TREE_FINISHED: b.TreeFinished([b.Metric("train_auc", 0.5)]),
    MsgType.ERROR: b.ErrorReply("host", "X", "boom", True, True),
    MsgType.ALIGNED: b.Aligned(10, 7, 3),
    MsgType.OPENED: b.Opened(10, [b.Checkpoint(4, "ab"), b.Checkpoint(5, "ab")]),
    MsgType.RESUME_JOB: b.ResumeJob(b.Checkpoint(5, "ab")),
    MsgType.RESUMED: b.Resumed(5, 10, 7, 3, 1, [b.TreeFinished([b.Metric("train_auc", 0.5)])]),
    MsgType.PSI_POINTS: b.PsiPoints(1, b"\x01" * 64),
    MsgType.ALIGNED_ROWS: b.AlignedRows(b"\x00" * 8, encode_mask(np.ones(3, bool))),
    MsgType.PUBLIC_KEY: sb.PublicKeyMsg(b"\x05", 3),
    MsgType.TREE_START: sb.TreeStart(1, encode_mask(np.ones(9, bool)), 2, 42, 9),
    MsgType.ENCRYPTED_GRADIENTS: sb.EncryptedGradients(1, 0, b"\x02" * 512),
    MsgType.ENCRYPTED_HISTOGRAMS: sb.EncryptedHistograms(
        1, 2, [3, 4], 5, 33, [3, 2], encode_mask(np.ones(330, bool)), 11, b"\x03" * 10),
    MsgType.SPLIT_CHOICES: sb.SplitChoices(1, 2, [sb.SplitChoice(3, 4, 5, True)]),
    MsgType.APPLIED_SPLITS: sb.AppliedSplits(1, 2, [sb.AppliedSplit(3, 0, encode_mask(np.ones(4, bool)))]),
    MsgType.NODE_POSITIONS: sb.NodePositions(1, 2, [sb.NodeSplit(3, 5, 6, encode_mask(np.ones(4, bool)))]),
    MsgType.DECISIONS: sb.Decisions(0, [1, 2], 3, b"\x07"),
    MsgType.HISTOGRAM_SHARD: sb.HistogramShard(1, 0, 1, b"\x05", 33, 2, [3], b"\x00" * 6,
                                              b"\x00" * 12, b"\x01" * 32, b"\x02" * 24, 177,
                                              11, "fedboost.host.work.1.units"),
    MsgType.SHARD_HISTOGRAM: sb.ShardHistogram(1, 0, 1, [0, 1], encode_mask(np.ones(66, bool)),
                                              b"\x03" * 10, 0.25),
    MsgType.TREE_CIPHERTEXTS: sb.TreeCiphertexts(1, 0, 2, b"\x05", b"\x02" * 24),
    MsgType.CRYPTO_SHARD: sb.CryptoShard(1, -1, "encrypt", b"\x05", b"key", "pool", 4096, 9000,
                                        12, b"\x01" * 40),
    MsgType.CRYPTO_UNIT: sb.CryptoUnit(1, -1, "pool", 1, b"\x02" * 24, 0.5),
    MsgType.DECISION_REQUEST: sb.DecisionRequest(0, 2, b"\x01\0\0\0", b"\x07\0\0\0"),
    MsgType.PATH_DECISIONS: sb.PathDecisions(0, 2, 1, b"\x80"),
    MsgType.F_OPEN_JOB: f.OpenForest(f.ForestSpec(
        [b.PartyInfo("g", "active"), b.PartyInfo("h", "passive", "credit")],
        f.ForestParams(50, 10, "sqrt", 5, 32, "binary", True, 0, False), 1024, 0.3, 0, "y")),
    MsgType.F_OPENED: f.ForestOpened(10, [0, 3]),
    MsgType.F_LABELS: f.EncryptedLabels(1, 1, 9, b"\x02" * 512),
    MsgType.F_FEATURES: f.FeatureCount(10),
    MsgType.F_REQUEST: f.LevelRequest(100_001, 2, b"\x01\x00" * 3,
                                      [sb.NodeSplit(3, 5, 6, encode_mask(np.ones(4, bool)))],
                                      [f.NodeRequest(5, [0, 4])]),
    MsgType.F_HISTOGRAMS: f.LevelHistograms(1, 2, b"\xff", 37, [b"\x03" * 10]),
    MsgType.F_SPLITS: f.ForestSplits(1, 2, [sb.SplitChoice(3, 4, 5, True)]),
    MsgType.F_APPLIED: f.ForestApplied(1, 2, [3], [65_536], [b"\xf0"]),
    MsgType.OPEN_SCORING: sc.OpenScoring([b.PartyInfo("g", "active", "applicants")], "trained",
                                        4096, "vertical_secureboost"),
    MsgType.SCORE_ROWS: sc.ScoreRows(7, ["25115", "2346"], 10.0),
    MsgType.FIND_ROWS: sc.FindRows(7, ["25115", "2346"]),
    MsgType.ROUND_DECISIONS: sc.RoundDecisions(7, b"\x01\0\0\0", 2, b"\x80"),
    MsgType.ROWS_FOUND: sc.RowsFound(7, [1]),
    MsgType.SCORES: sc.Scores(7, 1, b"\0" * 16, [], []),
}


@pytest.mark.parametrize("kind", list(MsgType))
def test_every_kind_round_trips(kind: Kind) -> None:
    default = (h.Round(1, 2, 0, ["a", "b"]) if kind.name.startswith("H_")
               else f.TreeCommand(100_001, 2, [0, 1]) if kind.name.startswith("F_")
               else b.Step(1, 2, ["host"]))
    body = SAMPLES.get(kind, default)
    env = Envelope("job", "task", "guest", "host", kind, body)
    assert decode_envelope(encode_envelope(env)) == env


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=300))
def test_garbage_is_rejected_cleanly(data: bytes) -> None:
    try:
        decode_envelope(data)
    except DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(body=st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text()
                         | st.binary(), lambda c: st.lists(c, max_size=4), max_leaves=10),
       kind=st.sampled_from([int(k) for k in MsgType] + [0, 999]))
def test_wrong_body_shapes_are_rejected(body: object, kind: int) -> None:
    data = msgpack.packb({"version": WIRE_VERSION, "job": "j", "task": "t", "sender": "s",
                          "recipient": "r", "kind": kind, "body": body}, use_bin_type=True)
    try:
        env = decode_envelope(data)
    except DecodeError:
        return
    assert env.kind == kind


@settings(max_examples=200, deadline=None)
@given(bits=st.lists(st.booleans(), max_size=2000), sparse=st.booleans())
def test_instance_space_round_trip_picks_smaller(bits: list[bool], sparse: bool) -> None:
    mask = np.array(bits, dtype=bool)
    if sparse:
        mask[:] = False
        mask[:: max(1, len(bits) // 3 or 1)] = len(bits) > 0
    space = encode_mask(mask)
    np.testing.assert_array_equal(decode_mask(space, mask.size), mask)
    assert space.encoding in (BITMAP, GAPS)
    assert len(space.data) <= (mask.size + 7) // 8


def test_sparse_masks_travel_as_gaps() -> None:
    mask = np.zeros(100_000, dtype=bool)
    mask[[5, 70_000]] = True
    space = encode_mask(mask)
    assert space.encoding == GAPS and len(space.data) < 10
    with pytest.raises(DecodeError):
        decode_mask(space, 99)


@pytest.mark.parametrize("data", [
    b"\xc6\xff\xff\xff\xff",            # bin of 4 GiB declared, 0 bytes sent
    b"\xdd\xff\xff\xff\xff",            # array of 4 billion items declared
    b"\xdf\xff\xff\xff\xff",            # map of 4 billion pairs declared
    b"\x86\xa1v\x01\xa5nonce\xc6\x7f\xff\xff\xff",  # a sealed message's field declared huge
])
def test_declared_lengths_beyond_the_data_are_refused_without_allocating(data: bytes) -> None:
    sealer = federation_sealers(["host"])["host"]
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError):
            decode_envelope(data)
        with pytest.raises(DecodeError):
            sealer.open(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


_SEALERS = federation_sealers(["guest", "host"])
_GOOD = _SEALERS["guest"].seal(Envelope("job", "s/t", "guest", "host", MsgType.ACK, b.Ack(1)))


@settings(max_examples=1000, deadline=None)
@given(cut=st.integers(0, len(_GOOD)), flips=st.lists(
    st.tuples(st.integers(0, len(_GOOD) - 1), st.integers(0, 255)), max_size=3))
def test_damaged_sealed_messages_raise_only_decode_errors(cut: int, flips: list[tuple[int, int]]) -> None:
    data = bytearray(_GOOD)
    for at, value in flips:
        data[at] = value
    damaged = bytes(data[:cut])
    try:
        env = _SEALERS["host"].open(damaged)
    except DecodeError:
        return
    # only an untouched message opens, and only once (a second copy is a replay)
    assert env.body == b.Ack(1) and damaged == _GOOD
    with pytest.raises(ForgedMessage, match="replayed"):
        _SEALERS["host"].open(damaged)
    _SEALERS["host"]._seen.clear()


@settings(max_examples=500, deadline=None)
@given(size=st.integers(0, 2**64), encoding=st.integers(-1, 3), data=st.binary(max_size=64),
       expected=st.integers(0, 300))
def test_hostile_instance_spaces_decode_to_the_receivers_size_or_are_refused(
        size: int, encoding: int, data: bytes, expected: int) -> None:
    """Whatever a peer declares, the mask has the size the receiver expects, or DecodeError."""
    try:
        mask = decode_mask(InstanceSpace(size, encoding, data), expected)
    except DecodeError:
        return
    assert mask.dtype == bool and mask.size == expected


@pytest.mark.parametrize("data", [
    b"\xff" * 9 + b"\x01",  # a gap of 2^64 - 1: beyond int64, and beyond any instance space
    b"\x80\x80\x80\x80\x01",  # a gap of 2^28 in a space of 50
    b"\x01" * 51,  # 51 members of a space of 50
])
def test_run_length_gaps_beyond_the_space_are_refused(data: bytes) -> None:
    with pytest.raises(DecodeError, match="outside"):
        decode_mask(InstanceSpace(50, GAPS, data), 50)


_INTS = st.integers(-2**63, 2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(
    st.builds(sb.Decisions, _INTS, st.lists(_INTS, max_size=40), _INTS, st.binary(max_size=300)),
    st.builds(h.LeafValues, _INTS, _INTS, st.lists(_INTS, max_size=20),
              st.lists(st.floats(allow_nan=True), max_size=20)),
    st.builds(b.TreeFinished, st.lists(st.builds(b.Metric, st.text(max_size=300), st.floats())),
              st.lists(st.lists(st.builds(b.Metric, st.text(max_size=40), st.floats()),
                                max_size=3), max_size=3)),
    st.builds(b.ErrorReply, st.text(), st.text(), st.text(max_size=70_000), st.booleans(),
              st.booleans())))
def test_every_msgpack_width_of_every_field_type_round_trips(body: object) -> None:
    """Ints of every msgpack width (fixint to 64 bits, both signs), floats (NaN included),
    strings of every length class, nested lists: read in place as msgpack wrote them."""
    kind = {sb.Decisions: MsgType.DECISIONS, h.LeafValues: MsgType.H_LEAVES,
            b.TreeFinished: MsgType.TREE_FINISHED, b.ErrorReply: MsgType.ERROR}[type(body)]
    data = encode_envelope(Envelope("job", "task", "guest", "host", kind, body))
    assert encode_envelope(decode_envelope(data)) == data  # bytes: NaN compares equal here


def _envelope_map(*pairs: tuple[str, object], raw_body: bytes = b"") -> bytes:
    """An envelope's map of ``pairs``, then a body of ``raw_body`` msgpack bytes if given."""
    packer = msgpack.Packer(use_bin_type=True)
    return packer.pack_map_header(len(pairs) + bool(raw_body)) + b"".join(
        packer.pack(k) + packer.pack(v) for k, v in pairs) + (
        packer.pack("body") + raw_body if raw_body else b"")


_HEAD = (("version", WIRE_VERSION), ("job", "j"), ("task", "t"), ("sender", "s"),
         ("recipient", "r"), ("kind", int(MsgType.ACK)))


@pytest.mark.parametrize("data, refusal", [
    (_envelope_map(("body", [1]), *_HEAD), "the body last"),
    (_envelope_map(*_HEAD, ("body", [1])) + b"\x00", "1 bytes after the body"),
    (_envelope_map(*_HEAD, ("kind", 100), ("body", [1])), "'kind' unknown or repeated"),
    (_envelope_map(*_HEAD, ("body", [1, 2])), "ACK: expected 1 fields of Ack"),
    (_envelope_map(*_HEAD[:5], ("kind", int(MsgType.ERROR)),
                   ("body", ["p", b"\xff", "m", True, False])), "ERROR.step: expected str"),
    (_envelope_map(*_HEAD[:5], ("kind", int(MsgType.ROWS_FOUND)), ("body", [1, [1, 2.5]])),
     r"ROWS_FOUND.unknown\[1\]: expected int"),
    (_envelope_map(*_HEAD[:5], ("kind", int(MsgType.ROWS_FOUND)),
                   raw_body=b"\x92\x01\xdd\x7f\xff\xff\xff"), "declares 2147483647 items"),
    (_envelope_map(*_HEAD[:5], ("kind", int(MsgType.ERROR)),
                   raw_body=b"\x95\xa1p\xa2\xc3\x28"), "ERROR.step: a str that is not UTF-8"),
])
def test_envelopes_out_of_shape_are_refused_naming_the_field(data: bytes, refusal: str) -> None:
    with pytest.raises(DecodeError, match=refusal):
        decode_envelope(data)


@pytest.mark.parametrize("field, value, refusal", [
    (1, 17, "max_depth=17: at most 16"), (3, 255, "max_bin=255: at most 254"),
    (4, "poisson", "objective='poisson': one of binary, multiclass, regression"),
    (2, 0.0, "learning_rate=0.0: above 0.0")])
def test_openers_with_parameters_out_of_bounds_are_refused_naming_them(
        field: int, value: object, refusal: str) -> None:
    """The bounds of ``TreeParams`` (declared once, in ``boosting.params``) hold on the wire
    too: a job spec out of them is a DecodeError, before any worker reads it."""
    body = to_wire(SAMPLES[MsgType.S_OPEN_JOB])
    body[0][1][field] = value  # OpenSimfl -> spec -> params -> the field
    data = _envelope_map(*_HEAD[:5], ("kind", int(MsgType.S_OPEN_JOB)), ("body", body))
    with pytest.raises(DecodeError, match=rf"S_OPEN_JOB\.spec\.params: invalid parameter {refusal}"):
        decode_envelope(data)
