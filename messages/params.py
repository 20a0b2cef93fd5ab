"""The boosting hyper-parameters every tree protocol shares: one definition.

``TreeParams`` travels nested in the openers of vertical SecureBoost, the horizontal protocol
and SimFL (``JobSpec.params``, ``HorizontalSpec.params``, ``SimflSpec.params``); the job file's
``params:`` schema (``flows.job_schema``) is made from its fields and their bounds, and a worker
turns it into the core's ``boosting.params.BoostParams`` whole (``BoostParams(**asdict(p))``),
never field by field. A new hyper-parameter: its field here (with bounds and a docstring), its
use in ``boosting``, and its line in the docs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OBJECTIVES = ("binary", "multiclass", "regression")


def bounds(**limits: Any) -> Any:
    """A field's limits for the job file's schema (pydantic ``Field`` keywords: ge, gt, le)."""
    return {"bounds": limits}


@dataclass(frozen=True, slots=True)
class TreeParams:
    """Hyper-parameters of one GBDT (the job file's ``params:``)."""

    n_trees: int = field(default=30, metadata=bounds(ge=1, le=10_000))
    """Boosting rounds (trees per output)."""
    max_depth: int = field(default=3, metadata=bounds(ge=1, le=16))
    learning_rate: float = field(default=0.3, metadata=bounds(gt=0.0, le=1.0))
    max_bin: int = field(default=32, metadata=bounds(ge=2, le=254))
    """Bins per feature (one more index is kept for missing values)."""
    objective: str = field(default="binary", metadata={"choices": OBJECTIVES})
    reg_lambda: float = field(default=1.0, metadata=bounds(ge=0.0))
    """L2 regularisation of the leaf weights."""
    gamma: float = field(default=0.0, metadata=bounds(ge=0.0))
    """Smallest gain a split must bring."""
    min_child_weight: float = field(default=1.0, metadata=bounds(ge=0.0))
    """Smallest hessian sum of a child."""
    min_samples_leaf: int = field(default=1, metadata=bounds(ge=1))
    subsample: float = field(default=1.0, metadata=bounds(gt=0.0, le=1.0))
    """Fraction of the rows each tree is grown on."""
    seed: int = field(default=0, metadata=bounds(ge=0))
