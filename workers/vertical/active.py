"""The active party (label holder) in vertical SecureBoost (SecureBoost Alg. 1-2).

It holds labels, the private key, plaintext g/h and leaf values, and never sends any of them:
passive parties get only ciphertexts, the splits they own, and instance spaces. Its state is
``workers.vertical.active_state``; it encrypts gradients in ``workers.vertical.encryption`` and
decrypts histograms in ``workers.vertical.decryption``.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from boosting import BoostingError
from boosting.binning import goes_left, split_threshold
from boosting.hist import build_histograms
from boosting.losses import base_score, transform
from boosting.metrics import evaluate
from boosting.params import BoostParams
from boosting.grow import TreeGrower
from boosting.privacy import PrivacyPlan
from boosting.split import SplitCandidate
from boosting.train import allowed_blocks
from boosting.tree import node_values, save_model, write_json_atomic
from crypto.schemes import generate_keypair
from messages.bodies import Ack, Metric, Opened, ResumeJob, Step, TreeFinished
from messages.secureboost import (AppliedSplits, JobSpec, NodePositions, NodeSplit, OpenJob,
                                  SplitChoice, SplitChoices, SplitsFound)
from messages.envelope import Kind, MsgType
from messages.instance_space import decode_mask, encode_mask
from workers import ProtocolError, StageError, checkpoint
from workers.column_partitioned.alignment import send_public_key
from workers.column_partitioned.opening import bin_active_rows, open_active
from workers.column_partitioned.scoring import save_training_rows
from workers.data import save_categories
from workers.handlers import StepContext
from workers.policy import check_noise_seed
from workers.state import JobState
from workers.vertical.active_state import ActiveTraining, participants_of
from workers.vertical.decryption import decrypt_histograms, decrypt_level
from workers.vertical.early_stopping import kept_trees
from workers.vertical.explain import leaf_purity, tree_splits, write_splits
from workers.model_folder import ModelPart

PROTOCOL = "vertical_secureboost"
"""The protocol whose steps this module and workers.vertical.passive answer (checked against policies)."""
PACKERS = ("key_holder", "passive")
"""Who may fold bin sums into shared ciphertexts (the job's ``crypto.pack_bin_sums``)."""


def params_of(open_job: OpenJob) -> BoostParams:
    """Boosting parameters from a job spec."""
    spec = open_job.spec
    return BoostParams(**asdict(spec.params), complete_secure=spec.complete_secure)


def open_job(ctx: StepContext, body: OpenJob) -> tuple[Kind, Any]:
    """Load labels and features, make the Paillier key pair."""
    state = open_active(ctx, body.spec, PROTOCOL)
    if body.spec.pack_bin_sums not in PACKERS:
        raise ProtocolError(f"pack_bin_sums {body.spec.pack_bin_sums!r} is not one of {PACKERS}")
    params = params_of(body)
    privacy = private_plan(ctx.party.name, body.spec, params)
    if privacy is not None:  # its noise protects this party's labels
        check_noise_seed(ctx.party.policy, ctx.party.name, body.spec.dp_seed)
    public, private = generate_keypair(body.spec.scheme, body.spec.key_bits,
                                       obfuscator=ctx.party.policy.obfuscator)
    state.role_state = run = ActiveTraining(params=params, public=public, private=private,
                                            pack_bin_sums=body.spec.pack_bin_sums,
                                            crypto_processes=ctx.party.crypto_processes,
                                            make_ahead=ctx.party.make_ahead,
                                            privacy=privacy, noise_seed=body.spec.dp_seed
                                            if body.spec.dp_seed >= 0 else secrets.randbits(63))
    run.crypto_pool()  # its processes start (and build their tables) during PSI
    run.prepare_encryption(len(state.data.ids), 0)  # on idle CPU only
    ctx.state = state
    return MsgType.OPENED, Opened(rows=len(state.data.ids),
                                  checkpoints=checkpoint.available(
                                      ctx.model_dir, state.digest, checkpoint.key_of(ctx.party)))


def private_plan(me: str, spec: JobSpec, params: BoostParams) -> PrivacyPlan | None:
    """The job's DPBoost plan over its rounds (``bin_features`` counts the classes in)."""
    if spec.dp_epsilon <= 0:
        return None
    try:
        return PrivacyPlan(spec.dp_epsilon, params.n_trees, params.max_depth,
                           spec.dp_per_ensemble or params.n_trees, spec.dp_clip,
                           params.reg_lambda, params.learning_rate)
    except BoostingError as exc:
        raise ProtocolError(f"{me}: the job's privacy settings are refused: {exc}") from None


def _checkpoint(ctx: StepContext, state: JobState, trees_done: int) -> None:
    """Keep the job after ``trees_done`` trees: no processes, no tree in progress."""
    run: ActiveTraining = state.role_state
    checkpoint.save_job(ctx.model_dir, trees_done, state, run.public.n,
                        key=checkpoint.key_of(ctx.party), pool=None, grower=None, level_splits={},
                        builds_ahead="", children_ahead={}, key_share=b"", encrypting=None,
                        decrypting=None)


def resume_job(ctx: StepContext, body: ResumeJob) -> tuple[Kind, Any]:
    """Go back to the state of a checkpoint every party holds."""
    state = checkpoint.restore(ctx.model_dir, body.checkpoint, ctx.state,
                               checkpoint.key_of(ctx.party))
    run: ActiveTraining = state.role_state
    done = body.checkpoint.trees_done
    if len(run.trees) != done:
        raise checkpoint.CheckpointError(f"checkpoint holds {len(run.trees)} trees, not {done}")
    run.crypto_processes = ctx.party.crypto_processes  # this worker's, not the checkpoint's
    run.make_ahead = ctx.party.make_ahead
    run.prepare_encryption(run.y.size, done)
    ctx.state = state
    return MsgType.RESUMED, checkpoint.resumed(state, done, run.outputs, run.history)


def bin_features(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Bin own features on the training rows; set up labels and margins; send the public key."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    y, run.n_classes = bin_active_rows(state, run.params.objective, run.params.max_bin)
    run.y = y
    if run.privacy is not None:  # every tree grown: rounds x classes
        run.privacy = replace(run.privacy, n_trees=run.params.n_trees * run.outputs)
    run.base = base_score(run.params.objective, y, run.n_classes)
    run.margin = np.tile(run.base, (y.size, 1))
    send_public_key(ctx, state, run.public)
    checkpoint.discard(ctx.model_dir)  # a fresh start: older checkpoints are of another run
    _checkpoint(ctx, state, 0)
    return MsgType.ACK, Ack(count=run.outputs)  # the flow needs the trees per round


def find_best_splits(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Alg. 2: decrypt passive histograms, add own, pick each node's best split."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    grower = run.require_grower(body.tree)
    participants = participants_of(state, run, body.tree)
    ctx.mailbox.require(*[(MsgType.ENCRYPTED_HISTOGRAMS, p, body.tree, body.depth)
                          for p in participants])
    if grower.depth != body.depth:
        raise StageError(f"find_best_splits at depth {body.depth}, tree is at depth {grower.depth}")
    built = grower.nodes_to_build()
    plain = decrypt_level(ctx, run, participants, body, built)  # before the grower changes
    bins = state.require_bins()
    slots = grower.slot_of_row(built)
    grower.add_histograms(0, built, build_histograms(bins, slots, grower.grad.ints,
                                                     grower.hess.ints, len(built), run.params.max_bin))
    for passive in participants:
        msg = ctx.mailbox.take(MsgType.ENCRYPTED_HISTOGRAMS, passive, body.tree, body.depth)
        block = 1 + state.passives.index(passive)
        grower.add_histograms(block, built, decrypt_histograms(run, msg, built, passive,
                                                                plain[passive]))
    grower.begin_level()
    blocks = allowed_blocks(run.params, body.tree, 1 + len(state.passives), run.outputs)
    run.level_splits = grower.find_splits(blocks)
    n_splits = sum(s is not None for s in run.level_splits.values())
    ahead = _builds_ahead(run, participants, body.depth, n_splits)
    run.builds_ahead = ahead
    run.children_ahead = _children(grower, run.level_splits) if ahead else {}
    owned: dict[str, list[SplitChoice]] = {p: [] for p in participants if p == ahead}
    own: list[NodeSplit] = []
    for node, split in run.level_splits.items():
        left_id, right_id = run.children_ahead.get(node, (-1, -1))
        if split is not None and split.block > 0:
            owner = state.passives[split.block - 1]
            owned.setdefault(owner, []).append(
                SplitChoice(node=node, feature=split.feature, bin=split.bin,
                            missing_left=split.missing_left, left_id=left_id, right_id=right_id))
        elif split is not None and ahead:  # the positions the broadcast would bring later
            mask = _own_mask(run, bins, grower.node_rows(node), split)
            own.append(NodeSplit(node=node, left_id=left_id, right_id=right_id,
                                 left=encode_mask(mask)))
    for owner, choices in owned.items():
        ctx.send(owner, MsgType.SPLIT_CHOICES, SplitChoices(
            body.tree, body.depth, choices, build_ahead=owner == ahead,
            ahead=own if owner == ahead else []))
    return MsgType.SPLITS_FOUND, SplitsFound(
        owners=[p for p in state.passives if owned.get(p)], n_splits=n_splits,
        n_leaves=len(run.level_splits) - n_splits, ahead=[ahead] if ahead else [])


def _builds_ahead(run: ActiveTraining, participants: list[str], depth: int,
                  n_splits: int) -> str:
    """The one data provider of a lossless tree builds the next level as it applies this
    one's splits (it holds every position then); with several, each needs the others' splits
    first, and under differential privacy which children open depends on noisy counts."""
    if (len(participants) == 1 and run.privacy is None and n_splits
            and depth + 1 < run.params.max_depth):
        return participants[0]
    return ""


def _children(grower: TreeGrower, splits: dict[int, SplitCandidate | None]) -> dict[int, tuple[int, int]]:
    """The ids ``TreeGrower.split_node`` gives each split's children: the next two in turn,
    in frontier order (``broadcast_nodes`` splits in that order)."""
    children, next_id = {}, len(grower.nodes)
    for node in grower.frontier:
        if splits.get(node) is not None:
            children[node], next_id = (next_id, next_id + 1), next_id + 2
    return children


def _own_mask(run: ActiveTraining, bins: np.ndarray, rows: np.ndarray,
              split: SplitCandidate) -> np.ndarray:
    return goes_left(bins[rows, split.feature], split.bin, split.missing_left,
                     run.params.max_bin)


def broadcast_nodes(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Apply the level's splits in node order and send every passive party the new positions."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    grower = run.require_grower(body.tree)
    ctx.mailbox.require(*[(MsgType.APPLIED_SPLITS, o, body.tree, body.depth) for o in body.owners])
    applied = {}
    for owner in body.owners:
        msg: AppliedSplits = ctx.mailbox.take(MsgType.APPLIED_SPLITS, owner, body.tree, body.depth)
        for item in msg.splits:
            applied[(owner, item.node)] = item
    bins = state.require_bins()
    # a party that built ahead routed its rows with the split choices: no positions for it
    receivers = [p for p in participants_of(state, run, body.tree) if p != run.builds_ahead]
    out: list[NodeSplit] = []
    for node in list(grower.frontier):
        split = run.level_splits.get(node)
        if split is None:
            continue
        rows = grower.node_rows(node)
        if split.block == 0:
            mask = _own_mask(run, bins, rows, split)
            left, right = grower.split_node(
                node, split, mask, owner=state.party,
                threshold=split_threshold(state.cuts[split.feature], split.bin))
        else:
            owner = state.passives[split.block - 1]
            theirs = applied.get((owner, node))
            if theirs is None:
                raise ProtocolError(f"{owner} did not apply the split of node {node}")
            mask = decode_mask(theirs.left, rows.size)
            left, right = grower.split_node(node, split, mask, owner=owner,
                                            record_id=theirs.record_id, hide_feature=True)
        if run.builds_ahead and run.children_ahead.get(node) != (left, right):
            raise StageError(f"node {node}: children {left}, {right}, not the "
                             f"{run.children_ahead.get(node)} {run.builds_ahead} was told")
        if receivers:
            out.append(NodeSplit(node=node, left_id=left, right_id=right,
                                 left=encode_mask(mask)))
    for passive in receivers:
        ctx.send(passive, MsgType.NODE_POSITIONS, NodePositions(body.tree, body.depth, out))
    run.level_splits, run.builds_ahead, run.children_ahead = {}, "", {}
    return MsgType.ACK, Ack(count=len(grower.next_level()))


def finish_tree(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Leaf weights, prediction update, training metrics."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    grower = run.require_grower(body.tree)
    if grower.frontier:
        raise StageError(f"tree {body.tree} still has {len(grower.frontier)} open nodes")
    run.splits.extend(tree_splits(body.tree, grower, state.party, state.passives))
    tree, node_of_row = grower.finish(body.tree % run.outputs)
    run.margin[:, tree.output] += node_values(tree)[node_of_row]
    run.trees.append(tree)
    run.grower = None
    ctx.mailbox.drop_tree(body.tree)
    metrics = evaluate(run.params.objective, run.y, transform(run.params.objective, run.margin),
                       "train")
    if run.params.objective in ("binary", "multiclass"):
        metrics["leaf_purity"] = leaf_purity(node_of_row, run.y)
    done = TreeFinished([Metric(k, v) for k, v in metrics.items()])
    run.history.append(done)
    _checkpoint(ctx, state, len(run.trees))
    return MsgType.TREE_FINISHED, done


def close_job(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Stop the job's crypto processes; the saved model stays."""
    state: JobState | None = ctx.state
    if state is not None and isinstance(state.role_state, ActiveTraining):
        state.role_state.close()
        checkpoint.discard(ctx.model_dir)  # the job is complete and its model saved
    return MsgType.ACK, Ack()


def save_model_part(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Write the active party's model part: structure, owners, own thresholds, leaf values;
    the first ``body.tree`` trees when early stopping keeps those (``kept_trees``)."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    directory = ctx.model_dir
    features = {state.party: state.data.names, **{p: () for p in state.passives}}
    keep = kept_trees(body, len(run.trees))
    model = run.model(features)
    save_model(replace(model, trees=model.trees[:keep]), ModelPart(Path(directory)).model)
    save_categories(Path(directory), state.data.categories)
    write_splits(Path(directory), ctx.job, state.party, [s for s in run.splits if s.tree < keep])
    aligned, valid = state.require_aligned()
    save_training_rows(Path(directory), [state.data.ids[r] for r in aligned.tolist()], valid)
    write_json_atomic(ModelPart(Path(directory)).party, {
        "party": state.party, "role": "active", "job": ctx.job, "saved_at": time.time(),
        "parties": [state.party, *state.passives]})
    return MsgType.ACK, Ack(count=keep)
