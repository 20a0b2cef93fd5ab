"""The active party (label holder) of the vertical random forest (seed 002, Alg. 2-4).

It encrypts its label channels once per job and sends them to every passive party. Per tree it
draws the bootstrap sample (from the job's seed) and per node the features (under a key of its
own: no other party can replay the draws); per level it asks each passive party for the
encrypted per-bin label sums of its drawn features, decrypts them, and picks each node's best
split by Gini (classification) or variance (regression) over its own and the passive parties'
features, or a random allowed one where none lowers the impurity (``workers.forest.splits``).
It learns the instance spaces of every node and the leaf values, never a
passive party's feature, threshold, or which child of its split holds the lower values.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from boosting._typing import FloatArray, IntArray
from boosting.binning import goes_left, split_threshold
from boosting.forest import (bootstrap_weights, draw_features, features_per_node,
                             label_channels, leaf_value, node_rng, tree_rng)
from boosting.losses import n_outputs
from boosting.params import BoostParams
from boosting.tree import Model, Tree, TreeNode, save_model, write_json_atomic
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.schemes import PrivateKey, PublicKey, ciphertexts_to_bytes, generate_keypair
from messages.bodies import Ack
from messages.secureboost import NodeSplit, SplitChoice, SplitsFound
from messages.envelope import MsgType
from messages.forest import (MAX_TREES, EncryptedLabels, FeatureCount, ForestApplied,
                             ForestOpened, ForestSplits, ForestSpec, LevelHistograms,
                             LevelRequest, NodeRequest, OpenForest, TreeCommand)
from messages.instance_space import encode_mask
from workers import ProtocolError, StageError
from workers import checkpoint
from workers.data import save_categories
from workers.forest import trees as kept
from workers.forest.splits import (Decryption, FeatureOption, choose_split, own_options,
                                   passive_options)
from workers.handlers import StepContext
from workers.state import JobState
from workers.vertical.alignment import send_public_key
from workers.vertical.opening import bin_active_rows, open_active

log = logging.getLogger("fedboost.worker")

PROTOCOL = "vertical_random_forest"
REGRESSION_BITS = 40
"""Fixed-point bits of a regression target's encrypted channel (relative to its largest |y|)."""


def params_of(spec: ForestSpec) -> BoostParams:
    """The model file's parameters (a forest has no learning rate: 1)."""
    return BoostParams(n_trees=spec.n_trees, max_depth=spec.max_depth, learning_rate=1.0,
                       max_bin=spec.max_bin, objective=spec.objective,  # type: ignore[arg-type]
                       min_samples_leaf=spec.min_samples_leaf, seed=spec.seed)


@dataclass(slots=True)
class GrowingTree:
    """One tree being grown (one attempt of it)."""

    tree: int
    work: int
    weights: IntArray
    node_of_row: IntArray
    """Node of each training row in the sample (-1: not drawn)."""
    depth: int = 0
    level: list[int] = field(default_factory=list)
    """Nodes of the current level that are being split (their histograms asked for)."""
    next_id: int = 1
    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Internal nodes: children, owner and (own) feature/threshold or (passive) record id."""
    own_features: dict[int, IntArray] = field(default_factory=dict)
    asked: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    """Per passive party, per node, the features (its own indices) asked this level."""
    broadcast: list[NodeSplit] = field(default_factory=list)
    """Splits of the previous level, for every passive party to route its rows."""
    waiting: dict[str, set[int]] = field(default_factory=dict)
    """Per owner, the nodes whose split it must still apply (and send back)."""


@dataclass(slots=True)
class ActiveForest:
    """The active party's state of a forest job."""

    spec: ForestSpec
    params: BoostParams
    public: PublicKey
    private: PrivateKey
    n_classes: int = 0
    y: FloatArray = field(default_factory=lambda: np.empty(0))
    channels: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    packer: GradientPacker | None = None
    packing: BinSumPacking | None = None
    scale: float = 1.0
    """Fixed-point scale of the encrypted channels (regression; 1 for classes)."""
    feature_counts: dict[str, int] = field(default_factory=dict)
    node_keys: tuple[int, int] = (0, 0)
    """Keys of the nodes' feature draws and of their random splits: known to this party
    alone, so no other party replays them from the job's public seed."""
    labels_sent: bool = False
    trees: dict[int, list[Tree]] = field(default_factory=dict)
    """Finished trees (one per output), leaf values not yet divided by the number of trees."""
    growing: dict[int, GrowingTree] = field(default_factory=dict)
    saved: list[int] | None = None
    """The trees of the saved forest (what validation scores)."""
    score_margin: np.ndarray | None = None

    @property
    def outputs(self) -> int:
        return n_outputs(self.params.objective, self.n_classes)

    def finish(self, margin: FloatArray) -> FloatArray:
        """The forest's prediction is the sum of its (divided) leaves."""
        return margin

    def scoring_model(self) -> Model:
        """The saved forest, else the trees finished so far."""
        return self.model({}, self.saved)

    def model(self, features: dict[str, tuple[str, ...]], only: list[int] | None = None) -> Model:
        """The forest over ``only`` (default: every finished tree), leaves averaged."""
        chosen = sorted(self.trees) if only is None else only
        count = max(1, len(chosen))
        trees = tuple(Tree(nodes=tuple(replace(n, value=n.value / count) for n in t.nodes),
                           output=t.output)
                      for k in chosen for t in self.trees[k])
        return Model(self.params, (0.0,) * self.outputs, self.n_classes, trees, features,
                     ensemble="forest")


