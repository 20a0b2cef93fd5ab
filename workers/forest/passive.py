"""A passive party (feature holder) of the vertical random forest (seed 002).

It holds the active party's label channels encrypted (sent once per job), each tree's sample
weights and the instance spaces of its nodes. Per level it sums, for the features the active
party drew for each node, the encrypted label channels per bin (each sampled row as often as it
was drawn), packs the sums and sends them. For a split it owns it keeps the threshold in its
lookup table and shows the active party the two children in random order (``flip``), so the
active party never learns which side holds the lower values of the feature.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boosting._typing import IntArray
from boosting.binning import goes_left, split_threshold
from boosting.forest import bootstrap_weights, tree_rng
from boosting.tree import write_json_atomic
from crypto._gmp import mpz
from crypto.bin_products import bin_products
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.schemes import (PublicKey, ciphertexts_from_bytes, ciphertexts_to_bytes,
                            public_key_from_n)
from messages.bodies import Ack
from messages.secureboost import PublicKeyMsg
from messages.envelope import Kind, MsgType
from messages.forest import (MAX_TREES, EncryptedLabels, FeatureCount, ForestApplied,
                             ForestOpened, ForestSplits, ForestSpec, LevelHistograms,
                             LevelRequest, OpenForest, TreeCommand)
from messages.instance_space import decode_mask
from workers import ProtocolError, StageError, checkpoint
from workers.column_partitioned.alignment import receive_alignment
from workers.column_partitioned.lookup import (LookupRecord, lookup_to_dict,
                                               record_from_dict, record_to_dict)
from workers.column_partitioned.opening import bin_training_rows, open_passive
from workers.data import save_categories
from workers.forest import trees as kept
from workers.forest.active import PROTOCOL, REGRESSION_BITS
from workers.forest.budget import FeatureLedger, check_features_summed, dataset_digest
from workers.handlers import StepContext
from workers.policy import check_key_bits
from workers.state import JobState
from workers.model_folder import ModelPart

MAX_GROUPS = 64
"""Most label groups (two channels each) a multiclass job may send: 128 classes."""
RECORDS_PER_TREE = 65_536
"""Record ids of tree t are t * RECORDS_PER_TREE + k: unique in the forest's lookup table."""


@dataclass(slots=True)
class TreeWork:
    """One tree (attempt) at this party: the sample and where each sampled row is."""

    work: int
    weights: IntArray
    node_of_row: IntArray
    depth: int = 0
    level: set[int] = field(default_factory=set)
    node_ids: set[int] = field(default_factory=set)
    split_here: set[int] = field(default_factory=set)
    records: dict[int, LookupRecord] = field(default_factory=dict)


