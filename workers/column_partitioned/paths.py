"""Path-mode federated prediction: one round per tree level (SecureBoost section 4, inference).

The active party knows, for every tree and every row of a batch, the node the row has reached.
Per level it asks each passive party only for its decisions at the nodes it owns on those paths
((row, record) pairs, all trees at once), decides its own nodes itself, and moves every row one
level down. A passive party thus reveals the decisions on each row's path and no other: in
batched mode (``workers.column_partitioned.scoring``) it reveals every record's decision for
every row.

A passive party answers only pairs inside the job: rows of the batch, records it owns, each
pair once, levels a tree can have; and only as many as paths have: a record only at its own
level, per row at most one record of each tree per level, each level of a batch once. An
active party that lies about where its rows are can still pick *which* node of a level it asks
about (the passive party does not know the tree's shape), not more of them: per row, tree and
level one decision, as its path would give.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from boosting._typing import FloatArray, IntArray
from boosting.binning import goes_left_raw
from boosting.params import TreeParams, field_bounds
from boosting.tree import Model, Tree, node_values
from messages.bodies import Ack, Step
from messages.secureboost import DecisionRequest, PathDecisions
from messages.envelope import Kind, MsgType
from workers import ProtocolError, StageError
from workers.column_partitioned.alignment import receive_alignment
from workers.column_partitioned.lookup import LookupRecord
from workers.column_partitioned.scoring import (StagedTraining, keeps_stages, lookup_records,
                                                model_of, score_x, store_margin, store_staged)
from workers.handlers import StepContext
from workers.state import JobState

MAX_LEVELS: int = field_bounds(TreeParams, "max_depth")["le"]
"""Levels a tree may have: no job's ``params.max_depth`` is deeper (``boosting.params``), so no
request asks for a deeper level."""
LEAF, OWN = -2, -1
"""Owner codes of a node in ``_TreeTable.owner``; passive party k has code k."""


@dataclass(frozen=True, slots=True)
class _TreeTable:
    """One tree as arrays indexed by node id, for moving many rows at once."""

    left: IntArray
    right: IntArray
    owner: IntArray
    record: IntArray
    feature: IntArray
    threshold: FloatArray
    missing_left: np.ndarray
    values: FloatArray


def _table(tree: Tree, me: str, passives: list[str]) -> _TreeTable:
    size = max(node.id for node in tree.nodes) + 1
    left, right = np.full(size, -1), np.full(size, -1)
    owner, record, feature = np.full(size, LEAF), np.full(size, -1), np.full(size, -1)
    threshold, missing_left = np.full(size, np.nan), np.zeros(size, dtype=bool)
    for node in tree.nodes:
        if node.is_leaf:
            continue
        left[node.id], right[node.id] = node.left, node.right
        if node.owner == me:
            owner[node.id], feature[node.id] = OWN, node.feature
            threshold[node.id], missing_left[node.id] = node.threshold, node.missing_left
        elif node.owner in passives:
            owner[node.id], record[node.id] = passives.index(node.owner), node.record_id
        else:
            raise StageError(f"{me}: the model names an unknown party {node.owner!r}")
    return _TreeTable(left, right, owner, record, feature, threshold, missing_left,
                      node_values(tree))


@dataclass(slots=True)
class PathWalk:
    """The active party's walk of one batch: the node each row has reached in each tree."""

    batch: int
    tables: list[_TreeTable]
    position: IntArray
    """Node id per (tree, batch row)."""
    depth: int = 0
    """The level being asked (its decisions not applied yet)."""
    asked: bool = False
    first: int = 0
    """The model's tree ``tables[0]`` is: a training job's validation walks only the trees
    added since its last walk (early stopping scores the model after every round), onto the
    margins that walk left."""


