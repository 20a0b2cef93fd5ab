"""The horizontal protocol's messages (FedTree): members with different rows and the same
columns, an aggregator that sums their masked histograms and grows the trees.

Commands come from the flow; peer messages go member -> aggregator (column names, masked
vectors, gradient ranges, round keys) and aggregator -> member (cells to split, cuts, scale,
splits, leaves), and member -> member (the public keys of the pairwise masks, the sealed seal
contributions). No message carries a path, a row, a raw value or a plain count or histogram of
one member.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from messages.bodies import PartyInfo
from messages.kinds import declare
from messages.params import TreeParams


@dataclass(frozen=True, slots=True)
class HorizontalSpec:
    """Everything a party needs to take part in a horizontal job (no data, no paths)."""

    parties: list[PartyInfo]
    params: TreeParams
    min_members: int
    summary_size: int
    """The set-up grid's resolution: a cell holding a quantile is split while it holds more
    than 1/summary_size of the feature's rows (``workers.horizontal.grid``)."""
    dp_epsilon: float
    """The job's privacy budget; 0: no differential privacy (lossless)."""
    dp_clip: float
    dp_seed: int
    """Seed of the aggregator's noise (-1: fresh randomness from the OS)."""
    dp_per_ensemble: int = 0
    """Trees per DPBoost ensemble (``boosting.privacy.PrivacyPlan``); 0 without privacy."""


@dataclass(frozen=True, slots=True)
class OpenHorizontal:
    """Command: load the party's data set and prepare a horizontal training job."""

    spec: HorizontalSpec
    protocol: ClassVar[str] = "horizontal"

    @property
    def parties(self) -> list[PartyInfo]:
        """Every party of the job and its role (member or aggregator)."""
        return self.spec.parties


@dataclass(frozen=True, slots=True)
class Round:
    """Command for one step of tree ``tree`` at ``depth`` in attempt ``attempt`` (a tree is
    grown again, under fresh masks, when a member drops out before its root was opened);
    ``members`` are the tree's members (a set-up step: ``depth`` is the set-up round)."""

    tree: int = -1
    depth: int = -1
    attempt: int = 0
    members: list[str] = field(default_factory=list)


# ---- peer messages ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MaskPublicKey:
    """Member -> member: the sender's X25519 public key of this job session."""

    key: bytes


@dataclass(frozen=True, slots=True)
class SealShare:
    """Member -> member: the sender's seal contribution of this job session, encrypted and
    authenticated under their pair secret (``workers.pairwise_masks.seal_share``)."""

    nonce: bytes
    sealed: bytes


@dataclass(frozen=True, slots=True)
class MemberColumns:
    """Member -> aggregator, set-up round 0: its column names (the cuts need the same)."""

    columns: list[str]


@dataclass(frozen=True, slots=True)
class RefineCells:
    """Aggregator -> members: the cells of each feature to split for set-up round ``round``
    (int32 LE cell indices per feature, ``workers.horizontal.grid``)."""

    round: int
    cells: list[bytes]

    @property
    def depth(self) -> int:
        """The mailbox files a set-up round as a depth."""
        return self.round


@dataclass(frozen=True, slots=True)
class RoundKey:
    """Member -> aggregator: the key that removes the seals of one round's masked vectors,
    sent only on the flow's word that every vector of the round is in."""

    tree: int
    depth: int
    attempt: int
    key: bytes


@dataclass(frozen=True, slots=True)
class MaskedVector:
    """Member -> aggregator: int64 values under the pairwise masks of one round (uint64 LE)."""

    purpose: str
    tree: int
    depth: int
    attempt: int
    values: bytes


@dataclass(frozen=True, slots=True)
class SharedCuts:
    """Aggregator -> members: the reference columns, every feature's cuts (float64 LE; none
    when members' columns differ), the model's base score (binary, regression; 0 for every
    class in multiclass) and its outputs: the union's classes in multiclass (its highest label
    plus one, as the core counts them), else 1."""

    columns: list[str]
    cuts: list[bytes]
    base_score: float
    classes: int


@dataclass(frozen=True, slots=True)
class GradientRange:
    """Member -> aggregator: the peak exponents of its g and h this tree (``max|g| < 2**e``)
    and its rows in the tree: what a common quantization scale needs."""

    tree: int
    attempt: int
    g_exponent: int
    h_exponent: int
    rows: int


@dataclass(frozen=True, slots=True)
class GradientScale:
    """Aggregator -> members: the largest exponents and the rows of all members."""

    tree: int
    attempt: int
    g_exponent: int
    h_exponent: int
    rows: int


@dataclass(frozen=True, slots=True)
class NodeSplit:
    """One node's split: rows with bin <= ``bin`` of ``feature`` go to ``left``."""

    node: int
    feature: int
    bin: int
    missing_left: bool
    left: int
    right: int


@dataclass(frozen=True, slots=True)
class LevelSplits:
    """Aggregator -> members: the splits of one level, and the children whose histograms the
    members build next (the smaller of each pair; the aggregator subtracts the other)."""

    tree: int
    depth: int
    attempt: int
    splits: list[NodeSplit]
    build: list[int]


@dataclass(frozen=True, slots=True)
class LeafValues:
    """Aggregator -> members: the finished tree's leaf values (learning rate applied)."""

    tree: int
    attempt: int
    leaves: list[int]
    values: list[float]


declare(
    "horizontal",  # commands 300-319, peer messages 320-339
    openers={"H_OPEN_JOB": (300, OpenHorizontal)},
    commands={name: (number, Round) for name, number in (
        ("H_SUMMARIZE", 301), ("H_MERGE_BINS", 302), ("H_APPLY_BINS", 303),
        ("H_COMPUTE_GRADIENTS", 304), ("H_AGREE_SCALE", 305), ("H_UPDATE_HISTOGRAMS", 306),
        ("H_SECURE_SUM", 307), ("H_APPLY_SPLITS", 308), ("H_SEND_TREE", 309),
        ("H_RECEIVE_TREE", 310), ("H_RELEASE_ROUND", 311))},
    peer={"H_MASK_KEY": (320, MaskPublicKey), "H_COLUMNS": (321, MemberColumns),
          "H_MASKED": (322, MaskedVector), "H_CUTS": (323, SharedCuts),
          "H_GRADIENT_RANGE": (324, GradientRange), "H_GRADIENT_SCALE": (325, GradientScale),
          "H_SPLITS": (326, LevelSplits), "H_LEAVES": (327, LeafValues),
          "H_SEAL_KEY": (328, SealShare), "H_ROUND_KEY": (329, RoundKey),
          "H_REFINE": (330, RefineCells)})
