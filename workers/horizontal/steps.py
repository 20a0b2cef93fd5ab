"""The horizontal protocol's steps per role: message kind -> the step that answers it."""

from __future__ import annotations

from messages.envelope import MsgType
from workers.handlers import Protocol, RoleSteps
from workers.horizontal import aggregator, member, setup

MEMBER = RoleSteps({
    MsgType.H_OPEN_JOB: member.open_job,
    MsgType.H_SUMMARIZE: setup.summarize_columns,
    MsgType.H_APPLY_BINS: setup.apply_bins,
    MsgType.H_COMPUTE_GRADIENTS: member.compute_gradients,
    MsgType.H_UPDATE_HISTOGRAMS: member.update_histograms,
    MsgType.H_RELEASE_ROUND: member.release_round,
    MsgType.H_APPLY_SPLITS: member.apply_splits,
    MsgType.H_RECEIVE_TREE: member.receive_tree,
    MsgType.RESUME_JOB: member.resume_job,
    MsgType.SAVE_MODEL: member.save_model_part,
    MsgType.CLOSE_JOB: member.close_job,
})

AGGREGATOR = RoleSteps({
    MsgType.H_OPEN_JOB: aggregator.open_job,
    MsgType.H_MERGE_BINS: setup.merge_bins,
    MsgType.H_APPLY_BINS: setup.outputs_per_round,
    MsgType.H_AGREE_SCALE: aggregator.agree_scale,
    MsgType.H_SECURE_SUM: aggregator.secure_sum,
    MsgType.H_SEND_TREE: aggregator.send_tree,
    MsgType.RESUME_JOB: aggregator.resume_job,
    MsgType.SAVE_MODEL: aggregator.save_model_part,
    MsgType.CLOSE_JOB: aggregator.close_job,
})

HORIZONTAL = Protocol(member.PROTOCOL, {"member": MEMBER, "aggregator": AGGREGATOR})
