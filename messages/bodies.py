"""One frozen dataclass per protocol message (SecureBoost steps, PSI, prediction).

Commands come from the flow and are answered with ``Ack``, a typed reply, or ``ErrorReply``;
peer messages go party to party and carry ciphertexts, blinded ids and instance spaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from messages.instance_space import InstanceSpace
from messages.kinds import declare
from messages.params import TreeParams

VALIDATION_BATCH = 4096
"""Rows per prediction batch when a training job scores its hold-out (flow and parties agree)."""


# ---- job set-up ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PartyInfo:
    """A party's name, its role in the job ("active"/"passive"; "member"/"aggregator") and the
    name of the data set it uses, in its own worker file ("": its default data set)."""

    name: str
    role: str
    dataset: str = ""


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
class Step:
    """Command for one protocol step at given coordinates (-1 where not applicable)."""

    tree: int = -1
    depth: int = -1
    owners: list[str] = field(default_factory=list)


# ---- replies --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ack:
    """Reply: the step is done; ``count`` is step-specific (rows, features, nodes)."""

    count: int = 0


@dataclass(frozen=True, slots=True)
class Aligned:
    """Reply of psi_intersect: aligned rows, and how many are for training / validation."""

    n_aligned: int
    n_train: int
    n_valid: int


@dataclass(frozen=True, slots=True)
class SplitsFound:
    """Reply of find_best_splits: the parties owning this level's splits, and counts."""

    owners: list[str]
    n_splits: int
    n_leaves: int


@dataclass(frozen=True, slots=True)
class Metric:
    """A named metric value."""

    name: str
    value: float


