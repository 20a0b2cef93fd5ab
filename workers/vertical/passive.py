"""A passive party (feature holder) in vertical SecureBoost (SecureBoost Alg. 1-2, Fig. 3).

It sees only ciphertexts of g/h, the instance spaces of nodes, and the splits it owns; it keeps
a lookup table ``record_id -> (feature, threshold, missing direction)``
(``workers.column_partitioned.lookup``) and never learns leaf values or labels. Its encrypted
histograms, summed with its helper processes, are ``workers.vertical.histograms``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boosting.binning import goes_left, split_threshold
from boosting.grow import smaller_child
from boosting.params import BoostParams
from boosting.tree import write_json_atomic
from crypto._gmp import mpz
from crypto.compress import BinSumPacking
from crypto.schemes import PublicKey, public_key_from_n
from messages.bodies import Ack, Opened, ResumeJob, Step
from messages.secureboost import (AppliedSplit, AppliedSplits, EncryptedGradients, NodePositions,
                                  NodeSplit, OpenJob, PublicKeyMsg, SplitChoices)
from messages.envelope import Kind, MsgType
from messages.instance_space import InstanceSpace, decode_mask, encode_mask
from workers import ProtocolError, StageError, checkpoint
from workers.column_partitioned.alignment import receive_alignment
from workers.column_partitioned.lookup import LookupRecord, lookup_to_dict
from workers.column_partitioned.opening import bin_training_rows, open_passive
from workers.data import save_categories
from workers.handlers import StepContext
from workers.policy import check_bin_sum_packer, check_key_bits
from workers.shards import LevelWork
from workers.state import JobState
from workers.vertical.active import PROTOCOL, params_of
from workers.vertical.early_stopping import kept_records
from workers.vertical.root_histogram import ArrivingTree, add_chunks, check_tree_start, in_order
from workers.model_folder import ModelPart

log = logging.getLogger("fedboost.worker")


@dataclass(slots=True)
class PassiveTraining:
    """The passive party's training state for the tree being grown."""

    params: BoostParams
    private: bool = False
    """The job is under differential privacy: the active party draws every split among all
    bins (it does not know this party's cuts), so a child may hold no rows."""
    public: PublicKey | None = None
    tree: int = -1
    growing: bool = False
    """The tree's gradients are taken and the tree is not finished yet."""
    chunks: tuple[bytes, ...] = ()
    """The tree's E(g, h, 1) of in-tree rows, fixed width, chunks as received: kept only with
    several helpers, whose first level brings them the whole tree."""
    tree_ciphertexts: list[mpz] = field(default_factory=list)
    """The same, parsed and range-checked once per tree (this process sums from them)."""
    tree_digest: bytes = b""
    """Their SHA-256, which names them to helpers (hashed chunk by chunk as the tree starts)."""
    enc_index: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    in_tree: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    node_of_row: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    packing: BinSumPacking | None = None
    """How the tree's bin sums are packed for the trip back (from the gradients' layout)."""
    depth: int = -1
    level_nodes: set[int] = field(default_factory=set)
    """The nodes of the current level (the root, then the previous level's children): the only
    nodes a split may be asked for, one each."""
    split_here: set[int] = field(default_factory=set)
    """Nodes of the current level this party has split already."""
    node_ids: set[int] = field(default_factory=set)
    """Every node id of the tree so far (new children must have new ids)."""
    records: dict[int, LookupRecord] = field(default_factory=dict)
    level: LevelWork | None = None
    """The level whose histograms are being built (shards handed out, results arriving)."""
    arriving: ArrivingTree | None = None
    """The next tree's gradients while they arrive (never checkpointed)."""
    root_sums: list[mpz] | None = None
    """The tree's root histograms, summed as its gradients arrived (None: helpers share it)."""
    tree_helpers: int = 0
    """The party's helper processes as the tree started (its root is shared with them)."""


checkpoint.register_state_types(PassiveTraining, LookupRecord)


