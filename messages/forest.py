"""The vertical random forest's messages (seed 002).

Commands come from the flow; peer messages go active -> passive (the encrypted labels once per
job, each tree's sample and each level's feature requests and splits) and passive -> active
(feature counts, encrypted per-bin label sums with plaintext counts, the instance spaces of the
splits it owns, children in random order). Trees travel as ``work`` ids (``attempt * MAX_TREES
+ tree``), so the messages of a retried tree never mix with those of its failed attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from boosting.params import MAX_FEATURES_RULES as MAX_FEATURES_RULES  # the schema's too
from boosting.params import TreeParams, check_fields
from messages.bodies import PartyInfo
from messages.kinds import declare
from messages.secureboost import NodeSplit, SplitChoice

MAX_TREES = 100_000
"""Trees a forest may have; a tree's attempt ``a`` is work ``a * MAX_TREES + tree``."""


_GBDT_FIELDS = {f.name: f for f in fields(TreeParams)}


def _as_in_a_gbdt(name: str, default: Any) -> Any:
    """A parameter the forest shares with a GBDT: its bounds or choices are ``TreeParams``'s."""
    return field(default=default, metadata=_GBDT_FIELDS[name].metadata)


@dataclass(frozen=True, slots=True)
class ForestParams:
    """A forest's parameters (the job file's ``params:``, but for what only the flow reads:
    ``flows.declared.forest``). Declared here once, with their defaults and bounds."""

    n_trees: int = _as_in_a_gbdt("n_trees", 50)
    max_depth: int = _as_in_a_gbdt("max_depth", 10)
    max_features: str = "sqrt"
    """Features drawn per node: ``sqrt`` or ``log2`` of all the parties' features, or a
    fraction of them in (0, 1] (as text on the wire)."""
    min_samples_leaf: int = _as_in_a_gbdt("min_samples_leaf", 1)
    max_bin: int = _as_in_a_gbdt("max_bin", 32)
    objective: str = _as_in_a_gbdt("objective", "binary")
    bootstrap: bool = True
    seed: int = _as_in_a_gbdt("seed", 0)
    complete_secure: bool = False
    """The first tree grows on the active party's features alone (no passive party sees its
    instance spaces), as Completely SecureBoost's first round."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.max_features not in MAX_FEATURES_RULES and not _is_fraction(self.max_features):
            raise ValueError(f"invalid parameter max_features={self.max_features!r}: sqrt, log2 "
                             f"or a fraction of the features in (0, 1]")


def _is_fraction(text: str) -> bool:
    try:
        return 0.0 < float(text) <= 1.0
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ForestSpec:
    """Everything a party needs to take part in a forest job (no data, no paths)."""

    parties: list[PartyInfo]
    params: ForestParams
    key_bits: int
    valid_fraction: float
    valid_seed: int
    label: str
    scheme: str = "paillier"
    """The job's encryption scheme (``crypto.schemes``): ``paillier`` or ``ou``."""


@dataclass(frozen=True, slots=True)
class OpenForest:
    """Command: load the party's data set and prepare a forest job."""

    spec: ForestSpec
    protocol: ClassVar[str] = "vertical_random_forest"

    @property
    def parties(self) -> list[PartyInfo]:
        """Every party of the job and its role (active or passive)."""
        return self.spec.parties


@dataclass(frozen=True, slots=True)
class ForestOpened:
    """Reply of open: rows loaded and the trees this party holds from earlier runs of exactly
    this job (same spec, same data)."""

    rows: int
    trees: list[int]


@dataclass(frozen=True, slots=True)
class TreeCommand:
    """Command for one step of work ``work`` (tree and attempt) at ``depth``; ``keep`` lists
    the trees every party holds (sent with the preparation step)."""

    work: int = -1
    depth: int = -1
    keep: list[int] = field(default_factory=list)


# ---- peer messages ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EncryptedLabels:
    """Active -> passive, once per job: per training row, ``groups`` Paillier ciphertexts of
    the packed label channels (fixed width), and how they are packed."""

    groups: int
    value_bits: int
    max_rows: int
    ciphertexts: bytes


@dataclass(frozen=True, slots=True)
class FeatureCount:
    """Passive -> active: how many features this party has (what feature draws range over)."""

    count: int


@dataclass(frozen=True, slots=True)
class NodeRequest:
    """The features (the receiver's own indices) whose histograms one node needs."""

    node: int
    features: list[int]


@dataclass(frozen=True, slots=True)
class LevelRequest:
    """Active -> passive: the tree's sample (level 0: uint16 multiplicity per training row,
    LE), the previous level's splits, and this level's histogram requests."""

    tree: int
    depth: int
    weights: bytes
    splits: list[NodeSplit]
    requests: list[NodeRequest]


@dataclass(frozen=True, slots=True)
class LevelHistograms:
    """Passive -> active: per label group, the encrypted sums of every requested (node,
    feature, bin) cell, non-empty cells packed (``crypto.compress``; each sum's count slot is the
    cell's weighted row count); ``filled`` marks the non-empty cells (bit-packed)."""

    tree: int
    depth: int
    filled: bytes
    per_ciphertext: int
    ciphertexts: list[bytes]


@dataclass(frozen=True, slots=True)
class ForestSplits:
    """Active -> owner: the splits of one level this passive party must apply."""

    tree: int
    depth: int
    splits: list[SplitChoice]


@dataclass(frozen=True, slots=True)
class ForestApplied:
    """Owner -> active: per applied split its record id and the rows of its *first* child, a
    child chosen at random (seed 002: the active party never learns which side holds the lower
    values)."""

    tree: int
    depth: int
    nodes: list[int]
    records: list[int]
    first: list[bytes]
    """Bit-packed masks over each node's sampled rows (ascending row order)."""


declare(
    "vertical_random_forest",  # commands 380-389, peer messages 390-399
    openers={"F_OPEN_JOB": (380, OpenForest)},
    commands={name: (number, TreeCommand) for name, number in (
        ("F_PREPARE", 381), ("F_LEVEL", 382), ("F_FIND_SPLITS", 383), ("F_APPLY_SPLITS", 384),
        ("F_FINISH_TREE", 385), ("F_SAVE_MODEL", 386))},
    replies={"F_OPENED": (387, ForestOpened)},
    peer={"F_LABELS": (390, EncryptedLabels), "F_FEATURES": (391, FeatureCount),
          "F_REQUEST": (392, LevelRequest), "F_HISTOGRAMS": (393, LevelHistograms),
          "F_SPLITS": (394, ForestSplits), "F_APPLIED": (395, ForestApplied)})
