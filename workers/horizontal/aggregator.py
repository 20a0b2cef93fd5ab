"""The aggregator of a horizontal job: sums the members' masked histograms and grows the tree
(FedTree, horizontal); its set-up step (cuts from summed grid counts) is in
``workers.horizontal.setup``.

It holds no rows. It sees the members' column names, row counts and gradient peak exponents,
and the sums over all members of a round: the pairwise masks hide each member's own vector
(``workers.pairwise_masks``), a sum is formed only once every live member's vector of that
round is in, and a tree's root sum only with the round key a member releases once all are in.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boosting._typing import FloatArray, IntArray
from boosting.fixedpoint import quantize_at
from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan, PrivateTree, split_candidates, tree_rng
from boosting.tree import Tree
from messages.bodies import Ack, Opened, Resumed, ResumeJob, Step
from messages.envelope import Kind, MsgType
from messages.horizontal import (GradientRange, GradientScale, HorizontalSpec, LeafValues,
                                 LevelSplits, MaskedVector, OpenHorizontal, Round, RoundKey)
from workers import NotReady, ProtocolError, StageError, checkpoint
from workers.horizontal.grid import GridRounds
from workers.pairwise_masks import unmask_sum, unseal_sum
from workers.horizontal.attempts import require_current, take_current
from workers.horizontal.member import (PROTOCOL, aggregator_of, members_of, params_of,
                                       private_plan)
from workers.horizontal.member_state import OLDER_FORMATS
from workers.handlers import StepContext
from workers.horizontal.tree import SplitChooser, SummedTree
from workers.policy import check_protocol

@dataclass(slots=True)
class AggregatorJob:
    """The aggregator's state of one horizontal job."""

    spec: HorizontalSpec
    params: BoostParams
    digest: str
    plan: PrivacyPlan | None
    """Differential privacy of the model (None: none, the lossless protocol)."""
    noise_seed: int
    """The job's ``privacy.seed`` (experiments only), or a secret of this aggregator's, kept in
    its checkpoints: a tree grown again after a restart draws the same noise, so a member that
    saw its first splits learns nothing new from the second growth."""
    grid: GridRounds | None = None
    """The set-up rounds (``workers.horizontal.grid``) until the cuts are sent."""
    stats: tuple[int, ...] = (0, 0)
    """The members' rows and label sum (multiclass: rows per class), summed."""
    columns: list[str] = field(default_factory=list)
    cuts: list[FloatArray] = field(default_factory=list)
    bin_counts: IntArray | None = None
    """The union's rows per bin of the cuts (``GridRounds.bin_counts``): under count floors,
    which candidates stay roomy (``boosting.privacy.roomy_candidates``). None in a checkpoint
    from before them: every candidate at every level."""
    base: float = 0.0
    classes: int = 1
    """Trees per round: the union's classes in multiclass, else 1."""
    columns_differ: bool = False
    """The members' columns differed: no cuts were made, each member names its own file."""

    def tree_plan(self) -> PrivacyPlan | None:
        """The DPBoost plan over every tree grown (``n_trees * classes`` in multiclass, once
        the classes are known; ``plan`` is the one checked at open_job)."""
        if self.plan is None or self.classes == 1:
            return self.plan
        return private_plan(self.spec, self.params, "aggregator", self.classes)
    trees: list[Tree] = field(default_factory=list)
    run: str = ""
    round: tuple[int, int] = (-1, -1)
    live: list[str] = field(default_factory=list)
    tree: SummedTree | None = None
    chooser: SplitChooser = field(default_factory=SplitChooser)


@dataclass(slots=True)
class AggregatorRecord:
    """What the aggregator's checkpoint holds after its trees (and after the cuts)."""

    columns: list[str]
    cuts: list[FloatArray]
    base: float
    classes: int
    trees: list[Tree]
    noise_seed: int
    bin_counts: IntArray | None

    @classmethod
    def older(cls, where: str, saved: dict[str, Any], noise_seed: int) -> AggregatorRecord:
        """A checkpoint of the dict layout (format 2; from before multiclass: one class; from
        before the noise seed was kept: this session's; before count floors: no bin counts)."""
        saved = checkpoint.older_state(where, saved, {"columns", "cuts", "base", "trees"},
                                       OLDER_FORMATS, 2)
        return cls(list(saved["columns"]), list(saved["cuts"]), float(saved["base"]),
                   int(saved.get("classes", 1)), list(saved["trees"]),
                   int(saved.get("noise_seed", noise_seed)), saved.get("bin_counts"))


checkpoint.register_state_types(AggregatorRecord)


