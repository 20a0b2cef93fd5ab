"""fedboost's Python API: train, resume, predict, the centralized reference and inspection.

The functions live by concern (``fedboost.results``: what they return; ``fedboost.prediction``:
scoring); this module trains, resumes and trains the centralized reference, and is where
users import them all from.

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
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from fedboost import _prefect_env
from fedboost.prediction import DataSource, predict
from fedboost.results import (PredictResult, TrainResult, TreeRecord, model_parts_in, tree_history,
                              write_json)

if TYPE_CHECKING:
    from boosting.train import TreeReport
    from fedboost.inspection import ModelInspection
    from flows.config import AnyJobConfig

__all__ = [
    "DataSource", "FedboostWarning", "JobSource", "PredictResult", "TrainResult", "TreeRecord",
    "broker_password_warning", "centralized", "inspect", "keep_password_out", "predict",
    "report", "resume", "stopped_early", "train"]


JobSource = Union[str, os.PathLike[str], Mapping[str, Any], "AnyJobConfig"]
"""A job: a job file's path, its content as a mapping, or a validated job config."""


class FedboostWarning(UserWarning):
    """Something works but should be done otherwise (the command prints it as one line)."""


def train(config: JobSource, out: str | os.PathLike[str] | None = None, *,
          log_level: str = "WARNING") -> TrainResult:
    """Train a federated model (or continue the job if its parties hold checkpoints of it).

    Parameters
    ----------
    config
        A job file's path, its content as a mapping (relative data paths resolve against the
        current folder), or a validated job file (``flows.config``: ``SecureBoostJobConfig``,
        ``ForestJobConfig``, ``HorizontalJobConfig``, ``SimflJobConfig``, or a plug-in's).
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
    from workers.model_folder import RunFolder
    _prefect_env.configure()
    job, source = _job_config(config)
    job = keep_password_out(job, source)
    folder = Path(out) if out is not None else Path("runs") / job.job
    folder.mkdir(parents=True, exist_ok=True)
    write_json(RunFolder(folder).job, json.loads(job.model_dump_json()), mode=0o600)
    return _run_training(job, folder, log_level)


def resume(job: str, out: str | os.PathLike[str] | None = None, *,
           log_level: str = "WARNING") -> TrainResult:
    """Continue an interrupted job after its last completed tree, from ``out/job.json``
    (default ``runs/<job>``) as :func:`train` wrote it (``log_level``: as for :func:`train`)."""
    from workers.model_folder import RunFolder
    _prefect_env.configure()
    from flows.config import ConfigError, validate_job
    from messages.names import JOB_NAME_RULE, is_job_name

    if not is_job_name(job):  # it names a folder under runs/
        raise ConfigError(f"job {job!r} is not a job name ({JOB_NAME_RULE})")
    folder = Path(out) if out is not None else Path("runs") / job
    job_file = RunFolder(folder).job
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


def centralized(config: JobSource, out: str | os.PathLike[str] | None = None, *,
                on_tree: Callable[[TreeReport], None] | None = None) -> TrainResult:
    """The same model trained in one place on the joined data (vertical) or the union of the
    members' rows (horizontal: with the cuts they share): the lossless reference. ``out``
    defaults to ``runs/<job>-centralized``; ``on_tree`` sees each tree's report."""
    from workers.model_folder import ModelPart, RunFolder
    _prefect_env.configure()  # the horizontal reference imports the flow's summary size
    from boosting.params import BoostParams
    from boosting.train import train as train_core
    from boosting.tree import save_model
    from fedboost.joined import join_parties, pool_members
    from flows.config import ConfigError, HorizontalJobConfig, SimflJobConfig, VerticalJobConfig
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
        if not isinstance(job, (HorizontalJobConfig, SimflJobConfig)):
            raise ConfigError(f"job {job.job}: protocol {job.protocol} has no pooled reference")
        pooled = pool_members(job)
        # horizontal: the cuts its members share; SimFL's builders each bin with their own
        cuts = [pooled.cuts] if protocol.reference_shares_cuts else None
        blocks, y, valid = [pooled.block], pooled.y, None
        n_rows, n_valid = len(pooled.ids), 0
    else:
        if not isinstance(job, VerticalJobConfig):
            raise ConfigError(f"job {job.job}: protocol {job.protocol} has no joined reference")
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
    save_model(model, ModelPart(folder).model)
    write_json(RunFolder(folder).metrics, result)
    return TrainResult(job=job.job, protocol=job.protocol, run_dir=folder, metrics=result,
                       history=tree_history(result),
                       model_parts={"centralized": ModelPart(folder).model})


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
    from workers.model_folder import RunFolder

    folder = Path(out) if out is not None else Path("runs") / job
    try:
        metrics = json.loads(RunFolder(folder).metrics.read_text())
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

    if isinstance(config, Mapping):
        return parse_config(dict(config), base=Path.cwd(), source="(mapping)"), "(mapping)"
    if isinstance(config, (str, os.PathLike)):
        return load_config(Path(config)), str(config)
    if isinstance(config, tuple(job_schemas().values())):
        return config, f"job {config.job}"
    raise TypeError(f"a job is a job file's path, a mapping or a validated job config, not "
                    f"{type(config).__name__}")


def keep_password_out(config: AnyJobConfig, source: object) -> AnyJobConfig:
    """The job without the password in ``transport.url`` (it goes to job.json and Prefect);
    this process and its children keep it in their environment as ``FEDBOOST_AMQP_URL``."""
    from flows.config import AMQP_URL_ENV, without_broker_password

    stripped = without_broker_password(config)
    if stripped is None:
        return config
    warnings.warn(broker_password_warning(source), FedboostWarning, stacklevel=3)
    if config.transport.url is not None:
        os.environ.setdefault(AMQP_URL_ENV, config.transport.url)
    return stripped


def _run_training(config: AnyJobConfig, out: Path, log_level: str) -> TrainResult:
    """Train (or, when the parties hold checkpoints of this job, continue) and write
    ``metrics.json``."""
    from workers.model_folder import RunFolder
    from fedboost._console import prefect_console
    from fedboost.preflight import check_party_files

    if config.transport.kind != "rabbitmq":  # before Prefect is even imported
        check_party_files(config.parties, getattr(config.params, "objective", None))
    from fedboost._ephemeral import isolate_ephemeral_server
    from fedboost.embedded import protocol_flow, train_embedded
    from flows.run import RunResult

    isolate_ephemeral_server()
    with prefect_console(log_level):
        if config.transport.kind == "rabbitmq":  # the parties' workers run on their own
            result = protocol_flow(config)(config)
        else:
            result = train_embedded(config, out)
    metrics = RunResult.from_dict(result).as_metrics_json()
    write_json(RunFolder(out).metrics, metrics)
    return TrainResult(job=config.job, protocol=config.protocol, run_dir=out, metrics=metrics,
                       history=tree_history(metrics),
                       model_parts=model_parts_in(out, list(config.parties)))
