"""The vertical random forest's declaration and job file schema (flows.forest, workers.forest,
messages.forest)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator

from flows.declared import ProtocolDeclaration
from flows.declared.secureboost import VerticalJobConfig
from flows.job_schema import NoEarlyStopping, schema_fields
from flows.schema_base import Strict
from messages.envelope import MsgType
from messages.forest import MAX_FEATURES_RULES, ForestParams


if typing.TYPE_CHECKING:  # the fields create_model gives ForestParamsConfig: ForestParams's
    _ForestFields = ForestParams
else:
    _ForestFields = object


class _ForestParamsBase(NoEarlyStopping, Strict, _ForestFields):
    """What only the flow reads, beside the parameters every party gets
    (``messages.forest.ForestParams``, from which the rest of the schema is made)."""

    why_no_early_stopping: ClassVar[str] = ("a forest's trees are independent and averaged, grown in "
                              "parallel: none is a stage to stop after")

    min_trees: int | None = Field(None, ge=1)
    """Fewest trees the job may finish with when trees are dropped (default: all)."""
    tree_retries: int = Field(2, ge=0, le=10)
    """Times a failed tree is grown again before it is dropped."""
    parallel_trees: int = Field(2, ge=1, le=64)
    """Trees grown at once (Prefect task concurrency)."""

    def forest_params(self) -> ForestParams:
        """The parameters as every party is told them (``max_features`` as text)."""
        chosen = self.model_dump(include=set(FOREST_PARAMS))
        return ForestParams(**{**chosen, "max_features": str(chosen["max_features"])})

    @model_validator(mode="after")
    def _enough(self) -> _ForestParamsBase:
        if self.min_trees is not None and self.min_trees > self.n_trees:
            raise ValueError(f"min_trees {self.min_trees} exceeds n_trees {self.n_trees}")
        self.forest_params()  # the checks of ForestParams: max_features's fraction in (0, 1]
        return self


FOREST_PARAMS = {f.name for f in dataclasses.fields(ForestParams)}
_RULE: Any = Literal[MAX_FEATURES_RULES]
"""A named rule of ``max_features`` (``boosting.params.MAX_FEATURES_RULES``)."""

ForestParamsConfig: type[_ForestParamsBase] = create_model(
    "ForestParamsConfig", __base__=_ForestParamsBase,
    __doc__="The vertical random forest's parameters (seed 002; ``messages.forest``).",
    **schema_fields(ForestParams, {"max_features": _RULE | float}))


class ForestJobConfig(VerticalJobConfig):
    """A vertical random forest job: parties as for SecureBoost."""

    protocol: Literal["vertical_random_forest"]
    params: ForestParamsConfig = ForestParamsConfig()


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
