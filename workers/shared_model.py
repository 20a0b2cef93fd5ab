"""The model files of protocols whose every member keeps the whole model (horizontal, SimFL):
``model.json`` and a ``party.json`` that lets ``fedboost predict`` score with that copy alone."""

from __future__ import annotations

import time
from typing import Any

from boosting.tree import Model, save_model, write_json_atomic
from messages.bodies import Ack
from messages.envelope import MsgType
from workers.runtime import StepContext


def save_member_model(ctx: StepContext, model: Model, protocol: str, members: list[str],
                      id_column: str) -> tuple[MsgType, Any]:
    """Write this member's copy of the model; the reply counts its trees."""
    save_model(model, ctx.model_dir / "model.json")
    write_json_atomic(ctx.model_dir / "party.json", {
        "party": ctx.party.name, "role": "member", "protocol": protocol, "job": ctx.job,
        "saved_at": time.time(), "members": members, "id_column": id_column})
    return MsgType.ACK, Ack(count=len(model.trees))
