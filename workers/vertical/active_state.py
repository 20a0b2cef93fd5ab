"""The active party's training state in vertical SecureBoost: labels, the key pair, margins,
the tree being grown, and the work it shares with its helper processes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from boosting._typing import FloatArray
from boosting.grow import TreeGrower
from boosting.losses import n_outputs, transform
from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan
from boosting.split import SplitCandidate
from boosting.train import allowed_blocks
from boosting.tree import Model, Tree
from crypto.encoding import GradientPacker
from crypto.schemes import PrivateKey, PublicKey
from crypto.pool import KeyHolderPool
from messages.bodies import TreeFinished
from workers import StageError, checkpoint
from workers.crypto_shards import SharedCrypto, seal_key
from workers.handlers import StepContext
from workers.lifeline import die_with_parent
from workers.state import JobState
from workers.vertical.explain import SplitRecord


@dataclass(slots=True)
class ActiveTraining:
    """The active party's training state; the shared validation steps keep its learning curve
    (it has what ``workers.column_partitioned.scoring.StagedTraining`` declares)."""

    STORED_AS: ClassVar[str] = "workers.vertical.active.ActiveTraining"
    """Its name in checkpoints (it was defined in ``workers.vertical.active``)."""

    params: BoostParams
    public: PublicKey
    private: PrivateKey
    y: np.ndarray = field(default_factory=lambda: np.empty(0))
    n_classes: int = 0
    base: np.ndarray = field(default_factory=lambda: np.empty(0))
    margin: np.ndarray = field(default_factory=lambda: np.empty(0))
    grads: tuple[np.ndarray, np.ndarray] | None = None
    grower: TreeGrower | None = None
    packer: GradientPacker | None = None
    pack_bin_sums: str = "key_holder"
    """Who folds bin sums into shared ciphertexts (the job's ``crypto.pack_bin_sums``)."""
    per_ciphertext: int = 1
    """Bin sums per ciphertext the passive parties were told to send for this tree."""
    level_splits: dict[int, SplitCandidate | None] = field(default_factory=dict)
    builds_ahead: str = ""
    """The passive party that builds the next level's histograms as it applies this level's
    splits (``SplitChoices.build_ahead``); "": the level's positions are broadcast."""
    children_ahead: dict[int, tuple[int, int]] = field(default_factory=dict)
    """The children's ids it was told, per split node (the grower must make the same)."""
    trees: list[Tree] = field(default_factory=list)
    history: list[TreeFinished] = field(default_factory=list)
    """Training metrics after each tree (a resumed flow reports them again)."""
    score_margin: np.ndarray | None = None
    passive_features: dict[str, int] = field(default_factory=dict)
    """Each passive party's feature count, as its root histograms declared and bounded it."""
    pool: KeyHolderPool | None = None
    """Encryption/decryption processes (``crypto_processes``, default one per core), started
    with the first encrypted tree."""
    crypto_processes: int = 0
    """Cores this process encrypts and decrypts on (the worker's setting; 0: every core)."""
    make_ahead: bool = True
    """Make obfuscators ahead on idle CPU (the worker's setting)."""
    key_share: bytes = b""
    """The private key sealed for the party's own processes (``workers.crypto_shards``)."""
    encrypting: Encryption | None = None
    """The tree whose gradients are being encrypted, with helper processes."""
    decrypting: SharedCrypto | None = None
    """The level whose histograms are being decrypted, with helper processes."""
    splits: list[SplitRecord] = field(default_factory=list)
    """Every finished tree's splits with their gains (the run report's feature importance)."""
    staged_margin: np.ndarray | None = None
    """Validation margins after each tree (trees x rows x outputs), for the learning curve."""
    valid_walked: int = 0
    """Trees whose validation decisions are in ``score_margin``
    (``workers.column_partitioned.paths``)."""
    privacy: PrivacyPlan | None = None
    """Differential privacy of the model (``boosting.privacy``); None: lossless."""
    noise_seed: int = 0
    """The job's ``privacy.seed`` (experiments only), or a secret of this party's: kept in its
    checkpoints, so a tree grown again after a restart draws the same noise."""

    def crypto_pool(self) -> KeyHolderPool:
        if self.pool is None:
            self.pool = KeyHolderPool(self.private, self.crypto_processes or None,
                                      on_start=die_with_parent)
        return self.pool

    def prepare_encryption(self, rows: int, tree: int) -> None:
        """Have obfuscators for tree ``tree``'s ``rows`` made ahead on idle CPU
        (``crypto.pool``), such as while this party waits for the passive parties' histograms."""
        if self.make_ahead and tree < self.params.n_trees * self.outputs:
            self.crypto_pool().prepare(rows)

    def close(self) -> None:
        """Stop the crypto processes."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def sealed_key(self, ctx: StepContext) -> bytes:
        if not self.key_share:
            self.key_share = seal_key(ctx, self.private)
        return self.key_share

    def require_grower(self, tree: int) -> TreeGrower:
        if self.grower is None or len(self.trees) != tree:
            raise StageError(f"tree {tree} is not being grown (trees done: {len(self.trees)})")
        return self.grower

    @property
    def outputs(self) -> int:
        return n_outputs(self.params.objective, self.n_classes)

    def finish(self, margin: FloatArray) -> FloatArray:
        """Predictions from margins (what validation scoring sums)."""
        return transform(self.params.objective, margin)

    def scoring_model(self) -> Model:
        """The trees so far, for scoring the validation rows."""
        return self.model({})

    def model(self, features: dict[str, tuple[str, ...]]) -> Model:
        return Model(self.params, tuple(float(b) for b in self.base), self.n_classes,
                     tuple(self.trees), features)


checkpoint.register_state_types(ActiveTraining, SplitRecord, PrivacyPlan)


@dataclass(slots=True)
class Encryption:
    """A tree's encryption shared with helper processes: what goes to whom, and the units."""

    participants: list[str]
    packed: list[int]
    work: SharedCrypto
    started: float


def participants_of(state: JobState, run: ActiveTraining, tree: int) -> list[str]:
    """Passive parties taking part in a tree (none in Completely SecureBoost's first round)."""
    blocks = allowed_blocks(run.params, tree, 1 + len(state.passives), run.outputs)
    return [state.passives[b - 1] for b in blocks if b > 0]
