"""Vertical SecureBoost's declaration and job file schema (flows.secureboost, workers.vertical,
messages.secureboost)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from flows.broker_settings import SigningConfig, TransportConfig
from flows.declared import ProtocolDeclaration
from flows.job_schema import (JobName, PartyConfig, PrivacyConfig, TreeParamsConfig,
                              check_broker_needs, check_party_names, check_privacy)
from flows.schema_base import Strict
from messages.envelope import MsgType


class ParamsConfig(TreeParamsConfig):
    """Vertical SecureBoost's boosting parameters."""

    complete_secure: bool = False
    """Completely SecureBoost: the first round's trees grow on the active party alone."""
    early_stopping_rounds: int | None = Field(None, ge=1)
    """Stop once the first validation metric has not improved for this many rounds (as
    XGBoost's); the model keeps the rounds up to the best one (``flows.early_stopping``).
    Needs ``validation.fraction``."""


class CryptoConfig(Strict):
    """Homomorphic encryption settings."""

    scheme: Literal["paillier", "ou"] = "paillier"
    """``paillier``, or ``ou`` (Okamoto-Uchiyama: half the ciphertext bytes and cheaper
    arithmetic at the same modulus size, docs/crypto.md). Vertical protocols only."""
    key_bits: int = Field(2048, ge=1024, le=4096)
    pack_bin_sums: Literal["key_holder", "passive"] = "passive"
    """Who folds several encrypted bin sums into one ciphertext (``crypto.compress``): each
    passive party before sending, under random high bits (the default: what every party's
    default policy allows), or the key holder, modulo p^2 and q^2 (less CPU in all, 16x the
    histogram bytes; only with passive parties whose own ``policy.pack_bin_sums`` lists
    ``key_holder``: a single sum shows its whole plaintext to the key holder). SecureBoost
    only."""

    @field_validator("key_bits")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError("key_bits must be even")
        return v


class ValidationConfig(Strict):
    """Hold-out of aligned rows for validation metrics."""

    fraction: float = Field(0.0, ge=0.0, le=0.9)
    seed: int = Field(0, ge=0)


class VerticalJobConfig(Strict):
    """What every column-partitioned (vertical) job file holds: one active party with the
    labels, passive parties with other columns of the same customers, the encryption, the
    validation rows. Each vertical protocol's schema adds its ``protocol`` and ``params``."""

    job: JobName
    protocol: str
    parties: dict[str, PartyConfig]
    crypto: CryptoConfig = CryptoConfig()
    validation: ValidationConfig = ValidationConfig()
    transport: TransportConfig = TransportConfig()
    signing: SigningConfig | None = None
    """Signing keys (the flow signs as ``flow``); the embedded default makes its own."""
    privacy: PrivacyConfig | None = None
    """Optional differential privacy (SecureBoost only); without it training is lossless."""

    @model_validator(mode="after")
    def _roles(self) -> VerticalJobConfig:
        check_party_names(self.parties)
        if self.privacy is not None and self.protocol != "vertical_secureboost":
            raise ValueError(f"privacy: {self.protocol} has no differential privacy")
        actives = [n for n, p in self.parties.items() if p.role == "active"]
        if len(actives) != 1:
            raise ValueError(f"exactly one party must have role active, found {len(actives)}")
        if not self.passives:
            raise ValueError("at least one party must have role passive")
        if self.parties[actives[0]].label is None:
            raise ValueError(f"parties.{actives[0]}.label: the active party needs a label column")
        for name in self.passives:
            if self.parties[name].label is not None:
                raise ValueError(f"parties.{name}.label: only the active party holds labels")
        check_broker_needs(self.transport, self.signing, self.parties, list(self.parties))
        return self

    @property
    def active(self) -> str:
        """Name of the active party."""
        return next(n for n, p in self.parties.items() if p.role == "active")

    @property
    def passives(self) -> list[str]:
        """Names of the passive parties, in file order."""
        return [n for n, p in self.parties.items() if p.role == "passive"]


class SecureBoostJobConfig(VerticalJobConfig):
    """A vertical SecureBoost training job."""

    protocol: Literal["vertical_secureboost"] = "vertical_secureboost"
    params: ParamsConfig = ParamsConfig()

    @model_validator(mode="after")
    def _privacy_and_stopping(self) -> SecureBoostJobConfig:
        check_privacy(self.privacy, self.params)
        if self.params.early_stopping_rounds and not self.validation.fraction:
            raise ValueError("params.early_stopping_rounds stops on validation rows: set "
                             "validation.fraction (e.g. 0.2)")
        return self


JobConfig = SecureBoostJobConfig
"""The name ``SecureBoostJobConfig`` had before the vertical forest shared its base
(``VerticalJobConfig``): Python API users may still import it."""


PROTOCOL = ProtocolDeclaration(
    name="vertical_secureboost", title="Vertical SecureBoost", schema=SecureBoostJobConfig,
    flow="flows.secureboost:vertical_secureboost",
    stages={**dict.fromkeys([MsgType.PSI_BLIND, MsgType.PSI_REBLIND, MsgType.PSI_INTERSECT],
                            "PSI"),
            MsgType.BIN_FEATURES: "binning"},
    scored_as="boosting")
