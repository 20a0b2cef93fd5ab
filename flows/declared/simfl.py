"""SimFL's declaration and job file schema (flows.simfl, workers.simfl, messages.simfl)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from flows.broker_settings import SigningConfig, TransportConfig
from flows.declared import ProtocolDeclaration
from flows.job_schema import (HorizontalPartyConfig, JobName, MembersAndAggregator, NoEarlyStopping,
                              TreeParamsConfig, check_broker_needs, check_party_names,
                              check_row_partitioned)
from flows.schema_base import Strict
from messages.envelope import MsgType


class LshConfig(Strict):
    """SimFL's p-stable LSH (the paper's defaults)."""

    functions: int | None = Field(None, ge=1, le=1000)
    """Hash functions L (default min(40, d - 1), d the number of features)."""
    r: float = Field(4.0, gt=0.0, le=1e6)
    """Bucket width."""
    seed: int = Field(0, ge=0)
    """Part of the preprocessing's key: another seed gives other functions. The projections
    themselves come from a secret the members agree on (never from this seed or from data)."""


class SimflPrivacyConfig(Strict):
    """The noise a member adds to the gradient sums it sends a builder
    (``workers.simfl.privacy``); it cannot be switched off."""

    label_noise: float = Field(4.0, ge=1.0, le=1000.0)
    """sigma_label: per builder row, drawn once per preprocessing, in units of ``clip``
    (members refuse less than 1)."""
    tree_noise: float = Field(8.0, ge=1.0, le=1000.0)
    """sigma_tree: drawn anew per tree, in units of ``clip`` (g) and of the hessian's bound
    (members refuse less than 1)."""
    clip: float = Field(1.0, gt=0.0, le=1e6)
    """Regression: each row's g is clipped to [-clip, clip] before it is summed. Binary: not
    used (the logistic loss's |g| < 1 is its own bound)."""
    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    """The delta of the (epsilon, delta) the job reports (``metrics.json``: ``privacy``)."""


class SimflParamsConfig(NoEarlyStopping, TreeParamsConfig):
    """Boosting parameters of SimFL, with its LSH (multiclass: one tree per class per round,
    grown by the round's builder; members' labels 0..255, at least two classes each)."""

    lsh: LshConfig = LshConfig()
    privacy: SimflPrivacyConfig = SimflPrivacyConfig()


class SimflJobConfig(MembersAndAggregator, Strict):
    """A SimFL job (seed 000): members with different rows and the same columns exchange LSH
    values once, through an aggregator, then take turns growing trees on weighted gradients."""

    job: JobName
    protocol: Literal["simfl"]
    parties: dict[str, HorizontalPartyConfig]
    params: SimflParamsConfig = SimflParamsConfig()
    transport: TransportConfig = TransportConfig()
    signing: SigningConfig | None = None

    @model_validator(mode="after")
    def _roles(self) -> SimflJobConfig:
        check_party_names(self.parties)
        check_row_partitioned(self.parties, 2, "SimFL needs at least 2 members")
        check_broker_needs(self.transport, self.signing, self.parties, self.members)
        return self


PROTOCOL = ProtocolDeclaration(
    name="simfl", title="SimFL: similarity-based horizontal boosting", schema=SimflJobConfig,
    flow="flows.simfl:simfl",
    stages=dict.fromkeys([MsgType.S_MEMBER_KEY, MsgType.S_HASH_ROWS, MsgType.S_MATCH_ROWS,
                          MsgType.S_STORE_SIMILAR], "LSH"),
    shared_model=True)
