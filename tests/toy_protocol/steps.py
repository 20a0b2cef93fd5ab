"""The toy protocol's worker steps: members and the aggregator."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from typing import Any

from messages.bodies import Ack, Metric, Opened, Step, TreeFinished
from messages.envelope import Kind, MsgType
from tests.toy_protocol.messages import NAME, GradientSum, Leaf, OpenToy, ToySpec
from workers import ProtocolError
from workers.handlers import Protocol, RoleSteps, StepContext
from workers.policy import check_protocol


@dataclass(slots=True)
class ToyMember:
    spec: ToySpec
    labels: list[float]
    prediction: float = 0.0
    leaves: list[float] = field(default_factory=list)


def _aggregator(spec: ToySpec) -> str:
    return next(p.name for p in spec.parties if p.role == "aggregator")


def _members(spec: ToySpec) -> list[str]:
    return [p.name for p in spec.parties if p.role == "member"]


def member_open(ctx: StepContext, body: OpenToy) -> tuple[Kind, Any]:
    check_protocol(ctx.party.policy, ctx.party.name, NAME)
    data = ctx.party.dataset_in(body.spec.parties)
    with open(data.path, newline="") as f:
        labels = [float(row[data.label]) for row in csv.DictReader(f)]
    if not labels:
        raise ProtocolError(f"{ctx.party.name}: no rows in {data.path}")
    ctx.state = ToyMember(body.spec, labels)
    return MsgType.OPENED, Opened(rows=len(labels), checkpoints=[])


def send_sums(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    job: ToyMember = ctx.state
    g_sum = sum(job.prediction - y for y in job.labels)  # squared loss: g = prediction - y
    ctx.send(_aggregator(job.spec), MsgType.T_SUMS, GradientSum(body.tree, g_sum, len(job.labels)))
    return MsgType.ACK, Ack()


def apply_leaf(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    job: ToyMember = ctx.state
    agg = _aggregator(job.spec)
    ctx.mailbox.require((MsgType.T_LEAF, agg, body.tree, -1))
    leaf: Leaf = ctx.mailbox.take(MsgType.T_LEAF, agg, body.tree)
    job.prediction += leaf.value
    job.leaves.append(leaf.value)
    mse = sum((job.prediction - y) ** 2 for y in job.labels) / len(job.labels)
    return MsgType.TREE_FINISHED, TreeFinished([Metric("rows", float(len(job.labels))),
                                                Metric("train_rmse", mse ** 0.5)])


def save_model(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    job: ToyMember = ctx.state
    ctx.model_dir.mkdir(parents=True, exist_ok=True)
    (ctx.model_dir / "model.json").write_text(json.dumps({"leaves": job.leaves}))
    return MsgType.ACK, Ack(count=len(job.leaves))


def aggregator_open(ctx: StepContext, body: OpenToy) -> tuple[Kind, Any]:
    check_protocol(ctx.party.policy, ctx.party.name, NAME)
    ctx.state = body.spec
    return MsgType.OPENED, Opened(rows=0, checkpoints=[])


def combine(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    spec: ToySpec = ctx.state
    members = _members(spec)
    ctx.mailbox.require(*[(MsgType.T_SUMS, m, body.tree, -1) for m in members])
    sums: list[GradientSum] = [ctx.mailbox.take(MsgType.T_SUMS, m, body.tree) for m in members]
    if any(s.rows <= 0 for s in sums):
        raise ProtocolError(f"{ctx.party.name}: sums of no rows")
    value = -spec.learning_rate * sum(s.g_sum for s in sums) / sum(s.rows for s in sums)
    for m in members:
        ctx.send(m, MsgType.T_LEAF, Leaf(body.tree, value))
    return MsgType.ACK, Ack(count=len(members))


def close(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    return MsgType.ACK, Ack()


PROTOCOL = Protocol(NAME, {
    "member": RoleSteps({MsgType.T_OPEN_JOB: member_open, MsgType.T_SEND_SUMS: send_sums,
                         MsgType.T_APPLY: apply_leaf, MsgType.SAVE_MODEL: save_model,
                         MsgType.CLOSE_JOB: close}),
    "aggregator": RoleSteps({MsgType.T_OPEN_JOB: aggregator_open, MsgType.T_COMBINE: combine,
                             MsgType.CLOSE_JOB: close}),
})
