"""Envelopes ``{version, job, task, sender, recipient, kind, body}`` in msgpack."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

from messages import DecodeError, UnknownMessageType
from messages import bodies as b
from messages import forest as f
from messages import horizontal as h
from messages import simfl as s
from messages.codec import WireReader, decoding, read_typed, to_wire
from messages.names import JOB_NAME_RULE, is_job_name

WIRE_VERSION = 4
"""2: a row's packed (g, h, count) slots are sized by what they hold (``crypto.encoding``); a
version-1 party would cut the bin sums apart in the wrong places, so the versions refuse each other.
3: horizontal set-up counts cells of a public grid instead of sending quantile summaries, and a
tree's root histograms are sealed until a round key is released (``messages.horizontal``).
4: SimFL's gradient sums are randomised for every builder row and its hash functions come from
a secret the members exchange sealed (``S_LSH_KEY``, ``S_LSH_SECRET``); an older member would
send exact sums."""
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Refuse to parse anything larger; transports chunk big payloads well below this."""


class MsgType(IntEnum):
    """Every message kind, with its body class in ``BODY_TYPES``."""

    OPEN_JOB = 1
    OPEN_PREDICTION = 2
    PSI_BLIND = 10
    PSI_REBLIND = 11
    PSI_INTERSECT = 12
    BIN_FEATURES = 13
    ENCRYPT_GRADIENTS = 20
    BUILD_HISTOGRAMS = 21
    FIND_BEST_SPLITS = 22
    APPLY_SPLITS = 23
    BROADCAST_NODES = 24
    FINISH_TREE = 25
    SAVE_MODEL = 26
    EVALUATE_VALIDATION = 27
    EVALUATE_NODES = 30
    FINISH_TRAVERSAL = 31
    WRITE_SCORES = 32
    CLOSE_JOB = 40
    RESUME_JOB = 41

    ACK = 100
    SPLITS_FOUND = 101
    TREE_FINISHED = 102
    ERROR = 103
    ALIGNED = 104
    OPENED = 105
    RESUMED = 106

    PSI_POINTS = 200
    ALIGNED_ROWS = 201
    PUBLIC_KEY = 202
    TREE_START = 203
    ENCRYPTED_GRADIENTS = 204
    ENCRYPTED_HISTOGRAMS = 205
    SPLIT_CHOICES = 206
    APPLIED_SPLITS = 207
    NODE_POSITIONS = 208
    DECISIONS = 210

    HISTOGRAM_SHARD = 220
    SHARD_HISTOGRAM = 221
    TREE_CIPHERTEXTS = 222
    CRYPTO_SHARD = 223
    CRYPTO_UNIT = 224

    TRAVERSE_LEVEL = 33
    """Path-mode prediction, one round per tree level (command to every party)."""
    DECISION_REQUEST = 211
    PATH_DECISIONS = 212

    # the horizontal protocol (messages.horizontal): commands 300-319, peer messages 320-339
    H_OPEN_JOB = 300
    H_SUMMARIZE = 301
    H_MERGE_BINS = 302
    H_APPLY_BINS = 303
    H_COMPUTE_GRADIENTS = 304
    H_AGREE_SCALE = 305
    H_UPDATE_HISTOGRAMS = 306
    H_SECURE_SUM = 307
    H_APPLY_SPLITS = 308
    H_SEND_TREE = 309
    H_RECEIVE_TREE = 310
    H_RELEASE_ROUND = 311
    H_MASK_KEY = 320
    H_COLUMNS = 321
    H_MASKED = 322
    H_CUTS = 323
    H_GRADIENT_RANGE = 324
    H_GRADIENT_SCALE = 325
    H_SPLITS = 326
    H_LEAVES = 327
    H_SEAL_KEY = 328
    H_ROUND_KEY = 329
    H_REFINE = 330

    # SimFL (messages.simfl): commands 340-359, peer messages 360-379
    S_OPEN_JOB = 340
    S_MEMBER_KEY = 341
    S_HASH_ROWS = 342
    S_MATCH_ROWS = 343
    S_STORE_SIMILAR = 344
    S_SEND_GRADIENTS = 345
    S_BUILD_TREE = 346
    S_RECEIVE_TREE = 347
    S_PREPARE_REPLY = 350
    S_ROW_HASHES = 360
    S_SIMILAR = 361
    S_GRADIENTS = 362
    S_TREE = 363
    S_LSH_KEY = 364
    S_LSH_SECRET = 365
    # the vertical random forest (messages.forest): commands 380-389, peer messages 390-399
    F_OPEN_JOB = 380
    F_PREPARE = 381
    F_LEVEL = 382
    F_FIND_SPLITS = 383
    F_APPLY_SPLITS = 384
    F_FINISH_TREE = 385
    F_SAVE_MODEL = 386
    F_OPENED = 387
    F_LABELS = 390
    F_FEATURES = 391
    F_REQUEST = 392
    F_HISTOGRAMS = 393
    F_SPLITS = 394
    F_APPLIED = 395

    # the scoring service (fedboost serve-model): 400-419
    OPEN_SCORING = 400
    SCORE_ROWS = 401
    ROWS_FOUND = 402
    SCORES = 403
    ROUND_DECISIONS = 404
    """A passive party's decisions for one scoring round, to the active party."""
    FIND_ROWS = 405
    """A membership round: each party answers which ids it has no row for, sending nothing
    else."""