def open_job(ctx: StepContext, body: OpenJob) -> tuple[Kind, Any]:
    """Load own features (no labels); refuse a packing of bin sums the policy does not allow."""
    if body.spec.pack_bin_sums == "key_holder":
        check_bin_sum_packer(ctx.party.policy, ctx.party.name, "key_holder",
                             "the job's crypto.pack_bin_sums")
    state = open_passive(ctx, body.spec, PROTOCOL)
    state.role_state = PassiveTraining(params=params_of(body), private=body.spec.dp_epsilon > 0)
    ctx.state = state
    return MsgType.OPENED, Opened(rows=len(state.data.ids),
                                  checkpoints=checkpoint.available(
                                      ctx.model_dir, state.digest, checkpoint.key_of(ctx.party)))


def _checkpoint(ctx: StepContext, state: JobState, trees_done: int) -> None:
    """Keep the job after ``trees_done`` trees: lookup records and bins, no tree in progress."""
    run: PassiveTraining = state.role_state
    checkpoint.save_job(ctx.model_dir, trees_done, state, require_key(run).n,
                        key=checkpoint.key_of(ctx.party), growing=False, chunks=(),
                        tree_ciphertexts=[], tree_digest=b"", level=None, tree=-1, depth=-1,
                        arriving=None, root_sums=None, tree_helpers=0)


def resume_job(ctx: StepContext, body: ResumeJob) -> tuple[Kind, Any]:
    """Go back to the state of a checkpoint every party holds."""
    ctx.state = checkpoint.restore(ctx.model_dir, body.checkpoint, ctx.state,
                                   checkpoint.key_of(ctx.party))
    return MsgType.RESUMED, checkpoint.resumed(ctx.state, body.checkpoint.trees_done)


def bin_features(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Learn the aligned rows and the public key; bin own features on the training rows."""
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    ctx.mailbox.require((MsgType.ALIGNED_ROWS, state.active, -1, -1),
                        (MsgType.PUBLIC_KEY, state.active, -1, -1))
    key: PublicKeyMsg = ctx.mailbox.take(MsgType.PUBLIC_KEY, state.active)
    n = int.from_bytes(key.n, "big")
    # the key itself, not only the spec, must meet the policy: the active party made it
    check_key_bits(ctx.party.policy, ctx.party.name, n.bit_length(),
                   f"the public key {state.active} sent", state.scheme)
    run.public = public_key_from_n(state.scheme, n, expected_bits=state.key_bits)
    receive_alignment(ctx)
    bin_training_rows(state, run.params.max_bin)
    checkpoint.discard(ctx.model_dir)  # a fresh start: older checkpoints are of another run
    _checkpoint(ctx, state, 0)
    return MsgType.ACK, Ack(count=state.data.x.shape[1])


def start_tree(ctx: StepContext, state: JobState, run: PassiveTraining, tree: int) -> None:
    """Take the tree's encrypted gradients (all chunks, parsed and range-checked as they
    arrived or now: ``workers.vertical.root_histogram``) and reset node positions. Checks
    everything before taking."""
    ctx.mailbox.require((MsgType.TREE_START, state.active, tree, -1))
    arrival = arriving_tree(ctx, state, run, tree)
    assert arrival is not None  # its start is here
    key = (MsgType.ENCRYPTED_GRADIENTS, state.active, tree, -1)
    ctx.mailbox.require(key, counts=[arrival.start.n_chunks])
    chunks: list[EncryptedGradients] = ctx.mailbox.items.get(key, [])  # none: a tree of no rows
    add_chunks(arrival, chunks, state.require_bins(), require_key(run), run.params.max_bin + 1)
    parsed = in_order(arrival)
    digest = hashlib.sha256()
    ordered = tuple(c.ciphertexts for c in sorted(chunks, key=lambda c: c.chunk))
    if arrival.helpers:
        for raw in ordered:  # names the tree's ciphertexts to the helpers
            digest.update(raw)
    ctx.mailbox.take(MsgType.TREE_START, state.active, tree)
    ctx.mailbox.take_all(*key)
    run.tree, run.growing, run.in_tree, run.packing = tree, True, arrival.in_tree, arrival.packing
    run.arriving, run.root_sums, run.tree_helpers = None, arrival.root_sums, arrival.helpers
    run.chunks = ordered if arrival.helpers > 1 else ()
    run.tree_ciphertexts = parsed
    run.tree_digest = digest.digest() if arrival.helpers else b""
    run.enc_index = np.cumsum(arrival.in_tree) - 1
    run.node_of_row = np.zeros(arrival.in_tree.size, dtype=np.int64)
    run.depth = 0
    run.level_nodes, run.split_here, run.node_ids = {0}, set(), {0}
    run.level = None


def arriving_tree(ctx: StepContext, state: JobState, run: PassiveTraining,
                  tree: int) -> ArrivingTree | None:
    """The tree's gradients as they arrive, from its start on (checked as it is taken up);
    None before its start is here. The party's helpers are counted here, once a tree: over a
    WAN each count is a round trip to the broker."""
    if run.arriving is not None and run.arriving.tree == tree:
        return run.arriving
    starts = ctx.mailbox.items.get((MsgType.TREE_START, state.active, tree, -1))
    if not starts:
        return None
    arrival = check_tree_start(starts[0], state.require_bins().shape[0], require_key(run),
                               run.private, ctx.party.policy, ctx.party.name)
    arrival.helpers = ctx.helpers()
    if not arrival.helpers:
        n_sums = state.require_bins().shape[1] * (run.params.max_bin + 1)
        arrival.root_sums = [mpz(1)] * n_sums
    run.arriving = arrival
    return arrival


def require_key(run: PassiveTraining) -> PublicKey:
    if run.public is None:
        raise StageError("the active party's public key has not arrived")
    return run.public


def apply_positions(ctx: StepContext, state: JobState, run: PassiveTraining,
                     tree: int, depth: int) -> list[int]:
    """Route rows by the previous level's splits as the active party broadcast them; return
    the nodes to build (smaller children)."""
    ctx.mailbox.require((MsgType.NODE_POSITIONS, state.active, tree, depth - 1))
    msg: NodePositions = ctx.mailbox.take(MsgType.NODE_POSITIONS, state.active, tree, depth - 1)
    return route_rows(ctx.party.name, run, msg, depth)


Routing = list[tuple[NodeSplit, np.ndarray, np.ndarray, int, int]]
"""A level's checked splits, each with its rows, left mask and child counts (``_routed``)."""


