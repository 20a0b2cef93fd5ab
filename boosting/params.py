"""Training parameters: one declaration, one frozen bag that round-trips to JSON (XGBoost
``save_config``).

``TreeParams`` holds the hyper-parameters every tree protocol shares, each with its default,
its bounds and its docstring, written here once: the core checks them when parameters are
made, the openers of vertical SecureBoost, the horizontal protocol and SimFL carry them
(``messages.params`` re-exports the class for the wire), and the job file's ``params:`` schema
(``flows.job_schema``) is made from its fields and their bounds. ``BoostParams`` adds what only
the trainer needs. A new hyper-parameter: its field here (with bounds and a docstring), its use
in ``boosting``, and its line in the docs.

This module imports nothing but the standard library (and ``boosting``'s error): the wire and
the flows take their parameters from it without taking the core's numpy.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from dataclasses import dataclass, field
from typing import Any

from boosting import BoostingError

OBJECTIVES: tuple[str, ...] = ("binary", "multiclass", "regression")

# Bin indices are stored as uint8 with one index reserved for missing values.
MAX_BIN_LIMIT = 255
MAX_FEATURES_RULES: tuple[str, ...] = ("sqrt", "log2")
"""A forest's named rules of the features a node draws (``boosting.forest.features_per_node``);
else a fraction of them."""

_LIMITS = {"ge": (operator.ge, "at least"), "gt": (operator.gt, "above"),
           "le": (operator.le, "at most"), "lt": (operator.lt, "below")}


def bounds(**limits: Any) -> Any:
    """A field's limits (pydantic ``Field`` keywords: ge, gt, le, lt), for the core's check
    and the job file's schema."""
    return {"bounds": limits}


def field_bounds(cls: type, name: str) -> dict[str, Any]:
    """The limits a field of ``cls`` declares (``{}``: none), for code sized by them (the
    deepest level a request may name)."""
    limits: dict[str, Any] = next(f for f in dataclasses.fields(cls)
                                  if f.name == name).metadata.get("bounds", {})
    return dict(limits)


def check_fields(params: Any) -> None:
    """Raise ``BoostingError`` naming the first field of ``params`` outside its bounds or
    choices (metadata ``bounds``, ``choices``, or ``each_of`` for a tuple of choices)."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise BoostingError(f"invalid parameter {f.name}={value!r}: one of "
                                f"{', '.join(choices)}")
        each_of = f.metadata.get("each_of")  # a tuple (or a dict of tuples) of choices
        if each_of is not None and any(v not in each_of for v in _items(value)):
            raise BoostingError(f"invalid parameter {f.name}={value!r}: each one of "
                                f"{', '.join(each_of)}")
        for key, limit in f.metadata.get("bounds", {}).items():
            compare, words = _LIMITS[key]
            if not compare(value, limit):
                raise BoostingError(f"invalid parameter {f.name}={value!r}: {words} {limit}")


def _items(value: Any) -> list[Any]:
    """The choices a tuple holds, or the tuples of a dict's values."""
    return [v for vs in value.values() for v in vs] if isinstance(value, dict) else list(value)


@dataclass(frozen=True, slots=True)
class TreeParams:
    """Hyper-parameters of one GBDT (the job file's ``params:``)."""

    n_trees: int = field(default=30, metadata=bounds(ge=1, le=10_000))
    """Boosting rounds (trees per output)."""
    max_depth: int = field(default=3, metadata=bounds(ge=1, le=16))
    learning_rate: float = field(default=0.3, metadata=bounds(gt=0.0, le=1.0))
    max_bin: int = field(default=32, metadata=bounds(ge=2, le=MAX_BIN_LIMIT - 1))
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

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, slots=True)
class BoostParams(TreeParams):
    """Hyper-parameters of one GBDT, shared by the centralized and federated trainers: the
    shared ones and the trainer's own."""

    complete_secure: bool = False
    """Completely SecureBoost: the first tree uses the active party's features only."""

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
