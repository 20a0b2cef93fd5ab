"""fedboost's Python API: train, resume, predict, the centralized reference and inspection.

The ``fedboost`` command is a thin layer over these functions; they return typed results and
raise fedboost's errors (``flows.config.ConfigError``, ``workers.DataError``, ...) where the
command prints one line. Importing this module is light: Prefect and the protocol code are
imported on first use, after Prefect's settings (``fedboost._prefect_env``) are in place.

>>> import fedboost
>>> result = fedboost.train("configs/breast.yaml", out="runs/breast")  # doctest: +SKIP
>>> result.final_metrics["valid_auc"]  # doctest: +SKIP
0.9895...
"""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from fedboost import _prefect_env

if TYPE_CHECKING:
    import numpy as np

    from boosting.train import TreeReport
    from fedboost.inspection import ModelInspection
    from flows.config import AnyJobConfig, JobConfig

JobSource = Union[str, os.PathLike[str], Mapping[str, Any], "AnyJobConfig"]
"""A job: a job file's path, its content as a mapping, or a validated job config."""
DataSource = Union[str, os.PathLike[str], Mapping[str, Union[str, os.PathLike[str]]], None]
"""Rows to score: ``{party: file}``, or one file for a member's own copy of a shared model."""


class FedboostWarning(UserWarning):
    """Something works but should be done otherwise (the command prints it as one line)."""


@dataclass(frozen=True, slots=True)
class TreeRecord:
    """One tree of a run: its index, seconds to grow it (None: an earlier, interrupted run of
    the job grew it) and the metrics after it."""

    tree: int
    seconds: float | None
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True)
class TrainResult:
    """A finished training run (federated or centralized)."""

    job: str
    protocol: str
    run_dir: Path
    metrics: dict[str, Any]
    """What ``metrics.json`` holds (row counts, final metrics, seconds, ``trees``, ...)."""
    history: list[TreeRecord]
    model_parts: dict[str, Path]
    """Each party's model file in ``run_dir`` (``model.json``, or a passive party's
    ``lookup.json``); over RabbitMQ the parties' workers keep theirs, so none is here."""

    @property
    def n_trees(self) -> int:
        """Trees in the model."""
        return int(self.metrics["n_trees"])

    @property
    def final_metrics(self) -> dict[str, float]:
        """The model's ``train_*`` and ``valid_*`` metrics after its last tree."""
        return {k: float(v) for k, v in self.metrics.items()
                if k.startswith(("train_", "valid_")) and k != "train_seconds"
                and isinstance(v, (int, float))}

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> TrainResult:
        """The result of a run ``fedboost train`` (or :func:`train`) wrote to ``run_dir``."""
        from flows.config import ConfigError

        folder = Path(run_dir)
        try:
            metrics = json.loads((folder / "metrics.json").read_text())
            job = json.loads((folder / "job.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{folder}: not a finished training run ({exc})") from None
        return cls(job=str(job["job"]), protocol=str(job.get("protocol",
                                                              "vertical_secureboost")),
                   run_dir=folder, metrics=metrics, history=_history(metrics),
                   model_parts=_model_parts(folder, list(job.get("parties", {}))))


@dataclass(frozen=True, slots=True)
class PredictResult:
    """A finished scoring run."""

    n_scored: int
    seconds: float
    mode: str
    """``path`` or ``batched`` (federated), ``local`` (a member's copy of a shared model)."""
    party: str
    """Who scored: the active party (federated) or the member."""
    scores_file: Path | None
    """The scores here (``id,score``; see the README); None over RabbitMQ, where the active
    party's worker keeps them (``remote_file``)."""
    remote_file: str | None = None
    """Over RabbitMQ: the scores file in the active party's models folder (``JOB/PARTY/F``)."""

    def read_scores(self) -> tuple[list[str], np.ndarray]:
        """The scored ids and the score columns (rows x columns) of ``scores_file``."""
        import csv

        import numpy as np

        if self.scores_file is None:
            raise ValueError(f"the scores are at party {self.party}: {self.remote_file}")
        with open(self.scores_file, newline="") as handle:
            rows = list(csv.reader(handle))[1:]
        return [r[0] for r in rows], np.array([[float(v) for v in r[1:]] for r in rows])


def train(config: JobSource, out: str | os.PathLike[str] | None = None, *,
          log_level: str = "WARNING") -> TrainResult:
    """Train a federated model (or continue the job if its parties hold checkpoints of it).

    Parameters
    ----------
    config
        A job file's path, its content as a mapping (relative data paths resolve against the
        current folder), or a validated ``JobConfig``/``HorizontalJobConfig``/
        ``SimflJobConfig``.
    out
        The run folder (default ``runs/<job>``): ``job.json``, ``metrics.json`` and, on the
        embedded default, each party's model part.
    log_level
        Prefect's lines on the console at this level and above (``INFO``: the flow's,
        ``DEBUG``: every task's too); the Prefect API keeps them all.

    Returns
    -------
    TrainResult
        Metrics, per-tree history and model files.

    Raises
    ------
    flows.config.ConfigError, workers.DataError, boosting.BoostingError
        Bad job or data (one line naming the key, party or file).
    flows.coordinator.JobStopped, flows.coordinator.PartyError
        A party refused or failed the job.
    """
    _prefect_env.configure()
    job, source = _job_config(config)
    job = keep_password_out(job, source)
    folder = Path(out) if out is not None else Path("runs") / job.job
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / "job.json", json.loads(job.model_dump_json()), mode=0o600)
    return _run_training(job, folder, log_level)


