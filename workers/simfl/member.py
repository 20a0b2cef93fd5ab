"""A SimFL member (seed 000, Algorithm 2): rows with every column and the label.

After preprocessing (``workers.simfl.preprocess``) a member knows, for each other member, the
handle of that member's most similar row to each of its own rows, and all that member's
handles. Training: members take turns building trees; for the builder's tree every other member
sends, for every builder handle, the summed g of its rows most similar to that row, and the
total of its h, randomised (``workers.simfl.privacy``); the builder estimates the exact sums,
adds them to its own rows' g and h (Weighted Gradient Boosting), grows the tree and shares
it. No feature value leaves a member except the thresholds of the trees it builds. In
multiclass a round is one tree per class, all grown by the round's builder on the gradients of the margins at the round's
start (the core's softmax rounds); each class's sums carry noise of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from boosting._typing import BinMatrix, FloatArray
from boosting.binning import apply_cuts, fit_cuts
from boosting.fixedpoint import quantize
from boosting.grow import TreeGrower, sample_rows
from boosting.losses import gradients, transform
from boosting.metrics import evaluate
from boosting.params import BoostParams
from boosting.train import BinnedBlock, grow_tree
from boosting.tree import (Model, Tree, TreeNode, leaf_values, node_values, raw_decider,
                           trees_from_arrays, trees_to_arrays)
from messages.bodies import Ack, Metric, Opened, Resumed, ResumeJob, Step, TreeFinished
from messages.codec import to_wire
from messages.envelope import Kind, MsgType
from messages.simfl import OpenSimfl, SharedTree, SimilarGradients, SimflSpec, WireNode
from workers import DataError, ProtocolError, StageError, checkpoint
from workers.data import PartyData
from workers.handlers import StepContext
from workers.pairwise_masks import MaskKey
from workers.policy import check_protocol
from workers.row_partitioned import (MAX_CLASSES, OWNER, load_member_data, members_of, params_of,
                                     save_member_model, shared_model)
from workers.simfl.privacy import HESSIAN_BOUND, GradientNoise, denoise, hessian_share

PROTOCOL = "simfl"
MAX_ROWS = 1 << 26
"""Rows one member may declare (the aggregator's and builder's allocations are bounded)."""
MIN_NOISE = 1.0
"""The least sigma_label and sigma_tree a member accepts, whatever the job says: below it one
tree's sum tells a lone row's label with an advantage above 0.28 (``2 Phi(1 / 2 sigma) - 1``)."""
OLDER_FORMATS = {1: "SimFL format 1 (exact gradient sums)"}
"""The dict layouts of SimFL checkpoints that are refused, and why (format 2, the randomised
sums with every other member's handles, is read: ``MemberRecord.older``)."""


@dataclass(slots=True)
class MemberRecord:
    """What a SimFL member's checkpoint holds after its trees (and after preprocessing)."""

    handles: np.ndarray
    members: list[str]
    similar: list[np.ndarray]
    everyone: list[np.ndarray]
    base: float
    classes: int
    margin: FloatArray
    round_margin: FloatArray
    packed: list[Any]
    """Each tree as flat arrays (``SimflMember.packed``)."""
    history: list[TreeFinished]

    @property
    def trees(self) -> list[Any]:
        return self.packed

    @classmethod
    def older(cls, where: str, saved: dict[str, Any]) -> MemberRecord:
        """A checkpoint of the dict layout (format 2; from before multiclass: one class)."""
        saved = checkpoint.older_state(where, saved, {"handles", "similar", "members", "everyone",
                                                    "base", "margin", "trees", "history"},
                                       OLDER_FORMATS, 2)
        return cls(np.asarray(saved["handles"], dtype=np.uint64), list(saved["members"]),
                   list(saved["similar"]), list(saved["everyone"]), float(saved["base"]),
                   int(saved.get("classes", 1)), np.array(saved["margin"]),
                   np.array(saved.get("round_margin", saved["margin"])), list(saved["trees"]),
                   [TreeFinished([Metric(str(n), float(v)) for n, v in metrics])
                    for metrics in saved["history"]])


checkpoint.register_state_types(MemberRecord)


def builder_of(spec: SimflSpec, tree: int, classes: int = 1) -> str:
    """Members take turns: round r (tree t's round is t // classes, one tree per class) is
    grown by member r mod M, in the job's order."""
    members = members_of(spec)
    return members[(tree // classes) % len(members)]


def noise_of(spec: SimflSpec, builder: str, classes: int) -> GradientNoise:
    """The job's gradient noise toward ``builder``. The logistic and softmax losses' |g| < 1 is
    their own clip (C = 1, which the label guarantee needs: a flipped label then moves g by
    exactly 1 in every tree of a class it is or was). The h total's noise is calibrated to
    the trees any member sends that builder over the whole job."""
    clip = spec.gradient_clip if spec.params.objective == "regression" else 1.0
    return GradientNoise(spec.noise_label, spec.noise_tree, clip,
                         HESSIAN_BOUND[spec.params.objective],
                         max(1, trees_built_by(spec, builder, classes)))


def trees_built_by(spec: SimflSpec, builder: str, classes: int = 1) -> int:
    """How many of the job's trees (``n_trees`` rounds of ``classes`` trees) ``builder`` grows."""
    members = members_of(spec)
    rounds = spec.params.n_trees
    mine = members.index(builder)
    return classes * ((rounds - mine + len(members) - 1) // len(members)) if mine < rounds else 0


def noise_stream(prep_key: str, builder: str, output: int, classes: int) -> str:
    """Which persistent noise a sum vector carries: one draw per (preprocessing, builder) and,
    in multiclass, per class (a flipped label moves two classes' sums in opposite directions,
    which noise shared by the classes would not hide)."""
    return f"{prep_key}/{builder}" if classes == 1 else f"{prep_key}/{builder}/class {output}"


@dataclass(slots=True)
class SimflMember:
    """A member's state of one SimFL job."""

    spec: SimflSpec
    params: BoostParams
    data: PartyData
    data_file: str
    id_column: str
    digest: str
    cuts: list[FloatArray]
    bins: BinMatrix
    handles: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    similar: dict[str, np.ndarray] = field(default_factory=dict)
    """Per other member, the handle of its most similar row to each of this member's rows."""
    everyone: dict[str, np.ndarray] = field(default_factory=dict)
    """Per other member, all its handles in its order (a sum is sent for each)."""
    target: dict[str, np.ndarray] = field(default_factory=dict)
    """Per other member, the position in ``everyone`` of each of this member's similar rows."""
    exchange: MaskKey | None = None
    """This job's X25519 key for the hash functions' secret (never stored)."""
    base: float = 0.0
    classes: int = 1
    """Trees per round: the union's classes in multiclass, else 1 (``SimilarRows.classes``)."""
    margin: FloatArray | None = None
    """Rows x outputs: the model so far on this member's rows."""
    round_margin: FloatArray | None = None
    """The margins at the start of the current round (every class's tree of a round is grown
    on their gradients)."""
    trees: list[Tree] = field(default_factory=list)
    packed: list[dict[str, Any]] = field(default_factory=list)
    """Each tree as flat arrays (``boosting.tree.trees_to_arrays``): what checkpoints hold, so
    that a checkpoint after tree 500 costs arrays, not a dataclass per node."""
    history: list[TreeFinished] = field(default_factory=list)
    prep_key: str = ""

    @property
    def y(self) -> FloatArray:
        assert self.data.y is not None
        return self.data.y

    def model(self) -> Model:
        return shared_model(self.params, self.base, self.classes, self.trees, self.data.names)

    def set_prepared(self, similar: dict[str, np.ndarray], everyone: dict[str, np.ndarray],
                     base: float, classes: int = 1) -> None:
        """Keep a preprocessing's result; every similar handle must be one of that member's,
        and the classes must hold this member's labels."""
        multiclass = self.params.objective == "multiclass"
        fits = (2 <= classes <= MAX_CLASSES and self.y.max() < classes) if multiclass \
            else classes == 1
        if not fits:
            raise ProtocolError(f"{self.data_file}: {classes} classes do not fit this member's "
                                f"{self.params.objective} labels")
        targets = {}
        for m, given in similar.items():
            handles = np.asarray(given, dtype=np.uint64)
            others = np.asarray(everyone[m], dtype=np.uint64)
            order = np.argsort(others)
            at = order[np.minimum(np.searchsorted(others, handles, sorter=order),
                                  others.size - 1)]
            if handles.size != self.y.size or not np.array_equal(others[at], handles):
                raise ProtocolError(f"{self.data_file}: similar rows of {m} are not among its "
                                    f"rows")
            targets[m] = at
        self.similar = {m: np.asarray(v, dtype=np.uint64) for m, v in similar.items()}
        self.everyone = {m: np.asarray(v, dtype=np.uint64) for m, v in everyone.items()}
        self.target, self.base, self.classes = targets, float(base), int(classes)
        self.margin = np.full((self.y.size, self.classes), self.base)
        self.round_margin = None

    def require_similar(self) -> None:
        if self.margin is None or not self.similar:
            raise StageError(f"{self.data_file}: preprocessing has not run")


def open_job(ctx: StepContext, body: OpenSimfl) -> tuple[Kind, Any]:
    """Load the member's data set (labels of both classes), bin it with its own cuts."""
    spec, me = body.spec, ctx.party.name
    check_protocol(ctx.party.policy, me, PROTOCOL)
    if not (spec.noise_label >= MIN_NOISE and spec.noise_tree >= MIN_NOISE
            and np.isfinite(spec.gradient_clip) and spec.gradient_clip > 0):
        raise ProtocolError(f"{me}: the job's gradient noise (label {spec.noise_label}, tree "
                            f"{spec.noise_tree}, clip {spec.gradient_clip}) is below this "
                            f"member's minimum {MIN_NOISE}: refused")
    own = ctx.party.dataset_in(spec.parties)
    data = load_member_data(me, own)
    y = data.labels()
    if spec.params.objective == "binary" and not np.isin(y, (0.0, 1.0)).all():
        raise DataError(f"party {me}: file {own.path}: objective binary needs labels 0/1")
    if spec.params.objective == "multiclass" and not np.isin(y, np.arange(MAX_CLASSES)).all():
        raise DataError(f"party {me}: file {own.path}: objective multiclass needs labels "
                        f"0..{MAX_CLASSES - 1}")
    if spec.params.objective != "regression":
        if np.unique(y).size < 2:
            raise DataError(f"party {me}: file {own.path}: its labels hold one class only "
                            f"({int(y[0])}); every SimFL member needs both")
    cuts = fit_cuts(data.x, spec.params.max_bin)
    ctx.state = SimflMember(spec=spec, params=params_of(spec), data=data, data_file=own.path,
                            id_column=own.id_column,
                            digest=checkpoint.job_digest(spec, own.path, own.columns),
                            cuts=cuts, bins=apply_cuts(data.x, cuts, spec.params.max_bin))
    return MsgType.OPENED, Opened(rows=len(data.ids), checkpoints=checkpoint.available(
        ctx.model_dir, ctx.state.digest, checkpoint.key_of(ctx.party)))


def _gradients(job: SimflMember, tree: int) -> tuple[FloatArray, FloatArray]:
    """g and h of tree ``tree``'s output at the margins of its round's start."""
    assert job.margin is not None
    output = tree % job.classes
    if output == 0 or job.round_margin is None:  # a round's trees share its first gradients
        job.round_margin = job.margin.copy()
    g, h = gradients(job.params.objective, job.round_margin, job.y)
    return g[:, output], h[:, output]


def send_gradients(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Algorithm 2, l.1-8: for every builder row, the summed g and h of this member's rows whose
    most similar builder row it is, randomised under this member's own key."""
    job: SimflMember = ctx.state
    job.require_similar()
    builder = builder_of(job.spec, body.tree, job.classes)
    if body.tree != len(job.trees) or builder == ctx.party.name or body.owners != [builder]:
        raise StageError(f"{ctx.party.name}: tree {body.tree} by {body.owners}; {len(job.trees)} "
                         f"trees done, builder {builder}")
    g, h = _gradients(job, body.tree)
    noise = noise_of(job.spec, builder, job.classes)
    g_sum, h_sum = noise.sums(g, h, job.target[builder], job.everyone[builder].size)
    g_sent, h_total = noise.randomize(g_sum, h_sum, checkpoint.key_of(ctx.party), noise_stream(
        job.prep_key, builder, body.tree % job.classes, job.classes))
    ctx.send(builder, MsgType.S_GRADIENTS, SimilarGradients(
        body.tree, g_sent.astype("<f8").tobytes(), h_total))
    return MsgType.ACK, Ack(count=int(g_sent.size))


def build_tree(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Algorithm 2, l.9-21: weighted gradients (own plus the others' sums, estimated from the
    noisy ones) on this member's rows; the tree grows with the core and goes to every other
    member."""
    job: SimflMember = ctx.state
    me = ctx.party.name
    job.require_similar()
    if body.tree != len(job.trees) or builder_of(job.spec, body.tree, job.classes) != me:
        raise StageError(f"{me}: tree {body.tree} is not this member's to build now")
    others = [m for m in members_of(job.spec) if m != me]
    ctx.mailbox.require(*[(MsgType.S_GRADIENTS, m, body.tree, -1) for m in others])
    own_g, own_h = _gradients(job, body.tree)
    output = body.tree % job.classes
    g, h = own_g.copy(), own_h.copy()
    noise = noise_of(job.spec, me, job.classes)
    n = job.y.size
    received = 0
    for m in others:
        part: SimilarGradients = ctx.mailbox.take(MsgType.S_GRADIENTS, m, body.tree)
        if len(part.g) != 8 * n:
            raise ProtocolError(f"{me}: {m} sent {len(part.g) // 8} gradient sums for {n} rows")
        g_part = np.frombuffer(part.g, "<f8")
        if not (np.isfinite(g_part).all() and isinstance(part.h_total, float)
                and np.isfinite(part.h_total)):
            raise ProtocolError(f"{me}: {m}'s gradient sums are not finite")
        g += denoise(g_part, noise.g_spread(), own_g, own_h)
        h += hessian_share(part.h_total, noise.h_spread(), own_h) * own_h  # sums of h >= 0
        received += len(part.g) + 8
    grower = TreeGrower(job.params, quantize(g, n), quantize(h, n),
                        sample_rows(n, job.params.subsample, job.params.seed, body.tree), 1)
    tree = grow_tree(job.params, grower, [BinnedBlock(OWNER, job.cuts, job.bins)], [0], output)
    shared = SharedTree(body.tree, [WireNode(nd.id, nd.left, nd.right, nd.feature,
                                             float(nd.threshold), nd.missing_left, nd.value)
                                    for nd in tree.nodes])
    for m in others:
        ctx.send(m, MsgType.S_TREE, shared)
    assert job.margin is not None
    job.margin[:, output] += node_values(tree)[grower.node_of_row]
    tree_bytes = len(msgpack.packb(to_wire(shared), use_bin_type=True))
    mine = _checked_tree(shared, len(job.data.names), job.params.max_depth, me,
                         output)  # as every member holds it
    sizes = [Metric("tree_bytes", float(tree_bytes)), Metric("gradient_bytes", float(received))]
    return MsgType.TREE_FINISHED, _finish(ctx, job, mine, sizes)


def receive_tree(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """The builder's tree, checked, applied to this member's rows."""
    job: SimflMember = ctx.state
    me = ctx.party.name
    builder = builder_of(job.spec, body.tree, job.classes)
    if body.tree != len(job.trees) or builder == me:
        raise StageError(f"{me}: tree {body.tree} from {builder}: not expected now")
    shared: SharedTree = ctx.mailbox.take(MsgType.S_TREE, builder, body.tree)
    output = body.tree % job.classes
    tree = _checked_tree(shared, len(job.data.names), job.params.max_depth, me, output)
    assert job.margin is not None
    job.margin[:, output] += leaf_values(tree, job.y.size, raw_decider({OWNER: job.data.x}))
    return MsgType.TREE_FINISHED, _finish(ctx, job, tree, [])


def _checked_tree(shared: SharedTree, n_features: int, max_depth: int, who: str,
                  output: int) -> Tree:
    """A tree from the wire: ids 0..n-1, every split's children later nodes, each node reached
    once, features that exist, no NaN, at most ``2^(depth+1) - 1`` nodes; it adds to margin
    column ``output`` (its class in multiclass)."""
    nodes = shared.nodes
    if not nodes or len(nodes) > 2 ** (max_depth + 1) - 1 or \
            [n.id for n in nodes] != list(range(len(nodes))):
        raise ProtocolError(f"{who}: tree {shared.tree} has {len(nodes)} nodes out of order")
    reached = {0}
    for n in nodes:
        if n.left == -1 and n.right == -1:
            if not np.isfinite(n.value):
                raise ProtocolError(f"{who}: tree {shared.tree} leaf {n.id} is not finite")
            continue
        if not (n.id < n.left < len(nodes) and n.id < n.right < len(nodes)) or \
                n.left == n.right or {n.left, n.right} & reached or \
                not 0 <= n.feature < n_features or np.isnan(n.threshold):
            raise ProtocolError(f"{who}: tree {shared.tree} node {n.id} is malformed")
        reached |= {n.left, n.right}
    if len(reached) != len(nodes):
        raise ProtocolError(f"{who}: tree {shared.tree} has unreachable nodes")
    return Tree(nodes=tuple(
        TreeNode(id=n.id, value=n.value) if n.left == -1 else
        TreeNode(id=n.id, left=n.left, right=n.right, owner=OWNER, feature=n.feature,
                 threshold=n.threshold, missing_left=n.missing_left)
        for n in nodes), output=output)


def _finish(ctx: StepContext, job: SimflMember, tree: Tree,
            extra: list[Metric]) -> TreeFinished:
    """Append the tree, checkpoint, report metrics over this member's own rows."""
    job.trees.append(tree)
    job.packed.append(trees_to_arrays([tree]))
    assert job.margin is not None
    pred = transform(job.params.objective, job.margin)
    metrics = [Metric(k, v) for k, v in evaluate(job.params.objective, job.y, pred,
                                                 "train").items()]
    done = TreeFinished(metrics=[*metrics, Metric("rows", float(job.y.size)), *extra])
    job.history.append(done)
    checkpoint.save(ctx.model_dir, len(job.trees), job.digest, job.prep_key, MemberRecord(
        job.handles, list(job.similar), list(job.similar.values()), list(job.everyone.values()),
        job.base, job.classes, job.margin,
        job.margin if job.round_margin is None else job.round_margin, job.packed, job.history),
        checkpoint.key_of(ctx.party))
    return done


def resume_job(ctx: StepContext, body: ResumeJob) -> tuple[Kind, Any]:
    """Go back to a checkpoint every member holds (its similarity, margins and trees)."""
    job: SimflMember = ctx.state
    me = ctx.party.name
    saved = checkpoint.load_record(ctx.model_dir, body.checkpoint, job.digest,
                                   checkpoint.key_of(ctx.party), MemberRecord, me,
                                   MemberRecord.older)
    job.handles = np.asarray(saved.handles, dtype=np.uint64)
    job.set_prepared(dict(zip(saved.members, saved.similar)),
                     dict(zip(saved.members, saved.everyone)), saved.base, saved.classes)
    job.margin, job.round_margin = saved.margin.copy(), saved.round_margin.copy()
    job.packed = list(saved.packed)
    job.trees = [tree for packed in job.packed for tree in trees_from_arrays(packed)]
    job.history = list(saved.history)
    job.prep_key = body.checkpoint.run
    return MsgType.RESUMED, Resumed(trees_done=len(job.trees), n_aligned=job.y.size,
                                    n_train=job.y.size, n_valid=0, outputs=job.classes,
                                    history=list(job.history))


def save_model_part(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Every member keeps all the trees."""
    job: SimflMember = ctx.state
    return save_member_model(ctx, job.model(), PROTOCOL, members_of(job.spec), job.id_column)


def close_job(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    if isinstance(ctx.state, SimflMember):
        checkpoint.discard(ctx.model_dir)
    return MsgType.ACK, Ack()

