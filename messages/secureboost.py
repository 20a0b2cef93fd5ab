"""Vertical SecureBoost's bodies: opening a job or a prediction, keys, encrypted gradients and
histograms, splits, and path prediction (the vertical forest reuses the last three).

Peer messages go party to party and carry ciphertexts and instance spaces; work goes from a
party to its own helper processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from messages.bodies import PartyInfo, Step
from messages.instance_space import InstanceSpace
from messages.kinds import declare
from messages.params import TreeParams


VALIDATION_BATCH = 4096
"""Rows per prediction batch when a training job scores its hold-out (flow and parties agree)."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything a party needs to take part in a training job (no data, no paths)."""

    parties: list[PartyInfo]
    params: TreeParams
    complete_secure: bool
    key_bits: int
    valid_fraction: float
    valid_seed: int
    label: str
    """The active party's label column name: a passive party refuses a column of that name."""
    pack_bin_sums: str = "key_holder"
    """Who folds bin sums into shared ciphertexts: ``key_holder`` or ``passive``."""
    scheme: str = "paillier"
    """The job's encryption scheme (``crypto.schemes``): ``paillier`` or ``ou``."""
    dp_epsilon: float = 0.0
    """Differential privacy of the released model (``boosting.privacy``); 0: none (lossless)."""
    dp_clip: float = 0.0
    dp_seed: int = -1
    """Seed of the active party's noise (-1: fresh randomness from the OS)."""
    dp_per_ensemble: int = 0


@dataclass(frozen=True, slots=True)
class OpenJob:
    """Command: load local data and prepare state for a training job."""

    spec: JobSpec
    protocol: ClassVar[str] = "vertical_secureboost"
    """An opener names its protocol: the worker serves the job with that protocol's steps."""

    @property
    def parties(self) -> list[PartyInfo]:
        """Every party of the job and its role."""
        return self.spec.parties


@dataclass(frozen=True, slots=True)
class OpenPrediction:
    """Command: load the party's saved model part and its rows to score.

    No paths: ``model_job`` names the trained job whose part each worker loads from its own
    model folder; the rows are the party's own data file; ``scores_file`` is a plain file name
    the active party writes in that model folder (ignored by passive parties).
    """

    parties: list[PartyInfo]
    batch_size: int
    scores_file: str
    model_job: str
    protocol: ClassVar[str] = "vertical_secureboost"


@dataclass(frozen=True, slots=True)
class SplitsFound:
    """Reply of find_best_splits: the parties owning this level's splits, and counts."""

    owners: list[str]
    n_splits: int
    n_leaves: int
    ahead: list[str] = field(default_factory=list)
    """Passive parties told to build the next level's histograms as they apply these splits
    (``SplitChoices.build_ahead``): the flow asks them for no build_histograms of it."""


# ---- SecureBoost training ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PublicKeyMsg:
    """The active party's Paillier modulus (big-endian)."""

    n: bytes
    bits: int


@dataclass(frozen=True, slots=True)
class TreeStart:
    """Rows used by a tree (subsample) and how its packed gradients are laid out."""

    tree: int
    in_tree: InstanceSpace
    n_chunks: int
    value_bits: int
    max_rows: int
    per_ciphertext: int = 1
    """Bin sums each passive party folds into one ciphertext of its histograms (1: none, the
    key holder folds them)."""


@dataclass(frozen=True, slots=True)
class EncryptedGradients:
    """A chunk of packed E(g, h, 1) of the in-tree training rows, in row order."""

    tree: int
    chunk: int
    ciphertexts: bytes


@dataclass(frozen=True, slots=True)
class EncryptedHistograms:
    """Per built node, features x bins of encrypted bin sums, packed for the trip.

    The features come in shards (``shard_features`` of them each, in feature order), as the
    passive party's processes built them. ``filled`` marks the non-empty bins, shard by shard,
    each shard node-major (node, feature, bin); the sums of a shard's filled bins travel
    ``per_ciphertext`` to a fixed-width ciphertext (crypto.compress), the shards one after the
    other, a shard's last ciphertext possibly holding fewer.
    """

    tree: int
    depth: int
    nodes: list[int]
    n_features: int
    n_bins: int
    shard_features: list[int]
    filled: InstanceSpace
    per_ciphertext: int
    ciphertexts: bytes


