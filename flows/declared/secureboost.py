"""Vertical SecureBoost's declaration (flows.secureboost, workers.vertical, messages.bodies)."""

from __future__ import annotations

from flows.config import JobConfig
from flows.declared import ProtocolDeclaration
from messages.envelope import MsgType

PROTOCOL = ProtocolDeclaration(
    name="vertical_secureboost", title="Vertical SecureBoost", schema=JobConfig,
    flow="flows.secureboost:vertical_secureboost",
    stages={**dict.fromkeys([MsgType.PSI_BLIND, MsgType.PSI_REBLIND, MsgType.PSI_INTERSECT],
                            "PSI"),
            MsgType.BIN_FEATURES: "binning"},
    scored_as="boosting")
