"""The vertical random forest's declaration and job file schema (flows.forest, workers.forest,
messages.forest)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from flows.declared import ProtocolDeclaration
from flows.declared.secureboost import JobConfig
from flows.job_schema import NoEarlyStopping
from flows.schema_base import Strict
from messages.envelope import MsgType


class ForestParamsConfig(NoEarlyStopping, Strict):
    """The vertical random forest's parameters (seed 002)."""

    why_no_early_stopping: ClassVar[str] = ("a forest's trees are independent and averaged, grown in "
                              "parallel: none is a stage to stop after")

    n_trees: int = Field(50, ge=1, le=10_000)
    max_depth: int = Field(10, ge=1, le=16)
    max_features: Literal["sqrt", "log2"] | float = "sqrt"
    """Features drawn per node: sqrt or log2 of all the parties' features, or a fraction."""
    min_samples_leaf: int = Field(1, ge=1)
    max_bin: int = Field(32, ge=2, le=254)
    objective: Literal["binary", "multiclass", "regression"] = "binary"
    bootstrap: bool = True
    seed: int = Field(0, ge=0)
    complete_secure: bool = False
    """The first tree grows on the active party's features alone (no passive party sees its
    instance spaces), as Completely SecureBoost's first round."""
    min_trees: int | None = Field(None, ge=1)
    """Fewest trees the job may finish with when trees are dropped (default: all)."""
    tree_retries: int = Field(2, ge=0, le=10)
    """Times a failed tree is grown again before it is dropped."""
    parallel_trees: int = Field(2, ge=1, le=64)
    """Trees grown at once (Prefect task concurrency)."""

    @field_validator("max_features")
    @classmethod
    def _fraction(cls, v: str | float) -> str | float:
        if isinstance(v, float) and not 0.0 < v <= 1.0:
            raise ValueError("a fraction of the features must be in (0, 1]")
        return v

    @model_validator(mode="after")
    def _enough(self) -> ForestParamsConfig:
        if self.min_trees is not None and self.min_trees > self.n_trees:
            raise ValueError(f"min_trees {self.min_trees} exceeds n_trees {self.n_trees}")
        return self


class ForestJobConfig(JobConfig):
    """A vertical random forest job: parties as for SecureBoost."""

    # (ignores: a field narrowed in a subclass, which pydantic allows and mypy calls unsound)
    protocol: Literal["vertical_random_forest"]  # type: ignore[assignment]
    params: ForestParamsConfig = ForestParamsConfig()  # type: ignore[assignment]


PROTOCOL = ProtocolDeclaration(
    name="vertical_random_forest", title="Vertical federated random forest (seed 002)",
    schema=ForestJobConfig, flow="flows.forest:vertical_random_forest",
    stages={**dict.fromkeys([MsgType.PSI_BLIND, MsgType.PSI_REBLIND, MsgType.PSI_INTERSECT],
                            "PSI"),
            MsgType.F_PREPARE: "binning", MsgType.F_SAVE_MODEL: "saving"},
    scored_as="forest", reference=None,
    no_reference="the centralized reference trains boosted trees; a forest's reference is "
                 "scikit-learn's RandomForestClassifier on the joined, identically binned data "
                 "(tests/flows/test_forest.py)")
