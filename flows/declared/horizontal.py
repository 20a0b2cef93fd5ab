"""Horizontal GBDT's declaration and job file schema (flows.horizontal, workers.horizontal,
messages.horizontal)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from flows.broker_settings import SigningConfig, TransportConfig
from flows.declared import ProtocolDeclaration
from flows.job_schema import (HorizontalPartyConfig, JobName, MembersAndAggregator, NoEarlyStopping,
                              PrivacyConfig, TreeParamsConfig, check_broker_needs,
                              check_party_names, check_privacy, check_row_partitioned)
from flows.schema_base import Strict
from messages.envelope import MsgType


class HorizontalParamsConfig(NoEarlyStopping, TreeParamsConfig):
    """Boosting parameters of the horizontal protocol (multiclass: one tree per class per
    round; members' labels 0..255)."""


class HorizontalJobConfig(MembersAndAggregator, Strict):
    """A horizontal training job (FedTree): members with different rows and the same columns,
    one aggregator that sums their masked histograms and grows the trees."""

    job: JobName
    protocol: Literal["horizontal"]
    parties: dict[str, HorizontalPartyConfig]
    params: HorizontalParamsConfig = HorizontalParamsConfig()
    privacy: PrivacyConfig | None = None
    """Optional differential privacy; without it the protocol is lossless."""
    min_members: int = Field(2, ge=2, le=1000)
    """Members that must remain: below this (after dropouts) the job fails. Default: every
    member of the job (a dropout stops it), since a tree grown without a member shows the
    aggregator that member's rows per bin (docs/horizontal.md, "Dropouts")."""
    transport: TransportConfig = TransportConfig()
    signing: SigningConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _every_member_by_default(cls, data: Any) -> Any:
        """``min_members`` left out is the number of members (at least 2, as secure
        aggregation needs)."""
        if not isinstance(data, dict) or data.get("min_members") is not None or \
                not isinstance(data.get("parties"), dict):
            return data
        members = [p for p in data["parties"].values()
                   if (p.get("role") if isinstance(p, dict) else getattr(p, "role", None))
                   == "member"]
        return {**data, "min_members": max(2, len(members))}

    @model_validator(mode="after")
    def _roles(self) -> HorizontalJobConfig:
        check_party_names(self.parties)
        check_row_partitioned(self.parties, self.min_members,
                               f"min_members is {self.min_members}: secure aggregation needs at "
                               f"least 2")
        check_privacy(self.privacy, self.params)
        check_broker_needs(self.transport, self.signing, self.parties, self.members)
        return self


PROTOCOL = ProtocolDeclaration(
    name="horizontal", title="Horizontal GBDT with secure aggregation (FedTree)",
    schema=HorizontalJobConfig, flow="flows.horizontal:horizontal",
    stages=dict.fromkeys([MsgType.H_SUMMARIZE, MsgType.H_MERGE_BINS, MsgType.H_APPLY_BINS],
                         "binning"),
    shared_model=True, reference_shares_cuts=True)
