"""The active party's state of a vertical random forest job: the forest (its key pair, label
channels, finished trees) and each tree being grown (``workers.forest.growing``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from boosting._typing import FloatArray, IntArray
from boosting.losses import n_outputs
from boosting.params import BoostParams, TreeParams
from boosting.tree import Model, Tree
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.schemes import PrivateKey, PublicKey
from messages.forest import ForestSpec
from messages.secureboost import NodeSplit


def params_of(spec: ForestSpec) -> BoostParams:
    """The model file's parameters (a forest has no learning rate: 1)."""
    shared = {f.name for f in dataclasses.fields(TreeParams)}
    return BoostParams(**{name: value for name, value in dataclasses.asdict(spec.params).items()
                          if name in shared}, learning_rate=1.0)


@dataclass(slots=True)
class GrowingTree:
    """One tree being grown (one attempt of it)."""

    tree: int
    work: int
    weights: IntArray
    node_of_row: IntArray
    """Node of each training row in the sample (-1: not drawn)."""
    depth: int = 0
    level: list[int] = field(default_factory=list)
    """Nodes of the current level that are being split (their histograms asked for)."""
    next_id: int = 1
    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Internal nodes: children, owner and (own) feature/threshold or (passive) record id."""
    own_features: dict[int, IntArray] = field(default_factory=dict)
    asked: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    """Per passive party, per node, the features (its own indices) asked this level."""
    broadcast: list[NodeSplit] = field(default_factory=list)
    """Splits of the previous level, for every passive party to route its rows."""
    waiting: dict[str, set[int]] = field(default_factory=dict)
    """Per owner, the nodes whose split it must still apply (and send back)."""


@dataclass(slots=True)
class ActiveForest:
    """The active party's state of a forest job."""

    spec: ForestSpec
    params: BoostParams
    public: PublicKey
    private: PrivateKey
    n_classes: int = 0
    y: FloatArray = field(default_factory=lambda: np.empty(0))
    channels: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    packer: GradientPacker | None = None
    packing: BinSumPacking | None = None
    scale: float = 1.0
    """Fixed-point scale of the encrypted channels (regression; 1 for classes)."""
    feature_counts: dict[str, int] = field(default_factory=dict)
    node_keys: tuple[int, int] = (0, 0)
    """Keys of the nodes' feature draws and of their random splits: known to this party
    alone, so no other party replays them from the job's public seed."""
    labels_sent: bool = False
    trees: dict[int, list[Tree]] = field(default_factory=dict)
    """Finished trees (one per output), leaf values not yet divided by the number of trees."""
    growing: dict[int, GrowingTree] = field(default_factory=dict)
    saved: list[int] | None = None
    """The trees of the saved forest (what validation scores)."""
    score_margin: np.ndarray | None = None

    @property
    def outputs(self) -> int:
        return n_outputs(self.params.objective, self.n_classes)

    def finish(self, margin: FloatArray) -> FloatArray:
        """The forest's prediction is the sum of its (divided) leaves."""
        return margin

    def scoring_model(self) -> Model:
        """The saved forest, else the trees finished so far."""
        return self.model({}, self.saved)

    def model(self, features: dict[str, tuple[str, ...]], only: list[int] | None = None) -> Model:
        """The forest over ``only`` (default: every finished tree), leaves averaged."""
        chosen = sorted(self.trees) if only is None else only
        count = max(1, len(chosen))
        trees = tuple(Tree(nodes=tuple(replace(n, value=n.value / count) for n in t.nodes),
                           output=t.output)
                      for k in chosen for t in self.trees[k])
        return Model(self.params, (0.0,) * self.outputs, self.n_classes, trees, features,
                     ensemble="forest")
