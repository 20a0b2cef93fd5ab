"""Federated prediction: opening a prediction job, batched mode, and the scores file.

Batched mode, two rounds per batch (seed 002, Alg. 5). Round 1: every passive party evaluates
*all* its lookup records on the batch at once and sends the decisions bit-packed, so the active
party learns every decision of every row. Round 2: the active party walks every tree, taking
its own decisions from its thresholds and the others' from the bits. Path mode, which reveals
only the decisions on each row's path, is in ``workers.column_partitioned.paths``.

A prediction job names the trained job whose model part each worker loads from its own model
folder, and scores the party's own data file; the scores file is written only inside the
active party's model folder. A training job's validation rows are scored the same way; what
these steps need of a protocol's training state is declared here (``ValidatedTraining``,
``StagedTraining``), so no protocol's package is imported.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from boosting._typing import FloatArray
from boosting.binning import goes_left_raw, goes_left_table
from boosting.metrics import evaluate
from boosting.params import BoostParams
from boosting.tree import Model, Tree, TreeNode, load_model, open_private, write_json_atomic
from messages.bodies import Ack, Metric, Step, TreeFinished
from messages.secureboost import Decisions, OpenPrediction
from messages.envelope import Kind, MsgType
from messages.names import JOB_NAME_RULE, is_job_name
from workers import DataError, ProtocolError, StageError
from workers.column_partitioned.alignment import receive_alignment
from workers.column_partitioned.lookup import LookupRecord, lookup_from_dict
from workers.column_partitioned.released import DecisionLedger
from workers.data import PartyData, load_categories, load_party_data
from workers.handlers import StepContext
from workers.party import DataSet
from workers.policy import PolicyError
from workers.state import JobState
from workers.model_folder import ModelPart


SCORES_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A scores file is a plain name in the active party's model folder: no separators, no ``..``
as a component, nothing absolute."""


@dataclass(slots=True)
class ActiveScoring:
    """A saved model being used to score new rows."""

    model: Model
    scores_path: Path
    """Inside the party's model folder of the trained job."""
    score_margin: np.ndarray | None = None
    trained_rows: dict[str, str] | None = None
    """id -> 'train' or 'valid' for the trained job's aligned rows (``training_rows.json``)."""


class ScoredRole(Protocol):
    """An active party's role whose rows are scored: a saved model's (``ActiveScoring``), or a
    training job's of any protocol (its validation rows)."""

    score_margin: np.ndarray | None
    """The scored rows' margins, batch by batch (``store_margin``)."""


class ValidatedTraining(ScoredRole, Protocol):
    """An active party's training state whose validation rows are scored (SecureBoost's
    ``workers.vertical.active_state.ActiveTraining``, the forest's
    ``workers.forest.active_state.ActiveForest``)."""

    params: BoostParams

    def finish(self, margin: FloatArray) -> FloatArray:
        """Predictions from margins."""
        ...


@runtime_checkable
class StagedTraining(ValidatedTraining, Protocol):
    """A training state whose trees are the stages of one sum (boosting: SecureBoost's
    ``ActiveTraining``): its validation keeps the margins after each tree, the learning curve,
    and walks only the trees added since its last validation. ``isinstance`` checks that the
    members are there: a forest's state, whose trees are not stages, has neither
    ``staged_margin`` nor ``valid_walked``."""

    trees: list[Tree]
    staged_margin: np.ndarray | None
    """Validation margins after each tree (trees x rows x outputs)."""
    valid_walked: int
    """Trees whose validation decisions are in ``score_margin``: the next path-mode walk
    (``paths``) asks only about the others."""


MAX_STAGED_VALUES = 5_000_000
"""Margins kept for validation metrics after every tree (trees x rows x outputs, 40 MB of
float64): beyond it the validation curve has only its final point."""


def keeps_stages(n_trees: int, n_rows: int, outputs: int) -> bool:
    """Whether validation margins after every tree fit in :data:`MAX_STAGED_VALUES`."""
    return n_trees * n_rows * outputs <= MAX_STAGED_VALUES


