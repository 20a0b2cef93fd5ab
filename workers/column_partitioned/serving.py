"""Scoring sessions: a saved vertical model scores rows by id, round after round.

A session (``fedboost serve-model``) opens once: every party loads its part of the trained job's
model from its own model folder and indexes the rows of one of its data sets by id. Each round
(``ScoreRows``) names ids; a passive party looks them up, evaluates *all* its lookup records on
those rows and sends the bit-packed decisions to the active party (seed 002, Alg. 5, round 1),
which finishes the traversal of every tree with its own decisions (round 2) and answers the
predictions. So the active party learns every decision of every requested row: a passive party
takes part only if its policy allows ``batched`` prediction.

A passive party sends its decisions only to the active party its saved model part names, and
answers an unknown id with its position in the round, never with anything of its data. The
service asks every party which ids it lacks first (``FindRows``, a membership round that sends
nothing to anyone else) and sends a scoring round only for ids every party holds: a request
that cannot be scored sends no decisions to the active party.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boosting.flat_trees import FlatTrees, OwnSplits, flatten, margins, route
from boosting.tree import Model, load_model
from messages.bodies import Ack
from messages.scoring import (MAX_SCORING_ROWS, FindRows, OpenScoring, RoundDecisions, RowsFound,
                              ScoreRows, Scores)
from messages.envelope import Kind, MsgType
from workers import DataError, ProtocolError, StageError
from workers.column_partitioned.lookup import lookup_from_dict
from workers.column_partitioned.scoring import (LookupArrays, decision_bits, model_folder,
                                                rows_to_score)
from workers.data import PartyData
from workers.handlers import Handler, StepContext
from workers.policy import PolicyError
from workers.state import JobState
from workers.model_folder import ModelPart

STALE_ROUNDS = 256
"""Decisions of rounds this far behind the one being finished are dropped (their round was
given up, e.g. after a passive party answered too late): the mailbox does not fill up."""


@dataclass(slots=True)
class RowIndex:
    """A data set's rows by id, restricted to the model's features."""

    rows: dict[str, int]
    x: np.ndarray

    def find(self, ids: list[str]) -> tuple[np.ndarray, list[int]]:
        """Row of each id, and the positions of ids without a row."""
        rows = np.array([self.rows.get(i, -1) for i in ids], dtype=np.int64)
        return rows, np.flatnonzero(rows < 0).tolist()


@dataclass(slots=True)
class PassiveSession:
    """A passive party's lookup table and rows, for the session's lifetime."""

    table: LookupArrays
    records: bytes
    """The table's record ids as every round sends them (uint32 little-endian)."""
    index: RowIndex
    max_rows: int


@dataclass(slots=True)
class ActiveSession:
    """The active party's model, flattened for routing, and where each node's decision is."""

    model: Model
    flat: FlatTrees
    index: RowIndex
    max_rows: int
    own: OwnSplits
    """The nodes this party owns: decided on its rows as the rows reach them."""
    passive_nodes: dict[str, tuple[np.ndarray, np.ndarray]]
    """Per passive party: decision rows of its nodes and their lookup record ids."""
    waiting: dict[int, float] = field(default_factory=dict)
    """Rounds waiting for decisions, and since when (monotonic)."""


def open_scoring(ctx: StepContext, body: OpenScoring) -> tuple[Kind, Any]:
    """Load this party's model part and index its rows by id."""
    actives = [p.name for p in body.parties if p.role == "active"]
    passives = [p.name for p in body.parties if p.role == "passive"]
    if len(actives) != 1 or not 1 <= body.max_rows <= MAX_SCORING_ROWS:
        raise ProtocolError(f"a scoring session needs one active party and at most "
                            f"{MAX_SCORING_ROWS} rows a round")
    me = ctx.party.name
    directory = model_folder(ctx, body.model_job)
    own = ctx.party.dataset_in(body.parties)
    if me == actives[0]:
        model = load_model(ModelPart(directory).model)
        data = rows_to_score(me, own, directory, model.features.get(me, ()))
        role_state: Any = _active_session(me, model, _index(data), passives, body.max_rows)
    else:
        if "batched" not in ctx.party.policy.predict_modes:
            raise PolicyError(f"party {me} refuses the scoring service: it would send all its "
                              f"decisions for every requested row to {actives[0]}, and its "
                              f"policy (predict_modes) allows path-mode prediction only")
        _check_active(me, directory, body.model_job, actives[0])
        path = ModelPart(directory).lookup
        try:
            expected, records = lookup_from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"party {me}: cannot read {path}: {exc}") from None
        data = rows_to_score(me, own, directory, expected)
        table = LookupArrays.of(records)
        role_state = PassiveSession(table=table, index=_index(data), max_rows=body.max_rows,
                                    records=np.array(table.records, dtype="<u4").tobytes())
    state = JobState(kind="score", party=me, active=actives[0], passives=passives, data=data,
                     data_file=own.path)
    state.role_state = role_state
    ctx.state = state
    return MsgType.ACK, Ack(count=len(data.ids))


