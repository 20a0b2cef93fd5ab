"""Horizontal GBDT's declaration (flows.horizontal, workers.horizontal, messages.horizontal)."""

from __future__ import annotations

from flows.config import HorizontalJobConfig
from flows.declared import ProtocolDeclaration
from messages.envelope import MsgType

PROTOCOL = ProtocolDeclaration(
    name="horizontal", title="Horizontal GBDT with secure aggregation (FedTree)",
    schema=HorizontalJobConfig, flow="flows.horizontal:horizontal",
    stages=dict.fromkeys([MsgType.H_SUMMARIZE, MsgType.H_MERGE_BINS, MsgType.H_APPLY_BINS],
                         "binning"),
    shared_model=True, reference_shares_cuts=True)
