"""A passive party (feature holder) in vertical SecureBoost (SecureBoost Alg. 1-2, Fig. 3).

It sees only ciphertexts of g/h, the instance spaces of nodes, and the splits it owns; it keeps
a lookup table ``record_id -> (feature, threshold, missing direction)`` and never learns leaf
values or labels.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from boosting.binning import goes_left, goes_left_raw, split_threshold
from boosting.fixedpoint import value_bits
from boosting.grow import smaller_child
from boosting.params import BoostParams
from boosting.tree import write_json_atomic
from crypto._gmp import mpz
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.schemes import PublicKey, ciphertexts_from_bytes, public_key_from_n
from messages.bodies import (Ack, AppliedSplit, AppliedSplits, EncryptedGradients,
                             EncryptedHistograms, HistogramShard, NodePositions, Opened, OpenJob,
                             PublicKeyMsg, ResumeJob, SplitChoices, Step, TreeCiphertexts,
                             TreeStart)
from messages.envelope import MsgType
from messages.instance_space import decode_mask, encode_mask
from workers import NotReady, ProtocolError, StageError, checkpoint
from workers.vertical.active import PROTOCOL, params_of
from workers.vertical.opening import bin_training_rows, open_passive
from workers.vertical.alignment import receive_alignment
from workers.data import save_categories
from workers.policy import check_bin_sum_packer, check_key_bits
from workers.runtime import StepContext
from workers.shards import (LevelData, LevelWork, hold_tree_chunk, shard_data, shard_result,
                            sum_claimed)
from workers.state import JobState

log = logging.getLogger("fedboost.worker")
_HAND_OUT = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hand-out")
"""Hands a level's data to the party's helpers while the step's thread sums (one at a time)."""

LOOKUP_FORMAT = "fedboost-lookup"
LOOKUP_VERSION = 1


@dataclass(frozen=True, slots=True)
class LookupRecord:
    """One split this party owns: ``x[feature] <= threshold`` goes left (bin form: ``bin``)."""

    feature: int
    bin: int
    threshold: float
    missing_left: bool
    flip: bool = False
    """The split's children were shown to the active party in swapped order (the vertical
    forest, seed 002): its "left" child is this record's right one."""
    tree: int = -1
    depth: int = -1
    """The tree and level of the split (-1: a lookup file written before they were kept):
    path-mode prediction asks a record only at its level, one per tree and row."""


def records_go_left(x: np.ndarray, records: list[LookupRecord]) -> np.ndarray:
    """Per record and row, whether the row goes to the child the active party calls left
    (records x rows; ``x``: rows x this party's features)."""
    bits = np.zeros((len(records), x.shape[0]), dtype=bool)
    for k, r in enumerate(records):
        bits[k] = goes_left_raw(x[:, r.feature], r.threshold, r.missing_left) ^ r.flip
    return bits


@dataclass(slots=True)
class PassiveTraining:
    """The passive party's training state for the tree being grown."""

    params: BoostParams
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


checkpoint.register_state_types(PassiveTraining, LookupRecord)


def open_job(ctx: StepContext, body: OpenJob) -> tuple[MsgType, Any]:
    """Load own features (no labels); refuse a packing of bin sums the policy does not allow."""
    if body.spec.pack_bin_sums == "key_holder":
        check_bin_sum_packer(ctx.party.policy, ctx.party.name, "key_holder",
                             "the job's crypto.pack_bin_sums")
    state = open_passive(ctx, body.spec, PROTOCOL)
    state.role_state = PassiveTraining(params=params_of(body))
    ctx.state = state
    return MsgType.OPENED, Opened(rows=len(state.data.ids),
                                  checkpoints=checkpoint.available(
                                      ctx.model_dir, state.digest, checkpoint.key_of(ctx.party)))