@dataclass(frozen=True, slots=True)
class TreeCiphertexts:
    """Work for the party's helper processes: one chunk of a tree's E(g, h, 1) (fixed width),
    passed on as it arrives from the active party, so helpers hold the tree by the time its
    first histograms are asked for. The chunks in order make the tree's ciphertexts, which the
    tree's ``HistogramShard``s name by their SHA-256. Never leaves the party.
    """

    tree: int
    chunk: int
    n_chunks: int
    n: bytes
    ciphertexts: bytes
    scheme: str = "paillier"


@dataclass(frozen=True, slots=True)
class HistogramShard:
    """Work for one of a party's own processes: a level's data, to sum the histograms of the
    features it claims one by one from the pool ``claims`` (workers.shards).

    Per built node (in order): that node's rows of the bin codes (rows x features, uint8,
    row-major) and, per row, where its E(g, h, 1) is in the tree's ciphertexts (``index``,
    uint32 little-endian). ``tree_digest`` names the tree's ciphertexts: with one helper they
    came before, in ``TreeCiphertexts`` chunks; with more, the tree's first level carries them
    in ``tree_ciphertexts`` (chunk copies on a shared queue would not reach every helper).
    Never leaves the party.
    """

    tree: int
    depth: int
    shard: int
    n: bytes
    n_bins: int
    n_features: int
    rows: list[int]
    bins: bytes
    index: bytes
    tree_digest: bytes
    tree_ciphertexts: bytes
    cell_bits: int
    per_ciphertext: int
    """How to pack the bin sums (crypto.compress.BinSumPacking)."""
    claims: str
    scheme: str = "paillier"
    """Which scheme's key ``n`` is (``crypto.schemes``)."""


@dataclass(frozen=True, slots=True)
class ShardHistogram:
    """A shard's result: the features it summed and, feature after feature, which bins
    (node, bin) are filled and their sums packed ``per_ciphertext`` to a ciphertext; and the
    seconds it took."""

    tree: int
    depth: int
    shard: int
    features: list[int]
    filled: InstanceSpace
    ciphertexts: bytes
    seconds: float


@dataclass(frozen=True, slots=True)
class CryptoShard:
    """Work for one of the active party's own processes: encrypt (``op`` "encrypt": packed
    gradients to a tree's chunks) or decrypt (``op`` "decrypt": a level's histograms) the units
    it claims one by one from the pool ``claims`` (workers.crypto_shards).

    ``key`` is the job's Paillier private key and ``data`` the step's inputs (``count`` values
    of ``width`` bytes, ``unit`` to a claimable unit), both sealed under a key only the party's
    own processes can derive, bound to the job and this shard. Never leaves the party.
    """

    tree: int
    depth: int
    op: str
    n: bytes
    key: bytes
    claims: str
    unit: int
    count: int
    width: int
    data: bytes
    cell_bits: int = 0
    """Bits of a bin sum, for ``op`` "fold" (bin sums sent one per ciphertext, folded)."""


@dataclass(frozen=True, slots=True)
class CryptoUnit:
    """A helper's result for one unit of a ``CryptoShard``: its ciphertexts (encrypt), or its
    plaintexts sealed like the shard's inputs (decrypt); and the seconds it took."""

    tree: int
    depth: int
    claims: str
    unit: int
    result: bytes
    seconds: float


@dataclass(frozen=True, slots=True)
class SplitChoice:
    """A split the owner party must apply: its feature index and bin threshold."""

    node: int
    feature: int
    bin: int
    missing_left: bool
    left_id: int = -1
    right_id: int = -1
    """The children's node ids, given when the level is built ahead (else -1)."""


