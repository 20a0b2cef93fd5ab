"""A SimFL member (seed 000, Algorithms 1-2): rows with every column and the label.

Preprocessing: it sends the aggregator its rows' LSH values under opaque per-job handles and
gets back, for each other member, the handle of that member's most similar row to each of its
own. Training: members take turns building trees; for the builder's tree every other member
sends, per builder handle, the summed g and h of its rows most similar to that row (Weighted
Gradient Boosting); the builder grows the tree on its own rows with those weighted gradients
and shares it. No feature value leaves a member except the thresholds of the trees it builds.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path
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
from messages.envelope import MsgType
from messages.simfl import (MemberKey, OpenSimfl, Prepare, RowHashes, SharedTree,
                            SimilarGradients, SimilarRows, SimflSpec, WireNode)
from workers import DataError, ProtocolError, StageError, checkpoint
from workers.data import PartyData
from workers.horizontal.tree import OWNER
from workers.policy import check_protocol
from workers.runtime import StepContext
from workers.row_partitioned import (aggregator_of, load_member_data, members_of, params_of,
                                     save_member_model)
from workers.simfl.lsh import DEFAULT_R, LshFunctions, default_functions

PROTOCOL = "simfl"
MAX_ROWS = 1 << 26
"""Rows one member may declare (the aggregator's and builder's allocations are bounded)."""


def builder_of(spec: SimflSpec, tree: int) -> str:
    """Members take turns: tree t is grown by member t mod M, in the job's order."""
    members = members_of(spec)
    return members[tree % len(members)]


def lsh_of(spec: SimflSpec, n_features: int) -> LshFunctions:
    """The job's hash functions: from its seed, the same at every member."""
    return LshFunctions.from_seed(spec.lsh_seed, n_features,
                                  spec.lsh_functions or default_functions(n_features),
                                  spec.lsh_r or DEFAULT_R)


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
    base: float = 0.0
    margin: FloatArray | None = None
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
        n_classes = 2 if self.params.objective == "binary" else 1
        return Model(self.params, (self.base,), n_classes, tuple(self.trees),
                     {OWNER: self.data.names})

    def require_similar(self) -> None:
        if self.margin is None or not self.similar:
            raise StageError(f"{self.data_file}: preprocessing has not run")


def open_job(ctx: StepContext, body: OpenSimfl) -> tuple[MsgType, Any]:
    """Load the member's data set (labels of both classes), bin it with its own cuts."""
    spec, me = body.spec, ctx.party.name
    check_protocol(ctx.party.policy, me, PROTOCOL)
    own = ctx.party.dataset_in(spec.parties)
    data = load_member_data(me, own)
    if spec.objective == "binary":
        if not np.isin(data.y, (0.0, 1.0)).all():
            raise DataError(f"party {me}: file {own.path}: objective binary needs labels 0/1")
        if np.unique(data.y).size < 2:
            raise DataError(f"party {me}: file {own.path}: its labels hold one class only "
                            f"({int(data.y[0])}); every SimFL member needs both")
    cuts = fit_cuts(data.x, spec.max_bin)
    ctx.state = SimflMember(spec=spec, params=params_of(spec), data=data, data_file=own.path,
                            id_column=own.id_column,
                            digest=checkpoint.job_digest(spec, own.path, own.columns),
                            cuts=cuts, bins=apply_cuts(data.x, cuts, spec.max_bin))
    return MsgType.OPENED, Opened(rows=len(data.ids), checkpoints=checkpoint.available(
        ctx.model_dir, ctx.state.digest, checkpoint.key_of(ctx.party)))