def _checkpoint(ctx: StepContext, state: JobState, trees_done: int) -> None:
    """Keep the job after ``trees_done`` trees: lookup records and bins, no tree in progress."""
    run: PassiveTraining = state.role_state
    checkpoint.save_job(ctx.model_dir, trees_done, state, _require_key(run).n,
                        key=checkpoint.key_of(ctx.party), growing=False, chunks=(),
                        tree_ciphertexts=[], tree_digest=b"", level=None, tree=-1, depth=-1)


def resume_job(ctx: StepContext, body: ResumeJob) -> tuple[MsgType, Any]:
    """Go back to the state of a checkpoint every party holds."""
    ctx.state = checkpoint.restore(ctx.model_dir, body.checkpoint, ctx.state,
                                   checkpoint.key_of(ctx.party))
    return MsgType.RESUMED, checkpoint.resumed(ctx.state, body.checkpoint.trees_done)


def bin_features(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
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


def gradients_arrived(ctx: StepContext, sender: str,
                      body: TreeStart | EncryptedGradients) -> None:
    """As a tree's gradients arrive (its start, then chunks): pass each chunk on to the helpers,
    and once all are here start the tree, before its first histograms are asked for. Whatever
    fails here fails again, and is answered, in that step."""
    state: JobState | None = ctx.state
    run = None if state is None else state.role_state
    if (not isinstance(run, PassiveTraining) or sender != state.active
            or run.tree >= body.tree or run.growing):
        return  # not training, this tree started already, or the previous one is not finished
    if isinstance(body, EncryptedGradients):
        _pass_on_chunk(ctx, state, run, body)
    try:
        _start_tree(ctx, state, run, body.tree)
    except NotReady:
        return  # more chunks to come


def _pass_on_chunk(ctx: StepContext, state: JobState, run: PassiveTraining,
                   chunk: EncryptedGradients) -> None:
    """With one helper, pass a gradient chunk on to it, sealed and published beside this
    thread; the tree's levels queue after it. With more, copies of a chunk on the shared work
    queue could all go to one helper (each takes whatever comes while it is free), so they get
    the tree with its first level instead (``_hand_out``)."""
    starts = ctx.mailbox.items.get((MsgType.TREE_START, state.active, chunk.tree, -1))
    if not starts or run.public is None or ctx.helpers() != 1:
        return
    _HAND_OUT.submit(_hand_out_chunk, ctx, TreeCiphertexts(
        tree=chunk.tree, chunk=chunk.chunk, n_chunks=starts[0].n_chunks,
        n=run.public.n_bytes, ciphertexts=chunk.ciphertexts, scheme=run.public.scheme))


def _hand_out_chunk(ctx: StepContext, chunk: TreeCiphertexts) -> None:
    """Not waited for: a helper without the whole tree answers its shards empty, and this
    process sums what it left."""
    try:
        ctx.submit_work(MsgType.TREE_CIPHERTEXTS, chunk, before_ack=False)
    except Exception as exc:  # noqa: BLE001 - a failed hand-out costs time, never a result
        log.warning("%s: could not hand tree %d's chunk %d to the helpers: %r", ctx.party.name,
                    chunk.tree, chunk.chunk, exc)


def _start_tree(ctx: StepContext, state: JobState, run: PassiveTraining, tree: int) -> None:
    """Take the tree's encrypted gradients (all chunks), parse and range-check them, and reset
    node positions. Checks everything before taking."""
    ctx.mailbox.require((MsgType.TREE_START, state.active, tree, -1))
    start: TreeStart = ctx.mailbox.items[(MsgType.TREE_START, state.active, tree, -1)][0]
    public = _require_key(run)
    n_train = state.require_bins().shape[0]
    # the shape the active party declares is the one honest gradients of this party's rows
    # have: it sets how wide each bin sum is, so how much of each a decryption shows
    if start.max_rows != n_train or start.value_bits != value_bits(n_train) \
            or not 1 <= start.n_chunks <= n_train:
        raise ProtocolError(f"tree {tree}: gradients of {start.value_bits} bits for "
                            f"{start.max_rows} rows in {start.n_chunks} chunks; this party has "
                            f"{n_train} rows, whose gradients have {value_bits(n_train)} bits")
    key = (MsgType.ENCRYPTED_GRADIENTS, state.active, tree, -1)
    ctx.mailbox.require(key, counts=[start.n_chunks])
    chunks: list[EncryptedGradients] = ctx.mailbox.items[key]
    if sorted(c.chunk for c in chunks) != list(range(start.n_chunks)):
        raise ProtocolError(f"tree {tree}: gradient chunks {sorted(c.chunk for c in chunks)}")
    most = BinSumPacking.for_key(GradientPacker(start.value_bits, start.max_rows).cell_bits,
                                 public.plaintext_bits)
    if start.per_ciphertext not in (1, most.per_ciphertext):
        raise ProtocolError(f"tree {tree}: asked to pack {start.per_ciphertext} bin sums per "
                            f"ciphertext; 1 (the key holder folds) or {most.per_ciphertext}")
    if start.per_ciphertext == 1:
        check_bin_sum_packer(ctx.party.policy, ctx.party.name, "key_holder",
                             f"tree {tree} asks for one bin sum per ciphertext")
    packing = BinSumPacking(most.cell_bits, start.per_ciphertext)
    in_tree = decode_mask(start.in_tree, n_train)
    ordered = tuple(c.ciphertexts for c in sorted(chunks, key=lambda c: c.chunk))
    count, rest = divmod(sum(len(c) for c in ordered), public.ciphertext_bytes)
    if rest or count != int(in_tree.sum()):
        raise ProtocolError(f"tree {tree}: {count} ciphertexts for {int(in_tree.sum())} rows")
    # chunk by chunk, never joined: a million rows' ciphertexts are 512 MB at 2048 bits
    helpers = ctx.helpers()
    parsed: list[mpz] = []
    digest = hashlib.sha256()
    for raw in ordered:
        parsed += ciphertexts_from_bytes(raw, public)  # range-checked here, once a tree
        if helpers:
            digest.update(raw)
    ctx.mailbox.take(MsgType.TREE_START, state.active, tree)
    ctx.mailbox.take_all(*key)
    run.tree, run.growing, run.in_tree, run.packing = tree, True, in_tree, packing
    run.chunks = ordered if helpers > 1 else ()
    run.tree_ciphertexts, run.tree_digest = parsed, digest.digest() if helpers else b""
    run.enc_index = np.cumsum(in_tree) - 1
    run.node_of_row = np.zeros(n_train, dtype=np.int64)
    run.depth = 0
    run.level_nodes, run.split_here, run.node_ids = {0}, set(), {0}
    run.level = None


def _require_key(run: PassiveTraining) -> PublicKey:
    if run.public is None:
        raise StageError("the active party's public key has not arrived")
    return run.public


def _apply_positions(ctx: StepContext, state: JobState, run: PassiveTraining,
                     tree: int, depth: int) -> list[int]:
    """Route rows by the previous level's splits; return the nodes to build (smaller children)."""
    ctx.mailbox.require((MsgType.NODE_POSITIONS, state.active, tree, depth - 1))
    msg: NodePositions = ctx.mailbox.take(MsgType.NODE_POSITIONS, state.active, tree, depth - 1)
    _check_positions(ctx.party.name, run, msg)
    routed = []
    for split in msg.splits:
        rows = np.flatnonzero(run.node_of_row == split.node)
        mask = decode_mask(split.left, rows.size)
        n_left = int(run.in_tree[rows[mask]].sum())
        n_right = int(run.in_tree[rows[~mask]].sum())
        # the job's min_samples_leaf holds for every split honest training makes: a smaller
        # child would be a node of chosen few rows, whose sums show the rows' bins
        if min(n_left, n_right) < run.params.min_samples_leaf:
            raise ProtocolError(f"{ctx.party.name}: t{tree} d{depth - 1}: node {split.node} "
                                f"split into {n_left} and {n_right} rows; the job's "
                                f"min_samples_leaf is {run.params.min_samples_leaf}")
        routed.append((split, rows, mask, n_left, n_right))
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


def build_encrypted_histograms(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Alg. 1 lines 4-9: per node and feature, sum E(g, h, 1) per bin (smaller children only).

    With helper processes, the features are claimed one at a time by this process and the
    helpers (workers.shards); the step completes when every helper has answered.
    """
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    level = (body.tree, body.depth)
    if run.level is None or run.level.key != level:
        run.level = _start_level(ctx, state, run, body)
    work = run.level
    public, packing = _require_key(run), work.data.packing
    answers = (MsgType.SHARD_HISTOGRAM, ctx.party.name, *level)
    if not work.gives_up_on_helpers(time.monotonic()):
        ctx.mailbox.require(answers, counts=[work.tickets - len(work.answered)])
    for part in ctx.mailbox.take_all(*answers):
        work.add_answer(part, packing, public.ciphertext_bytes)
    run.level = None
    if work.pool:
        ctx.close_claims(work.pool)
    if len(work.answered) < work.tickets:
        log.warning("%s t%d d%d: %d of %d helpers did not answer; their features are summed "
                    "here", ctx.party.name, body.tree, body.depth,
                    work.tickets - len(work.answered), work.tickets)
    for feature in work.missing():  # claimed by a helper that never answered
        work.features[feature] = work.data.sum_features([feature])
    log.debug("%s t%d d%d: %d of %d features summed by helpers (in up to %.3fs), %d here",
              ctx.party.name, body.tree, body.depth, work.by_helpers, work.n_features,
              work.helper_seconds, work.n_features - work.by_helpers)
    _send_histograms(ctx, state, body, work.built, work.data, *work.merged())
    return MsgType.ACK, Ack(count=len(work.built))


def _send_histograms(ctx: StepContext, state: JobState, body: Step, built: list[int],
                     data: LevelData, widths: list[int], filled: np.ndarray,
                     ciphertexts: bytes) -> None:
    """Alg. 1 line 9: the level's encrypted histograms go to the active party."""
    ctx.send(state.active, MsgType.ENCRYPTED_HISTOGRAMS, EncryptedHistograms(
        tree=body.tree, depth=body.depth, nodes=built, n_features=data.codes.shape[1],
        n_bins=data.n_bins, shard_features=widths, filled=encode_mask(filled),
        per_ciphertext=data.packing.per_ciphertext, ciphertexts=ciphertexts))


def _start_level(ctx: StepContext, state: JobState, run: PassiveTraining,
                 body: Step) -> LevelWork:
    """Position the rows; hand the level to the helpers and claim features here too."""
    started = time.perf_counter()
    if body.depth == 0:
        if run.tree != body.tree:  # its gradients came while another step ran, or just now
            _start_tree(ctx, state, run, body.tree)
        elif run.depth != 0:
            raise StageError(f"build_histograms t{body.tree} d0: party is at t{run.tree} "
                             f"d{run.depth}")
        built = [0]
    else:
        if run.tree != body.tree or run.depth != body.depth - 1:
            raise StageError(f"build_histograms t{body.tree} d{body.depth}: party is at "
                             f"t{run.tree} d{run.depth}")
        built = _apply_positions(ctx, state, run, body.tree, body.depth)
    public, bins, packing = _require_key(run), state.require_bins(), run.packing
    if packing is None:
        raise StageError(f"build_histograms t{body.tree}: the tree's gradients have not arrived")
    node_rows = [np.flatnonzero((run.node_of_row == node) & run.in_tree) for node in built]
    rows, counts = np.concatenate(node_rows), [int(r.size) for r in node_rows]
    helpers = ctx.helpers()
    pool = ctx.open_claims(bins.shape[1]) if helpers else ""
    # gathering, sealing and publishing the level's data runs beside this thread's summing
    handing_out = _HAND_OUT.submit(_hand_out, ctx, run, body, helpers, pool, packing, bins,
                                   rows, counts)
    data = LevelData(bins[rows], [run.tree_ciphertexts[i] for i in run.enc_index[rows].tolist()],
                     counts, run.params.max_bin + 1, public, packing)
    work = LevelWork(key=(body.tree, body.depth), built=built, n_bins=data.n_bins,
                     n_features=bins.shape[1], pool=pool, tickets=helpers, data=data)
    summing = time.monotonic()
    if helpers:
        work.features = sum_claimed(data, lambda: ctx.claim(pool))
    else:
        work.together = data.sum_features(list(range(data.codes.shape[1])))
    summed = time.monotonic()
    work.summed_here = summed, summed - summing
    handed_out = handing_out.result()  # its errors are this step's; acks wait for it
    log.debug("%s t%d d%d: %d helpers; handed out at %.3fs, %d features done here at %.3fs",
              ctx.party.name, body.tree, body.depth, helpers, handed_out - started,
              len(work.features), time.perf_counter() - started)
    return work


def _hand_out(ctx: StepContext, run: PassiveTraining, body: Step, helpers: int, pool: str,
              packing: BinSumPacking, bins: np.ndarray, rows: np.ndarray,
              counts: list[int]) -> float:
    """Queue the level's data for each helper: every bin code of its rows and where their
    ciphertexts are in the tree's; with several helpers, the tree's first level also brings the
    tree's ciphertexts (one helper got them chunk by chunk as they arrived).
    Returns when it was done (``time.perf_counter``)."""
    if helpers:
        shard = HistogramShard(
            tree=body.tree, depth=body.depth, shard=0, n=_require_key(run).n_bytes,
            n_bins=run.params.max_bin + 1, n_features=bins.shape[1], rows=counts,
            bins=np.ascontiguousarray(bins[rows]).tobytes(),
            index=run.enc_index[rows].astype("<u4").tobytes(),
            tree_digest=run.tree_digest,
            tree_ciphertexts=b"".join(run.chunks) if body.depth == 0 and helpers > 1 else b"",
            cell_bits=packing.cell_bits,
            per_ciphertext=packing.per_ciphertext, claims=pool, scheme=run.public.scheme)
        for k in range(1, helpers + 1):
            ctx.submit_work(MsgType.HISTOGRAM_SHARD, replace(shard, shard=k))
    return time.perf_counter()


def histogram_shard(ctx: StepContext, body: HistogramShard) -> tuple[MsgType, Any]:
    """Work step (a helper process of this party): sum the features it can claim."""
    started = time.perf_counter()
    data = shard_data(body)
    if data is None:  # this process does not hold the tree's ciphertexts: nothing to sum with
        return MsgType.SHARD_HISTOGRAM, shard_result(body, {}, started)
    done = sum_claimed(data, lambda: ctx.claim(body.claims))
    return MsgType.SHARD_HISTOGRAM, shard_result(body, done, started)


def tree_ciphertexts(_: StepContext, body: TreeCiphertexts) -> None:
    """Work step (a helper process of this party): keep a chunk of a tree's ciphertexts for
    its shards. Nothing is answered: a helper without the whole tree answers its shards empty."""
    hold_tree_chunk(body)


def apply_splits(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Alg. 2 last step: record the owned splits, return each node's left instance space."""
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    ctx.mailbox.require((MsgType.SPLIT_CHOICES, state.active, body.tree, body.depth))
    msg: SplitChoices = ctx.mailbox.take(MsgType.SPLIT_CHOICES, state.active, body.tree, body.depth)
    if run.tree != body.tree or run.depth != body.depth:
        raise StageError(f"apply_splits t{body.tree} d{body.depth}: party is at t{run.tree} d{run.depth}")
    bins = state.require_bins()
    _check_choices(ctx.party.name, run, msg, bins.shape[1])  # before any mask or record
    run.split_here |= {choice.node for choice in msg.splits}
    out = []
    for choice in msg.splits:
        rows = np.flatnonzero(run.node_of_row == choice.node)
        mask = goes_left(bins[rows, choice.feature], choice.bin, choice.missing_left,
                         run.params.max_bin)
        record_id = len(run.records)
        run.records[record_id] = LookupRecord(
            feature=choice.feature, bin=choice.bin, missing_left=choice.missing_left,
            threshold=split_threshold(state.cuts[choice.feature], choice.bin), tree=run.tree,
            depth=run.depth)
        out.append(AppliedSplit(node=choice.node, record_id=record_id, left=encode_mask(mask)))
    ctx.send(state.active, MsgType.APPLIED_SPLITS, AppliedSplits(body.tree, body.depth, out))
    return MsgType.ACK, Ack(count=len(out))


def close_job(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Forget the job (the worker drops its state); the saved lookup table stays."""
    state: JobState | None = ctx.state
    if state is not None and isinstance(state.role_state, PassiveTraining):
        checkpoint.discard(ctx.model_dir)  # the job is complete and its model saved
    return MsgType.ACK, Ack()


def finish_tree(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Drop the tree's ciphertexts (the lookup records stay) and checkpoint the job.

    Every passive party finishes every tree, also one it took no part in (Completely
    SecureBoost's first tree), so all checkpoints count the same trees.
    """
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    if run.tree > body.tree:
        raise StageError(f"finish_tree t{body.tree}: party is at t{run.tree}")
    run.growing, run.chunks, run.level = False, (), None
    run.tree_ciphertexts, run.tree_digest = [], b""
    ctx.mailbox.drop_tree(body.tree)
    _checkpoint(ctx, state, body.tree + 1)
    return MsgType.ACK, Ack(count=len(run.records))


def save_model_part(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Write the lookup table: the only model part a passive party holds."""
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    write_json_atomic(ctx.model_dir / "lookup.json", lookup_to_dict(
        state.party, ctx.job, state.data.names, run.records))
    save_categories(ctx.model_dir, state.data.categories)
    write_json_atomic(ctx.model_dir / "party.json", {
        "party": state.party, "role": "passive", "job": ctx.job, "saved_at": time.time(),
        "active": state.active})
    return MsgType.ACK, Ack(count=len(run.records))


def lookup_to_dict(party: str, job: str, names: tuple[str, ...],
                   records: dict[int, LookupRecord]) -> dict[str, Any]:
    """Versioned JSON form of a lookup table."""
    return {"format": LOOKUP_FORMAT, "version": LOOKUP_VERSION, "party": party, "job": job,
            "features": list(names),
            "records": {str(k): record_to_dict(r) for k, r in records.items()}}


def record_to_dict(r: LookupRecord) -> dict[str, Any]:
    """A lookup record as its file (and a forest's kept tree) holds it."""
    return {"feature": r.feature, "bin": r.bin, "threshold": r.threshold,
            "missing_left": r.missing_left, "flip": r.flip, "tree": r.tree, "depth": r.depth}


def record_from_dict(v: dict[str, Any]) -> LookupRecord:
    """A lookup record from its file form (files without tree and depth: -1)."""
    return LookupRecord(feature=int(v["feature"]), bin=int(v["bin"]),
                        threshold=float(v["threshold"]), missing_left=bool(v["missing_left"]),
                        flip=bool(v.get("flip", False)), tree=int(v.get("tree", -1)),
                        depth=int(v.get("depth", -1)))


def lookup_from_dict(raw: dict[str, Any]) -> tuple[tuple[str, ...], dict[int, LookupRecord]]:
    """Feature names and records of a lookup file."""
    if raw.get("format") != LOOKUP_FORMAT or raw.get("version") != LOOKUP_VERSION:
        raise ProtocolError(f"not a {LOOKUP_FORMAT} v{LOOKUP_VERSION} file")
    records = {int(k): record_from_dict(v) for k, v in raw["records"].items()}
    return tuple(raw["features"]), records
