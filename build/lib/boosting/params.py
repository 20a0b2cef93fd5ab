"""Training parameters: one frozen bag that round-trips to JSON (XGBoost ``save_config``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from boosting import BoostingError

Objective = Literal["binary", "multiclass", "regression"]
OBJECTIVES: tuple[str, ...] = ("binary", "multiclass", "regression")

# Bin indices are stored as uint8 with one index reserved for missing values.
MAX_BIN_LIMIT = 255


@dataclass(frozen=True, slots=True)
class BoostParams:
    """Hyper-parameters of one GBDT, shared by the centralized and federated trainers."""

    n_trees: int = 30
    max_depth: int = 3
    learning_rate: float = 0.3
    max_bin: int = 32
    objective: Objective = "binary"
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    min_samples_leaf: int = 1
    subsample: float = 1.0
    seed: int = 0
    complete_secure: bool = False
    """Completely SecureBoost: the first tree uses the active party's features only."""

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool]] = [
            ("n_trees", self.n_trees >= 1),
            ("max_depth", 1 <= self.max_depth <= 16),
            ("learning_rate", 0.0 < self.learning_rate <= 1.0),
            ("max_bin", 2 <= self.max_bin <= MAX_BIN_LIMIT - 1),
            ("objective", self.objective in OBJECTIVES),
            ("reg_lambda", self.reg_lambda >= 0.0),
            ("gamma", self.gamma >= 0.0),
            ("min_child_weight", self.min_child_weight >= 0.0),
            ("min_samples_leaf", self.min_samples_leaf >= 1),
            ("subsample", 0.0 < self.subsample <= 1.0),
        ]
        for name, ok in checks:
            if not ok:
                raise BoostingError(f"invalid parameter {name}={getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        """Return the parameters as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BoostParams:
        """Build parameters from a dict, rejecting unknown keys by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise BoostingError(f"unknown parameter(s): {', '.join(unknown)}")
        return cls(**raw)

    def to_json(self) -> str:
        """Serialise to JSON (sorted keys, so equal params give equal text)."""
        return json.dumps(self.to_dict(), sort_keys=True)
