"""A member's state of one horizontal job, and the model the members share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boosting._typing import BinMatrix, FloatArray, IntArray
from boosting.params import BoostParams
from boosting.tree import Model, Tree
from messages.bodies import TreeFinished
from messages.horizontal import HorizontalSpec
from workers import StageError, checkpoint
from workers.data import PartyData
from workers.horizontal.grid import Layout
from workers.pairwise_masks import MaskKey
from workers.horizontal.tree import MemberTree
from workers.row_partitioned import shared_model


@dataclass(slots=True)
class MemberRecord:
    """What a member's checkpoint holds after its trees (and after binning)."""

    cuts: list[FloatArray]
    base: float
    classes: int
    margin: FloatArray
    round_margin: FloatArray
    trees: list[Tree]
    history: list[TreeFinished]

    @classmethod
    def older(cls, where: str, saved: dict[str, Any]) -> MemberRecord:
        """A checkpoint of the dict layout (format 2: the cuts from the set-up grid; from
        before multiclass: one class, each round one tree)."""
        saved = checkpoint.older_state(where, saved, {"cuts", "base", "margin", "trees", "history"},
                                       OLDER_FORMATS, 2)
        return cls(list(saved["cuts"]), float(saved["base"]), int(saved.get("classes", 1)),
                   np.array(saved["margin"]), np.array(saved.get("round_margin", saved["margin"])),
                   list(saved["trees"]), list(saved["history"]))


OLDER_FORMATS = {1: "an older horizontal protocol (cuts from quantile summaries)"}
"""The dict layouts of horizontal checkpoints that are refused, and why."""


@dataclass(slots=True)
class MemberJob:
    """A member's state of one horizontal job."""

    spec: HorizontalSpec
    params: BoostParams
    data: PartyData
    data_file: str
    id_column: str
    digest: str
    aggregator: str
    mask_key: MaskKey
    seal: bytes
    """This member's seal contribution of this session (``masking.round_seal_key``)."""
    draws: bytes
    """This job's secret of the member's row draws (``workers.horizontal.draws``): derived
    from its checkpoint key, never stored or sent."""
    released: dict[str, list[str]]
    """Tree prefix -> the members whose root round this member released a key for."""
    announced: bool = False
    """Whether the other members were sent this session's mask public key."""
    peers: dict[str, bytes] = field(default_factory=dict)
    """Pair secret with each other member (from their public keys)."""
    seals: dict[str, bytes] = field(default_factory=dict)
    """Every other member's seal contribution (from its encrypted share)."""
    masked: set[tuple[str, int, int, int]] = field(default_factory=set)
    """Rounds this member has masked a vector in: never two vectors under one mask."""
    layouts: list[Layout] = field(default_factory=list)
    """The set-up grid's cells per feature (``workers.horizontal.grid``)."""
    grid_round: int = -1
    cuts: list[FloatArray] = field(default_factory=list)
    bins: BinMatrix | None = None
    base: float = 0.0
    classes: int = 1
    """Trees per round: the union's classes in multiclass, else 1 (``SharedCuts.classes``)."""
    margin: FloatArray | None = None
    """Rows x outputs: the model so far on this member's rows."""
    round_margin: FloatArray | None = None
    """The margins at the start of the current round: every class's tree of a round is grown
    on the gradients of the same margins, as the core grows them."""
    trees: list[Tree] = field(default_factory=list)
    history: list[TreeFinished] = field(default_factory=list)
    run: str = ""
    # the tree in progress
    round: tuple[int, int] = (-1, -1)
    """(tree, attempt) of the tree being grown."""
    live: list[str] = field(default_factory=list)
    prefix: str = ""
    """The tree in progress's name (``released.tree_prefix``)."""
    opened: tuple[int, int] = (-1, -1)
    """(tree, attempt) whose root round this member released the key of."""
    grad: FloatArray | None = None
    hess: FloatArray | None = None
    g_ints: IntArray | None = None
    h_ints: IntArray | None = None
    tree: MemberTree | None = None

    @property
    def y(self) -> FloatArray:
        assert self.data.y is not None
        return self.data.y

    def require_bins(self) -> BinMatrix:
        if self.bins is None:
            raise StageError(f"{self.data_file}: rows are not binned yet")
        return self.bins

    def model(self) -> Model:
        return shared_model(self.params, self.base, self.classes, self.trees, self.data.names)


checkpoint.register_state_types(MemberRecord)