def open_job(ctx: StepContext, body: OpenHorizontal) -> tuple[Kind, Any]:
    """Check the job against the party's policy; prepare the noise source under DP."""
    spec = body.spec
    me = ctx.party.name
    check_protocol(ctx.party.policy, me, PROTOCOL)
    if aggregator_of(spec) != me:
        raise ProtocolError(f"{me}: the job's aggregator is {aggregator_of(spec)}")
    if len(members_of(spec)) < max(2, spec.min_members):
        raise ProtocolError(f"{me}: {len(members_of(spec))} members; secure aggregation needs "
                            f"at least {max(2, spec.min_members)}")
    params = params_of(spec)
    plan = private_plan(spec, params, me)
    # a seed only for experiments: who knows it can remove the noise
    noise_seed = spec.dp_seed if spec.dp_seed >= 0 else secrets.randbits(63)
    # the digest names the spec only: the aggregator has no data file
    digest = checkpoint.job_digest(spec, "/dev/null", None)
    job = AggregatorJob(spec=spec, params=params, digest=digest, plan=plan,
                        noise_seed=noise_seed)
    ctx.state = job
    return MsgType.OPENED, Opened(rows=0, checkpoints=checkpoint.available(
        ctx.model_dir, digest, checkpoint.key_of(ctx.party)))


def take_masked(ctx: StepContext, sender: str, purpose: str, tree: int, depth: int,
                 attempt: int, length: int) -> np.ndarray:
    """One member's masked vector of a round, checked for its purpose and length."""
    while True:
        body: MaskedVector = ctx.mailbox.take(MsgType.H_MASKED, sender, tree, depth)
        if body.attempt == attempt and body.purpose == purpose:
            break
    if len(body.values) != 8 * length:
        raise ProtocolError(f"{ctx.party.name}: {sender}'s masked {purpose} vector has "
                            f"{len(body.values)} bytes, expected {8 * length}")
    return np.frombuffer(body.values, dtype="<u8").astype(np.uint64)