def route_rows(party: str, run: PassiveTraining, msg: NodePositions, depth: int) -> list[int]:
    """Route rows by a level's splits (``depth - 1``) and move to ``depth``; return the nodes
    to build (the smaller child of each split)."""
    return move_rows(run, msg, _routed(party, run, msg, depth), depth)


def move_rows(run: PassiveTraining, msg: NodePositions, routed: Routing, depth: int) -> list[int]:
    """Move to ``depth`` by positions ``_routed`` checked; return the nodes to build."""
    built = []
    for split, rows, mask, n_left, n_right in routed:
        run.node_of_row[rows[mask]] = split.left_id
        run.node_of_row[rows[~mask]] = split.right_id
        built.append(smaller_child(n_left, n_right, split.left_id, split.right_id))
    run.depth = depth
    run.level_nodes = {i for split in msg.splits for i in (split.left_id, split.right_id)}
    run.split_here = set()
    run.node_ids |= run.level_nodes
    return built


def _routed(party: str, run: PassiveTraining, msg: NodePositions, depth: int) -> Routing:
    """Every split of the positions checked, with its rows, left mask and child counts;
    nothing changed yet."""
    _check_positions(party, run, msg)
    routed = []
    for split in msg.splits:
        rows = np.flatnonzero(run.node_of_row == split.node)
        mask = decode_mask(split.left, rows.size)
        n_left = int(run.in_tree[rows[mask]].sum())
        n_right = int(run.in_tree[rows[~mask]].sum())
        # the job's min_samples_leaf holds for every split honest training makes: a smaller
        # child would be a node of chosen few rows, whose sums show the rows' bins. Under DP
        # an empty child is honest (a bin past this party's last cut) and has no rows to show
        smallest = min(n_left, n_right)
        if smallest < run.params.min_samples_leaf and not (run.private and smallest == 0):
            raise ProtocolError(f"{party}: t{msg.tree} d{depth - 1}: node {split.node} "
                                f"split into {n_left} and {n_right} rows; the job's "
                                f"min_samples_leaf is {run.params.min_samples_leaf}")
        routed.append((split, rows, mask, n_left, n_right))
    return routed


