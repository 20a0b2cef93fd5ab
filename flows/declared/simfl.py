"""SimFL's declaration (flows.simfl, workers.simfl, messages.simfl)."""

from __future__ import annotations

from flows.config import SimflJobConfig
from flows.declared import ProtocolDeclaration
from messages.envelope import MsgType

PROTOCOL = ProtocolDeclaration(
    name="simfl", title="SimFL: similarity-based horizontal boosting", schema=SimflJobConfig,
    flow="flows.simfl:simfl",
    stages=dict.fromkeys([MsgType.S_MEMBER_KEY, MsgType.S_HASH_ROWS, MsgType.S_MATCH_ROWS,
                          MsgType.S_STORE_SIMILAR], "LSH"),
    shared_model=True)
