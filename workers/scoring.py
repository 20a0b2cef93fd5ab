"""Federated prediction in two rounds per batch (seed 002, Alg. 5).

Round 1: every passive party evaluates *all* its lookup records on the batch at once and sends
the decisions bit-packed. Round 2: the active party walks every tree, taking its own decisions
from its thresholds and the others' from the bits. Used for the validation rows of a training
job and for ``fedboost predict``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boosting.binning import goes_left_raw
from boosting.losses import transform
from boosting.metrics import evaluate
from boosting.tree import Model, TreeNode, load_model, open_private
from messages.bodies import Ack, Decisions, Metric, OpenPrediction, Step, TreeFinished
from messages.envelope import MsgType
from workers import DataError, ProtocolError, StageError
from workers.active import ActiveTraining
from workers.alignment import receive_alignment
from workers.data import PartyData, load_party_csv
from workers.passive import LookupRecord, PassiveTraining, lookup_from_dict
from workers.runtime import StepContext
from workers.state import JobState


@dataclass(slots=True)
class ActiveScoring:
    """A saved model being used to score new rows."""

    model: Model
    scores_path: str
    score_margin: np.ndarray | None = None


@dataclass(slots=True)
class PassiveScoring:
    """A saved lookup table being used to score new rows."""

    records: dict[int, LookupRecord]


def open_prediction(ctx: StepContext, body: OpenPrediction) -> tuple[MsgType, Any]:
    """Load this party's model part and the rows to score."""
    actives = [p.name for p in body.parties if p.role == "active"]
    passives = [p.name for p in body.parties if p.role == "passive"]
    if len(actives) != 1 or body.batch_size < 1:
        raise ProtocolError("a prediction job needs one active party and a positive batch size")
    directory = Path(ctx.party.model_dir)
    is_active = ctx.party.name == actives[0]
    data = load_party_csv(ctx.party.name, ctx.party.data, ctx.party.id_column, ctx.party.label,
                          require_label=False)
    if is_active:
        model = load_model(directory / "model.json")
        expected = model.features.get(ctx.party.name, ())
        role_state: Any = ActiveScoring(model=model, scores_path=body.scores_path)
    else:
        path = directory / "lookup.json"
        try:
            expected, records = lookup_from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"party {ctx.party.name}: cannot read {path}: {exc}") from None
        role_state = PassiveScoring(records=records)
    missing = [n for n in expected if n not in data.names]
    if missing:
        raise DataError(f"party {ctx.party.name}: file {ctx.party.data}: missing model feature "
                        f"column(s) {', '.join(missing)}")
    columns = [data.names.index(n) for n in expected]
    data = PartyData(ids=data.ids, names=tuple(expected), x=data.x[:, columns], y=data.y)
    state = JobState(kind="predict", party=ctx.party.name, active=actives[0], passives=passives,
                     data=data, predict_batch=body.batch_size)
    state.role_state = role_state
    ctx.state = state
    return MsgType.ACK, Ack(count=len(data.ids))


def _score_x(state: JobState) -> np.ndarray:
    if state.score_x is None:  # prediction jobs score every aligned row
        state.score_x = state.data.x[state.require_aligned()[0]]
    return state.score_x


def _records(state: JobState) -> dict[int, LookupRecord]:
    run = state.role_state
    if isinstance(run, (PassiveTraining, PassiveScoring)):
        return run.records
    raise StageError(f"{state.party} holds no lookup table")