def _check_positions(party: str, run: PassiveTraining, msg: NodePositions) -> None:
    """Each node of the level is split at most once, into two children with new ids."""
    nodes = [split.node for split in msg.splits]
    children = [i for split in msg.splits for i in (split.left_id, split.right_id)]
    if len(set(nodes)) != len(nodes) or not set(nodes) <= run.level_nodes:
        raise ProtocolError(f"{party}: t{msg.tree} d{msg.depth}: positions split nodes "
                            f"{nodes}; the level's nodes are {sorted(run.level_nodes)}, one split "
                            f"each")
    if len(set(children)) != len(children) or set(children) & run.node_ids:
        raise ProtocolError(f"{party}: t{msg.tree} d{msg.depth}: positions give children "
                            f"{children}, not all new and distinct")


def _check_choices(party: str, run: PassiveTraining, msg: SplitChoices, n_features: int) -> None:
    """At most one split per node of the current level that this party has not split yet, in
    range: anything else would make this party reveal more instance spaces than the tree has
    nodes (one SplitChoices listing every (feature, bin) of node 0 rebuilds the binned matrix)."""
    nodes = [choice.node for choice in msg.splits]
    if len(set(nodes)) != len(nodes):
        raise ProtocolError(f"{party}: t{msg.tree} d{msg.depth}: refused {len(nodes)} splits "
                            f"for nodes {sorted(set(nodes))}: at most one split per node")
    closed = sorted(set(nodes) - (run.level_nodes - run.split_here))
    if closed:
        raise ProtocolError(f"{party}: t{msg.tree} d{msg.depth}: refused splits of nodes "
                            f"{closed}: not open at this level (open: "
                            f"{sorted(run.level_nodes - run.split_here)})")
    if run.depth >= run.params.max_depth:
        raise ProtocolError(f"{party}: t{msg.tree} d{msg.depth}: refused splits below the "
                            f"maximum depth {run.params.max_depth}")
    for choice in msg.splits:
        if not (0 <= choice.feature < n_features and 0 <= choice.bin < run.params.max_bin):
            raise ProtocolError(f"{party}: split on feature {choice.feature} bin {choice.bin} "
                                f"is out of range")


def record_splits(ctx: StepContext, body: Step
                  ) -> tuple[list[AppliedSplit], tuple[NodePositions, Routing] | None]:
    """Alg. 2 last step: record the level's owned splits in the lookup table and send the
    active party each node's left instance space; returns what was sent and, told to build
    ahead, the level's positions as checked (``workers.vertical.histograms.apply_splits``
    answers the step)."""
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    ctx.mailbox.require((MsgType.SPLIT_CHOICES, state.active, body.tree, body.depth))
    msg: SplitChoices = ctx.mailbox.take(MsgType.SPLIT_CHOICES, state.active, body.tree, body.depth)
    if run.tree != body.tree or run.depth != body.depth:
        raise StageError(f"apply_splits t{body.tree} d{body.depth}: party is at t{run.tree} d{run.depth}")
    bins = state.require_bins()
    _check_choices(ctx.party.name, run, msg, bins.shape[1])  # before any mask or record
    lefts = {choice.node: encode_mask(goes_left(
        bins[run.node_of_row == choice.node, choice.feature], choice.bin, choice.missing_left,
        run.params.max_bin)) for choice in msg.splits}
    # the whole level's positions checked before any record
    ahead = _check_ahead(ctx.party.name, run, msg, lefts) if msg.build_ahead else None
    run.split_here |= {choice.node for choice in msg.splits}
    out = []
    for choice in msg.splits:
        record_id = len(run.records)
        run.records[record_id] = LookupRecord(
            feature=choice.feature, bin=choice.bin, missing_left=choice.missing_left,
            threshold=split_threshold(state.cuts[choice.feature], choice.bin), tree=run.tree,
            depth=run.depth)
        out.append(AppliedSplit(node=choice.node, record_id=record_id, left=lefts[choice.node]))
    ctx.send(state.active, MsgType.APPLIED_SPLITS, AppliedSplits(body.tree, body.depth, out))
    return out, ahead