def _fields(node: TreeNode) -> dict[str, Any]:
    return {name: getattr(node, name) for name in TreeNode.__slots__}


def open_job(ctx: StepContext, body: OpenForest) -> tuple[MsgType, Any]:
    """Load labels and features, make the Paillier key pair; report the trees kept."""
    spec = body.spec
    state = open_active(ctx, spec, PROTOCOL)
    public, private = generate_keypair(spec.scheme, spec.key_bits,
                                       obfuscator=ctx.party.policy.obfuscator)
    state.role_state = ActiveForest(spec=spec, params=params_of(spec), public=public,
                                    private=private,
                                    node_keys=(_secret(ctx, state, "draws"),
                                               _secret(ctx, state, "splits")))
    ctx.state = state
    return MsgType.F_OPENED, ForestOpened(rows=len(state.data.ids),
                                          trees=kept.held_trees(ctx.model_dir, state.digest))


def _secret(ctx: StepContext, state: JobState, purpose: str) -> int:
    """A key only this party can make, the same for every run of exactly this job (so a
    retried tree is the same tree): an HMAC under its checkpoint key of the job's digest."""
    mac = hmac.new(checkpoint.key_of(ctx.party), f"{PROTOCOL} {purpose} {state.digest}".encode(),
                   hashlib.sha256)
    return int.from_bytes(mac.digest(), "big")


def prepare(ctx: StepContext, body: TreeCommand) -> tuple[MsgType, Any]:
    """Bin own features; encrypt the label channels once and send them (with the public key)
    to every passive party; load the kept trees; learn the passive parties' feature counts."""
    state: JobState = ctx.state
    run: ActiveForest = state.role_state
    if not run.labels_sent:
        _bin_and_encrypt(ctx, state, run, body.keep)
    ctx.mailbox.require(*[(MsgType.F_FEATURES, p, -1, -1) for p in state.passives])
    for passive in state.passives:
        count: FeatureCount = ctx.mailbox.take(MsgType.F_FEATURES, passive)
        if not 1 <= count.count <= 100_000:
            raise ProtocolError(f"{passive} reports {count.count} features")
        run.feature_counts[passive] = count.count
    return MsgType.ACK, Ack(count=state.data.x.shape[1] + sum(run.feature_counts.values()))