def model_folder(ctx: StepContext, model_job: str) -> Path:
    """This party's model folder of a trained job (``{job}`` in its configured path)."""
    if not is_job_name(model_job):
        raise ProtocolError(f"model job {model_job[:80]!r} is not a job name ({JOB_NAME_RULE})")
    return ctx.party.model_folder(model_job)


def scores_path(folder: Path, name: str) -> Path:
    """Where the scores go: ``name`` inside the model folder, or a ``ProtocolError``."""
    if not SCORES_FILE.fullmatch(name) or ".." in name:
        raise ProtocolError(f"scores file {name[:80]!r} must be a plain file name (letters, "
                            f"digits, '_', '.', '-'; no '/', no '..'): it is written only in "
                            f"the active party's model folder")
    return folder / name


@dataclass(slots=True)
class PassiveScoring:
    """A saved lookup table being used to score new rows."""

    records: dict[int, LookupRecord]
    ledger: DecisionLedger | None = None
    """The path-mode decisions this model has released per row, across prediction jobs."""


def open_prediction(ctx: StepContext, body: OpenPrediction) -> tuple[Kind, Any]:
    """Load this party's model part and the rows to score."""
    actives = [p.name for p in body.parties if p.role == "active"]
    passives = [p.name for p in body.parties if p.role == "passive"]
    if len(actives) != 1 or body.batch_size < 1:
        raise ProtocolError("a prediction job needs one active party and a positive batch size")
    directory = model_folder(ctx, body.model_job)
    is_active = ctx.party.name == actives[0]
    scores = scores_path(directory, body.scores_file) if is_active else directory
    own = ctx.party.dataset_in(body.parties)
    if is_active:
        model = load_model(ModelPart(directory).model)
        expected = model.features.get(ctx.party.name, ())
        role_state: Any = ActiveScoring(model=model, scores_path=scores,
                                        trained_rows=load_training_rows(directory))
    else:
        path = ModelPart(directory).lookup
        try:
            expected, records = lookup_from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"party {ctx.party.name}: cannot read {path}: {exc}") from None
        role_state = PassiveScoring(records=records, ledger=DecisionLedger.of_model(
            ctx.party.private_dir(), body.model_job))
    data = rows_to_score(ctx.party.name, own, directory, expected)
    state = JobState(kind="predict", party=ctx.party.name, active=actives[0], passives=passives,
                     data=data, predict_batch=body.batch_size)
    state.role_state = role_state
    ctx.state = state
    return MsgType.ACK, Ack(count=len(data.ids))


def rows_to_score(party: str, own: DataSet, folder: Path, features: tuple[str, ...]) -> PartyData:
    """A data set's rows with the features of the model part in ``folder``, in its order, and
    its categorical columns coded as in training (a category training never saw: missing)."""
    return load_party_data(party, own.path, own.id_column, own.label, require_label=False,
                           columns=list(features), categories=load_categories(folder))


def score_x(state: JobState) -> np.ndarray:
    """Raw features of the rows this job scores (validation rows, or every aligned row)."""
    if state.score_x is None:  # prediction jobs score every aligned row
        state.score_x = state.data.x[state.require_aligned()[0]]
    return state.score_x


def lookup_records(state: JobState) -> dict[int, LookupRecord]:
    """The passive party's lookup table (training or saved)."""
    records = getattr(state.role_state, "records", None)  # any protocol's passive role
    if isinstance(records, dict):
        return records
    raise StageError(f"{state.party} holds no lookup table")


