"""Opening a training job of a vertical protocol (SecureBoost, the forest) at either role: the
job must give this party its role, the party's policy must allow the protocol and key size,
and the party loads its own data set (labels only at the active party)."""

from __future__ import annotations

from typing import Any

import numpy as np

from boosting.binning import apply_cuts, fit_cuts
from boosting.losses import check_labels
from workers import DataError, ProtocolError, StageError, checkpoint
from workers.data import load_party_data
from workers.handlers import StepContext
from workers.policy import check_job
from workers.state import JobState


def open_active(ctx: StepContext, spec: Any, protocol: str) -> JobState:
    """The active party's state of a new job: its features and labels (``spec``: a job spec
    naming parties, ``key_bits``, the validation hold-out)."""
    actives = [p.name for p in spec.parties if p.role == "active"]
    if actives != [ctx.party.name]:
        raise ProtocolError(f"job names {actives} as active party, this worker is {ctx.party.name}")
    check_job(ctx.party.policy, ctx.party.name, protocol, spec.key_bits, spec.scheme)
    own = ctx.party.dataset_in(spec.parties)
    data = load_party_data(ctx.party.name, own.path, own.id_column, own.label,
                           require_label=True, columns=own.columns, categorical=own.categorical,
                           objective=spec.params.objective)
    return JobState(kind="train", party=ctx.party.name, active=ctx.party.name,
                    passives=[p.name for p in spec.parties if p.role == "passive"], data=data,
                    valid_fraction=spec.valid_fraction, valid_seed=spec.valid_seed,
                    key_bits=spec.key_bits, scheme=spec.scheme, data_file=own.path,
                    digest=checkpoint.job_digest(spec, own.path, own.columns, own.categorical))


def open_passive(ctx: StepContext, spec: Any, protocol: str) -> JobState:
    """A passive party's state of a new job: its features, never a label."""
    actives = [p.name for p in spec.parties if p.role == "active"]
    if len(actives) != 1:
        raise ProtocolError(f"job needs exactly one active party, names {actives}")
    if ctx.party.name not in [p.name for p in spec.parties if p.role == "passive"]:
        raise ProtocolError(f"job does not list {ctx.party.name} as a passive party")
    check_job(ctx.party.policy, ctx.party.name, protocol, spec.key_bits, spec.scheme)
    own = ctx.party.dataset_in(spec.parties)
    data = load_party_data(ctx.party.name, own.path, own.id_column, None,
                           require_label=False, columns=own.columns, categorical=own.categorical)
    if spec.label and spec.label in data.names and own.columns is None:
        # labels stay with the active party: a same-named column here is most likely a copy
        raise DataError(f"party {ctx.party.name}: file {own.path}: column {spec.label!r} has "
                        f"the name of the active party's label; a passive party must not hold "
                        f"labels: remove it, or list this party's features with 'columns:'")
    return JobState(kind="train", party=ctx.party.name, active=actives[0],
                    passives=[p.name for p in spec.parties if p.role == "passive"], data=data,
                    key_bits=spec.key_bits, scheme=spec.scheme, data_file=own.path,
                    digest=checkpoint.job_digest(spec, own.path, own.columns, own.categorical))


def bin_active_rows(state: JobState, objective: str, max_bin: int) -> tuple[np.ndarray, int]:
    """The active party's training labels checked for the objective (and their class count),
    its features binned on the training rows, its validation rows kept for scoring."""
    if state.data.y is None:
        raise StageError(f"{state.party}: the active party has no labels")
    train_rows = state.train_rows
    y = state.data.y[train_rows]
    try:
        n_classes = check_labels(objective, y)
    except ValueError as exc:
        raise DataError(f"party {state.party}: file {state.data_file}: {exc}") from None
    bin_training_rows(state, max_bin)
    return y, n_classes


def bin_training_rows(state: JobState, max_bin: int) -> None:
    """Fit cuts on the training rows and bin them, one column at a time: the training rows'
    features as a whole float64 copy would be 400 MB at a million rows and 50 features, a
    column is 8 MB. Keeps the validation rows' raw features for scoring."""
    x, rows = state.data.x, state.train_rows
    bins = np.empty((rows.size, x.shape[1]), dtype=np.uint8)
    cuts = []
    for j in range(x.shape[1]):
        column = x[rows, j][:, np.newaxis]
        cuts += fit_cuts(column, max_bin)
        bins[:, j] = apply_cuts(column, cuts[-1:], max_bin)[:, 0]
    state.cuts, state.bins = cuts, bins
    state.score_x = x[state.valid_rows]
