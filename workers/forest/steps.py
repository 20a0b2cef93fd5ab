"""The vertical random forest's steps per role: message kind -> the step that answers it."""

from __future__ import annotations

from messages.envelope import Kind, MsgType
from workers.column_partitioned import alignment, paths, scoring, serving
from workers.forest import active, passive
from workers.handlers import Handler, Protocol, RoleSteps

ACTIVE_HANDLERS: dict[Kind, Handler] = {
    MsgType.F_OPEN_JOB: active.open_job,
    MsgType.PSI_BLIND: alignment.psi_blind,
    MsgType.PSI_INTERSECT: alignment.psi_intersect,
    MsgType.F_PREPARE: active.prepare,
    MsgType.F_LEVEL: active.grow_level,
    MsgType.F_FIND_SPLITS: active.find_splits,
    MsgType.F_FINISH_TREE: active.finish_tree,
    MsgType.TRAVERSE_LEVEL: paths.traverse_level,  # validation in path mode, as SecureBoost
    MsgType.EVALUATE_VALIDATION: scoring.evaluate_validation,
    MsgType.F_SAVE_MODEL: active.save_model_part,
    MsgType.CLOSE_JOB: active.close_job,
    **serving.ACTIVE_STEPS,  # the scoring service (fedboost serve-model)
}

PASSIVE_HANDLERS: dict[Kind, Handler] = {
    MsgType.F_OPEN_JOB: passive.open_job,
    MsgType.PSI_BLIND: alignment.psi_blind,
    MsgType.PSI_REBLIND: alignment.psi_reblind,
    MsgType.F_PREPARE: passive.prepare,
    MsgType.F_LEVEL: passive.build_histograms,
    MsgType.F_APPLY_SPLITS: passive.apply_splits,
    MsgType.F_FINISH_TREE: passive.finish_tree,
    MsgType.TRAVERSE_LEVEL: paths.answer_level,
    MsgType.F_SAVE_MODEL: passive.save_model_part,
    MsgType.CLOSE_JOB: passive.close_job,
    **serving.PASSIVE_STEPS,
}

FOREST = Protocol("vertical_random_forest",
                  {"active": RoleSteps(ACTIVE_HANDLERS), "passive": RoleSteps(PASSIVE_HANDLERS)})
