"""The vertical random forest's declaration (flows.forest, workers.forest, messages.forest)."""

from __future__ import annotations

from flows.config import ForestJobConfig
from flows.declared import ProtocolDeclaration
from messages.envelope import MsgType

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
