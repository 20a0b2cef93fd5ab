"""Scoring with a trained model (``fedboost.predict``): federated over the embedded default or
the parties' running workers, or alone with a member's own copy of a shared model."""

from __future__ import annotations

import json
import os
import time
import typing
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from fedboost import _prefect_env
from fedboost.results import PredictResult

if TYPE_CHECKING:
    from flows.config import VerticalJobConfig


DataSource = Union[str, os.PathLike[str], Mapping[str, Union[str, os.PathLike[str]]], None]
"""Rows to score: ``{party: file}``, or one file for a member's own copy of a shared model."""


def predict(model_dir: str | os.PathLike[str], data: DataSource = None, *,
            out: str | os.PathLike[str] | None = None, mode: str = "path",
            batch_size: int = 4096, log_level: str = "WARNING") -> PredictResult:
    """Score rows with a trained model.

    Parameters
    ----------
    model_dir
        A run folder (holding ``job.json``), or a member's own folder of a horizontal or SimFL
        model (``model.json`` and ``party.json``).
    data
        Vertical: ``{party: file}`` of rows to score (default: each party's training file).
        Horizontal/SimFL: ``{member: file}`` or one file, scored locally with the member's
        copy.
    out
        Scores file (default ``model_dir/scores.csv``); over RabbitMQ the active party's
        worker keeps the scores instead.
    mode
        ``path`` (each passive party reveals only the decisions on a row's path) or
        ``batched`` (all its decisions, two rounds per batch).
    batch_size
        Rows per batch.
    log_level
        Prefect's lines on the console at this level and above (as for :func:`train`).
    """
    from workers.model_folder import ModelPart, RunFolder
    _prefect_env.configure()
    from flows.config import ConfigError, validate_job
    from flows.declared import declaration

    folder = Path(model_dir)
    job_file = RunFolder(folder).job
    if not job_file.exists() and ModelPart(folder).party.exists():
        return _predict_with_copy(folder, data, out)  # a member's own folder of a shared model
    try:
        raw = json.loads(job_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{job_file}: not a fedboost model folder ({exc})") from None
    config = validate_job(raw, str(job_file))
    if declaration(config.protocol).shared_model:  # e.g. horizontal: every member's own
        return _predict_member(folder, config, data, out)
    from fedboost._console import prefect_console
    from fedboost._ephemeral import isolate_ephemeral_server

    isolate_ephemeral_server()
    with prefect_console(log_level):
        # not a shared model: a vertical schema (validate_job's union names the others too)
        return _predict_federated(folder, config, data, out, mode,  # type: ignore[arg-type]
                                  batch_size)


def _data_files(data: DataSource) -> tuple[dict[str, Path], Path | None]:
    """``data`` as files by party, or one file without a party."""
    if data is None:
        return {}, None
    if isinstance(data, Mapping):
        return {str(k): Path(v) for k, v in data.items()}, None
    return {}, Path(data)


def _predict_federated(model_dir: Path, config: VerticalJobConfig, data: DataSource,
                       out: str | os.PathLike[str] | None, mode: str,
                       batch_size: int) -> PredictResult:
    from workers.model_folder import RunFolder
    from fedboost.embedded import party_specs, run_embedded
    from flows.config import ConfigError
    from flows.predict import PredictMode, federated_predict

    if mode not in typing.get_args(PredictMode):
        raise ConfigError(f"mode {mode!r}: expected one of {', '.join(typing.get_args(PredictMode))}")
    walk = typing.cast(PredictMode, mode)
    by_party, single = _data_files(data)
    if single is not None:
        raise ConfigError(f"--data {str(single)!r}: expected PARTY=CSV with PARTY one of "
                          f"{', '.join(config.parties)}")
    for party, path in by_party.items():
        if party not in config.parties:
            raise ConfigError(f"--data {party}={path}: expected PARTY=CSV with PARTY one of "
                              f"{', '.join(config.parties)}")
    job = f"{config.job[:47]}-predict-{uuid.uuid4().hex[:8]}"  # the job-name rule: <= 64
    scores_file = f"scores-{job}.csv"  # a plain name: the active worker writes in its model folder

    def run() -> dict[str, Any]:
        return federated_predict(job, config.active, config.passives, scores_file, config.job,
                                 batch_size, walk,
                                 {name: p.dataset or "" for name, p in config.parties.items()})

    if config.transport.kind == "rabbitmq":
        return _predict_on_workers(config, job, scores_file, mode, run,
                                   bool(by_party), out is not None)
    target = Path(out or RunFolder(model_dir).scores).resolve()
    result = run_embedded(job, party_specs(config, model_dir, by_party), run)
    target.parent.mkdir(parents=True, exist_ok=True)
    (model_dir / config.active / scores_file).replace(target)  # the caller, not the worker, picks
    return PredictResult(n_scored=int(result["n_scored"]), seconds=float(result["seconds"]),
                         mode=mode, party=config.active, scores_file=target)


def _predict_on_workers(config: VerticalJobConfig, job: str, scores_file: str, mode: str,
                        run: Callable[[], dict[str, Any]], data_given: bool,
                        out_given: bool) -> PredictResult:
    """Score against the parties' running workers: each loads its part of the trained job from
    its own model folder and scores its own data file; the scores stay with the active party."""
    from flows.coordinator import connected
    from flows.config import ConfigError

    for flag, given in (("--data", data_given), ("--out", out_given)):
        if given:
            raise ConfigError(f"{flag}: over RabbitMQ each worker scores its own data file and "
                              f"the active party keeps the scores in its model folder")
    with connected(config.model_copy(update={"job": job})):
        result = run()
    return PredictResult(n_scored=int(result["n_scored"]), seconds=float(result["seconds"]),
                         mode=mode, party=config.active, scores_file=None,
                         remote_file=f"{config.job}/{config.active}/{scores_file}")


def _predict_with_copy(folder: Path, data: DataSource,
                       out: str | os.PathLike[str] | None) -> PredictResult:
    """Score with a member's own copy of a shared model (``models/JOB/MEMBER`` of its
    worker, holding model.json and party.json)."""
    from workers.model_folder import ModelPart
    from flows.config import ConfigError
    from flows.declared import declared

    try:
        party = json.loads(ModelPart(folder).party.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{folder}/party.json: cannot read it ({exc})") from None
    protocol = declared().get(str(party.get("protocol")))
    if protocol is None or not protocol.shared_model:
        raise ConfigError(f"{folder}: a vertical model part scores only federatedly: "
                          f"run fedboost predict on the run folder that holds job.json")
    by_party, single = _data_files(data)
    if len(by_party) + (single is not None) != 1:
        raise ConfigError("--data CSV: the rows to score with this member's model")
    path = single or next(iter(by_party.values()))
    return _score_member(folder, str(party.get("party")), str(party.get("id_column", "id")),
                         path, Path(out or ModelPart(folder).scores))


def _predict_member(model_dir: Path, config: Any, data: DataSource,
                    out: str | os.PathLike[str] | None) -> PredictResult:
    """Horizontal models are shared: a member scores its own rows locally, no federation."""
    from workers.model_folder import ModelPart, RunFolder
    from flows.config import ConfigError

    by_party, single = _data_files(data)
    if len(by_party) + (single is not None) > 1:
        raise ConfigError("--data: a horizontal model scores one member's file at a time "
                          "(MEMBER=CSV)")
    if single is not None:
        raise ConfigError(f"--data {str(single)!r}: expected MEMBER=CSV with MEMBER one of "
                          f"{', '.join(config.members)}")
    member, path = config.members[0], None
    if by_party:
        member, path = next(iter(by_party.items()))
        if member not in config.members:
            raise ConfigError(f"--data {member}={path}: expected MEMBER=CSV with MEMBER one of "
                              f"{', '.join(config.members)}")
    entry = config.parties[member]
    path = path or entry.data
    if path is None:
        raise ConfigError(f"--data: member {member}'s data file is not in {model_dir}/job.json "
                          f"(trained over a broker): give --data {member}=CSV")
    if not ModelPart(model_dir / member).model.exists():
        raise ConfigError(f"{model_dir / member}: no model.json (over a broker each member's "
                          f"worker keeps its copy: fedboost predict MODELS/{config.job}/{member} "
                          f"--data CSV)")
    return _score_member(model_dir / member, member, entry.id, Path(path),
                         Path(out or RunFolder(model_dir).scores))


def _score_member(folder: Path, member: str, id_column: str, path: Path,
                  out: Path) -> PredictResult:
    """Write the scores of ``path``'s rows under the model in ``folder``."""
    from workers.model_folder import ModelPart
    from boosting.tree import load_model, raw_decider
    from workers.data import load_party_data
    from workers.row_partitioned import OWNER
    from workers.column_partitioned.scoring import write_scores_csv

    started = time.perf_counter()
    model = load_model(ModelPart(folder).model)
    rows = load_party_data(member, path, id_column, None, require_label=False,
                           columns=list(model.features[OWNER]))
    pred = model.predict(raw_decider({OWNER: rows.x}), len(rows.ids))
    target = out.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    write_scores_csv(target, rows.ids, pred, model.params.objective)
    return PredictResult(n_scored=len(rows.ids), seconds=time.perf_counter() - started,
                         mode="local", party=member, scores_file=target)