def _check_active(me: str, directory: Any, model_job: str, active: str) -> None:
    """A passive party's decisions go only to the active party it trained the model with."""
    try:
        saved = json.loads(ModelPart(directory).party.read_text()).get("active")
    except (OSError, ValueError, AttributeError):
        saved = None
    if saved is not None and saved != active:
        raise ProtocolError(f"party {me}: job {model_job}'s model was trained with active party "
                            f"{saved}, not {active}: refused")


def _index(data: PartyData) -> RowIndex:
    """Rows by id (``rows_to_score`` loaded exactly the model's features, in its order)."""
    return RowIndex(rows={ident: k for k, ident in enumerate(data.ids)},
                    x=np.ascontiguousarray(data.x))


def _active_session(me: str, model: Model, index: RowIndex, passives: list[str],
                    max_rows: int) -> ActiveSession:
    flat = flatten(model)
    owners = {node.owner for node in flat.internal}
    strangers = sorted(owners - {me, *passives})
    if strangers:
        raise ProtocolError(f"party {me}: the model has nodes of {', '.join(strangers)}, which "
                            f"the session does not name")
    nodes = flat.internal
    passive_nodes = {}
    for passive in passives:
        mine = [k for k, node in enumerate(nodes) if node.owner == passive]
        passive_nodes[passive] = (np.array(mine, dtype=np.int64),
                                  np.array([nodes[k].record_id for k in mine], dtype=np.int64))
    return ActiveSession(model=model, flat=flat, index=index, max_rows=max_rows,
                         own=OwnSplits.of(flat, me), passive_nodes=passive_nodes)


def _session(ctx: StepContext, kind: type | tuple[type, ...]) -> tuple[JobState, Any]:
    state = ctx.state
    if not isinstance(state, JobState) or not isinstance(state.role_state, kind):
        raise StageError(f"{ctx.party.name}: job {ctx.job} is not a scoring session")
    return state, state.role_state


def find_rows(ctx: StepContext, body: FindRows) -> tuple[Kind, Any]:
    """The membership round (either role): positions of the ids without a row here; nothing
    goes to any other party. No ids: a ping."""
    _, run = _session(ctx, (PassiveSession, ActiveSession))
    if len(body.ids) > run.max_rows:
        raise ProtocolError(f"a membership round asks for at most {run.max_rows} rows, not "
                            f"{len(body.ids)}")
    return MsgType.ROWS_FOUND, RowsFound(round=body.round, unknown=run.index.find(body.ids)[1])


def _check_round(body: ScoreRows, max_rows: int) -> None:
    if not 1 <= len(body.ids) <= max_rows:
        raise ProtocolError(f"a scoring round asks for 1 to {max_rows} rows, not {len(body.ids)}")


def score_rows_passive(ctx: StepContext, body: ScoreRows) -> tuple[Kind, Any]:
    """Round 1 (passive): every record's decision on the requested rows, to the active party."""
    state, run = _session(ctx, PassiveSession)
    _check_round(body, run.max_rows)
    rows, unknown = run.index.find(body.ids)
    if unknown:  # the active party must not wait for decisions that will not come
        decisions = RoundDecisions(round=body.round, records=b"", n_rows=0, bits=b"")
    else:
        bits = run.table.goes_left(run.index.x[rows])
        decisions = RoundDecisions(round=body.round, records=run.records, n_rows=len(rows),
                                   bits=np.packbits(bits).tobytes())
    ctx.send(state.active, MsgType.ROUND_DECISIONS, decisions)
    return MsgType.ROWS_FOUND, RowsFound(round=body.round, unknown=unknown)


