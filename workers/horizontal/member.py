"""A member of a horizontal job: rows with every column and the label (FedTree, horizontal).

It sends the aggregator only its column names, the peak exponents of its gradients, its row
count, masked vectors (its set-up cell counts and label sum, its histograms) and the key of a
complete root round: never a row, a value, a gradient or a plain count or histogram. The masks
are pairwise (``workers.pairwise_masks``), so they cancel only in the sum over all members
of a round; each round's vector is masked once. A tree's root histograms are also sealed, and
the member releases their round key for one member set per tree only
(``workers.horizontal.released``): the aggregator never holds two sums of a tree's root over
different members.

Its state is in ``workers.horizontal.member_state``, its exchanges with the other members in
``workers.horizontal.peers``; here are its steps.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import numpy as np

from boosting import BoostingError
from boosting._typing import FloatArray
from boosting.binning import apply_cuts
from boosting.fixedpoint import peak_exponent, quantize_at
from boosting.losses import gradients, transform
from boosting.metrics import evaluate
from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan, clip_gradients
from boosting.tree import node_values
from messages.bodies import Ack, Metric, Opened, Resumed, ResumeJob, Step, TreeFinished
from messages.envelope import Kind, MsgType
from messages.horizontal import (GradientRange, GradientScale, HorizontalSpec, LeafValues,
                                 LevelSplits, OpenHorizontal, Round, RoundKey)
from workers import DataError, ProtocolError, StageError, checkpoint
from workers.horizontal import ledger, released
from workers.pairwise_masks import SEAL_BYTES, MaskKey, MaskRound
from workers.handlers import StepContext
from workers.horizontal.attempts import take_current
from workers.horizontal.draws import floored_plan, member_secret, private_rows
from workers.keyed_draws import in_tree_rows
from workers.horizontal.member_state import MemberJob, MemberRecord
from workers.horizontal.peers import announce_key, pair_secrets, round_key, send_masked
from workers.horizontal.tree import MemberTree, assemble
from workers.policy import check_noise_seed, check_protocol
from workers.row_partitioned import (MAX_CLASSES, aggregator_of, load_member_data, members_of,
                                     params_of, save_member_model)

PROTOCOL = "horizontal"
STATS_SCALE = 2.0 ** 24
"""Fixed point of a regression member's label sum (the secure sum adds integers)."""


def open_job(ctx: StepContext, body: OpenHorizontal) -> tuple[Kind, Any]:
    """Load the member's data set, check its labels, make this session's mask key; derive
    this job's secret of its row draws (``workers.horizontal.draws``)."""
    spec = body.spec
    me = ctx.party.name
    check_protocol(ctx.party.policy, me, PROTOCOL)
    check_noise_seed(ctx.party.policy, me, spec.dp_seed)  # the aggregator's noise protects it
    own = ctx.party.dataset_in(spec.parties)
    data = load_member_data(me, own)
    _check_labels(me, own.path, spec.params.objective, data.labels())
    ledger.admit_job(ctx, spec, own.path, data)  # across jobs: before anything leaves
    digest = checkpoint.job_digest(spec, own.path, own.columns)
    job = MemberJob(spec=spec, params=params_of(spec), data=data, data_file=own.path,
                    id_column=own.id_column, digest=digest,
                    aggregator=aggregator_of(spec), mask_key=MaskKey.generate(),
                    draws=member_secret(checkpoint.key_of(ctx.party), digest),
                    seal=secrets.token_bytes(SEAL_BYTES),
                    released=released.load(ctx.model_dir))
    ctx.state = job
    return MsgType.OPENED, Opened(rows=len(data.ids), checkpoints=checkpoint.available(
        ctx.model_dir, job.digest, checkpoint.key_of(ctx.party)))