@dataclass(slots=True)
class PassiveForest:
    """The passive party's state of a forest job."""

    spec: ForestSpec
    features_sent: bool = False
    public: PublicKey | None = None
    labels: list[list[mpz]] = field(default_factory=list)
    """Per label group, per training row, the encrypted packed channels."""
    packing: BinSumPacking | None = None
    trees: dict[int, TreeWork] = field(default_factory=dict)
    records: dict[int, LookupRecord] = field(default_factory=dict)
    """Every finished tree's records (the lookup table)."""
    summed: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per level, over every tree (and attempt) of the job so far: the nodes asked about and
    the features summed for them (``workers.forest.budget``), where no ledger keeps them."""
    features_ledger: FeatureLedger | None = None
    """The same sums over every forest job on this data set, on disk (a worker's jobs)."""


def open_job(ctx: StepContext, body: OpenForest) -> tuple[Kind, Any]:
    """Load own features (no labels); report the trees kept."""
    spec = body.spec
    state = open_passive(ctx, spec, PROTOCOL)
    state.role_state = PassiveForest(spec=spec, features_ledger=FeatureLedger(
        ctx.party.private_dir(), dataset_digest(state.data_file, state.data.names)))
    ctx.state = state
    return MsgType.F_OPENED, ForestOpened(rows=len(state.data.ids),
                                          trees=kept.held_trees(ctx.model_dir, state.digest))


def prepare(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
    """Tell the active party the feature count; take the alignment, the key and the encrypted
    labels; bin own features; load the kept trees' records."""
    state: JobState = ctx.state
    run: PassiveForest = state.role_state
    if not run.features_sent:
        ctx.send(state.active, MsgType.F_FEATURES, FeatureCount(state.data.x.shape[1]))
        run.features_sent = True
    ctx.mailbox.require((MsgType.ALIGNED_ROWS, state.active, -1, -1),
                        (MsgType.PUBLIC_KEY, state.active, -1, -1),
                        (MsgType.F_LABELS, state.active, -1, -1))
    key: PublicKeyMsg = ctx.mailbox.take(MsgType.PUBLIC_KEY, state.active)
    n = int.from_bytes(key.n, "big")
    check_key_bits(ctx.party.policy, ctx.party.name, n.bit_length(),
                   f"the public key {state.active} sent", state.scheme)
    run.public = public_key_from_n(state.scheme, n, expected_bits=state.key_bits)
    receive_alignment(ctx)
    n_train = state.train_rows.size
    labels: EncryptedLabels = ctx.mailbox.take(MsgType.F_LABELS, state.active)
    _check_label_shape(run.spec, labels, n_train)
    parsed = ciphertexts_from_bytes(labels.ciphertexts, run.public)  # range-checked
    if len(parsed) != labels.groups * n_train:
        raise ProtocolError(f"{len(parsed)} label ciphertexts for {n_train} rows in "
                            f"{labels.groups} groups")
    run.labels = [parsed[g * n_train:(g + 1) * n_train] for g in range(labels.groups)]
    packer = GradientPacker(labels.value_bits, labels.max_rows)
    run.packing = BinSumPacking.for_key(packer.cell_bits, run.public.plaintext_bits)
    bin_training_rows(state, run.spec.params.max_bin)
    for tree in body.keep:
        raw = kept.load_tree(ctx.model_dir, checkpoint.key_of(ctx.party), state.digest, tree)
        for rid, r in raw.items():
            run.records[int(rid)] = record_from_dict(r)
    kept.keep_only(ctx.model_dir, set(body.keep))
    return MsgType.ACK, Ack(count=state.data.x.shape[1])


def _check_label_shape(spec: ForestSpec, labels: EncryptedLabels, n_train: int) -> None:
    """The labels come in the one shape the job's objective has: 0/1 channels (classes) or
    40-bit fixed point (regression), one group of two channels unless multiclass, for this
    party's rows. The shape sets how wide each bin sum is packed; an active party that
    declared a wider one (with chosen plaintexts in place of labels) would read more bits of
    every sum (docs/threat-model.md)."""
    bits = REGRESSION_BITS if spec.params.objective == "regression" else 1
    most = MAX_GROUPS if spec.params.objective == "multiclass" else 1
    if not 1 <= labels.groups <= most or labels.value_bits != bits \
            or labels.max_rows != n_train:
        raise ProtocolError(f"labels of {labels.groups} groups, {labels.value_bits} bits for "
                            f"{labels.max_rows} rows; a {spec.params.objective} job has 1 to {most} "
                            f"groups of {bits} bits, and this party has {n_train} rows")


def build_histograms(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
    """Route the previous level's splits, then sum the label channels per bin of each
    requested (node, feature) and send them packed."""
    state: JobState = ctx.state
    run: PassiveForest = state.role_state
    ctx.mailbox.require((MsgType.F_REQUEST, state.active, body.work, body.depth))
    request: LevelRequest = ctx.mailbox.take(MsgType.F_REQUEST, state.active, body.work,
                                             body.depth)
    bins = state.require_bins()
    tree = body.work % MAX_TREES
    if not 0 <= tree < run.spec.params.n_trees or body.work < 0:
        raise ProtocolError(f"tree work {body.work} is outside the job")
    if body.depth == 0:
        work = _start_tree(run, request, bins.shape[0])
    else:
        work = run.trees.get(body.work) or _missing(body.work)
        if work.depth != body.depth - 1:
            raise StageError(f"level {body.depth} of tree work {body.work}: at {work.depth}")
        _route(ctx.party.name, work, request)
    histograms = _histograms(ctx.party.name, run, work, request, bins)
    ctx.send(state.active, MsgType.F_HISTOGRAMS, histograms)
    return MsgType.ACK, Ack(count=len(request.requests))


def _missing(work: int) -> TreeWork:
    raise StageError(f"tree work {work} has not started here")


def _start_tree(run: PassiveForest, request: LevelRequest, n_rows: int) -> TreeWork:
    """A new tree (attempt): its sample weights; earlier attempts of the tree are dropped."""
    tree = request.tree % MAX_TREES
    for other in [w for w in run.trees if w % MAX_TREES == tree]:
        run.trees.pop(other)
    if request.weights:
        if len(request.weights) != 2 * n_rows:
            raise ProtocolError(f"tree {tree}: sample weights for {len(request.weights) // 2} "
                                f"rows, this party has {n_rows}")
        weights = np.frombuffer(request.weights, dtype="<u2").astype(np.int64)
        # the sample is the job's: drawn from its public seed, so this party checks it whole.
        # Any other would let the active party choose which rows it sums, and how often.
        drawn = bootstrap_weights(tree_rng(run.spec.params.seed, tree), n_rows, run.spec.params.bootstrap)
        if not np.array_equal(weights, drawn):
            raise ProtocolError(f"tree {tree}: the sample weights are not the job's "
                                f"bootstrap={run.spec.params.bootstrap} sample of {n_rows} rows "
                                f"(seed {run.spec.params.seed})")
    else:  # a tree this party takes no part in (Completely SecureBoost's first one)
        weights = np.zeros(n_rows, dtype=np.int64)
    work = TreeWork(request.tree, weights, np.where(weights > 0, 0, -1).astype(np.int64),
                    level={0}, node_ids={0})
    run.trees[request.tree] = work
    return work


def _route(party: str, work: TreeWork, request: LevelRequest) -> None:
    """Apply the previous level's splits: each node of the level at most once, new children."""
    nodes = [s.node for s in request.splits]
    children = [c for s in request.splits for c in (s.left_id, s.right_id)]
    if len(set(nodes)) != len(nodes) or not set(nodes) <= work.level:
        raise ProtocolError(f"{party}: tree work {request.tree} d{request.depth}: splits of "
                            f"nodes {nodes}, the level has {sorted(work.level)}")
    if len(set(children)) != len(children) or set(children) & work.node_ids \
            or any(not 0 < c < 2 ** 20 for c in children):
        raise ProtocolError(f"{party}: tree work {request.tree}: children {children} are not "
                            f"all new and distinct")
    for split in request.splits:
        rows = np.flatnonzero(work.node_of_row == split.node)
        left = decode_mask(split.left, rows.size)
        work.node_of_row[rows[left]] = split.left_id
        work.node_of_row[rows[~left]] = split.right_id
    work.depth = request.depth
    work.level = set(children)
    work.node_ids |= work.level
    work.split_here = set()


def _histograms(party: str, run: PassiveForest, work: TreeWork, request: LevelRequest,
                bins: np.ndarray) -> LevelHistograms:
    n_features = bins.shape[1]
    n_bins = run.spec.params.max_bin + 1
    nodes = [r.node for r in request.requests]
    if len(set(nodes)) != len(nodes) or not set(nodes) <= work.level:
        raise ProtocolError(f"{party}: histograms asked for nodes {nodes}; the level has "
                            f"{sorted(work.level)}, one request each")
    public, packing = run.public, run.packing
    if public is None or packing is None:
        raise StageError("prepare has not run")
    node_rows = []
    for req in request.requests:  # every request checked before anything is summed
        features = list(req.features)
        if not features or len(set(features)) != len(features) \
                or not all(0 <= f < n_features for f in features):
            raise ProtocolError(f"{party}: node {req.node}: features {features} out of range "
                                f"or repeated")
        rows = np.flatnonzero(work.node_of_row == req.node)
        if rows.size < 2 * run.spec.params.min_samples_leaf:  # distinct rows: weights can repeat one
            raise ProtocolError(f"{party}: node {req.node} holds fewer than two leaves' "
                                f"{run.spec.params.min_samples_leaf} rows: refused")
        node_rows.append((features, rows))
    asked = [len(f) for f, _ in node_rows]
    if run.features_ledger is not None:  # written before anything is summed and sent
        run.features_ledger.check(party, run.spec.params.max_features, n_features, request.depth, asked)
    else:
        run.summed[request.depth] = check_features_summed(
            party, run.spec.params.max_features, n_features, request.depth,
            run.summed.get(request.depth, (0, 0)), asked)
    sums: list[list[mpz]] = [[] for _ in run.labels]
    for features, rows in node_rows:
        drawn = np.repeat(rows, work.weights[rows])  # a row drawn k times is summed k times
        codes = bins[drawn][:, features]
        for g, labels in enumerate(run.labels):
            sums[g] += bin_products(codes, drawn, labels, n_bins, public.cipher_modulus)
    filled = np.array([c != 1 for c in sums[0]], dtype=bool) if sums else np.zeros(0, bool)
    blobs = [ciphertexts_to_bytes(packing.pack([c for c, full in zip(group, filled) if full],
                                               public.cipher_modulus, public), public)
             for group in sums] if request.requests else []
    return LevelHistograms(tree=request.tree, depth=request.depth,
                           filled=np.packbits(filled).tobytes(),
                           per_ciphertext=packing.per_ciphertext, ciphertexts=blobs)


def apply_splits(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
    """Record the owned splits and return each node's rows of a randomly chosen first child."""
    state: JobState = ctx.state
    run: PassiveForest = state.role_state
    ctx.mailbox.require((MsgType.F_SPLITS, state.active, body.work, body.depth))
    msg: ForestSplits = ctx.mailbox.take(MsgType.F_SPLITS, state.active, body.work, body.depth)
    work = run.trees.get(body.work) or _missing(body.work)
    bins = state.require_bins()
    nodes = [c.node for c in msg.splits]
    if len(set(nodes)) != len(nodes) or not set(nodes) <= work.level - work.split_here:
        raise ProtocolError(f"{ctx.party.name}: refused splits of nodes {nodes}: one split per "
                            f"open node of the level ({sorted(work.level - work.split_here)})")
    if work.depth != body.depth or body.depth >= run.spec.params.max_depth:
        raise ProtocolError(f"{ctx.party.name}: refused splits at level {body.depth}")
    out_nodes, records, first = [], [], []
    for choice in msg.splits:
        if not (0 <= choice.feature < bins.shape[1] and 0 <= choice.bin < run.spec.params.max_bin):
            raise ProtocolError(f"{ctx.party.name}: split on feature {choice.feature} bin "
                                f"{choice.bin} is out of range")
        rows = np.flatnonzero(work.node_of_row == choice.node)
        left = goes_left(bins[rows, choice.feature], choice.bin, choice.missing_left,
                         run.spec.params.max_bin)
        flip = bool(secrets.randbits(1))  # which child the active party sees first
        record_id = (body.work % MAX_TREES) * RECORDS_PER_TREE + len(work.records)
        work.records[record_id] = LookupRecord(
            feature=choice.feature, bin=choice.bin, missing_left=choice.missing_left,
            threshold=split_threshold(state.cuts[choice.feature], choice.bin), flip=flip,
            tree=body.work % MAX_TREES, depth=body.depth)
        out_nodes.append(choice.node)
        records.append(record_id)
        first.append(np.packbits(left ^ flip).tobytes())
    work.split_here |= set(nodes)
    ctx.send(state.active, MsgType.F_APPLIED, ForestApplied(body.work, body.depth, out_nodes,
                                                            records, first))
    return MsgType.ACK, Ack(count=len(out_nodes))


def finish_tree(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
    """Keep the tree's records (on disk too) and drop its sample."""
    state: JobState = ctx.state
    run: PassiveForest = state.role_state
    work = run.trees.pop(body.work, None) or _missing(body.work)
    kept.save_tree(ctx.model_dir, checkpoint.key_of(ctx.party), state.digest,
                   body.work % MAX_TREES,
                   {str(k): record_to_dict(r) for k, r in work.records.items()})
    run.records.update(work.records)
    ctx.mailbox.drop_tree(body.work)
    return MsgType.ACK, Ack(count=len(work.records))


def save_model_part(ctx: StepContext, body: TreeCommand) -> tuple[Kind, Any]:
    """Write the lookup table of the kept trees (SecureBoost's file format)."""
    state: JobState = ctx.state
    run: PassiveForest = state.role_state
    chosen = set(body.keep)
    records = {k: r for k, r in run.records.items() if k // RECORDS_PER_TREE in chosen}
    write_json_atomic(ModelPart(ctx.model_dir).lookup, lookup_to_dict(
        state.party, ctx.job, state.data.names, records))
    save_categories(ctx.model_dir, state.data.categories)
    write_json_atomic(ModelPart(ctx.model_dir).party, {
        "party": state.party, "role": "passive", "job": ctx.job, "saved_at": time.time(),
        "active": state.active})
    return MsgType.ACK, Ack(count=len(records))


def close_job(ctx: StepContext, _: Any) -> tuple[Kind, Any]:
    """The forest is saved: drop the kept trees."""
    if isinstance(getattr(ctx.state, "role_state", None), PassiveForest):
        kept.discard(ctx.model_dir)
    return MsgType.ACK, Ack()
