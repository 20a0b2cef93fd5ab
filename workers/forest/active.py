"""The active party (label holder) of the vertical random forest (seed 002, Alg. 2-4).

It encrypts its label channels once per job and sends them to every passive party. Per tree it
draws the bootstrap sample (from the job's seed) and per node the features (under a key of its
own: no other party can replay the draws); per level it asks each passive party for the
encrypted per-bin label sums of its drawn features, decrypts them, and picks each node's best
split by Gini (classification) or variance (regression) over its own and the passive parties'
features, or a random allowed one where none lowers the impurity (``workers.forest.splits``).
It learns the instance spaces of every node and the leaf values, never a
passive party's feature, threshold, or which child of its split holds the lower values.

Its state is in ``workers.forest.active_state``, a tree's rows, splits and assembly in
``workers.forest.growing``; here are its steps.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from boosting.binning import goes_left, split_threshold
from boosting.forest import (bootstrap_weights, draw_features, features_per_node,
                             label_channels, node_rng, tree_rng)
from boosting.tree import Tree, TreeNode, save_model, write_json_atomic
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.schemes import ciphertexts_to_bytes, generate_keypair
from messages.bodies import Ack
from messages.secureboost import SplitChoice, SplitsFound
from messages.envelope import Kind, MsgType
from messages.forest import (MAX_TREES, EncryptedLabels, FeatureCount, ForestOpened,
                             ForestSplits, LevelHistograms, LevelRequest, NodeRequest,
                             OpenForest, TreeCommand)
from workers import ProtocolError, StageError
from workers import checkpoint
from workers.column_partitioned.alignment import send_public_key
from workers.column_partitioned.opening import bin_active_rows, open_active
from workers.data import save_categories
from workers.forest import trees as kept
from workers.forest.active_state import ActiveForest, GrowingTree, params_of
from workers.forest.growing import assemble, collect_applied, rows_of, split_node
from workers.forest.splits import (Decryption, FeatureOption, choose_split, own_options,
                                   passive_options)
from workers.handlers import StepContext
from workers.state import JobState
from workers.model_folder import ModelPart

log = logging.getLogger("fedboost.worker")

PROTOCOL = "vertical_random_forest"
REGRESSION_BITS = 40
"""Fixed-point bits of a regression target's encrypted channel (relative to its largest |y|)."""


def _fields(node: TreeNode) -> dict[str, Any]:
    return {name: getattr(node, name) for name in TreeNode.__slots__}


def open_job(ctx: StepContext, body: OpenForest) -> tuple[Kind, Any]:
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


def prepare(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
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
    return run.spec.params.complete_secure and tree == 0


def _growing(run: ActiveForest, work: int) -> GrowingTree:
    grown = run.growing.get(work)
    if grown is None:
        raise StageError(f"tree work {work} is not being grown")
    return grown


def grow_level(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
    """Start a level: (level 0) draw the sample, else route the previous level's splits; draw
    each splittable node's features and ask the passive parties for their histograms."""
    state: JobState = ctx.state
    run: ActiveForest = state.role_state
    if not run.feature_counts:
        raise StageError("prepare has not run")
    tree, attempt = body.work % MAX_TREES, body.work // MAX_TREES
    if not 0 <= tree < run.spec.params.n_trees or attempt < 0:
        raise ProtocolError(f"tree work {body.work} is outside the job's {run.spec.params.n_trees} trees")
    if body.depth == 0:
        for other in [w for w in run.growing if w % MAX_TREES == tree]:
            run.growing.pop(other)  # an earlier attempt of this tree
        weights = bootstrap_weights(tree_rng(run.spec.params.seed, tree), run.y.size,
                                    run.spec.params.bootstrap)
        grown = GrowingTree(tree, body.work, weights,
                            np.where(weights > 0, 0, -1).astype(np.int64))
        run.growing[body.work] = grown
        candidates = [0]
    else:
        grown = _growing(run, body.work)
        if grown.depth != body.depth - 1:
            raise StageError(f"level {body.depth} of tree work {body.work}: the tree is at "
                             f"level {grown.depth}")
        collect_applied(ctx, state, grown)
        grown.depth = body.depth
        candidates = [c for s in grown.broadcast for c in (s.left_id, s.right_id)]
    grown.level = [n for n in candidates if _splittable(run, grown, n, body.depth)]
    features = _all_features(state, run)
    if _only_own(run, tree):
        features = [(o, f) for o, f in features if o == state.party]
    k = features_per_node(run.spec.params.max_features, len(features))
    grown.own_features, grown.asked = {}, {p: {} for p in state.passives}
    for node in grown.level:
        rng = node_rng(run.spec.params.seed, tree, body.depth, int(rows_of(grown, node)[0]),
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


def _splittable(run: ActiveForest, grown: GrowingTree, node: int, depth: int) -> bool:
    """A node may split if the depth allows and it has room for two leaves (distinct rows):
    what passive parties check themselves. Pure nodes too (``workers.forest.splits``)."""
    return depth < run.spec.params.max_depth \
        and rows_of(grown, node).size >= 2 * run.spec.params.min_samples_leaf


def find_splits(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
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
        rows = rows_of(grown, node)
        w = grown.weights[rows].astype(np.float64)
        options[node] += [own_options(state.party, run.params.objective, bins[rows, f], w,
                                      run.channels[rows], f, how.n_bins, how.min_samples_leaf)
                          for f in grown.own_features[node].tolist()]
        rng = node_rng(run.spec.params.seed, grown.tree, body.depth, int(rows[0]), run.node_keys[1])
        chosen = choose_split(options[node], rng, run.spec.params.min_samples_leaf)
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
            split_node(grown, node, left)
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
                      run.params.objective, run.params.max_bin + 1, run.spec.params.min_samples_leaf)


def finish_tree(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
    """Take the last splits, compute the leaves, keep the tree on disk."""
    state: JobState = ctx.state
    run: ActiveForest = state.role_state
    grown = _growing(run, body.work)
    collect_applied(ctx, state, grown)
    trees = assemble(run, grown)
    kept.save_tree(ctx.model_dir, checkpoint.key_of(ctx.party), state.digest, grown.tree,
                   [{"output": t.output, "nodes": [_fields(n) for n in t.nodes]}
                    for t in trees])
    run.trees[grown.tree] = trees
    run.growing.pop(body.work, None)
    ctx.mailbox.drop_tree(body.work)
    return MsgType.ACK, Ack(count=sum(len(t.nodes) for t in trees))


def save_model_part(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
    """Write the forest of the trees the flow keeps: the same files as SecureBoost's."""
    state: JobState = ctx.state
    run: ActiveForest = state.role_state
    chosen = sorted(body.keep)
    missing = sorted(set(chosen) - set(run.trees))
    if missing:
        raise StageError(f"{state.party}: trees {missing} are not finished here")
    features = {state.party: state.data.names, **{p: () for p in state.passives}}
    save_model(run.model(features, chosen), ModelPart(Path(ctx.model_dir)).model)
    run.saved = chosen
    save_categories(Path(ctx.model_dir), state.data.categories)
    write_json_atomic(ModelPart(Path(ctx.model_dir)).party, {
        "party": state.party, "role": "active", "job": ctx.job, "saved_at": time.time(),
        "parties": [state.party, *state.passives]})
    return MsgType.ACK, Ack(count=len(chosen))


def close_job(ctx: StepContext, _: Any) -> tuple[Kind, Any]:
    """The forest is saved: drop the kept trees."""
    if isinstance(getattr(ctx.state, "role_state", None), ActiveForest):
        kept.discard(ctx.model_dir)
    return MsgType.ACK, Ack()