def _check_ahead(party: str, run: PassiveTraining, msg: SplitChoices,
                 lefts: dict[int, InstanceSpace]) -> tuple[NodePositions, Routing]:
    """Building the next level at once is for a lossless job with a level left to build, by
    positions checked as broadcast ones are (``route_rows``), this party's splits and the
    active party's together."""
    where = f"{party}: t{msg.tree} d{msg.depth}"
    if run.private:  # which children open depends on the active party's noisy counts
        raise ProtocolError(f"{where}: refused to build the next level ahead under "
                            f"differential privacy")
    if msg.depth + 1 >= run.params.max_depth:
        raise ProtocolError(f"{where}: refused to build a level below the maximum depth "
                            f"{run.params.max_depth}")
    ids = [i for s in msg.ahead for i in (s.left_id, s.right_id)]
    ids += [i for c in msg.splits for i in (c.left_id, c.right_id)]
    if not ids or min(ids) < 0:
        raise ProtocolError(f"{where}: refused to build ahead: no split, or children "
                            f"without ids")
    # the positions the broadcast would bring: the active party's splits and this party's
    mine = [NodeSplit(c.node, c.left_id, c.right_id, lefts[c.node]) for c in msg.splits]
    positions = NodePositions(msg.tree, msg.depth,
                              sorted([*msg.ahead, *mine], key=lambda split: split.node))
    return positions, _routed(party, run, positions, msg.depth + 1)


def close_job(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Forget the job (the worker drops its state); the saved lookup table stays."""
    state: JobState | None = ctx.state
    if state is not None and isinstance(state.role_state, PassiveTraining):
        checkpoint.discard(ctx.model_dir)  # the job is complete and its model saved
    return MsgType.ACK, Ack()


def finish_tree(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Drop the tree's ciphertexts (the lookup records stay) and checkpoint the job.

    Every passive party finishes every tree, also one it took no part in (Completely
    SecureBoost's first tree), so all checkpoints count the same trees.
    """
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    if run.tree > body.tree:
        if not _started_after_one_it_sat_out(run, body.tree):
            raise StageError(f"finish_tree t{body.tree}: party is at t{run.tree}")
        # the flow's drop of a tree this party sat out, overtaken by the next tree's
        # gradients (they come straight from the active party): the next tree keeps its
        # ciphertexts; the checkpoint after body.tree holds no part of it (no split yet)
        ctx.mailbox.drop_tree(body.tree)
        _checkpoint(ctx, state, body.tree + 1)
        return MsgType.ACK, Ack(count=len(run.records))
    run.growing, run.chunks, run.level = False, (), None
    run.tree_ciphertexts, run.tree_digest = [], b""
    ctx.mailbox.drop_tree(body.tree)
    _checkpoint(ctx, state, body.tree + 1)
    return MsgType.ACK, Ack(count=len(run.records))


def _started_after_one_it_sat_out(run: PassiveTraining, tree: int) -> bool:
    """The party is at ``tree + 1``, started from its gradients before any level of it: only
    a party that did not grow ``tree`` (Completely SecureBoost's first round) starts the next
    one before ``tree``'s finish, since a tree it grows holds ``growing`` until then."""
    return (run.tree == tree + 1 and run.depth == 0 and run.level is None
            and not run.split_here and all(r.tree != run.tree for r in run.records.values()))


def save_model_part(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Write the lookup table: the only model part a passive party holds (the records of the
    first ``body.tree`` trees when early stopping keeps those)."""
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    records = kept_records(run.records, body)
    write_json_atomic(ModelPart(ctx.model_dir).lookup, lookup_to_dict(
        state.party, ctx.job, state.data.names, records))
    save_categories(ctx.model_dir, state.data.categories)
    write_json_atomic(ModelPart(ctx.model_dir).party, {
        "party": state.party, "role": "passive", "job": ctx.job, "saved_at": time.time(),
        "active": state.active})
    return MsgType.ACK, Ack(count=len(records))