BODY_TYPES: dict[MsgType, type] = {
    MsgType.OPEN_JOB: b.OpenJob,
    MsgType.OPEN_PREDICTION: b.OpenPrediction,
    MsgType.ACK: b.Ack,
    MsgType.SPLITS_FOUND: b.SplitsFound,
    MsgType.TREE_FINISHED: b.TreeFinished,
    MsgType.ERROR: b.ErrorReply,
    MsgType.ALIGNED: b.Aligned,
    MsgType.OPENED: b.Opened,
    MsgType.RESUME_JOB: b.ResumeJob,
    MsgType.RESUMED: b.Resumed,
    MsgType.PSI_POINTS: b.PsiPoints,
    MsgType.ALIGNED_ROWS: b.AlignedRows,
    MsgType.PUBLIC_KEY: b.PublicKeyMsg,
    MsgType.TREE_START: b.TreeStart,
    MsgType.ENCRYPTED_GRADIENTS: b.EncryptedGradients,
    MsgType.ENCRYPTED_HISTOGRAMS: b.EncryptedHistograms,
    MsgType.SPLIT_CHOICES: b.SplitChoices,
    MsgType.APPLIED_SPLITS: b.AppliedSplits,
    MsgType.NODE_POSITIONS: b.NodePositions,
    MsgType.DECISIONS: b.Decisions,
    MsgType.HISTOGRAM_SHARD: b.HistogramShard,
    MsgType.SHARD_HISTOGRAM: b.ShardHistogram,
    MsgType.TREE_CIPHERTEXTS: b.TreeCiphertexts,
    MsgType.CRYPTO_SHARD: b.CryptoShard,
    MsgType.CRYPTO_UNIT: b.CryptoUnit,
    MsgType.DECISION_REQUEST: b.DecisionRequest,
    MsgType.PATH_DECISIONS: b.PathDecisions,
    MsgType.H_OPEN_JOB: h.OpenHorizontal,
    MsgType.H_MASK_KEY: h.MaskPublicKey,
    MsgType.H_COLUMNS: h.MemberColumns,
    MsgType.H_SEAL_KEY: h.SealShare,
    MsgType.H_ROUND_KEY: h.RoundKey,
    MsgType.H_REFINE: h.RefineCells,
    MsgType.H_MASKED: h.MaskedVector,
    MsgType.H_CUTS: h.SharedCuts,
    MsgType.H_GRADIENT_RANGE: h.GradientRange,
    MsgType.H_GRADIENT_SCALE: h.GradientScale,
    MsgType.H_SPLITS: h.LevelSplits,
    MsgType.H_LEAVES: h.LeafValues,
    MsgType.OPEN_SCORING: b.OpenScoring,
    MsgType.SCORE_ROWS: b.ScoreRows,
    MsgType.ROWS_FOUND: b.RowsFound,
    MsgType.SCORES: b.Scores,
    MsgType.ROUND_DECISIONS: b.RoundDecisions,
    MsgType.FIND_ROWS: b.FindRows,
}
BODY_TYPES.update({
    MsgType.S_OPEN_JOB: s.OpenSimfl, MsgType.S_HASH_ROWS: s.Prepare,
    MsgType.S_PREPARE_REPLY: s.MemberKey, MsgType.S_ROW_HASHES: s.RowHashes,
    MsgType.S_SIMILAR: s.SimilarRows, MsgType.S_GRADIENTS: s.SimilarGradients,
    MsgType.S_TREE: s.SharedTree, MsgType.S_LSH_KEY: s.LshKey,
    MsgType.S_LSH_SECRET: s.LshSecret})