def member_key(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """A keyed digest of this member's data set, the LSH parameters and the members: the same
    key again means its preprocessing still holds (without revealing the data's digest)."""
    job: SimflMember = ctx.state
    s = job.spec
    h = hashlib.sha256()
    with open(job.data_file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    h.update(msgpack.packb([list(job.data.names), s.lsh_functions, s.lsh_r, s.lsh_seed,
                            members_of(s), ctx.party.name], use_bin_type=True))
    key = hmac.new(checkpoint.key_of(ctx.party), h.digest(), hashlib.sha256).hexdigest()
    return MsgType.S_PREPARE_REPLY, MemberKey(key)


def _cache_file(ctx: StepContext, key: str) -> Path:
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ProtocolError(f"{ctx.party.name}: preprocessing key {key!r} is not a digest")
    folder = ctx.party.private_dir() / "simfl"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"{key}.npz"


def hash_rows(ctx: StepContext, body: Prepare) -> tuple[MsgType, Any]:
    """Algorithm 1, l.1-4: this member's rows' LSH values under fresh opaque handles, to the
    aggregator; or, when this federation's preprocessing is on record here, nothing (count -1)."""
    job: SimflMember = ctx.state
    cache = _cache_file(ctx, body.key)
    if not body.force and cache.is_file() and _load_prepared(job, cache):
        job.prep_key = body.key
        return MsgType.ACK, Ack(count=-1)
    functions = lsh_of(job.spec, job.data.x.shape[1])
    hashes = functions.hash(job.data.x)
    handles = np.unique(np.frombuffer(secrets.token_bytes(8 * len(job.data.ids) * 2), "<u8"))
    handles = np.random.default_rng(secrets.randbits(64)).permutation(handles)[:len(job.data.ids)]
    if handles.size != len(job.data.ids):  # 2n random 64-bit values had n distinct
        raise ProtocolError(f"{ctx.party.name}: could not draw distinct row handles")
    job.handles, job.prep_key = handles.astype(np.uint64), body.key
    message = RowHashes(list(job.data.names), handles.astype("<u8").tobytes(),
                        hashes.astype("<i4").tobytes(), functions.a.shape[0], float(job.y.sum()))
    ctx.send(aggregator_of(job.spec), MsgType.S_ROW_HASHES, message)
    return MsgType.ACK, Ack(count=len(message.handles) + len(message.hashes))


def store_similar(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Algorithm 1, l.7-12 (done by the aggregator): keep the similar handles per other member,
    on record under the federation's preprocessing key."""
    job: SimflMember = ctx.state
    me = ctx.party.name
    got: SimilarRows = ctx.mailbox.take(MsgType.S_SIMILAR, aggregator_of(job.spec))
    if got.columns != list(job.data.names):
        raise DataError(f"party {me}: file {job.data_file}: columns differ from the first "
                        f"member's: {_first_difference(list(job.data.names), got.columns)}")
    if not got.members:  # another member's columns differ: its own error names its file
        return MsgType.ACK, Ack(count=0)
    others = [m for m in members_of(job.spec) if m != me]
    n = len(job.data.ids)
    if got.members != others or any(len(h) != 8 * n for h in got.handles) or \
            not np.isfinite(got.base_score):
        raise ProtocolError(f"{me}: similar rows for {got.members} of wrong shape; expected "
                            f"{others}, {n} rows each")
    job.similar = {m: np.frombuffer(h, "<u8").astype(np.uint64)
                   for m, h in zip(got.members, got.handles)}
    job.base = float(got.base_score)
    job.margin = np.full((n, 1), job.base)
    np.savez(_cache_file(ctx, job.prep_key), handles=job.handles, base=np.float64(job.base),
             members=np.array(others), **{f"similar_{k}": v for k, v in
                                           enumerate(job.similar.values())})
    return MsgType.ACK, Ack(count=sum(len(h) for h in got.handles))


def _load_prepared(job: SimflMember, path: Path) -> bool:
    """A preprocessing on record: handles, similar handles per member, base score."""
    with np.load(path, allow_pickle=False) as saved:
        handles = saved["handles"]
        others = [str(m) for m in saved["members"]]
        if handles.size != len(job.data.ids) or len(others) != len(members_of(job.spec)) - 1:
            return False
        job.handles = handles.astype(np.uint64)
        job.similar = {m: saved[f"similar_{k}"].astype(np.uint64) for k, m in enumerate(others)}
        job.base = float(saved["base"])
    job.margin = np.full((len(job.data.ids), 1), job.base)
    return True


def _first_difference(mine: list[str], reference: list[str]) -> str:
    for k, (a, b) in enumerate(zip(mine, reference)):
        if a != b:
            return f"column {k + 1} is {a!r} here, {b!r} there"
    return f"{len(mine)} columns here, {len(reference)} there"


def _gradients(job: SimflMember) -> tuple[FloatArray, FloatArray]:
    assert job.margin is not None
    g, h = gradients(job.params.objective, job.margin, job.y)
    return g[:, 0], h[:, 0]


def send_gradients(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Algorithm 2, l.1-8: per builder row, the summed g and h of this member's rows whose most
    similar builder row it is."""
    job: SimflMember = ctx.state
    job.require_similar()
    builder = builder_of(job.spec, body.tree)
    if body.tree != len(job.trees) or builder == ctx.party.name or body.owners != [builder]:
        raise StageError(f"{ctx.party.name}: tree {body.tree} by {body.owners}; {len(job.trees)} "
                         f"trees done, builder {builder}")
    g, h = _gradients(job)
    targets, where = np.unique(job.similar[builder], return_inverse=True)
    g_sum = np.bincount(where, weights=g, minlength=targets.size)
    h_sum = np.bincount(where, weights=h, minlength=targets.size)
    ctx.send(builder, MsgType.S_GRADIENTS, SimilarGradients(
        body.tree, targets.astype("<u8").tobytes(), g_sum.astype("<f8").tobytes(),
        h_sum.astype("<f8").tobytes()))
    return MsgType.ACK, Ack(count=int(targets.size))


def build_tree(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Algorithm 2, l.9-21: weighted gradients (own plus the others' sums) on this member's rows;
    the tree grows with the core and goes to every other member."""
    job: SimflMember = ctx.state
    me = ctx.party.name
    job.require_similar()
    if body.tree != len(job.trees) or builder_of(job.spec, body.tree) != me:
        raise StageError(f"{me}: tree {body.tree} is not this member's to build now")
    others = [m for m in members_of(job.spec) if m != me]
    ctx.mailbox.require(*[(MsgType.S_GRADIENTS, m, body.tree, -1) for m in others])
    g, h = _gradients(job)
    order = np.argsort(job.handles)
    received = 0
    for m in others:
        part: SimilarGradients = ctx.mailbox.take(MsgType.S_GRADIENTS, m, body.tree)
        handles = np.frombuffer(part.handles, "<u8").astype(np.uint64)
        g_part, h_part = (np.frombuffer(v, "<f8") for v in (part.g, part.h))
        if not (handles.size == g_part.size == h_part.size) or \
                not (np.isfinite(g_part).all() and np.isfinite(h_part).all()):
            raise ProtocolError(f"{me}: {m}'s gradient sums are malformed")
        at = np.searchsorted(job.handles, handles, sorter=order)
        rows = order[np.minimum(at, order.size - 1)]
        if handles.size and not np.array_equal(job.handles[rows], handles):
            raise ProtocolError(f"{me}: {m} sent gradient sums for rows that are not this "
                                f"member's")
        np.add.at(g, rows, g_part)
        np.add.at(h, rows, h_part)
        received += len(part.handles) + len(part.g) + len(part.h)
    n = job.y.size
    grower = TreeGrower(job.params, quantize(g, n), quantize(h, n),
                        sample_rows(n, job.params.subsample, job.params.seed, body.tree), 1)
    tree = grow_tree(job.params, grower, [BinnedBlock(OWNER, job.cuts, job.bins)], [0], 0)
    shared = SharedTree(body.tree, [WireNode(nd.id, nd.left, nd.right, nd.feature,
                                             float(nd.threshold), nd.missing_left, nd.value)
                                    for nd in tree.nodes])
    for m in others:
        ctx.send(m, MsgType.S_TREE, shared)
    assert job.margin is not None
    job.margin[:, 0] += node_values(tree)[grower.node_of_row]
    tree_bytes = len(msgpack.packb(to_wire(shared), use_bin_type=True))
    mine = _checked_tree(shared, len(job.data.names), job.params.max_depth, me)  # as all hold it
    sizes = [Metric("tree_bytes", float(tree_bytes)), Metric("gradient_bytes", float(received))]
    return MsgType.TREE_FINISHED, _finish(ctx, job, mine, sizes)


def receive_tree(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """The builder's tree, checked, applied to this member's rows."""
    job: SimflMember = ctx.state
    me = ctx.party.name
    builder = builder_of(job.spec, body.tree)
    if body.tree != len(job.trees) or builder == me:
        raise StageError(f"{me}: tree {body.tree} from {builder}: not expected now")
    shared: SharedTree = ctx.mailbox.take(MsgType.S_TREE, builder, body.tree)
    tree = _checked_tree(shared, len(job.data.names), job.params.max_depth, me)
    assert job.margin is not None
    job.margin[:, 0] += leaf_values(tree, job.y.size, raw_decider({OWNER: job.data.x}))
    return MsgType.TREE_FINISHED, _finish(ctx, job, tree, [])


def _checked_tree(shared: SharedTree, n_features: int, max_depth: int, who: str) -> Tree:
    """A tree from the wire: ids 0..n-1, every split's children later nodes, each node reached
    once, features that exist, no NaN, at most ``2^(depth+1) - 1`` nodes."""
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
        for n in nodes), output=0)


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
    checkpoint.save(ctx.model_dir, len(job.trees), job.digest, job.prep_key,
                    {"handles": job.handles, "similar": list(job.similar.values()),
                     "members": list(job.similar), "base": job.base, "margin": job.margin,
                     "trees": job.packed,
                     "history": [[[m.name, m.value] for m in done.metrics]
                                 for done in job.history]},
                    checkpoint.key_of(ctx.party))
    return done


def resume_job(ctx: StepContext, body: ResumeJob) -> tuple[MsgType, Any]:
    """Go back to a checkpoint every member holds (its similarity, margins and trees)."""
    job: SimflMember = ctx.state
    saved = checkpoint.load(ctx.model_dir, body.checkpoint, job.digest,
                            checkpoint.key_of(ctx.party))
    keys = {"handles", "similar", "members", "base", "margin", "trees", "history"}
    if not (isinstance(saved, dict) and keys <= set(saved)
            and len(saved["trees"]) == body.checkpoint.trees_done):
        raise checkpoint.CheckpointError(f"{ctx.party.name}: checkpoint after "
                                         f"{body.checkpoint.trees_done} trees is damaged")
    job.handles = np.asarray(saved["handles"], dtype=np.uint64)
    job.similar = dict(zip(saved["members"], (np.asarray(s, np.uint64)
                                              for s in saved["similar"])))
    job.base, job.margin = float(saved["base"]), np.array(saved["margin"])
    job.packed = list(saved["trees"])
    job.trees = [tree for packed in job.packed for tree in trees_from_arrays(packed)]
    job.history = [TreeFinished([Metric(str(n), float(v)) for n, v in metrics])
                   for metrics in saved["history"]]
    job.prep_key = body.checkpoint.run
    return MsgType.RESUMED, Resumed(trees_done=len(job.trees), n_aligned=job.y.size,
                                    n_train=job.y.size, n_valid=0, outputs=1,
                                    history=list(job.history))


def save_model_part(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Every member keeps all the trees."""
    job: SimflMember = ctx.state
    return save_member_model(ctx, job.model(), PROTOCOL, members_of(job.spec), job.id_column)


def close_job(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    if isinstance(ctx.state, SimflMember):
        checkpoint.discard(ctx.model_dir)
    return MsgType.ACK, Ack()

