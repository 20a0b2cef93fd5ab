"""SimFL's steps per role: message kind -> the step that answers it."""

from __future__ import annotations

from messages.envelope import MsgType
from workers.handlers import Protocol, RoleSteps
from workers.simfl import aggregator, member, preprocess

MEMBER = RoleSteps({
    MsgType.S_OPEN_JOB: member.open_job,
    MsgType.S_MEMBER_KEY: preprocess.member_key,
    MsgType.S_HASH_ROWS: preprocess.hash_rows,
    MsgType.S_STORE_SIMILAR: preprocess.store_similar,
    MsgType.S_SEND_GRADIENTS: member.send_gradients,
    MsgType.S_BUILD_TREE: member.build_tree,
    MsgType.S_RECEIVE_TREE: member.receive_tree,
    MsgType.RESUME_JOB: member.resume_job,
    MsgType.SAVE_MODEL: member.save_model_part,
    MsgType.CLOSE_JOB: member.close_job,
})

AGGREGATOR = RoleSteps({
    MsgType.S_OPEN_JOB: aggregator.open_job,
    MsgType.S_MATCH_ROWS: aggregator.match_rows,
    MsgType.CLOSE_JOB: aggregator.close_job,
})

SIMFL = Protocol(member.PROTOCOL, {"member": MEMBER, "aggregator": AGGREGATOR})