SIMFL_STEPS = frozenset({MsgType.S_MEMBER_KEY, MsgType.S_MATCH_ROWS, MsgType.S_STORE_SIMILAR,
                         MsgType.S_SEND_GRADIENTS, MsgType.S_BUILD_TREE, MsgType.S_RECEIVE_TREE})
BODY_TYPES.update({
    MsgType.F_OPEN_JOB: f.OpenForest, MsgType.F_OPENED: f.ForestOpened,
    MsgType.F_LABELS: f.EncryptedLabels, MsgType.F_FEATURES: f.FeatureCount,
    MsgType.F_REQUEST: f.LevelRequest, MsgType.F_HISTOGRAMS: f.LevelHistograms,
    MsgType.F_SPLITS: f.ForestSplits, MsgType.F_APPLIED: f.ForestApplied})
FOREST_STEPS = frozenset({MsgType.F_PREPARE, MsgType.F_LEVEL, MsgType.F_FIND_SPLITS,
                          MsgType.F_APPLY_SPLITS, MsgType.F_FINISH_TREE, MsgType.F_SAVE_MODEL})
for _kind in FOREST_STEPS:
    BODY_TYPES[_kind] = f.TreeCommand
for _kind in SIMFL_STEPS:
    BODY_TYPES[_kind] = b.Step
HORIZONTAL_STEPS = frozenset(
    {MsgType.H_SUMMARIZE, MsgType.H_MERGE_BINS, MsgType.H_APPLY_BINS, MsgType.H_COMPUTE_GRADIENTS,
     MsgType.H_AGREE_SCALE, MsgType.H_UPDATE_HISTOGRAMS, MsgType.H_SECURE_SUM,
     MsgType.H_APPLY_SPLITS, MsgType.H_SEND_TREE, MsgType.H_RECEIVE_TREE,
     MsgType.H_RELEASE_ROUND})
for _kind in HORIZONTAL_STEPS:
    BODY_TYPES[_kind] = h.Round
STEP_COMMANDS = frozenset(
    {MsgType.PSI_BLIND, MsgType.PSI_REBLIND, MsgType.PSI_INTERSECT, MsgType.BIN_FEATURES,
     MsgType.ENCRYPT_GRADIENTS, MsgType.BUILD_HISTOGRAMS, MsgType.FIND_BEST_SPLITS,
     MsgType.APPLY_SPLITS, MsgType.BROADCAST_NODES, MsgType.FINISH_TREE, MsgType.SAVE_MODEL,
     MsgType.EVALUATE_VALIDATION, MsgType.EVALUATE_NODES, MsgType.FINISH_TRAVERSAL, MsgType.WRITE_SCORES,
     MsgType.CLOSE_JOB, MsgType.TRAVERSE_LEVEL}
)
for _kind in STEP_COMMANDS:
    BODY_TYPES[_kind] = b.Step
OPENERS = frozenset({MsgType.OPEN_JOB, MsgType.OPEN_PREDICTION, MsgType.H_OPEN_JOB,
                     MsgType.S_OPEN_JOB, MsgType.F_OPEN_JOB, MsgType.OPEN_SCORING})
"""Commands that open a job at a party: their bodies name the protocol and every party's role."""
UNRECORDED = frozenset({MsgType.SCORE_ROWS, MsgType.FIND_ROWS})
"""Commands a worker answers without putting them on its durable record of answered commands
(an fsync each): a scoring service sends thousands a second. Answering one again sends the
same decisions to the same active party, which already has them; recent replays are still
refused by their nonce, and after a worker restart the session they name is no longer open."""
TRANSIENT = frozenset({MsgType.SCORE_ROWS, MsgType.ROUND_DECISIONS, MsgType.ROWS_FOUND,
                       MsgType.SCORES, MsgType.FIND_ROWS})
"""Kinds the broker need not write to disk: a scoring round is worth nothing after its timeout,
and one lost with the broker is answered 503 and asked again (a persistent message waits for
the broker's fsync: about 0.5 ms more per hop on loopback, and a long tail)."""
COMMANDS = (STEP_COMMANDS | HORIZONTAL_STEPS | SIMFL_STEPS | FOREST_STEPS | OPENERS
            | UNRECORDED | {MsgType.RESUME_JOB, MsgType.S_HASH_ROWS})