def _bin_and_encrypt(ctx: StepContext, state: JobState, run: ActiveForest,
                     keep: list[int]) -> None:
    y, run.n_classes = bin_active_rows(state, run.params.objective, run.params.max_bin)
    run.y = y
    run.channels = label_channels(run.params.objective, y, run.n_classes)
    for tree in keep:  # finished by an earlier run of this job
        raw = kept.load_tree(ctx.model_dir, checkpoint.key_of(ctx.party), state.digest, tree)
        run.trees[tree] = [Tree(nodes=tuple(TreeNode(**n) for n in t["nodes"]),
                                output=int(t["output"])) for t in raw]
    kept.keep_only(ctx.model_dir, set(keep))
    started = time.perf_counter()
    integers, value_bits = _fixed_point(run)
    run.packer = GradientPacker(value_bits, max(1, y.size))
    run.packer.check_fits(run.public.plaintext_bits)
    run.packing = BinSumPacking.for_key(run.packer.cell_bits, run.public.plaintext_bits)
    groups = -(-integers.shape[1] // 2)
    plaintexts: list[int] = []
    for g in range(groups):  # group-major: the passive party splits them by group
        first = integers[:, 2 * g]
        second = integers[:, 2 * g + 1] if 2 * g + 1 < integers.shape[1] else np.zeros_like(first)
        plaintexts += run.packer.pack(first.tolist(), second.tolist())
    blob = ciphertexts_to_bytes(run.private.encrypt_batch(plaintexts), run.public)
    send_public_key(ctx, state, run.public)
    labels = EncryptedLabels(groups=groups, value_bits=value_bits, max_rows=max(1, y.size),
                             ciphertexts=blob)
    for passive in state.passives:
        ctx.send(passive, MsgType.F_LABELS, labels)
    run.labels_sent = True
    log.info("%s: encrypted %d label ciphertexts in %.2f s", state.party, len(plaintexts),
             time.perf_counter() - started)


def _fixed_point(run: ActiveForest) -> tuple[np.ndarray, int]:
    """The channels as integers for packing, and their bits (classes: 0/1; a regression
    target: scaled to ``REGRESSION_BITS`` bits)."""
    if run.params.objective != "regression":
        run.scale = 1.0
        return run.channels.astype(np.int64), 1
    peak = float(np.max(np.abs(run.channels))) or 1.0
    run.scale = float(2 ** REGRESSION_BITS) / peak
    return np.rint(run.channels * run.scale).astype(np.int64), REGRESSION_BITS


def _all_features(state: JobState, run: ActiveForest) -> list[tuple[str, int]]:
    """(owner, local index) of every feature, own first, then each passive party's."""
    out = [(state.party, f) for f in range(state.data.x.shape[1])]
    for passive in state.passives:
        out += [(passive, f) for f in range(run.feature_counts[passive])]
    return out


def _only_own(run: ActiveForest, tree: int) -> bool:
    """Completely SecureBoost's protection for the forest: the first tree grows on the
    active party's features alone, and no passive party sees its instance spaces."""
    return run.spec.complete_secure and tree == 0


def _growing(run: ActiveForest, work: int) -> GrowingTree:
    grown = run.growing.get(work)
    if grown is None:
        raise StageError(f"tree work {work} is not being grown")
    return grown


def grow_level(ctx: StepContext, body: TreeCommand) -> tuple[MsgType, Any]:
    """Start a level: (level 0) draw the sample, else route the previous level's splits; draw
    each splittable node's features and ask the passive parties for their histograms."""
    state: JobState = ctx.state
    run: ActiveForest = state.role_state
    if not run.feature_counts:
        raise StageError("prepare has not run")
    tree, attempt = body.work % MAX_TREES, body.work // MAX_TREES
    if not 0 <= tree < run.spec.n_trees or attempt < 0:
        raise ProtocolError(f"tree work {body.work} is outside the job's {run.spec.n_trees} trees")
    if body.depth == 0:
        for other in [w for w in run.growing if w % MAX_TREES == tree]:
            run.growing.pop(other)  # an earlier attempt of this tree
        weights = bootstrap_weights(tree_rng(run.spec.seed, tree), run.y.size,
                                    run.spec.bootstrap)
        grown = GrowingTree(tree, body.work, weights,
                            np.where(weights > 0, 0, -1).astype(np.int64))
        run.growing[body.work] = grown
        candidates = [0]
    else:
        grown = _growing(run, body.work)
        if grown.depth != body.depth - 1:
            raise StageError(f"level {body.depth} of tree work {body.work}: the tree is at "
                             f"level {grown.depth}")
        _collect_applied(ctx, state, grown)
        grown.depth = body.depth
        candidates = [c for s in grown.broadcast for c in (s.left_id, s.right_id)]
    grown.level = [n for n in candidates if _splittable(run, grown, n, body.depth)]
    features = _all_features(state, run)
    if _only_own(run, tree):
        features = [(o, f) for o, f in features if o == state.party]
    k = features_per_node(run.spec.max_features, len(features))
    grown.own_features, grown.asked = {}, {p: {} for p in state.passives}
    for node in grown.level:
        rng = node_rng(run.spec.seed, tree, body.depth, int(_rows_of(grown, node)[0]),
                       run.node_keys[0])
        drawn = [features[i] for i in draw_features(rng, len(features), k)]
        grown.own_features[node] = np.array([f for o, f in drawn if o == state.party],
                                            dtype=np.int64)
        for passive in state.passives:
            mine = [f for o, f in drawn if o == passive]
            if mine:
                grown.asked[passive][node] = mine
    hidden = _only_own(run, tree)
    for passive in state.passives:
        ctx.send(passive, MsgType.F_REQUEST, LevelRequest(
            tree=body.work, depth=body.depth,
            weights=(b"" if hidden or body.depth else
                     grown.weights.astype("<u2").tobytes()),
            splits=[] if hidden else grown.broadcast,
            requests=[NodeRequest(n, f) for n, f in grown.asked[passive].items()]))
    grown.broadcast = []
    return MsgType.ACK, Ack(count=len(grown.level))


def _rows_of(grown: GrowingTree, node: int) -> IntArray:
    return np.flatnonzero(grown.node_of_row == node)


def _splittable(run: ActiveForest, grown: GrowingTree, node: int, depth: int) -> bool:
    """A node may split if the depth allows and it has room for two leaves (distinct rows):
    what passive parties check themselves. Pure nodes too (``workers.forest.splits``)."""
    return depth < run.spec.max_depth \
        and _rows_of(grown, node).size >= 2 * run.spec.min_samples_leaf


def find_splits(ctx: StepContext, body: TreeCommand) -> tuple[MsgType, Any]:
    """Decrypt the passive parties' histograms and choose every node's split
    (``workers.forest.splits``); apply own splits, send each owner its splits."""
    state: JobState = ctx.state
    run: ActiveForest = state.role_state
    grown = _growing(run, body.work)
    if grown.depth != body.depth:
        raise StageError(f"find_splits t{body.work} d{body.depth}: tree is at d{grown.depth}")
    ctx.mailbox.require(*[(MsgType.F_HISTOGRAMS, p, body.work, body.depth)
                          for p in state.passives])
    options: dict[int, list[FeatureOption]] = {n: [] for n in grown.level}
    how = _decryption(run)
    for passive in state.passives:
        msg: LevelHistograms = ctx.mailbox.take(MsgType.F_HISTOGRAMS, passive, body.work,
                                                body.depth)
        for node, option in passive_options(how, passive, grown.asked[passive], msg):
            options[node].append(option)
    bins = state.require_bins()
    owners: dict[str, list[SplitChoice]] = {}
    n_splits = 0
    for node in grown.level:
        rows = _rows_of(grown, node)
        w = grown.weights[rows].astype(np.float64)
        options[node] += [own_options(state.party, run.params.objective, bins[rows, f], w,
                                      run.channels[rows], f, how.n_bins, how.min_samples_leaf)
                          for f in grown.own_features[node].tolist()]
        rng = node_rng(run.spec.seed, grown.tree, body.depth, int(rows[0]), run.node_keys[1])
        chosen = choose_split(options[node], rng, run.spec.min_samples_leaf)
        if chosen is None:
            continue
        owner, split = chosen
        n_splits += 1
        if owner == state.party:
            left = goes_left(bins[rows, split.feature], split.bin, split.missing_left,
                             run.params.max_bin)
            grown.nodes[node] = {"owner": owner, "feature": split.feature, "bin": split.bin,
                                 "threshold": split_threshold(state.cuts[split.feature],
                                                              split.bin),
                                 "missing_left": split.missing_left}
            _split_node(grown, node, left)
        else:
            owners.setdefault(owner, []).append(SplitChoice(node, split.feature, split.bin,
                                                            split.missing_left))
    grown.waiting = {owner: {c.node for c in choices} for owner, choices in owners.items()}
    for owner, choices in owners.items():
        ctx.send(owner, MsgType.F_SPLITS, ForestSplits(body.work, body.depth, choices))
    return MsgType.SPLITS_FOUND, SplitsFound(owners=sorted(owners), n_splits=n_splits,
                                             n_leaves=len(grown.level) - n_splits)


def _decryption(run: ActiveForest) -> Decryption:
    if run.packer is None or run.packing is None:
        raise StageError("prepare has not run")
    return Decryption(run.private, run.packer, run.packing, run.scale, run.channels.shape[1],
                      run.params.objective, run.params.max_bin + 1, run.spec.min_samples_leaf)


def _split_node(grown: GrowingTree, node: int, left: np.ndarray) -> None:
    """Give ``node`` two new children; ``left`` over its sampled rows (ascending)."""
    rows = _rows_of(grown, node)
    left_id, right_id = grown.next_id, grown.next_id + 1
    grown.next_id += 2
    grown.nodes[node].update(left=left_id, right=right_id)
    grown.node_of_row[rows[left]] = left_id
    grown.node_of_row[rows[~left]] = right_id
    grown.broadcast.append(NodeSplit(node, left_id, right_id, encode_mask(left)))


def _collect_applied(ctx: StepContext, state: JobState, grown: GrowingTree) -> None:
    """Take the owners' answers for the previous level's passive splits."""
    ctx.mailbox.require(*[(MsgType.F_APPLIED, owner, grown.work, grown.depth)
                          for owner in grown.waiting])
    for owner, nodes in grown.waiting.items():
        msg: ForestApplied = ctx.mailbox.take(MsgType.F_APPLIED, owner, grown.work, grown.depth)
        if set(msg.nodes) != nodes or len(msg.nodes) != len(set(msg.nodes)) \
                or not len(msg.nodes) == len(msg.records) == len(msg.first):
            raise ProtocolError(f"{owner} applied splits of nodes {sorted(msg.nodes)}, asked "
                                f"{sorted(nodes)}")
        for node, record, first in zip(msg.nodes, msg.records, msg.first):
            size = _rows_of(grown, node).size
            if len(first) != (size + 7) // 8:
                raise ProtocolError(f"{owner}: node {node}'s children cover the wrong rows")
            left = np.unpackbits(np.frombuffer(first, dtype=np.uint8), count=size).astype(bool)
            if left.all() or not left.any():
                raise ProtocolError(f"{owner}: node {node}'s split leaves a child empty")
            grown.nodes[node] = {"owner": owner, "record_id": int(record)}
            _split_node(grown, node, left)
    grown.waiting = {}


def finish_tree(ctx: StepContext, body: TreeCommand) -> tuple[MsgType, Any]:
    """Take the last splits, compute the leaves, keep the tree on disk."""
    state: JobState = ctx.state
    run: ActiveForest = state.role_state
    grown = _growing(run, body.work)
    _collect_applied(ctx, state, grown)
    trees = _assemble(run, grown)
    kept.save_tree(ctx.model_dir, checkpoint.key_of(ctx.party), state.digest, grown.tree,
                   [{"output": t.output, "nodes": [_fields(n) for n in t.nodes]}
                    for t in trees])
    run.trees[grown.tree] = trees
    run.growing.pop(body.work, None)
    ctx.mailbox.drop_tree(body.work)
    return MsgType.ACK, Ack(count=sum(len(t.nodes) for t in trees))


def _assemble(run: ActiveForest, grown: GrowingTree) -> list[Tree]:
    """The tree per output, nodes parents-first, leaves with undivided values."""
    leaves = {}
    children = [0]
    order = []
    while children:
        node = children.pop(0)
        order.append(node)
        inner = grown.nodes.get(node)
        if inner is not None and "left" in inner:
            children += [inner["left"], inner["right"]]
        else:
            rows = _rows_of(grown, node)
            leaves[node] = leaf_value(run.params.objective, run.y[rows],
                                      grown.weights[rows].astype(np.float64), run.n_classes, 1)
    trees = []
    for output in range(run.outputs):
        nodes = []
        for node in sorted(order):
            inner = grown.nodes.get(node)
            if node in leaves:
                nodes.append(TreeNode(id=node, value=float(leaves[node][output])))
            else:
                assert inner is not None
                nodes.append(TreeNode(id=node, left=inner["left"], right=inner["right"],
                                      owner=inner["owner"], feature=inner.get("feature", -1),
                                      bin=inner.get("bin", -1),
                                      threshold=inner.get("threshold", float("nan")),
                                      missing_left=inner.get("missing_left", False),
                                      record_id=inner.get("record_id", -1)))
        trees.append(Tree(nodes=tuple(nodes), output=output))
    return trees


def save_model_part(ctx: StepContext, body: TreeCommand) -> tuple[MsgType, Any]:
    """Write the forest of the trees the flow keeps: the same files as SecureBoost's."""
    state: JobState = ctx.state
    run: ActiveForest = state.role_state
    chosen = sorted(body.keep)
    missing = sorted(set(chosen) - set(run.trees))
    if missing:
        raise StageError(f"{state.party}: trees {missing} are not finished here")
    features = {state.party: state.data.names, **{p: () for p in state.passives}}
    save_model(run.model(features, chosen), Path(ctx.model_dir) / "model.json")
    run.saved = chosen
    save_categories(Path(ctx.model_dir), state.data.categories)
    write_json_atomic(Path(ctx.model_dir) / "party.json", {
        "party": state.party, "role": "active", "job": ctx.job, "saved_at": time.time(),
        "parties": [state.party, *state.passives]})
    return MsgType.ACK, Ack(count=len(chosen))


def close_job(ctx: StepContext, _: Any) -> tuple[MsgType, Any]:
    """The forest is saved: drop the kept trees."""
    if isinstance(getattr(ctx.state, "role_state", None), ActiveForest):
        kept.discard(ctx.model_dir)
    return MsgType.ACK, Ack()