def evaluate_nodes(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Round 1 (passive): decisions of all own records for one batch, bit-packed."""
    if "batched" not in ctx.party.policy.predict_modes:
        raise PolicyError(f"party {ctx.party.name}: its policy answers path-mode prediction "
                          f"only (policy.predict_modes), not batched")
    state: JobState = ctx.state
    if state.kind == "predict" and state.aligned is None:
        ctx.mailbox.require((MsgType.ALIGNED_ROWS, state.active, -1, -1))
        receive_alignment(ctx)
    x = score_x(state)[state.batch_rows(body.tree)]
    table = LookupArrays.of(lookup_records(state))
    ctx.send(state.active, MsgType.DECISIONS, table.decisions(x, body.tree))
    return MsgType.ACK, Ack(count=int(x.shape[0]))


@dataclass(frozen=True, slots=True)
class LookupArrays:
    """A lookup table as arrays (records in id order), to decide all of them on many rows."""

    records: list[int]
    features: np.ndarray
    thresholds: np.ndarray
    missing_left: np.ndarray
    flip: np.ndarray
    """Records whose children the active party knows in swapped order (``LookupRecord.flip``)."""

    @classmethod
    def of(cls, records: dict[int, LookupRecord]) -> LookupArrays:
        ids = sorted(records)
        return cls(ids, np.array([records[r].feature for r in ids], dtype=np.int64),
                   np.array([records[r].threshold for r in ids], dtype=np.float64),
                   np.array([records[r].missing_left for r in ids], dtype=bool),
                   np.array([records[r].flip for r in ids], dtype=bool))

    def goes_left(self, x: np.ndarray) -> np.ndarray:
        """Records x rows: whether each row goes to the child the active party calls left."""
        bits = goes_left_table(x, self.features, self.thresholds, self.missing_left)
        if self.flip.any():
            bits ^= self.flip[:, None]
        return bits

    def decisions(self, x: np.ndarray, batch: int) -> Decisions:
        """Every record's decision on every row of ``x`` (own features), bit-packed
        record-major."""
        return Decisions(batch=batch, records=self.records, n_rows=int(x.shape[0]),
                         bits=np.packbits(self.goes_left(x)).tobytes())


def model_of(state: JobState) -> Model:
    """The active party's model (being trained, or saved)."""
    run = state.role_state
    if isinstance(run, ActiveScoring):
        return run.model
    scoring_model = getattr(run, "scoring_model", None)  # a training role of any protocol
    if callable(scoring_model):
        model: Model = scoring_model()
        return model
    raise StageError(f"{state.party} holds no model")


def finish_traversal(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Round 2 (active): walk the trees for one batch with own and received decisions."""
    state: JobState = ctx.state
    model = model_of(state)
    ctx.mailbox.require(*[(MsgType.DECISIONS, p, body.tree, -1) for p in state.passives])
    all_x = score_x(state)
    batch = state.batch_rows(body.tree)
    x = all_x[batch]
    n = x.shape[0]
    received: dict[str, tuple[dict[int, int], np.ndarray]] = {}
    for passive in state.passives:
        msg: Decisions = ctx.mailbox.take(MsgType.DECISIONS, passive, body.tree)
        received[passive] = ({r: k for k, r in enumerate(msg.records)}, decision_bits(
            passive, msg.bits, len(msg.records), msg.n_rows, n, body.tree))

    def decide(node: TreeNode, rows: np.ndarray) -> np.ndarray:
        if node.owner == state.party:
            return goes_left_raw(x[rows, node.feature], node.threshold, node.missing_left)
        index, bits = received[node.owner]
        if node.record_id not in index:
            raise ProtocolError(f"{node.owner} sent no decision for record {node.record_id}")
        return bits[index[node.record_id], rows]

    store_margin(state, batch, model.raw_predict(decide, n))
    return MsgType.ACK, Ack(count=n)


def decision_bits(passive: str, packed: bytes, n_records: int, n_rows: int, n: int,
                  batch: int) -> np.ndarray:
    """A passive party's decisions on ``n`` rows as a records x rows boolean matrix, checked
    for shape (``n_rows`` and the bytes are what it sent)."""
    if n_rows != n or len(packed) != (n_records * n + 7) // 8:
        raise ProtocolError(f"{passive} sent decisions of the wrong shape for batch {batch}")
    bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8), count=n_records * n)
    return bits.reshape(n_records, n).astype(bool)


def store_margin(state: JobState, batch: slice, margin: np.ndarray) -> None:
    """Keep the margins of one scored batch (either mode)."""
    run: ScoredRole = state.role_state
    if run.score_margin is None:
        run.score_margin = np.zeros((score_x(state).shape[0], margin.shape[1]))
    run.score_margin[batch] = margin


def store_staged(state: JobState, batch: slice | np.ndarray, staged: np.ndarray,
                 first: int = 0) -> None:
    """Keep one validation batch's margins after each tree (trees x rows x outputs) from tree
    ``first`` on (a walk of the trees added since the last one extends the earlier stages)."""
    run: StagedTraining = state.role_state
    trees = first + staged.shape[0]
    kept = run.staged_margin
    if kept is None or kept.shape[0] < trees:
        grown = np.zeros((trees, score_x(state).shape[0], staged.shape[2]))
        if kept is not None:
            grown[:kept.shape[0]] = kept
        run.staged_margin = kept = grown
    kept[first:trees, batch] = staged


def _scored_margin(run: ScoredRole) -> np.ndarray:
    if run.score_margin is None:
        raise StageError("no batch has been scored yet")
    return run.score_margin


def evaluate_validation(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Validation metrics of a training job from the scored hold-out rows."""
    state: JobState = ctx.state
    run: ValidatedTraining = state.role_state
    if state.data.y is None:
        raise StageError(f"{state.party}: no labels to validate against")
    y = state.data.y[state.valid_rows]
    pred = run.finish(_scored_margin(run))
    metrics = evaluate(run.params.objective, y, pred, "valid")
    staged = None  # a forest's trees are not stages
    if isinstance(run, StagedTraining):  # the next validation walks only newer trees
        run.valid_walked = len(run.trees)
        staged = run.staged_margin
        if staged is not None and staged.shape[0] != len(run.trees):
            staged = None  # stages of earlier trees were not kept (too many): no curve
    per_tree = [] if staged is None else [
        [Metric(k, v) for k, v in evaluate(run.params.objective, y, run.finish(m), "valid").items()]
        for m in staged]
    return MsgType.TREE_FINISHED, TreeFinished([Metric(k, v) for k, v in metrics.items()],
                                               per_tree)


def write_scores(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Write id and prediction(s) of every scored row to the scores file."""
    state: JobState = ctx.state
    run: ActiveScoring = state.role_state
    pred = run.model.finish(_scored_margin(run))
    ids = [state.data.ids[r] for r in state.require_aligned()[0]]
    trained = run.trained_rows
    splits = None if trained is None else [trained.get(i, "new") for i in ids]
    # checked at open_prediction: inside the model folder
    write_scores_csv(run.scores_path, ids, pred, run.model.params.objective, splits)
    return MsgType.ACK, Ack(count=len(ids))



def save_training_rows(directory: Path, ids: list[str], valid: np.ndarray) -> None:
    """Write ``training_rows.json``: the aligned ids by their role in training (0600)."""
    write_json_atomic(ModelPart(directory).training_rows, {
        "format": "fedboost-training-rows", "version": 1,
        "train": [i for i, v in zip(ids, valid.tolist()) if not v],
        "valid": [i for i, v in zip(ids, valid.tolist()) if v]})


def load_training_rows(directory: Path) -> dict[str, str] | None:
    """id -> 'train' / 'valid' from ``training_rows.json``; None if the folder has none (a model
    saved before it was written, or a protocol that does not keep it)."""
    try:
        raw = json.loads(ModelPart(directory).training_rows.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("format") != "fedboost-training-rows":
        return None
    return {**dict.fromkeys(map(str, raw.get("train", [])), "train"),
            **dict.fromkeys(map(str, raw.get("valid", [])), "valid")}


def write_scores_csv(path: Path, ids: list[str], pred: np.ndarray, objective: str,
                     splits: list[str] | None = None) -> None:
    """``id,score`` (binary), ``id,prediction`` (regression) or ``id,label,score_k..``
    (multiclass), then with ``splits`` a last column ``split``: ``train`` (a row the model
    was trained on), ``valid`` (held out of that training) or ``new``; written 0600 and
    atomically."""
    if objective == "binary":
        header, values = ["id", "score"], pred[:, :1]
    elif objective == "regression":
        header, values = ["id", "prediction"], pred[:, :1]
    else:
        header = ["id", "label"] + [f"score_{k}" for k in range(pred.shape[1])]
        values = np.column_stack([np.argmax(pred, axis=1), pred])
    with open_private(path) as handle:
        writer = csv.writer(handle)
        writer.writerow(header + (["split"] if splits is not None else []))
        for k, (ident, row) in enumerate(zip(ids, values)):
            writer.writerow([ident, *[repr(float(v)) if j or objective != "multiclass" else int(v)
                                      for j, v in enumerate(row)],
                             *([splits[k]] if splits is not None else [])])
