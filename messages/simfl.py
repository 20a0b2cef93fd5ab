"""SimFL's messages (seed 000): members exchange LSH values once, through the aggregator, and
then per tree the summed gradients of their rows similar to the builder's rows.

No message carries a feature value: keyed ids of hash values, opaque per-job row handles,
randomised gradient sums and finished trees (whose thresholds are the builder's cut points, part of the shared
model). The hash functions' secret travels only between members, sealed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from messages.bodies import PartyInfo, Step
from messages.kinds import declare
from messages.params import TreeParams


@dataclass(frozen=True, slots=True)
class SimflSpec:
    """Everything a party needs to take part in a SimFL job (no data, no paths)."""

    parties: list[PartyInfo]
    params: TreeParams
    lsh_functions: int
    """Hash functions L (0: the paper's min(40, d - 1))."""
    lsh_r: float
    lsh_seed: int
    """Part of the preprocessing's key (another seed, other functions); the functions come from
    a secret the members agree on among themselves, never from this seed."""
    noise_label: float
    """sigma_label: noise on the g sums a member sends, drawn once per builder row (units of
    ``gradient_clip``)."""
    noise_tree: float
    """sigma_tree: noise on the g and h sums, drawn anew per tree (units of their bounds)."""
    gradient_clip: float
    """C: each row's g is clipped to [-C, C] before it is summed (the logistic loss's g has
    |g| < 1)."""


@dataclass(frozen=True, slots=True)
class OpenSimfl:
    """Command: load the party's data set and prepare a SimFL training job."""

    spec: SimflSpec
    protocol: ClassVar[str] = "simfl"

    @property
    def parties(self) -> list[PartyInfo]:
        return self.spec.parties


@dataclass(frozen=True, slots=True)
class Prepare:
    """Command: the federation's preprocessing key (a digest of every member's key); a member
    that holds the similarity of that key reuses it unless ``force``."""

    key: str
    force: bool


@dataclass(frozen=True, slots=True)
class MemberKey:
    """Reply: a member's preprocessing key (keyed digest of its data and the LSH parameters)."""

    key: str


# ---- peer messages ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RowHashes:
    """Member -> aggregator: its column names, per row an opaque handle (uint64 LE) and the
    keyed bucket ids of its L hash values (uint64 LE, row-major;
    ``workers.simfl.lsh.bucket_ids``), its label sum (the base score; 0 in multiclass) and its
    classes."""

    columns: list[str]
    handles: bytes
    hashes: bytes
    functions: int
    label_sum: float
    classes: int
    """Multiclass: the member's highest label plus one (the union's classes are the largest);
    else 1."""


@dataclass(frozen=True, slots=True)
class LshKey:
    """Member -> the first member: an X25519 public key of this job, to receive the secret of
    the hash functions sealed."""

    public: bytes


@dataclass(frozen=True, slots=True)
class LshSecret:
    """The first member -> member: its X25519 public key of this job and the secret of the hash
    functions, sealed under their pair secret (ChaCha20-Poly1305)."""

    public: bytes
    sealed: bytes


@dataclass(frozen=True, slots=True)
class SimilarRows:
    """Aggregator -> member: for each other member, the handle of its most similar row to each
    of the recipient's rows (uint64 LE, in the order the recipient sent them) and the handles
    of all that member's rows (in its order: the recipient sends a sum for each); the reference
    columns (no lists when members' columns differ) and the base score."""

    columns: list[str]
    members: list[str]
    handles: list[bytes]
    base_score: float
    everyone: list[bytes]
    classes: int
    """Trees per round: the union's classes in multiclass, else 1."""


@dataclass(frozen=True, slots=True)
class SimilarGradients:
    """Member -> builder of tree ``tree``: for every builder row, in the builder's order, the
    sum of g of the sender's rows most similar to it (float64 LE), and the total of h over
    all the sender's rows (no h per row), randomised (``workers.simfl.privacy``)."""

    tree: int
    g: bytes
    h_total: float


@dataclass(frozen=True, slots=True)
class WireNode:
    """A node of a shared tree: a split (feature, raw threshold) or a leaf value."""

    id: int
    left: int
    right: int
    feature: int
    threshold: float
    missing_left: bool
    value: float


@dataclass(frozen=True, slots=True)
class SharedTree:
    """Builder -> every other member: the tree it grew."""

    tree: int
    nodes: list[WireNode]


declare(
    "simfl",  # commands 340-359, peer messages 360-379
    openers={"S_OPEN_JOB": (340, OpenSimfl)},
    commands={**{name: (number, Step) for name, number in (
        ("S_MEMBER_KEY", 341), ("S_MATCH_ROWS", 343), ("S_STORE_SIMILAR", 344),
        ("S_SEND_GRADIENTS", 345), ("S_BUILD_TREE", 346), ("S_RECEIVE_TREE", 347))},
              "S_HASH_ROWS": (342, Prepare)},
    replies={"S_PREPARE_REPLY": (350, MemberKey)},
    peer={"S_ROW_HASHES": (360, RowHashes), "S_SIMILAR": (361, SimilarRows),
          "S_GRADIENTS": (362, SimilarGradients), "S_TREE": (363, SharedTree),
          "S_LSH_KEY": (364, LshKey), "S_LSH_SECRET": (365, LshSecret)})