def score_rows_active(ctx: StepContext, body: ScoreRows) -> tuple[Kind, Any]:
    """Round 2 (active): walk every tree with own and received decisions; the predictions."""
    state, run = _session(ctx, ActiveSession)
    _check_round(body, run.max_rows)
    _await_decisions(ctx, state, run, body)
    received = {p: ctx.mailbox.take(MsgType.ROUND_DECISIONS, p, body.round)
                for p in state.passives}
    _drop_stale(ctx, body.round)
    rows, unknown = run.index.find(body.ids)
    incomplete = sorted(p for p, msg in received.items() if msg.n_rows == 0)
    n_outputs = len(run.model.base_score)
    if unknown or incomplete:
        return MsgType.SCORES, Scores(body.round, n_outputs, b"", unknown, incomplete)
    x = run.index.x[rows]
    goes_left = np.zeros((len(body.ids), len(run.flat.internal)), dtype=bool)
    for passive, msg in received.items():
        nodes, records = run.passive_nodes[passive]
        sent = _sent_records(passive, msg)
        bits = decision_bits(passive, msg.bits, sent.size, msg.n_rows, len(body.ids),
                             body.round)  # records x rows, as sent
        goes_left[:, nodes] = bits[_record_rows(passive, sent, records)].T
    margin = margins(run.model, run.flat, route(run.flat, goes_left, run.own, x))
    values = run.model.finish(margin).astype("<f8").tobytes()
    return MsgType.SCORES, Scores(body.round, n_outputs, values, [], [])


def _await_decisions(ctx: StepContext, state: JobState, run: ActiveSession,
                     body: ScoreRows) -> None:
    """Wait (``NotReady``) for every passive party's decisions, at most ``wait_seconds``."""
    keys = [(MsgType.ROUND_DECISIONS, p, body.round, -1) for p in state.passives]
    missing = [k[1] for k in keys if not ctx.mailbox.items.get(k)]
    if not missing:
        run.waiting.pop(body.round, None)
        return
    since = run.waiting.setdefault(body.round, time.monotonic())
    if time.monotonic() - since > body.wait_seconds:
        del run.waiting[body.round]
        raise ProtocolError(f"no decisions from {', '.join(missing)} for round {body.round} "
                            f"within {body.wait_seconds:g} s")
    ctx.mailbox.require(*keys)


def _sent_records(passive: str, msg: RoundDecisions) -> np.ndarray:
    if len(msg.records) % 4:
        raise ProtocolError(f"{passive} sent record ids of {len(msg.records)} bytes")
    return np.frombuffer(msg.records, dtype="<u4").astype(np.int64)


def _record_rows(passive: str, order: np.ndarray, needed: np.ndarray) -> np.ndarray:
    """Where each needed lookup record is among the (ascending) records a passive party
    sent."""
    at = np.searchsorted(order, needed)
    if at.size and (at.max() >= order.size or not np.array_equal(order[at], needed)):
        raise ProtocolError(f"{passive} sent no decision for some of its records")
    return at


def _drop_stale(ctx: StepContext, current: int) -> None:
    for key in [k for k in ctx.mailbox.items
                if k[0] == MsgType.ROUND_DECISIONS and k[2] < current - STALE_ROUNDS]:
        while ctx.mailbox.items.get(key):
            ctx.mailbox.take(*key)


ACTIVE_STEPS: dict[Kind, Handler] = {
    MsgType.OPEN_SCORING: open_scoring, MsgType.FIND_ROWS: find_rows,
    MsgType.SCORE_ROWS: score_rows_active}
"""The scoring service's steps of the active party (any vertical protocol whose model parts
are ``model.json`` and ``lookup.json`` includes them)."""
PASSIVE_STEPS: dict[Kind, Handler] = {
    MsgType.OPEN_SCORING: open_scoring, MsgType.FIND_ROWS: find_rows,
    MsgType.SCORE_ROWS: score_rows_passive}
"""The scoring service's steps of a passive party."""
