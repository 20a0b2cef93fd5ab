"""What the row-partitioned protocols (horizontal, SimFL) share: members hold rows with the
label, one aggregator holds none, and every member keeps the whole model (``model.json`` and a
``party.json`` that lets ``fedboost predict`` score with that copy alone)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from boosting.params import BoostParams
from boosting.tree import Model, Tree, save_model, write_json_atomic
from messages.bodies import Ack
from messages.envelope import Kind, MsgType
from workers import DataError, ProtocolError
from workers.data import PartyData, load_party_data
from workers.handlers import StepContext
from workers.party import DataSet
from workers.model_folder import ModelPart

OWNER = "members"
"""The owner of every split of a row-partitioned model: each member holds all its columns."""
MAX_CLASSES = 256
"""Multiclass labels a member may hold: 0..255. Each member's masked set-up stats count its
rows per class over all of them, so the sum tells the aggregator the union's classes without
any member's highest label."""


def params_of(spec: Any) -> BoostParams:
    """Boosting parameters from a horizontal or SimFL job spec (its ``TreeParams``)."""
    return BoostParams(**dataclasses.asdict(spec.params))


def members_of(spec: Any) -> list[str]:
    """The job's members, in its order."""
    return [p.name for p in spec.parties if p.role == "member"]


def aggregator_of(spec: Any) -> str:
    """The job's one aggregator."""
    found = [p.name for p in spec.parties if p.role == "aggregator"]
    if len(found) != 1:
        raise ProtocolError(f"the job needs exactly one aggregator, names {found}")
    return found[0]


def load_member_data(me: str, own: DataSet) -> PartyData:
    """A member's rows with their labels. Categorical columns are refused: members share
    columns, and codes each member drew from its own file would differ."""
    if own.categorical:
        raise DataError(f"party {me}: file {own.path}: categorical columns are encoded by the "
                        f"one party that owns them, in vertical jobs; members of a "
                        f"row-partitioned job share columns: encode "
                        f"{', '.join(own.categorical)} alike beforehand")
    data = load_party_data(me, own.path, own.id_column, own.label, require_label=True,
                           columns=own.columns)
    if own.label is None or data.y is None:
        raise DataError(f"party {me}: file {own.path}: a member needs its label column (label: "
                        f"in its worker file's data set)")
    return data


def save_member_model(ctx: StepContext, model: Model, protocol: str, members: list[str],
                      id_column: str) -> tuple[Kind, Any]:
    """Write this member's copy of the model; the reply counts its trees."""
    save_model(model, ModelPart(ctx.model_dir).model)
    write_json_atomic(ModelPart(ctx.model_dir).party, {
        "party": ctx.party.name, "role": "member", "protocol": protocol, "job": ctx.job,
        "saved_at": time.time(), "members": members, "id_column": id_column})
    return MsgType.ACK, Ack(count=len(model.trees))


def shared_model(params: BoostParams, base: float, classes: int, trees: list[Tree],
                 names: tuple[str, ...]) -> Model:
    """The model a row-partitioned job's members share: one base score, or zero margins for
    each of the ``classes`` in multiclass (as ``boosting.losses.base_score``)."""
    if params.objective == "multiclass":
        return Model(params, (0.0,) * classes, classes, tuple(trees), {OWNER: names})
    n_classes = 2 if params.objective == "binary" else 1
    return Model(params, (base,), n_classes, tuple(trees), {OWNER: names})