def _check_labels(me: str, path: str, objective: str, y: FloatArray) -> None:
    """A member may hold one class only (its rows are a part), but only labels of the job's
    objective."""
    if not np.isfinite(y).all():
        raise DataError(f"party {me}: file {path}: labels contain NaN or inf")
    if objective == "binary" and not np.isin(y, (0.0, 1.0)).all():
        bad = y[~np.isin(y, (0.0, 1.0))][0]
        raise DataError(f"party {me}: file {path}: objective binary needs labels 0/1, found "
                        f"{bad:g}")
    if objective == "multiclass":
        wrong = (y != np.round(y)) | (y < 0) | (y >= MAX_CLASSES)
        if wrong.any():
            raise DataError(f"party {me}: file {path}: objective multiclass needs labels "
                            f"0..{MAX_CLASSES - 1}, found {y[wrong][0]:g}")


def compute_gradients(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """FedTree step 2, first half: g and h of every row under the model so far (under
    differential privacy: unit hessians, gradients clipped to the bound, and only this tree's
    rows of its DPBoost ensemble, none if the tree expects fewer than the floor); the
    aggregator gets their peak exponents."""
    job: MemberJob = ctx.state
    me = ctx.party.name
    _check_round(job, me, body)
    if body.tree != len(job.trees):
        raise StageError(f"{me}: tree {body.tree} asked, {len(job.trees)} trees done")
    bins = job.require_bins()
    assert job.margin is not None
    output = body.tree % job.classes
    if output == 0 or job.round_margin is None:  # a round's trees share its first gradients
        job.round_margin = job.margin.copy()
    g, h = (a[:, output] for a in gradients(job.params.objective, job.round_margin, job.y))
    n = job.y.size
    # drawn from this member's own secret: the aggregator counts them at every root
    in_tree = in_tree_rows(job.draws, body.tree, n, job.params.subsample)
    plan = private_plan(job.spec, job.params, me, job.classes)
    if plan is not None:  # DPBoost: this tree's rows of its ensemble (or none below the
        # floor), clipped; unit hessians
        in_tree = private_rows(job.draws, plan, body.tree, in_tree, job.params.subsample)
        g, h = np.where(in_tree, clip_gradients(g, plan.bound), 0.0), np.ones_like(h)
    job.round, job.live = (body.tree, body.attempt), list(body.members)
    job.prefix = released.tree_prefix(job.run, job.trees)
    job.grad, job.hess, job.g_ints, job.h_ints = g, h, None, None
    job.tree = MemberTree.start(n, in_tree, bins.shape[1], job.params.max_bin,
                                job.params.max_depth)
    ctx.send(job.aggregator, MsgType.H_GRADIENT_RANGE, GradientRange(
        body.tree, body.attempt, peak_exponent(g), peak_exponent(h), n))
    return MsgType.ACK, Ack(count=n)


def private_plan(spec: HorizontalSpec, params: BoostParams, me: str,
                 classes: int = 1) -> PrivacyPlan | None:
    """The job's DPBoost plan (``boosting.privacy``) with the count floors
    (``draws.floored_plan``), None without differential privacy.
    It counts every tree grown: ``n_trees * classes`` in multiclass (one tree per class per
    round, as the vertical active party plans)."""
    if spec.dp_epsilon <= 0:
        return None
    trees = params.n_trees * classes
    try:
        return floored_plan(PrivacyPlan(spec.dp_epsilon, trees, params.max_depth,
                                        spec.dp_per_ensemble or trees, spec.dp_clip,
                                        params.reg_lambda, params.learning_rate), params)
    except BoostingError as exc:
        raise ProtocolError(f"{me}: the job's privacy settings are refused: {exc}") from None


def _check_round(job: MemberJob, me: str, body: Round) -> None:
    members = members_of(job.spec)
    if me not in body.members or any(m not in members for m in body.members) or \
            len(set(body.members)) != len(body.members):
        raise ProtocolError(f"{me}: round of tree {body.tree} names members {body.members}, "
                            f"not a set of this job's members including {me}")
    if len(body.members) < job.spec.min_members:
        raise ProtocolError(f"{me}: {len(body.members)} members left, the job needs "
                            f"{job.spec.min_members}: refused to mask for fewer")


def update_histograms(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """FedTree step 2: histograms of the level's nodes over this member's rows, quantized
    with the common scale, masked, to the aggregator."""
    job: MemberJob = ctx.state
    me = ctx.party.name
    tree = _current_tree(job, me, body)
    if body.depth != tree.depth:
        raise StageError(f"{me}: depth {body.depth} asked, the tree is at depth {tree.depth}")
    if body.depth > 0 and job.opened != job.round:  # deeper sums of another set would subtract
        raise ProtocolError(f"{me}: depth {body.depth} of tree {body.tree} attempt "
                            f"{body.attempt} asked, whose root this member did not open: refused")
    pair_secrets(ctx, job, job.live)  # a resumed job skipped the set-up, where they were made
    if job.g_ints is None:
        scale: GradientScale = take_current(ctx, MsgType.H_GRADIENT_SCALE, job.aggregator,
                                            body.tree, -1, body.attempt)
        assert job.grad is not None and job.hess is not None
        if not (job.y.size <= scale.rows <= 2 ** 42) or \
                peak_exponent(job.grad) > scale.g_exponent or \
                peak_exponent(job.hess) > scale.h_exponent or \
                not -1100 < min(scale.g_exponent, scale.h_exponent) <= \
                max(scale.g_exponent, scale.h_exponent) < 1100:
            raise ProtocolError(f"{me}: gradient scale {scale} does not cover this member's")
        job.g_ints = quantize_at(job.grad, scale.rows, scale.g_exponent).ints
        job.h_ints = quantize_at(job.hess, scale.rows, scale.h_exponent).ints
    assert job.h_ints is not None
    hist = tree.histograms(job.require_bins(), job.g_ints, job.h_ints)
    # the root round alone may be given up and redone with fewer members: it is sealed
    send_masked(ctx, job, hist, "hist", body.tree, body.depth, body.attempt, job.live,
                sealed=body.depth == 0)
    return MsgType.ACK, Ack(count=len(tree.build))


def release_round(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """Every live member's root histograms are in: send the aggregator the key of their seals.
    Refused for a tree this member released for another member set (in this run or before):
    the aggregator would subtract the two root sums."""
    job: MemberJob = ctx.state
    me = ctx.party.name
    _current_tree(job, me, body)
    if body.depth != 0 or ("hist", body.tree, 0, body.attempt) not in job.masked:
        raise StageError(f"{me}: release of tree {body.tree} depth {body.depth} attempt "
                         f"{body.attempt}: only a root round this member masked is released")
    before = job.released.get(job.prefix)
    if before is not None and before != sorted(job.live):
        raise ProtocolError(f"{me}: tree {body.tree} was opened with members {before}; opening "
                            f"it with {job.live} would show the aggregator their difference: "
                            f"refused")
    if before is None:
        job.released[job.prefix] = sorted(job.live)
        released.save(ctx.model_dir, job.released)
    job.opened = job.round
    ledger.opened(ctx.party.private_dir(), ctx.job, members_of(job.spec), job.data_file, "roots")
    key = round_key(ctx, job, MaskRound(ctx.job, "hist", body.tree, 0, body.attempt))
    ctx.send(job.aggregator, MsgType.H_ROUND_KEY, RoundKey(body.tree, 0, body.attempt, key))
    return MsgType.ACK, Ack(count=len(job.live))


def _current_tree(job: MemberJob, me: str, body: Round) -> MemberTree:
    if job.tree is None or job.round != (body.tree, body.attempt) or body.members != job.live:
        raise StageError(f"{me}: tree {body.tree} attempt {body.attempt} was not started here")
    return job.tree


def apply_splits(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """FedTree step 4 at a member: route its rows through the level's splits."""
    job: MemberJob = ctx.state
    me = ctx.party.name
    tree = _current_tree(job, me, body)
    level: LevelSplits = take_current(ctx, MsgType.H_SPLITS, job.aggregator, body.tree,
                                      body.depth, body.attempt)
    if body.depth != tree.depth:
        raise StageError(f"{me}: splits of depth {body.depth}, the tree is at depth {tree.depth}")
    tree.apply(level.splits, level.build, job.require_bins(), me)
    return MsgType.ACK, Ack(count=len(tree.frontier))


def receive_tree(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """FedTree step 1 for the next tree: the finished tree's leaves; the margins move by it;
    the member checkpoints and reports its training metrics over its own rows."""
    job: MemberJob = ctx.state
    me = ctx.party.name
    tree = _current_tree(job, me, body)
    leaves: LeafValues = take_current(ctx, MsgType.H_LEAVES, job.aggregator, body.tree, -1,
                                      body.attempt)
    if sorted(leaves.leaves) != tree.leaves() or len(leaves.values) != len(leaves.leaves) or \
            not all(math.isfinite(v) for v in leaves.values):
        raise ProtocolError(f"{me}: leaf values for nodes {leaves.leaves}; this tree's leaves "
                            f"are {tree.leaves()}")
    output = body.tree % job.classes
    finished = assemble(tree.n_nodes, tree.splits, dict(zip(leaves.leaves, leaves.values)),
                        job.cuts, output)
    assert job.margin is not None
    job.margin[:, output] += node_values(finished)[tree.node_of_row]
    job.trees.append(finished)
    pred = transform(job.params.objective, job.margin)
    metrics = [Metric(k, v) for k, v in evaluate(job.params.objective, job.y, pred,
                                                 "train").items()]
    done = TreeFinished(metrics=[*metrics, Metric("rows", float(job.y.size))])
    job.history.append(done)
    job.tree, job.g_ints, job.h_ints, job.grad, job.hess = None, None, None, None, None
    checkpoint_state(ctx, job)
    return MsgType.TREE_FINISHED, done


def checkpoint_state(ctx: StepContext, job: MemberJob) -> None:
    """Save the member's state after its trees (and after binning)."""
    assert job.margin is not None
    checkpoint.save(ctx.model_dir, len(job.trees), job.digest, job.run, MemberRecord(
        job.cuts, job.base, job.classes, job.margin,
        job.margin if job.round_margin is None else job.round_margin, job.trees, job.history),
        checkpoint.key_of(ctx.party))


def resume_job(ctx: StepContext, body: ResumeJob) -> tuple[Kind, Any]:
    """Go back to a checkpoint every party holds: cuts, base score, margins and trees."""
    job: MemberJob = ctx.state
    me = ctx.party.name
    saved = checkpoint.load_record(ctx.model_dir, body.checkpoint, job.digest,
                                   checkpoint.key_of(ctx.party), MemberRecord, me,
                                   MemberRecord.older)
    job.cuts, job.base, job.classes = list(saved.cuts), saved.base, saved.classes
    job.margin, job.round_margin = saved.margin.copy(), saved.round_margin.copy()
    job.trees, job.history = list(saved.trees), list(saved.history)
    job.bins = apply_cuts(job.data.x, job.cuts, job.params.max_bin)
    job.run = body.checkpoint.run
    announce_key(ctx, job, members_of(job.spec))
    return MsgType.RESUMED, Resumed(trees_done=len(job.trees), n_aligned=job.y.size,
                                    n_train=job.y.size, n_valid=0, outputs=job.classes,
                                    history=list(job.history))


def save_model_part(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Every member keeps the whole model (horizontal models are shared)."""
    job: MemberJob = ctx.state
    return save_member_model(ctx, job.model(), PROTOCOL, members_of(job.spec), job.id_column)


def close_job(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """The job is complete and its model saved: its checkpoints go."""
    if isinstance(ctx.state, MemberJob):
        checkpoint.discard(ctx.model_dir)
        released.discard(ctx.model_dir)
    return MsgType.ACK, Ack()

