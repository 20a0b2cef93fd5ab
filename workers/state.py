"""Per-job state of a party, kept by its worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boosting._typing import BinMatrix, FloatArray, IntArray
from crypto.psi import PsiKey
from messages.secureboost import VALIDATION_BATCH
from workers import StageError
from workers.data import PartyData


@dataclass(slots=True)
class JobState:
    """What one party knows about one job."""

    kind: str  # "train" or "predict"
    party: str
    active: str
    passives: list[str]
    data: PartyData
    valid_fraction: float = 0.0
    valid_seed: int = 0
    key_bits: int = 2048
    scheme: str = "paillier"
    """The job's encryption scheme (``crypto.schemes``)."""
    predict_batch: int = VALIDATION_BATCH
    psi: PsiKey | None = field(default_factory=PsiKey)
    """This party's PSI secret; checkpoints drop it (alignment is over by then)."""
    psi_order: IntArray | None = None
    """Data row of each id in the order this party sent its blinded ids."""
    aligned: IntArray | None = None
    """Data row of each aligned position (the federation's common row order)."""
    valid: np.ndarray | None = None
    """Mask over aligned positions held out for validation."""
    cuts: list[FloatArray] = field(default_factory=list)
    bins: BinMatrix | None = None
    """Binned features of the training rows."""
    score_x: FloatArray | None = None
    """Raw features of the rows scored federatedly (validation rows, or rows to predict)."""
    role_state: Any = None
    paths: Any = None
    """The active party's path-mode walk of the batch being scored; a passive party's digest
    of each level it answered (``workers.column_partitioned.paths``)."""
    digest: str = ""
    """The job spec and this party's data, as checkpoints record them (training jobs)."""
    data_file: str = ""
    """The party's data file of this job (named in its errors; never sent)."""

    def require_aligned(self) -> tuple[IntArray, np.ndarray]:
        """The aligned rows and validation mask, or a stage error."""
        if self.aligned is None or self.valid is None:
            raise StageError(f"{self.party}: entities are not aligned yet (run PSI first)")
        return self.aligned, self.valid

    def psi_key(self) -> PsiKey:
        """The PSI secret, or a stage error (a job resumed from a checkpoint is aligned)."""
        if self.psi is None:
            raise StageError(f"{self.party}: this job was resumed after alignment; no PSI now")
        return self.psi

    def require_bins(self) -> BinMatrix:
        """The binned training features, or a stage error."""
        if self.bins is None:
            raise StageError(f"{self.party}: features are not binned yet (run bin_features)")
        return self.bins

    @property
    def train_rows(self) -> IntArray:
        aligned, valid = self.require_aligned()
        return aligned[~valid]

    @property
    def valid_rows(self) -> IntArray:
        aligned, valid = self.require_aligned()
        return aligned[valid]

    def batch_rows(self, batch: int) -> slice:
        """Positions in the scoring set covered by a prediction batch."""
        if self.score_x is None:
            raise StageError(f"{self.party}: nothing to score in this job")
        start = batch * self.predict_batch
        if batch < 0 or start >= max(1, self.score_x.shape[0]):
            raise StageError(f"{self.party}: batch {batch} is out of range")
        return slice(start, min(start + self.predict_batch, self.score_x.shape[0]))