WORK = frozenset({MsgType.HISTOGRAM_SHARD, MsgType.TREE_CIPHERTEXTS, MsgType.CRYPTO_SHARD})
"""What a party's coordinating process hands to its own helper processes: shards of a step, and
the data those shards share (a tree's ciphertexts); the active party's encryption and
decryption shards."""
REPLIES = frozenset({MsgType.ACK, MsgType.SPLITS_FOUND, MsgType.TREE_FINISHED, MsgType.ERROR,
                     MsgType.ALIGNED, MsgType.OPENED, MsgType.RESUMED, MsgType.F_OPENED,
                     MsgType.S_PREPARE_REPLY, MsgType.ROWS_FOUND, MsgType.SCORES})
"""A party's answers to a flow's commands (a helper process's failed shard also answers with
``ERROR``, to its own party)."""
PEER_MAIL = frozenset(MsgType) - COMMANDS - WORK - REPLIES
"""What parties send one another within a job (and a party's helper processes back to it): a
job's mailbox files them. Every kind not declared a command, work or a reply is peer mail, so a
protocol's new peer message needs no listing here. A peer that opened its job first may send
some before this party's opener arrives: a worker keeps them until it does
(``workers.early_mail``)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message: who sent it to whom, for which job and task, and its typed body."""

    job: str
    task: str
    sender: str
    recipient: str
    kind: MsgType
    body: Any
    version: int = WIRE_VERSION


def encode_envelope(env: Envelope) -> bytes:
    """Serialise an envelope; the body must be of the kind's class."""
    expected = BODY_TYPES[env.kind]
    if not isinstance(env.body, expected):
        raise TypeError(f"{env.kind.name} needs a {expected.__name__} body")
    return msgpack.packb(
        {"version": env.version, "job": env.job, "task": env.task, "sender": env.sender,
         "recipient": env.recipient, "kind": int(env.kind), "body": to_wire(env.body)},
        use_bin_type=True,
    )


def decode_envelope(data: bytes | memoryview) -> Envelope:
    """Parse and validate an envelope; any malformed input raises ``DecodeError``.

    The body is read in place as its kind's class (``messages.codec``): decoding holds nothing
    but the message and what it decodes to, at most twice its size plus
    ``codec.DECODE_FLOOR_BYTES``. The body comes last, after the kind that names its class (as
    ``encode_envelope`` writes it).
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    reader = WireReader(data)
    head: dict[str, Any] = {}
    key = ""
    with decoding("envelope"):
        for _ in range(reader.read_map_header()):
            key = reader.read_str(_NAME_BYTES)
            if key in head or key not in _HEAD:
                raise DecodeError(f"envelope field {key!r} unknown or repeated")
            if key == "body":
                break
            head[key] = (reader.read_int() if key in ("version", "kind")
                         else reader.read_str(4 * _NAME_BYTES))
    if len(head) != len(_HEAD) - 1 or key != "body":
        raise DecodeError(f"envelope must be a map of {', '.join(_HEAD)}, the body last")
    if head["version"] != WIRE_VERSION:
        raise DecodeError(f"wire version {head['version']!r}, expected {WIRE_VERSION}")
    job, task, sender, recipient = (head[k] for k in ("job", "task", "sender", "recipient"))
    if max(len(job), len(task), len(sender), len(recipient)) > _NAME_BYTES:
        raise DecodeError("envelope job, task, sender and recipient must be short strings")
    if not is_job_name(job):  # it becomes a folder name at every party
        raise DecodeError(f"envelope job {job!r} is not a job name ({JOB_NAME_RULE})")
    try:
        kind = MsgType(head["kind"])
    except ValueError as exc:
        raise UnknownMessageType(f"unknown message kind {head['kind']!r}") from exc
    with decoding(kind.name):
        body = read_typed(BODY_TYPES[kind], reader)
    if not reader.at_end():
        raise DecodeError(f"{kind.name}: {len(data) - reader.pos} bytes after the body")
    return Envelope(job=job, task=task, sender=sender, recipient=recipient, kind=kind,
                    body=body)


_HEAD = ("version", "job", "task", "sender", "recipient", "kind", "body")
_NAME_BYTES = 256
"""Characters of a job, task, sender or recipient name at most (4 UTF-8 bytes each)."""
