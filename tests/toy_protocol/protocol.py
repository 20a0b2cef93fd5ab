"""The toy protocol's declaration and job file schema (light: no Prefect)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from flows.config import HorizontalPartyConfig, JobName, SigningConfig, TransportConfig
from flows.declared import ProtocolDeclaration
from messages.envelope import MsgType
from tests.toy_protocol import messages  # noqa: F401  (declares the kinds named below)


class ToyParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rounds: int = Field(5, ge=1, le=1000)
    learning_rate: float = Field(0.5, gt=0.0, le=1.0)


class ToyJobConfig(BaseModel):
    """A toy job: members with rows and labels, one aggregator."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    job: JobName
    protocol: Literal["toy_mean"]
    parties: dict[str, HorizontalPartyConfig]
    params: ToyParams = ToyParams()
    transport: TransportConfig = TransportConfig()
    signing: SigningConfig | None = None

    @property
    def aggregator(self) -> str:
        return next(n for n, p in self.parties.items() if p.role == "aggregator")

    @property
    def members(self) -> list[str]:
        return [n for n, p in self.parties.items() if p.role == "member"]


PROTOCOL = ProtocolDeclaration(
    name="toy_mean", title="Toy federated mean boosting (tests)", schema=ToyJobConfig,
    flow="tests.toy_protocol.flow:toy_mean", stages={MsgType.T_SEND_SUMS: "trees"},
    shared_model=True, reference=None, no_reference="the toy protocol has no reference")