@dataclass(frozen=True, slots=True)
class SplitChoices:
    """The splits of one level owned by the receiving passive party.

    With ``build_ahead`` (one data provider, no differential privacy) it also carries the
    positions of the active party's own splits of the level (``ahead``: what NodePositions
    would bring after them) and every child's id, so the party routes its rows and builds the
    next level's histograms in the same step: one round trip a level instead of two.
    """

    tree: int
    depth: int
    splits: list[SplitChoice]
    build_ahead: bool = False
    ahead: list[NodeSplit] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AppliedSplit:
    """Owner's answer for one node: its lookup-table record and the rows going left."""

    node: int
    record_id: int
    left: InstanceSpace


@dataclass(frozen=True, slots=True)
class AppliedSplits:
    """All of one owner's applied splits for a level."""

    tree: int
    depth: int
    splits: list[AppliedSplit]


@dataclass(frozen=True, slots=True)
class NodeSplit:
    """Broadcast: ``node`` split into ``left_id``/``right_id``; ``left`` over the node's rows."""

    node: int
    left_id: int
    right_id: int
    left: InstanceSpace


@dataclass(frozen=True, slots=True)
class NodePositions:
    """All splits of one level, so every passive party can route its rows."""

    tree: int
    depth: int
    splits: list[NodeSplit]


# ---- federated prediction (seed 002, Alg. 5) -----------------------------------------------
@dataclass(frozen=True, slots=True)
class Decisions:
    """A passive party's decisions for a batch: bit ``r * batch + i`` is row i at record r."""

    batch: int
    records: list[int]
    n_rows: int
    bits: bytes


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    """Path mode: the active party asks the owner for decisions at the nodes on rows' paths.

    Pair k is (batch row ``rows[k]``, lookup record ``records[k]``), both little-endian uint32:
    the nodes this party owns that rows of the batch have reached at level ``depth``.
    """

    batch: int
    depth: int
    rows: bytes
    records: bytes


@dataclass(frozen=True, slots=True)
class PathDecisions:
    """Path mode: the owner's answer to a ``DecisionRequest``, bit k for pair k (1 = left)."""

    batch: int
    depth: int
    n_pairs: int
    bits: bytes


# SecureBoost's kinds, which the vertical forest reuses for keys, validation and path prediction.
declare(
    "vertical_secureboost",
    openers={"OPEN_JOB": (1, OpenJob), "OPEN_PREDICTION": (2, OpenPrediction)},
    commands={name: (number, Step) for name, number in (
        ("BIN_FEATURES", 13), ("ENCRYPT_GRADIENTS", 20), ("BUILD_HISTOGRAMS", 21),
        ("FIND_BEST_SPLITS", 22), ("APPLY_SPLITS", 23), ("BROADCAST_NODES", 24),
        ("FINISH_TREE", 25), ("SAVE_MODEL", 26), ("EVALUATE_VALIDATION", 27),
        ("EVALUATE_NODES", 30), ("FINISH_TRAVERSAL", 31), ("WRITE_SCORES", 32),
        ("TRAVERSE_LEVEL", 33))},
    replies={"SPLITS_FOUND": (101, SplitsFound)},
    peer={"PUBLIC_KEY": (202, PublicKeyMsg), "TREE_START": (203, TreeStart),
          "ENCRYPTED_GRADIENTS": (204, EncryptedGradients),
          "ENCRYPTED_HISTOGRAMS": (205, EncryptedHistograms),
          "SPLIT_CHOICES": (206, SplitChoices), "APPLIED_SPLITS": (207, AppliedSplits),
          "NODE_POSITIONS": (208, NodePositions), "DECISIONS": (210, Decisions),
          "DECISION_REQUEST": (211, DecisionRequest), "PATH_DECISIONS": (212, PathDecisions),
          "SHARD_HISTOGRAM": (221, ShardHistogram), "CRYPTO_UNIT": (224, CryptoUnit)},
    work={"HISTOGRAM_SHARD": (220, HistogramShard), "TREE_CIPHERTEXTS": (222, TreeCiphertexts),
          "CRYPTO_SHARD": (223, CryptoShard)})