def evaluate_nodes(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Round 1 (passive): decisions of all own records for one batch, bit-packed."""
    state: JobState = ctx.state
    if state.kind == "predict" and state.aligned is None:
        ctx.mailbox.require((MsgType.ALIGNED_ROWS, state.active, -1, -1))
        receive_alignment(ctx)
    x = _score_x(state)[state.batch_rows(body.tree)]
    records = _records(state)
    ids = sorted(records)
    bits = np.zeros((len(ids), x.shape[0]), dtype=bool)
    for k, rid in enumerate(ids):
        r = records[rid]
        bits[k] = goes_left_raw(x[:, r.feature], r.threshold, r.missing_left)
    ctx.send(state.active, MsgType.DECISIONS, Decisions(
        batch=body.tree, records=ids, n_rows=int(x.shape[0]), bits=np.packbits(bits).tobytes()))
    return MsgType.ACK, Ack(count=int(x.shape[0]))


def _model(state: JobState) -> Model:
    run = state.role_state
    if isinstance(run, ActiveScoring):
        return run.model
    if isinstance(run, ActiveTraining):
        return run.model({})
    raise StageError(f"{state.party} holds no model")


def finish_traversal(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Round 2 (active): walk the trees for one batch with own and received decisions."""
    state: JobState = ctx.state
    model = _model(state)
    ctx.mailbox.require(*[(MsgType.DECISIONS, p, body.tree, -1) for p in state.passives])
    all_x = _score_x(state)
    batch = state.batch_rows(body.tree)
    x = all_x[batch]
    n = x.shape[0]
    received: dict[str, tuple[dict[int, int], np.ndarray]] = {}
    for passive in state.passives:
        msg: Decisions = ctx.mailbox.take(MsgType.DECISIONS, passive, body.tree)
        if msg.n_rows != n or len(msg.bits) != (len(msg.records) * n + 7) // 8:
            raise ProtocolError(f"{passive} sent decisions of the wrong shape for batch {body.tree}")
        bits = np.unpackbits(np.frombuffer(msg.bits, dtype=np.uint8), count=len(msg.records) * n)
        received[passive] = ({r: k for k, r in enumerate(msg.records)},
                             bits.reshape(len(msg.records), n).astype(bool))

    def decide(node: TreeNode, rows: np.ndarray) -> np.ndarray:
        if node.owner == state.party:
            return goes_left_raw(x[rows, node.feature], node.threshold, node.missing_left)
        index, bits = received[node.owner]
        if node.record_id not in index:
            raise ProtocolError(f"{node.owner} sent no decision for record {node.record_id}")
        return bits[index[node.record_id], rows]

    margin = model.raw_predict(decide, n)
    run: ActiveTraining | ActiveScoring = state.role_state
    if run.score_margin is None:
        run.score_margin = np.zeros((all_x.shape[0], margin.shape[1]))
    run.score_margin[batch] = margin
    return MsgType.ACK, Ack(count=n)


def _scored_margin(run: ActiveTraining | ActiveScoring) -> np.ndarray:
    if run.score_margin is None:
        raise StageError("no batch has been scored yet")
    return run.score_margin


def evaluate_validation(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Validation metrics of a training job from the scored hold-out rows."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    if state.data.y is None:
        raise StageError(f"{state.party}: no labels to validate against")
    y = state.data.y[state.valid_rows]
    pred = transform(run.params.objective, _scored_margin(run))
    metrics = evaluate(run.params.objective, y, pred, "valid")
    return MsgType.TREE_FINISHED, TreeFinished([Metric(k, v) for k, v in metrics.items()])


def write_scores(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Write id and prediction(s) of every scored row to the scores file."""
    state: JobState = ctx.state
    run: ActiveScoring = state.role_state
    pred = transform(run.model.params.objective, _scored_margin(run))
    ids = [state.data.ids[r] for r in state.require_aligned()[0]]
    objective = run.model.params.objective
    if objective == "binary":
        header, values = ["id", "score"], pred[:, :1]
    elif objective == "regression":
        header, values = ["id", "prediction"], pred[:, :1]
    else:
        header = ["id", "label"] + [f"score_{k}" for k in range(pred.shape[1])]
        values = np.column_stack([np.argmax(pred, axis=1), pred])
    path = Path(run.scores_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open_private(tmp) as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for ident, row in zip(ids, values):
            writer.writerow([ident, *[repr(float(v)) if k or objective != "multiclass" else int(v)
                                      for k, v in enumerate(row)]])
    tmp.replace(path)
    return MsgType.ACK, Ack(count=len(ids))
