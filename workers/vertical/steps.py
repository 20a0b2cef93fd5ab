"""Vertical SecureBoost's steps per role: message kind -> the step that answers it."""

from __future__ import annotations


from messages.envelope import Kind, MsgType
from workers import crypto_shards
from workers.column_partitioned import alignment, paths, scoring, serving
from workers.handlers import Arrival, Handler, Protocol, RoleSteps
from workers.vertical import active, encryption, histograms, passive


ACTIVE_HANDLERS: dict[Kind, Handler] = {
    MsgType.OPEN_JOB: active.open_job,
    MsgType.OPEN_PREDICTION: scoring.open_prediction,
    MsgType.PSI_BLIND: alignment.psi_blind,
    MsgType.PSI_INTERSECT: alignment.psi_intersect,
    MsgType.BIN_FEATURES: active.bin_features,
    MsgType.ENCRYPT_GRADIENTS: encryption.encrypt_gradients,
    MsgType.FIND_BEST_SPLITS: active.find_best_splits,
    MsgType.BROADCAST_NODES: active.broadcast_nodes,
    MsgType.FINISH_TREE: active.finish_tree,
    MsgType.SAVE_MODEL: active.save_model_part,
    MsgType.FINISH_TRAVERSAL: scoring.finish_traversal,
    MsgType.EVALUATE_VALIDATION: scoring.evaluate_validation,
    MsgType.WRITE_SCORES: scoring.write_scores,
    MsgType.CLOSE_JOB: active.close_job,
    MsgType.RESUME_JOB: active.resume_job,
    MsgType.TRAVERSE_LEVEL: paths.traverse_level,
    **serving.ACTIVE_STEPS,
}

PASSIVE_HANDLERS: dict[Kind, Handler] = {
    MsgType.OPEN_JOB: passive.open_job,
    MsgType.OPEN_PREDICTION: scoring.open_prediction,
    MsgType.PSI_BLIND: alignment.psi_blind,
    MsgType.PSI_REBLIND: alignment.psi_reblind,
    MsgType.BIN_FEATURES: passive.bin_features,
    MsgType.BUILD_HISTOGRAMS: histograms.build_encrypted_histograms,
    MsgType.APPLY_SPLITS: histograms.apply_splits,
    MsgType.FINISH_TREE: passive.finish_tree,
    MsgType.SAVE_MODEL: passive.save_model_part,
    MsgType.EVALUATE_NODES: scoring.evaluate_nodes,
    MsgType.CLOSE_JOB: passive.close_job,
    MsgType.RESUME_JOB: passive.resume_job,
    MsgType.TRAVERSE_LEVEL: paths.answer_level,
    **serving.PASSIVE_STEPS,
}

PASSIVE_ARRIVALS: dict[Kind, Arrival] = {
    # a tree starts as soon as its gradients are in: helpers get them before its first level
    MsgType.TREE_START: histograms.gradients_arrived,
    MsgType.ENCRYPTED_GRADIENTS: histograms.gradients_arrived,
}

WORK: dict[Kind, Handler] = {
    # a passive party's helper processes sum shards of its encrypted histograms
    MsgType.HISTOGRAM_SHARD: histograms.histogram_shard,
    MsgType.TREE_CIPHERTEXTS: histograms.tree_ciphertexts,
    # the active party's helper processes encrypt a tree's gradients and decrypt histograms
    MsgType.CRYPTO_SHARD: crypto_shards.crypto_shard,
}

VERTICAL = Protocol("vertical_secureboost",
                    {"active": RoleSteps(ACTIVE_HANDLERS),
                     "passive": RoleSteps(PASSIVE_HANDLERS, PASSIVE_ARRIVALS)},
                    work=WORK)