def resume(job: str, out: str | os.PathLike[str] | None = None, *,
           log_level: str = "WARNING") -> TrainResult:
    """Continue an interrupted job after its last completed tree, from ``out/job.json``
    (default ``runs/<job>``) as :func:`train` wrote it (``log_level``: as for :func:`train`)."""
    _prefect_env.configure()
    from flows.config import ConfigError, validate_job
    from messages.names import JOB_NAME_RULE, is_job_name

    if not is_job_name(job):  # it names a folder under runs/
        raise ConfigError(f"job {job!r} is not a job name ({JOB_NAME_RULE})")
    folder = Path(out) if out is not None else Path("runs") / job
    job_file = folder / "job.json"
    try:
        raw = json.loads(job_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{job_file}: no job to resume ({exc}); 'fedboost train' writes it") \
            from None
    config = keep_password_out(validate_job(raw, str(job_file)), job_file)  # older job.json
    if config.job != job:
        raise ConfigError(f"{job_file} is job {config.job!r}, not {job!r}")
    if stopped_early(job, folder):  # finished: training again would only start it over
        return TrainResult.load(folder)
    return _run_training(config, folder, log_level)


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
    _prefect_env.configure()
    from flows.config import ConfigError, validate_job
    from flows.declared import declaration

    folder = Path(model_dir)
    job_file = folder / "job.json"
    if not job_file.exists() and (folder / "party.json").exists():
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
        return _predict_federated(folder, config, data, out, mode, batch_size)


def centralized(config: JobSource, out: str | os.PathLike[str] | None = None, *,
                on_tree: Callable[[TreeReport], None] | None = None) -> TrainResult:
    """The same model trained in one place on the joined data (vertical) or the union of the
    members' rows (horizontal: with the cuts they share): the lossless reference. ``out``
    defaults to ``runs/<job>-centralized``; ``on_tree`` sees each tree's report."""
    _prefect_env.configure()  # the horizontal reference imports the flow's summary size
    from boosting.params import BoostParams
    from boosting.train import train as train_core
    from boosting.tree import save_model
    from fedboost.joined import join_parties, pool_members
    from flows.config import ConfigError
    from flows.declared import declaration

    job, _ = _job_config(config)
    protocol = declaration(job.protocol)
    if protocol.reference != "boosting":
        raise ConfigError(f"job {job.job}: {protocol.no_reference}")
    folder = Path(out) if out is not None else Path("runs") / f"{job.job}-centralized"
    params = BoostParams.from_dict(job.params.model_dump(exclude={"lsh",
                                                                  "early_stopping_rounds"}))
    cuts = None
    if protocol.shared_model:  # the union of the members' rows (ALL-IN)
        pooled = pool_members(job)
        # horizontal: the cuts its members share; SimFL's builders each bin with their own
        cuts = [pooled.cuts] if protocol.reference_shares_cuts else None
        blocks, y, valid = [pooled.block], pooled.y, None
        n_rows, n_valid = len(pooled.ids), 0
    else:
        joined = join_parties(job)
        blocks, y = joined.part(valid=False)
        valid = joined.part(valid=True) if joined.valid.any() else None
        n_rows, n_valid = len(joined.ids), int(joined.valid.sum())
    trees: list[dict[str, Any]] = []

    def report(r: TreeReport) -> None:
        trees.append({"tree": r.tree, "seconds": r.seconds, **r.metrics})
        if on_tree is not None:
            on_tree(r)

    start = time.perf_counter()
    model = train_core(params, blocks, y, valid=valid, on_tree=report, cuts=cuts)
    rounds = getattr(job.params, "early_stopping_rounds", None)
    if rounds and valid is not None:  # the federated run's rule, on the same curve
        model, trees, stopped = _stop_early(model, trees, rounds)
    result: dict[str, Any] = {
        "n_aligned": n_rows, "n_train": int(y.size), "n_valid": n_valid,
        "n_trees": len(model.trees),
        **{k: v for k, v in trees[-1].items() if k not in ("tree", "seconds")},
        "train_seconds": time.perf_counter() - start,
        "tree_seconds": [t["seconds"] for t in trees], "trees": trees}
    if rounds and valid is not None:
        result.update(stopped)
    save_model(model, folder / "model.json")
    _write_json(folder / "metrics.json", result)
    return TrainResult(job=job.job, protocol=job.protocol, run_dir=folder, metrics=result,
                       history=_history(result),
                       model_parts={"centralized": folder / "model.json"})


def _stop_early(model: Any, trees: list[dict[str, Any]],
                rounds: int) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """The centralized model as early stopping would have left it: trained trees past the
    stopping point and after the best round dropped (the curve to the stopping point kept)."""
    import dataclasses

    from boosting.losses import n_outputs
    from flows.early_stopping import EarlyStopping

    stopper = EarlyStopping(rounds, n_outputs(model.params.objective, model.n_classes))
    valid = [{k: v for k, v in t.items() if k.startswith("valid_")} for t in trees]
    grown = len(trees)
    for end in range(stopper.outputs, grown + 1, stopper.outputs):
        if stopper.after_round(valid[end - 1], valid[:end], end):
            grown = end
            break
    keep = stopper.kept_trees(grown)
    trees = trees[:grown]
    summary = {**{k: v for k, v in trees[keep - 1].items() if k not in ("tree", "seconds")},
               "n_trees": keep, **stopper.summary()}
    return dataclasses.replace(model, trees=model.trees[:keep]), trees, summary


def stopped_early(job: str, out: str | os.PathLike[str] | None = None) -> str | None:
    """Why ``fedboost resume`` has nothing to do for a job that stopped early (one line), or
    None for a job that did not."""
    folder = Path(out) if out is not None else Path("runs") / job
    try:
        metrics = json.loads((folder / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(metrics, dict) or not metrics.get("stopped_early"):
        return None
    return (f"job {job} stopped early after {len(metrics.get('trees', []))} trees "
            f"({metrics.get('best_metric')} did not improve for "
            f"{metrics.get('early_stopping_rounds')} rounds after round "
            f"{metrics.get('best_iteration')}); its model is complete: nothing to resume")


def inspect(model_dir: str | os.PathLike[str], party: str | None = None) -> ModelInspection:
    """What the model parts in ``model_dir`` hold, each as its owner can read it (see
    ``fedboost.inspection``); ``party`` keeps only that party's part."""
    from fedboost.inspection import inspect_model

    return inspect_model(Path(model_dir), party)


def report(run_dir: str | os.PathLike[str], party: str | None = None,
           out: str | os.PathLike[str] | None = None) -> Path:
    """Write the self-contained HTML report of a finished run (``fedboost.report``): learning
    curves, seconds per step, feature importance, trees; as ``party`` sees them (default: the
    lender, or the run's first party). Returns the file written."""
    from fedboost.report import write_report

    return write_report(Path(run_dir), party, None if out is None else Path(out))


def broker_password_warning(source: object) -> str:
    """The warning for a broker password written into a job or worker file."""
    from flows.config import AMQP_URL_ENV

    return (f"{source}: transport.url holds the broker password; it is kept out of run "
            f"folders and Prefect, but give it through {AMQP_URL_ENV} or "
            f"transport.password_file instead")


def _job_config(config: JobSource) -> tuple[AnyJobConfig, str]:
    """A validated job config, and what to call its source in messages."""
    from flows.config import job_schemas, load_config, parse_config

    if isinstance(config, tuple(job_schemas().values())):
        return config, f"job {config.job}"
    if isinstance(config, Mapping):
        return parse_config(dict(config), base=Path.cwd(), source="(mapping)"), "(mapping)"
    return load_config(Path(config)), str(config)


def keep_password_out(config: AnyJobConfig, source: object) -> AnyJobConfig:
    """The job without the password in ``transport.url`` (it goes to job.json and Prefect);
    this process and its children keep it in their environment as ``FEDBOOST_AMQP_URL``."""
    from flows.config import AMQP_URL_ENV, without_broker_password

    stripped = without_broker_password(config)  # type: ignore[arg-type]
    if stripped is None:
        return config
    warnings.warn(broker_password_warning(source), FedboostWarning, stacklevel=3)
    if config.transport.url is not None:
        os.environ.setdefault(AMQP_URL_ENV, config.transport.url)
    return stripped


def _run_training(config: AnyJobConfig, out: Path, log_level: str) -> TrainResult:
    """Train (or, when the parties hold checkpoints of this job, continue) and write
    ``metrics.json``."""
    from fedboost._console import prefect_console
    from fedboost.preflight import check_party_files

    if config.transport.kind != "rabbitmq":  # before Prefect is even imported
        check_party_files(config.parties)
    from fedboost._ephemeral import isolate_ephemeral_server
    from fedboost.embedded import protocol_flow, train_embedded

    isolate_ephemeral_server()
    with prefect_console(log_level):
        if config.transport.kind == "rabbitmq":  # the parties' workers run on their own
            result = protocol_flow(config)(config)
        else:
            result = train_embedded(config, out)
    history = result.pop("history")
    result["trees"] = [{"tree": k, "seconds": s, **m}
                       for k, (s, m) in enumerate(zip(result["tree_seconds"], history,
                                                      strict=True))]
    _write_json(out / "metrics.json", result)
    return TrainResult(job=config.job, protocol=config.protocol, run_dir=out, metrics=result,
                       history=_history(result),
                       model_parts=_model_parts(out, list(config.parties)))


def _history(metrics: Mapping[str, Any]) -> list[TreeRecord]:
    return [TreeRecord(tree=int(t["tree"]), seconds=t.get("seconds"),
                       metrics={k: float(v) for k, v in t.items()
                                if k not in ("tree", "seconds") and isinstance(v, (int, float))})
            for t in metrics.get("trees", [])]


def _model_parts(run_dir: Path, parties: list[str]) -> dict[str, Path]:
    parts = {}
    for party in parties:
        for name in ("model.json", "lookup.json"):
            if (run_dir / party / name).is_file():
                parts[party] = run_dir / party / name
    return parts


def _write_json(path: Path, payload: Any, mode: int = 0o644) -> None:
    from boosting.tree import write_json_atomic

    write_json_atomic(path, payload, permissions=mode)


def _data_files(data: DataSource) -> tuple[dict[str, Path], Path | None]:
    """``data`` as files by party, or one file without a party."""
    if data is None:
        return {}, None
    if isinstance(data, Mapping):
        return {str(k): Path(v) for k, v in data.items()}, None
    return {}, Path(data)


def _predict_federated(model_dir: Path, config: JobConfig, data: DataSource,
                       out: str | os.PathLike[str] | None, mode: str,
                       batch_size: int) -> PredictResult:
    from fedboost.embedded import party_specs, run_embedded
    from flows.config import ConfigError
    from flows.predict import federated_predict

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
                                 batch_size, mode,
                                 {name: p.dataset or "" for name, p in config.parties.items()})

    if config.transport.kind == "rabbitmq":
        return _predict_on_workers(config, job, scores_file, mode, run,
                                   bool(by_party), out is not None)
    target = Path(out or model_dir / "scores.csv").resolve()
    result = run_embedded(job, party_specs(config, model_dir, by_party), run)
    target.parent.mkdir(parents=True, exist_ok=True)
    (model_dir / config.active / scores_file).replace(target)  # the caller, not the worker, picks
    return PredictResult(n_scored=int(result["n_scored"]), seconds=float(result["seconds"]),
                         mode=mode, party=config.active, scores_file=target)


def _predict_on_workers(config: JobConfig, job: str, scores_file: str, mode: str,
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
    from flows.config import ConfigError
    from flows.declared import declared

    try:
        party = json.loads((folder / "party.json").read_text())
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
                         path, Path(out or folder / "scores.csv"))


def _predict_member(model_dir: Path, config: Any, data: DataSource,
                    out: str | os.PathLike[str] | None) -> PredictResult:
    """Horizontal models are shared: a member scores its own rows locally, no federation."""
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
    if not (model_dir / member / "model.json").exists():
        raise ConfigError(f"{model_dir / member}: no model.json (over a broker each member's "
                          f"worker keeps its copy: fedboost predict MODELS/{config.job}/{member} "
                          f"--data CSV)")
    return _score_member(model_dir / member, member, entry.id, Path(path),
                         Path(out or model_dir / "scores.csv"))


def _score_member(folder: Path, member: str, id_column: str, path: Path,
                  out: Path) -> PredictResult:
    """Write the scores of ``path``'s rows under the model in ``folder``."""
    from boosting.tree import load_model, raw_decider
    from workers.data import load_party_data
    from workers.horizontal.tree import OWNER
    from workers.vertical.scoring import write_scores_csv

    started = time.perf_counter()
    model = load_model(folder / "model.json")
    rows = load_party_data(member, path, id_column, None, require_label=False,
                           columns=list(model.features[OWNER]))
    pred = model.predict(raw_decider({OWNER: rows.x}), len(rows.ids))
    target = out.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    write_scores_csv(target, rows.ids, pred, model.params.objective)
    return PredictResult(n_scored=len(rows.ids), seconds=time.perf_counter() - started,
                         mode="local", party=member, scores_file=target)