@dataclass(frozen=True, slots=True)
class TreeFinished:
    """Reply of finish_tree at the active party: training metrics after this tree."""

    metrics: list[Metric]
    per_tree: list[list[Metric]] = field(default_factory=list)
    """Validation replies only: the metrics after each tree (the learning curve), or none
    when the margins after every tree would not fit in memory."""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Reply: the step failed; ``user_error`` marks bad input (data, config) vs a fault."""

    party: str
    step: str
    message: str
    user_error: bool
    state_lost: bool = False
    """The party has no state for the job (its worker restarted): the flow may resume the job
    from the parties' checkpoints."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A party's saved job state after ``trees_done`` trees of training run ``run`` (a digest
    of the run's Paillier public key: checkpoints of different runs never mix)."""

    trees_done: int
    run: str


@dataclass(frozen=True, slots=True)
class Opened:
    """Reply of open_job: rows loaded, and the checkpoints this party holds for exactly this
    job (same spec, same data)."""

    rows: int
    checkpoints: list[Checkpoint]


@dataclass(frozen=True, slots=True)
class ResumeJob:
    """Command: restore the checkpoint every party holds."""

    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class Resumed:
    """Reply of resume_job: the state restored after ``trees_done`` trees. The active party
    also reports what the flow learnt before (alignment, trees per round, per-tree metrics)."""

    trees_done: int
    n_aligned: int
    n_train: int
    n_valid: int
    outputs: int
    history: list[TreeFinished]


# ---- PSI ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PsiPoints:
    """Blinded id points: stage 1 a passive party's own, 2 the active party's,
    3 the active party's re-blinded by the passive party (same order as stage 2)."""

    stage: int
    points: bytes


@dataclass(frozen=True, slots=True)
class AlignedRows:
    """For each id a passive party sent (its sent order): its aligned row, or -1 (int32 LE).

    ``valid`` marks the aligned rows held out for validation.
    """

    positions: bytes
    valid: InstanceSpace


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


@dataclass(frozen=True, slots=True)
class SplitChoices:
    """The splits of one level owned by the receiving passive party."""

    tree: int
    depth: int
    splits: list[SplitChoice]


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


# ---- the scoring service (fedboost serve-model) ---------------------------------------------
MAX_SCORING_ROWS = 65_536
"""Rows one scoring round may ask for: what a party accepts, whatever a session says."""


@dataclass(frozen=True, slots=True)
class OpenScoring:
    """Command: open a scoring session over the model of trained job ``model_job``.

    Each party loads its part of that model from its own model folder and indexes the rows of
    its data set (``PartyInfo.dataset``) by id, once; the session then scores rows by id in
    rounds (``ScoreRows``) until it is closed. ``protocol`` is the trained job's protocol (its
    model parts are what the session loads): a party's policy must list it, and must allow
    ``batched`` prediction (``policy.predict_modes``) at a passive party.
    """

    parties: list[PartyInfo]
    model_job: str
    max_rows: int
    protocol: str


@dataclass(frozen=True, slots=True)
class ScoreRows:
    """Command, one scoring round: the rows with these ids, in this order (seed 002, Alg. 5:
    passive parties evaluate all their nodes and send the bits to the active party, which
    finishes the traversal). The active party waits at most ``wait_seconds`` for them."""

    round: int
    ids: list[str]
    wait_seconds: float


@dataclass(frozen=True, slots=True)
class FindRows:
    """Command, a membership round: which of these ids has no row here. Every party answers
    ``RowsFound`` and sends nothing else: a scoring round (``ScoreRows``) follows only for ids
    every party holds, so a request that cannot be scored sends no decisions to the active
    party. No ids: a ping (every party answering is what ``GET /readyz`` reports)."""

    round: int
    ids: list[str]


@dataclass(frozen=True, slots=True)
class RoundDecisions:
    """A passive party's decisions for one scoring round, to the active party: ``records``
    are its lookup record ids (uint32 little-endian, ascending: bytes, not a list, so a forest's
    thousands of records cost no per-item decoding), bit ``r * n_rows + i`` row i at record r;
    no records and no rows when it could not score the round (an unknown id)."""

    round: int
    records: bytes
    n_rows: int
    bits: bytes


@dataclass(frozen=True, slots=True)
class RowsFound:
    """A party's reply to ``FindRows``, and a passive party's to ``ScoreRows``: the positions
    (in the round's ids) of ids it has no row for; empty when every id has one (and, answering
    ``ScoreRows``, its decisions went to the active party)."""

    round: int
    unknown: list[int]


@dataclass(frozen=True, slots=True)
class Scores:
    """The active party's reply to ``ScoreRows``: rows x outputs of predictions (float64,
    little-endian, row-major), or, when some id is unknown to it, the positions of those ids
    (and no values); ``incomplete`` names passive parties that could not score the round."""

    round: int
    n_outputs: int
    values: bytes
    unknown: list[int]
    incomplete: list[str]


# The kinds whose bodies live here: those every protocol shares (opening, resuming, replies,
# saving, closing), vertical SecureBoost's (which the vertical forest reuses for PSI, keys,
# validation and path prediction) and the scoring service's.
declare(
    "core",
    openers={"OPEN_JOB": (1, OpenJob), "OPEN_PREDICTION": (2, OpenPrediction),
             "OPEN_SCORING": (400, OpenScoring)},
    commands={**{name: (number, Step) for name, number in (
        ("PSI_BLIND", 10), ("PSI_REBLIND", 11), ("PSI_INTERSECT", 12), ("BIN_FEATURES", 13),
        ("ENCRYPT_GRADIENTS", 20), ("BUILD_HISTOGRAMS", 21), ("FIND_BEST_SPLITS", 22),
        ("APPLY_SPLITS", 23), ("BROADCAST_NODES", 24), ("FINISH_TREE", 25), ("SAVE_MODEL", 26),
        ("EVALUATE_VALIDATION", 27), ("EVALUATE_NODES", 30), ("FINISH_TRAVERSAL", 31),
        ("WRITE_SCORES", 32), ("TRAVERSE_LEVEL", 33), ("CLOSE_JOB", 40))},
              "RESUME_JOB": (41, ResumeJob), "SCORE_ROWS": (401, ScoreRows),
              "FIND_ROWS": (405, FindRows)},
    replies={"ACK": (100, Ack), "SPLITS_FOUND": (101, SplitsFound),
             "TREE_FINISHED": (102, TreeFinished), "ERROR": (103, ErrorReply),
             "ALIGNED": (104, Aligned), "OPENED": (105, Opened), "RESUMED": (106, Resumed),
             "ROWS_FOUND": (402, RowsFound), "SCORES": (403, Scores)},
    peer={"PSI_POINTS": (200, PsiPoints), "ALIGNED_ROWS": (201, AlignedRows),
          "PUBLIC_KEY": (202, PublicKeyMsg), "TREE_START": (203, TreeStart),
          "ENCRYPTED_GRADIENTS": (204, EncryptedGradients),
          "ENCRYPTED_HISTOGRAMS": (205, EncryptedHistograms),
          "SPLIT_CHOICES": (206, SplitChoices), "APPLIED_SPLITS": (207, AppliedSplits),
          "NODE_POSITIONS": (208, NodePositions), "DECISIONS": (210, Decisions),
          "DECISION_REQUEST": (211, DecisionRequest), "PATH_DECISIONS": (212, PathDecisions),
          "SHARD_HISTOGRAM": (221, ShardHistogram), "CRYPTO_UNIT": (224, CryptoUnit),
          "ROUND_DECISIONS": (404, RoundDecisions)},
    work={"HISTOGRAM_SHARD": (220, HistogramShard), "TREE_CIPHERTEXTS": (222, TreeCiphertexts),
          "CRYPTO_SHARD": (223, CryptoShard)},
    unrecorded=("SCORE_ROWS", "FIND_ROWS"),
    transient=("SCORE_ROWS", "ROUND_DECISIONS", "ROWS_FOUND", "SCORES", "FIND_ROWS"))