def agree_scale(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """The quantization scale every live member uses this tree: the largest peak exponents
    and the members' rows (the core's ``quantize`` over the union)."""
    job: AggregatorJob = ctx.state
    if body.tree != len(job.trees):
        raise StageError(f"{ctx.party.name}: tree {body.tree} asked, {len(job.trees)} done")
    _check_live(ctx, job, body)
    require_current(ctx, MsgType.H_GRADIENT_RANGE, body.members, body.tree, -1, body.attempt)
    ranges: list[GradientRange] = [take_current(ctx, MsgType.H_GRADIENT_RANGE, m, body.tree, -1,
                                                body.attempt) for m in body.members]
    for m, r in zip(body.members, ranges):
        if not (0 < r.rows <= 2 ** 40 and -1100 < r.g_exponent < 1100
                and -1100 < r.h_exponent < 1100):
            raise ProtocolError(f"{ctx.party.name}: {m}'s gradient range {r} is out of bounds")
    rows = sum(r.rows for r in ranges)
    g_exp, h_exp = max(r.g_exponent for r in ranges), max(r.h_exponent for r in ranges)
    scale = GradientScale(body.tree, body.attempt, g_exp, h_exp, rows)
    for m in body.members:
        ctx.send(m, MsgType.H_GRADIENT_SCALE, scale)
    unit = np.ones(1)
    job.round, job.live = (body.tree, body.attempt), list(body.members)
    job.tree = SummedTree(job.params, job.cuts,
                          quantize_at(unit, rows, g_exp).scale, quantize_at(unit, rows, h_exp).scale)
    job.chooser = _chooser(job, body.tree, body.attempt)
    return MsgType.ACK, Ack(count=rows)


def _chooser(job: AggregatorJob, tree: int, attempt: int) -> SplitChooser:
    """Exact best splits, or DPBoost's mechanisms with this tree's own noise source (a tree
    grown again after a dropout draws anew: its first attempt's splits were sent)."""
    if job.plan is None:
        return SplitChooser()
    plan = job.tree_plan()
    assert plan is not None
    candidates = split_candidates([len(c) for c in job.cuts], job.params.max_bin)
    roomy = None if job.bin_counts is None else plan.roomy(tree, candidates, job.bin_counts,
                                                           job.params.subsample)
    return SplitChooser(PrivateTree(plan, tree, {0: candidates},
                                    tree_rng(job.noise_seed, tree, attempt),
                                    None if roomy is None else {0: roomy}))


def _check_live(ctx: StepContext, job: AggregatorJob, body: Round) -> None:
    members = members_of(job.spec)
    if len(set(body.members)) != len(body.members) or any(m not in members
                                                          for m in body.members):
        raise ProtocolError(f"{ctx.party.name}: round names members {body.members}, not a set "
                            f"of this job's members")
    if len(body.members) < job.spec.min_members:
        raise ProtocolError(f"{ctx.party.name}: {len(body.members)} members left, the job needs "
                            f"{job.spec.min_members}")


def _current(ctx: StepContext, job: AggregatorJob, body: Round) -> SummedTree:
    if job.tree is None or job.round != (body.tree, body.attempt) or body.members != job.live:
        raise StageError(f"{ctx.party.name}: tree {body.tree} attempt {body.attempt} was not "
                         f"started here")
    return job.tree


def secure_sum(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """FedTree steps 3 and 4: sum the live members' masked histograms of the level (the masks
    cancel only in the whole sum), derive the siblings, choose each node's split and tell the
    members. Replies with the nodes left open."""
    job: AggregatorJob = ctx.state
    tree = _current(ctx, job, body)
    if body.depth != tree.depth:
        raise StageError(f"{ctx.party.name}: depth {body.depth} asked, tree at {tree.depth}")
    require_current(ctx, MsgType.H_MASKED, body.members, body.tree, body.depth, body.attempt)
    n_features, n_bins = len(job.cuts), job.params.max_bin + 1
    shape = (len(tree.build), n_features, n_bins, 3)
    key = _round_key(ctx, body) if body.depth == 0 else b""  # may wait: nothing taken yet
    masked = [take_masked(ctx, m, "hist", body.tree, body.depth, body.attempt,
                          math.prod(shape)) for m in body.members]
    summed = unmask_sum(masked)
    if body.depth == 0:
        summed = unseal_sum(summed.view(np.uint64), key, body.members).view(np.int64)
        _check_root(ctx, summed.reshape(shape))
    tree.add_histograms(summed.reshape(shape))
    splits = tree.grow_level(job.chooser)
    level = LevelSplits(body.tree, body.depth, body.attempt, splits, list(tree.build))
    for m in body.members:
        ctx.send(m, MsgType.H_SPLITS, level)
    return MsgType.ACK, Ack(count=len(tree.frontier))


def _round_key(ctx: StepContext, body: Round) -> bytes:
    """The key a member released for the root round (any of them: all derive the same)."""
    keys = set()
    for m in body.members:
        waiting = ctx.mailbox.items.get((MsgType.H_ROUND_KEY, m, body.tree, 0), [])
        keys |= {k.key for k in waiting if isinstance(k, RoundKey) and k.attempt == body.attempt}
    if not keys:
        raise NotReady(f"H_ROUND_KEY of tree {body.tree} attempt {body.attempt}")
    if len(keys) > 1:
        raise ProtocolError(f"{ctx.party.name}: members sent different round keys for tree "
                            f"{body.tree} attempt {body.attempt}")
    return keys.pop()


def _check_root(ctx: StepContext, root: np.ndarray) -> None:
    """A root sum opened with the wrong key is noise: every feature's counts must be counts
    of the same rows."""
    counts = root[0, :, :, 2].sum(axis=1)
    if (root[0, :, :, 2] < 0).any() or (counts != counts[0]).any():
        raise ProtocolError(f"{ctx.party.name}: the released round key does not open the "
                            f"root histograms")


def send_tree(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """FedTree step 1: the finished tree's leaf values (clipped, with Laplace noise under DP) to the live
    members, who apply it to their margins."""
    job: AggregatorJob = ctx.state
    tree = _current(ctx, job, body)
    private = job.chooser.private
    values = tree.leaf_values() if private is None else tree.private_leaf_values(private)
    leaves = sorted(values)
    message = LeafValues(body.tree, body.attempt, leaves, [values[n] for n in leaves])
    for m in body.members:
        ctx.send(m, MsgType.H_LEAVES, message)
    job.trees.append(tree.tree(values, body.tree % job.classes))
    job.tree = None
    checkpoint_state(ctx, job)
    return MsgType.ACK, Ack(count=len(leaves))


def checkpoint_state(ctx: StepContext, job: AggregatorJob) -> None:
    """Save the aggregator's state after its trees (and after the cuts)."""
    checkpoint.save(ctx.model_dir, len(job.trees), job.digest, job.run, AggregatorRecord(
        job.columns, job.cuts, job.base, job.classes, job.trees, job.noise_seed, job.bin_counts),
        checkpoint.key_of(ctx.party))


def resume_job(ctx: StepContext, body: ResumeJob) -> tuple[Kind, Any]:
    """Go back to a checkpoint every party holds."""
    job: AggregatorJob = ctx.state
    me = ctx.party.name
    saved = checkpoint.load_record(ctx.model_dir, body.checkpoint, job.digest,
                                   checkpoint.key_of(ctx.party), AggregatorRecord, me,
                                   lambda where, old: AggregatorRecord.older(where, old,
                                                                             job.noise_seed))
    job.columns, job.cuts, job.base = list(saved.columns), list(saved.cuts), saved.base
    job.classes, job.trees, job.run = saved.classes, list(saved.trees), body.checkpoint.run
    job.noise_seed, job.bin_counts = saved.noise_seed, saved.bin_counts
    return MsgType.RESUMED, Resumed(trees_done=len(job.trees), n_aligned=0, n_train=0,
                                    n_valid=0, outputs=job.classes, history=[])


def save_model_part(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """The aggregator keeps no model: the members each save it."""
    job: AggregatorJob = ctx.state
    return MsgType.ACK, Ack(count=len(job.trees))


def close_job(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    if isinstance(ctx.state, AggregatorJob):
        checkpoint.discard(ctx.model_dir)
    return MsgType.ACK, Ack()