def _walk(state: JobState, model: Model, batch: int, depth: int, n_rows: int) -> PathWalk:
    """The batch's walk at ``depth``: a new one at level 0, else the one that reached it."""
    walk: PathWalk | None = state.paths
    if depth == 0 and (walk is None or walk.batch != batch or walk.depth != 0):
        run = state.role_state  # validation of stages walks the new trees only
        first = run.valid_walked if isinstance(run, StagedTraining) else 0
        tables = [_table(tree, state.party, state.passives) for tree in model.trees[first:]]
        walk = PathWalk(batch, tables, np.zeros((len(tables), n_rows), dtype=np.int64),
                        first=first)
        state.paths = walk
    if walk is None or walk.batch != batch or walk.depth != depth:
        raise StageError(f"{state.party}: level {depth} of batch {batch} is not the next one "
                         f"to score")
    return walk


def traverse_level(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Active: ask each owner for the decisions on the rows' paths at one level, then move the
    rows down; the reply counts (tree, row) pairs still at internal nodes."""
    state: JobState = ctx.state
    model = model_of(state)
    batch, depth = body.tree, body.depth
    if not 0 <= depth < MAX_LEVELS:
        raise ProtocolError(f"level {depth} is outside 0..{MAX_LEVELS - 1}")
    all_x = score_x(state)
    rows = state.batch_rows(batch)
    x = all_x[rows]
    walk = _walk(state, model, batch, depth, x.shape[0])
    tables = walk.tables
    if not walk.asked:  # the first try of this step (a retry waits for the same answers)
        _ask_owners(ctx, state, walk)
        walk.asked = True
    ctx.mailbox.require(*[(MsgType.PATH_DECISIONS, p, batch, depth) for p in state.passives])
    answers = [_take_answer(ctx, state, walk, k) for k in range(len(state.passives))]
    remaining = 0
    for t, table in enumerate(tables):
        at = walk.position[t]
        owner = table.owner[at]
        go_left = np.zeros(at.size, dtype=bool)
        own = np.flatnonzero(owner == OWN)
        nodes = at[own]
        go_left[own] = goes_left_raw(x[own, table.feature[nodes]], table.threshold[nodes],
                                     table.missing_left[nodes])
        for tree_of_pair, row_of_pair, bits in answers:
            mine = tree_of_pair == t
            go_left[row_of_pair[mine]] = bits[mine]
        inner = owner != LEAF
        walk.position[t] = np.where(inner, np.where(go_left, table.left[at], table.right[at]), at)
        remaining += int((table.owner[walk.position[t]] != LEAF).sum())
    walk.depth, walk.asked = depth + 1, False
    if remaining == 0:
        first = walk.first
        margin = (np.tile(np.array(model.base_score), (x.shape[0], 1)) if first == 0
                  else state.role_state.score_margin[rows].copy())
        # a training job's validation keeps the margins after each tree: its learning curve
        keep = isinstance(state.role_state, StagedTraining) and keeps_stages(
            len(model.trees), all_x.shape[0], margin.shape[1])
        staged: list[np.ndarray] = []
        for t, tree in enumerate(model.trees[first:]):  # Model.raw_predict's order: equal sums
            margin[:, tree.output] += tables[t].values[walk.position[t]]
            if keep:
                staged.append(margin.copy())
        store_margin(state, rows, margin)
        if staged:
            store_staged(state, rows, np.stack(staged), first)
        state.paths = None
    return MsgType.ACK, Ack(count=remaining)


def _pairs(walk: PathWalk, k: int) -> tuple[IntArray, IntArray, IntArray]:
    """(tree, row, record) of every pair at a node of passive party k, in request order."""
    trees, rows, records = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], \
        [np.zeros(0, dtype=np.int64)]  # a walk of no new trees asks nothing
    for t, table in enumerate(walk.tables):
        at = walk.position[t]
        hit = np.flatnonzero(table.owner[at] == k)
        trees.append(np.full(hit.size, t))
        rows.append(hit)
        records.append(table.record[at[hit]])
    return np.concatenate(trees), np.concatenate(rows), np.concatenate(records)


def _distinct(rows: IntArray, records: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Each (row, record) pair once, and where each pair of the request is among them: trees
    that share a record (a multiclass forest's outputs share one structure) ask it once."""
    pairs, inverse = np.unique(np.stack([rows, records], axis=1).reshape(-1, 2), axis=0,
                               return_inverse=True)
    return pairs[:, 0], pairs[:, 1], inverse.reshape(-1)


def _ask_owners(ctx: StepContext, state: JobState, walk: PathWalk) -> None:
    for k, passive in enumerate(state.passives):
        _, rows, records = _pairs(walk, k)
        rows, records, _ = _distinct(rows, records)
        ctx.send(passive, MsgType.DECISION_REQUEST, DecisionRequest(
            batch=walk.batch, depth=walk.depth, rows=rows.astype("<u4").tobytes(),
            records=records.astype("<u4").tobytes()))


def _take_answer(ctx: StepContext, state: JobState, walk: PathWalk,
                 k: int) -> tuple[IntArray, IntArray, np.ndarray]:
    passive = state.passives[k]
    trees, rows, records = _pairs(walk, k)
    asked, _, inverse = _distinct(rows, records)
    msg: PathDecisions = ctx.mailbox.take(MsgType.PATH_DECISIONS, passive, walk.batch, walk.depth)
    if msg.n_pairs != asked.size or len(msg.bits) != (asked.size + 7) // 8:
        raise ProtocolError(f"{passive} answered {msg.n_pairs} decisions for batch {walk.batch} "
                            f"level {walk.depth}, {asked.size} were asked")
    bits = np.unpackbits(np.frombuffer(msg.bits, dtype=np.uint8), count=asked.size).astype(bool)
    return trees, rows, bits[inverse]


def answer_level(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Passive: the decisions the active party asked for at one level, and no others."""
    state: JobState = ctx.state
    if state.kind == "predict" and state.aligned is None:
        ctx.mailbox.require((MsgType.ALIGNED_ROWS, state.active, -1, -1))
        receive_alignment(ctx)
    if not 0 <= body.depth < MAX_LEVELS:
        raise ProtocolError(f"level {body.depth} is outside 0..{MAX_LEVELS - 1}")
    x = score_x(state)[state.batch_rows(body.tree)]
    ctx.mailbox.require((MsgType.DECISION_REQUEST, state.active, body.tree, body.depth))
    request: DecisionRequest = ctx.mailbox.take(MsgType.DECISION_REQUEST, state.active,
                                                body.tree, body.depth)
    rows, records = _checked_pairs(state, request, x.shape[0])
    feature, threshold, missing_left, flip, tree = records
    _answer_once(state, request, rows, tree)
    ledger = getattr(state.role_state, "ledger", None)
    if ledger is not None:  # a prediction job: the model's releases over every job so far
        ids = state.data.ids
        positions = state.require_aligned()[0][state.batch_rows(body.tree)][rows]
        ledger.release(ctx.party.name, f"decision request for batch {request.batch} level "
                       f"{request.depth}", [ids[int(p)] for p in positions], tree, body.depth,
                       np.frombuffer(request.records, dtype="<u4").astype(np.int64))
    values = x[rows, feature]
    bits = goes_left_raw(values, threshold, missing_left).astype(bool) ^ flip
    ctx.send(state.active, MsgType.PATH_DECISIONS, PathDecisions(
        batch=body.tree, depth=body.depth, n_pairs=int(rows.size),
        bits=np.packbits(bits).tobytes()))
    return MsgType.ACK, Ack(count=int(rows.size))


def _answer_once(state: JobState, request: DecisionRequest, rows: IntArray,
                 trees: IntArray) -> None:
    """Each (row, tree) of a batch is answered once per level (the same request again: a
    retry); asked again, a level would give a row's decisions at more nodes than its path has.
    A level may be asked again about other trees: a training job's validation walks the
    trees added since its last walk (records of lookup files without trees count as one
    tree)."""
    answered: dict[str, bytes] = state.paths if isinstance(state.paths, dict) else {}
    state.paths = answered  # a passive party's record of the levels it answered
    level = f"{request.batch}/{request.depth}"
    digest = hashlib.sha256(request.rows + b"|" + request.records).digest()
    seen = answered.get(level, b"")
    if any(seen[k:k + len(digest)] == digest for k in range(0, len(seen), len(digest))):
        return  # a retry: the same answer again
    asked = np.frombuffer(answered.get(level + _PAIRS, b""), dtype="<i8")
    pairs = np.unique((rows << 32) | (np.maximum(trees, -1) + 1))
    # a level answered before the pairs were kept (an older checkpoint) is not asked again
    if seen and (level + _PAIRS not in answered or np.intersect1d(asked, pairs).size):
        raise ProtocolError(f"decision request for batch {request.batch} level "
                            f"{request.depth}: that level was answered already, for other pairs")
    answered[level] = seen + digest
    answered[level + _PAIRS] = np.union1d(asked, pairs).astype("<i8").tobytes()


_PAIRS = "/pairs"
"""Beside a level's request digests: the (row, tree) pairs it answered, as sorted int64."""


def _checked_pairs(state: JobState, request: DecisionRequest,
                   n_rows: int
                   ) -> tuple[IntArray, tuple[IntArray, FloatArray, np.ndarray, np.ndarray,
                                              IntArray]]:
    """The request's rows and the (feature, threshold, missing_left, flip, tree) of its
    records, or a ``ProtocolError`` for anything outside the job."""
    own = lookup_records(state)
    where = f"decision request for batch {request.batch} level {request.depth}"
    if len(request.rows) % 4 or len(request.rows) != len(request.records):
        raise ProtocolError(f"{where}: rows and records must be uint32 arrays of one length")
    if len(request.rows) // 4 > n_rows * len(own):
        raise ProtocolError(f"{where}: {len(request.rows) // 4} pairs, more than the batch's "
                            f"{n_rows} rows times {len(own)} records")
    rows = np.frombuffer(request.rows, dtype="<u4").astype(np.int64)
    records = np.frombuffer(request.records, dtype="<u4").astype(np.int64)
    if rows.size and int(rows.max()) >= n_rows:
        raise ProtocolError(f"{where}: row {int(rows.max())} is outside the batch of {n_rows}")
    ids = np.array(sorted(own), dtype=np.int64)
    index = np.minimum(np.searchsorted(ids, records), max(ids.size - 1, 0))
    unknown = records[ids[index] != records] if ids.size else records
    if unknown.size:
        raise ProtocolError(f"{where}: record {int(unknown[0])} is not one of this party's")
    if np.unique(rows * ids.size + index).size != rows.size:
        raise ProtocolError(f"{where}: a (row, record) pair is asked twice")
    table = [own[int(r)] for r in ids]
    _check_path_shape(where, request.depth, rows, records, table, index)
    feature = np.array([r.feature for r in table], dtype=np.int64)[index]
    threshold = np.array([r.threshold for r in table])[index]
    missing_left = np.array([r.missing_left for r in table], dtype=bool)[index]
    flip = np.array([r.flip for r in table], dtype=bool)[index]
    tree = np.array([r.tree for r in table], dtype=np.int64)[index]
    return rows, (feature, threshold, missing_left, flip, tree)


def _check_path_shape(where: str, level: int, rows: IntArray, records: IntArray,
                      table: list[LookupRecord], index: IntArray) -> None:
    """A record only at the level of its split, and per row at most one record of each tree:
    a path's shape (records of lookup files without tree and depth are not checked)."""
    depth = np.array([r.depth for r in table], dtype=np.int64)[index]
    off = np.flatnonzero((depth >= 0) & (depth != level))
    if off.size:
        raise ProtocolError(f"{where}: record {int(records[off[0]])} splits level "
                            f"{int(depth[off[0]])}, not {level}")
    tree = np.array([r.tree for r in table], dtype=np.int64)[index]
    known = tree >= 0
    pairs = rows[known] * (int(tree.max(initial=0)) + 1) + tree[known]
    unique, counts = np.unique(pairs, return_counts=True)
    if (counts > 1).any():
        row = int(unique[counts > 1][0]) // (int(tree.max(initial=0)) + 1)
        raise ProtocolError(f"{where}: row {row} is asked about two records of one tree at "
                            f"one level; a path has one")
