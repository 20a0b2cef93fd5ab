"""The ``fedboost`` command: train, predict, report, centralized, worker, serve.

User errors (bad config, bad data, empty intersection) end with one line on stderr naming the
party and file, and exit status 1 (2 for command-line usage); faults keep their traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedboost import _prefect_env

if TYPE_CHECKING:  # flows are imported late: Prefect's settings come first
    from flows.config import JobConfig

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130
"""Ctrl-C, as shells report a process ended by SIGINT."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    _prefect_env.configure()
    args = _parser().parse_args(argv)
    from boosting import BoostingError
    from flows._tasks import JobStopped, PartyError
    from fedboost.report import ReportError
    from flows.config import ConfigError
    from workers import DataError

    try:
        return int(args.run(args))
    except (ConfigError, DataError, BoostingError, JobStopped, ReportError) as exc:
        print(f"fedboost: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except PartyError as exc:
        if not exc.user_error:
            raise
        print(f"fedboost: error: {exc.reply.message}", file=sys.stderr)
        return EXIT_USER_ERROR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedboost", description=__doc__)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    train = sub.add_parser("train", help="train federatedly (embedded default)")
    train.add_argument("config", type=Path, help="job file (YAML)")
    train.add_argument("--out", type=Path, help="output folder (default runs/<job>)")
    _progress_options(train)
    train.set_defaults(run=_train)
    resume = sub.add_parser("resume", help="continue an interrupted training job after its "
                            "last completed tree")
    resume.add_argument("job", help="the job's name (its folder runs/JOB holds job.json)")
    resume.add_argument("--out", type=Path, help="the job's output folder (default runs/JOB)")
    _progress_options(resume)
    resume.set_defaults(run=_resume)
    report = sub.add_parser("report", help="write a run's report: one self-contained HTML page "
                            "(learning curves, time per step, feature importance, trees)")
    report.add_argument("run_dir", type=Path, help="folder written by 'fedboost train'")
    report.add_argument("--party", help="whose report: it names only this party's features "
                        "(default: the active party, or the first member)")
    report.add_argument("--out", type=Path, help="HTML file (default RUN_DIR/report.html, or "
                        "RUN_DIR/report-PARTY.html with --party)")
    report.set_defaults(run=_report)
    predict = sub.add_parser("predict", help="score rows federatedly with a trained model")
    predict.add_argument("model_dir", type=Path, help="folder written by 'fedboost train'")
    predict.add_argument("--data", action="append", default=[], metavar="PARTY=CSV",
                         help="a party's rows to score (default: its training file; embedded "
                              "only: a worker over RabbitMQ scores its own file)")
    predict.add_argument("--out", type=Path, help="scores file (default MODEL_DIR/scores.csv; "
                         "embedded only: over RabbitMQ the active party's worker keeps them)")
    predict.add_argument("--batch-size", type=int, default=4096)
    predict.add_argument("--mode", choices=["path", "batched"], default="path",
                         help="path (default): each passive party reveals only the decisions on "
                              "each row's path, one round per tree level; batched: all its "
                              "decisions for every row, two rounds per batch")
    predict.set_defaults(run=_predict)
    central = sub.add_parser("centralized", help="train the same model on the joined data")
    central.add_argument("config", type=Path, help="job file (YAML)")
    central.add_argument("--out", type=Path, help="output folder (default runs/<job>-centralized)")
    central.set_defaults(run=_centralized)
    worker = sub.add_parser("worker", help="run a party's long-running worker on RabbitMQ")
    worker.add_argument("--party", required=True, help="this party's name")
    worker.add_argument("--config", required=True, type=Path,
                        help="the party's worker file, or a job file naming the party")
    worker.add_argument("--processes", type=int, help="processes to start (default: the file's "
                        "'processes', 1): the extra ones share histogram work")
    worker.add_argument("--models", type=Path, help="model folder (default: the file's 'models')")
    worker.add_argument("--health-file", help="touch this file while serving (health checks)")
    worker.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    worker.set_defaults(run=_worker)
    serve = sub.add_parser("serve", help="serve every protocol's training flow as a Prefect "
                           "deployment (vertical_secureboost/NAME, horizontal/NAME, "
                           "simfl/NAME)")
    serve.add_argument("--name", default="fedboost", help="deployment name (default fedboost)")
    serve.add_argument("--config", type=Path, action="append", default=[],
                       help="a job file whose content becomes its protocol's deployment's default "
                            "parameter (repeat: one per protocol)")
    serve.add_argument("--cron", help="optional schedule, e.g. '0 2 * * *'")
    serve.set_defaults(run=_serve)
    defs = sub.add_parser("definitions", help="write RabbitMQ users and permissions per party")
    defs.add_argument("--party", action="append", required=True, metavar="NAME[=@FILE]",
                      help="a party (repeat per party); its broker password comes from "
                           "FEDBOOST_<NAME>_PASSWORD or the first line of FILE (NAME=PASSWORD "
                           "works but shows in ps and shell history)")
    defs.add_argument("--flow-password", metavar="@FILE",
                      help="the flows' user's password file (default: FEDBOOST_FLOW_PASSWORD)")
    defs.add_argument("--vhost", default="/", help="the federation's virtual host (default /)")
    defs.add_argument("--out", type=Path, required=True, help="definitions.json to write")
    defs.set_defaults(run=_definitions)
    keys = sub.add_parser("keys", help="make this party's (or the flows') Ed25519 signing key")
    keys.add_argument("--out", type=Path, required=True, help="key folder (signing.key_dir)")
    keys.add_argument("--name", action="append", required=True,
                      help="the identity: this party's name, or 'flow' on the flows' runner")
    keys.add_argument("--local-trial", action="store_true",
                      help="allow several --name: every identity's private key on this one "
                           "machine, for trials where one operator runs the whole federation")
    keys.set_defaults(run=_keys)
    return parser


def _progress_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--quiet", action="store_true",
                         help="no progress display: only the final line (and errors)")
    command.add_argument("--log-level", default="WARNING",
                         choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                         help="Prefect's log lines on the console (default WARNING; INFO shows "
                              "the flow's lines, DEBUG every task's too)")


def _write_json(path: Path, payload: Any, mode: int = 0o644) -> None:
    from boosting.tree import write_json_atomic

    write_json_atomic(path, payload)
    path.chmod(mode)


def _warn_broker_password(source: object) -> None:
    from flows.config import AMQP_URL_ENV

    print(f"fedboost: warning: {source}: transport.url holds the broker password; it is kept "
          f"out of run folders and Prefect, but give it through {AMQP_URL_ENV} or "
          f"transport.password_file instead", file=sys.stderr)


def _keep_password_out(config: Any, source: object) -> Any:
    """The job without the password in ``transport.url`` (it goes to job.json and Prefect);
    this process and its children keep it in their environment as ``FEDBOOST_AMQP_URL``."""
    from flows.config import AMQP_URL_ENV, without_broker_password

    stripped = without_broker_password(config)
    if stripped is None:
        return config
    _warn_broker_password(source)
    os.environ.setdefault(AMQP_URL_ENV, config.transport.url)
    return stripped


class _UserErrorFilter(logging.Filter):
    """Keep tracebacks of user errors (bad data, empty intersection) off the console.

    Prefect logs a failing task or flow with its traceback; for bad input the CLI prints one
    line instead. Records still reach the Prefect API, so the UI shows the full failure.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        from flows._tasks import JobStopped, PartyError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, JobStopped) or (isinstance(exc, PartyError) and exc.user_error):
            self.seen.add(str(exc))
            return False
        message = record.getMessage()
        return not any(text in message for text in self.seen)


def _quiet_task_logs() -> None:
    """Show the flow's per-tree progress, not a line per task (the Prefect UI has those)."""
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    user_errors = _UserErrorFilter()
    for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name or None).handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.addFilter(user_errors)


def _metrics_summary(result: dict[str, Any]) -> str:
    keys = [k for k in result if k.startswith(("train_", "valid_")) and k != "train_seconds"]
    return ", ".join(f"{k}={result[k]:.4f}" for k in keys)


def _train(args: argparse.Namespace) -> int:
    from flows.config import load_config

    config = _keep_password_out(load_config(args.config), args.config)
    out = args.out or Path("runs") / config.job
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "job.json", json.loads(config.model_dump_json()), mode=0o600)
    return _run_training(config, out, args)


def _resume(args: argparse.Namespace) -> int:
    from flows.config import ConfigError, validate_job
    from messages.names import JOB_NAME_RULE, is_job_name

    if not is_job_name(args.job):  # it names a folder under runs/
        raise ConfigError(f"job {args.job!r} is not a job name ({JOB_NAME_RULE})")
    out = args.out or Path("runs") / args.job
    job_file = out / "job.json"
    try:
        raw = json.loads(job_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{job_file}: no job to resume ({exc}); 'fedboost train' writes it") \
            from None
    config = validate_job(raw, str(job_file))
    config = _keep_password_out(config, job_file)  # a job.json of an older version
    if config.job != args.job:
        raise ConfigError(f"{job_file} is job {config.job!r}, not {args.job!r}")
    return _run_training(config, out, args)


def _console_logs(level: str) -> None:
    """Prefect's console lines at ``level`` and above (the API, and so the UI, keeps all)."""
    if level == "DEBUG":
        logging.getLogger("prefect.task_runs").setLevel(logging.INFO)
    for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name or None).handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setLevel(getattr(logging, level))


def _run_training(config: Any, out: Path, args: argparse.Namespace) -> int:
    """Train (or, when the parties hold checkpoints of this job, continue) and report."""
    from contextlib import nullcontext

    from fedboost.embedded import protocol_flow, train_embedded
    from fedboost.progress_view import progress_view
    from flows.progress import listening

    flow = protocol_flow(config)  # imports Prefect's flows: its logging is set up first
    _quiet_task_logs()
    _console_logs(args.log_level)
    mode = "quiet" if args.quiet else "bar" if sys.stdout.isatty() else "lines"
    view = progress_view(mode, sys.stdout)
    interrupted: list[int] = []

    def on_interrupt(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with view or nullcontext(), listening(config.job, view) if view else nullcontext():
            if config.transport.kind == "rabbitmq":  # the parties' workers run on their own
                result = flow(config)
            else:
                result = train_embedded(config, out)
    except BaseException:
        # Ctrl-C also stops the ephemeral Prefect server, so what surfaces may be Prefect
        # failing to record the crash rather than KeyboardInterrupt itself
        if not interrupted:
            raise
        print(f"fedboost: interrupted; the parties keep their checkpoints: 'fedboost resume "
              f"{config.job} --out {out}' continues after the last finished tree",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, previous)
    history = result.pop("history")
    result["trees"] = [{"tree": k, "seconds": s, **m}
                       for k, (s, m) in enumerate(zip(result["tree_seconds"], history,
                                                      strict=True))]
    _write_json(out / "metrics.json", result)
    resumed = (f" (resumed after {result['resumed_after']} trees)" if result["resumed_after"]
               else "")
    rows = "aligned rows" if config.protocol == "vertical_secureboost" else "rows"
    print(f"trained {result['n_trees']} trees{resumed} on {result['n_aligned']} {rows} in "
          f"{result['train_seconds']:.1f} s: {_metrics_summary(result)}; model in {out}/")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from fedboost.embedded import party_specs, run_embedded
    from flows.config import ConfigError, JobConfig, validate_job
    from flows.predict import federated_predict

    job_file = args.model_dir / "job.json"
    if not job_file.exists() and (args.model_dir / "party.json").exists():
        return _predict_with_copy(args)  # a member's own folder of a horizontal model
    try:
        raw = json.loads(job_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{job_file}: not a fedboost model folder ({exc})") from None
    config = validate_job(raw, str(job_file))
    if not isinstance(config, JobConfig):  # horizontal and SimFL models are every member's
        return _predict_member(args, config)
    data: dict[str, Path] = {}
    for item in args.data:
        party, sep, path = item.partition("=")
        if not sep or party not in config.parties:
            raise ConfigError(f"--data {item!r}: expected PARTY=CSV with PARTY one of "
                              f"{', '.join(config.parties)}")
        data[party] = Path(path)
    job = f"{config.job[:47]}-predict-{uuid.uuid4().hex[:8]}"  # the job-name rule: <= 64
    scores_file = f"scores-{job}.csv"  # a plain name: the active worker writes in its model folder

    def run() -> dict[str, Any]:
        return federated_predict(job, config.active, config.passives, scores_file, config.job,
                                 args.batch_size, args.mode,
                                 {name: p.dataset or "" for name, p in config.parties.items()})

    _quiet_task_logs()
    if config.transport.kind == "rabbitmq":
        return _predict_on_workers(args, config, job, scores_file, run)
    out = (args.out or args.model_dir / "scores.csv").resolve()
    result = run_embedded(job, party_specs(config, args.model_dir, data), run)
    out.parent.mkdir(parents=True, exist_ok=True)
    (args.model_dir / config.active / scores_file).replace(out)  # the CLI, not the worker, picks
    print(f"scored {result['n_scored']} rows in {result['seconds']:.1f} s "
          f"({args.mode} mode): {out}")
    return 0


def _predict_with_copy(args: argparse.Namespace) -> int:
    """Score with a member's own copy of a shared model (``models/JOB/MEMBER`` of its
    worker, holding model.json and party.json): ``--data CSV`` or ``--data MEMBER=CSV``."""
    from flows.config import ConfigError

    try:
        party = json.loads((args.model_dir / "party.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{args.model_dir}/party.json: cannot read it ({exc})") from None
    if party.get("protocol") not in ("horizontal", "simfl"):
        raise ConfigError(f"{args.model_dir}: a vertical model part scores only federatedly: "
                          f"run fedboost predict on the run folder that holds job.json")
    if len(args.data) != 1:
        raise ConfigError("--data CSV: the rows to score with this member's model")
    path = Path(args.data[0].partition("=")[2] or args.data[0])
    return _score_member(args, args.model_dir, str(party.get("party")),
                         str(party.get("id_column", "id")), path)


def _score_member(args: argparse.Namespace, folder: Path, member: str, id_column: str,
                  path: Path) -> int:
    """Write the scores of ``path``'s rows under the model in ``folder``."""
    from boosting.tree import load_model, raw_decider
    from workers.data import load_party_csv
    from workers.horizontal.tree import OWNER
    from workers.vertical.scoring import write_scores_csv

    started = time.perf_counter()
    model = load_model(folder / "model.json")
    rows = load_party_csv(member, path, id_column, None, require_label=False,
                          columns=list(model.features[OWNER]))
    pred = model.predict(raw_decider({OWNER: rows.x}), len(rows.ids))
    out = (args.out or args.model_dir / "scores.csv").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_scores_csv(out, rows.ids, pred, model.params.objective)
    print(f"scored {len(rows.ids)} rows of member {member} in {time.perf_counter() - started:.1f} s "
          f"with its copy of the model: {out}")
    return 0


def _predict_member(args: argparse.Namespace, config: Any) -> int:
    """Horizontal models are shared: a member scores its own rows locally, no federation."""
    from flows.config import ConfigError

    if len(args.data) > 1:
        raise ConfigError("--data: a horizontal model scores one member's file at a time "
                          "(MEMBER=CSV)")
    member, path = config.members[0], None
    if args.data:
        member, sep, given = args.data[0].partition("=")
        if not sep or member not in config.members:
            raise ConfigError(f"--data {args.data[0]!r}: expected MEMBER=CSV with MEMBER one of "
                              f"{', '.join(config.members)}")
        path = Path(given)
    entry = config.parties[member]
    path = path or entry.data
    if path is None:
        raise ConfigError(f"--data: member {member}'s data file is not in {args.model_dir}/job.json "
                          f"(trained over a broker): give --data {member}=CSV")
    if not (args.model_dir / member / "model.json").exists():
        raise ConfigError(f"{args.model_dir / member}: no model.json (over a broker each member's "
                          f"worker keeps its copy: fedboost predict MODELS/{config.job}/{member} "
                          f"--data CSV)")
    return _score_member(args, args.model_dir / member, member, entry.id, Path(path))


def _predict_on_workers(args: argparse.Namespace, config: JobConfig, job: str, scores_file: str,
                        run: Callable[[], dict[str, Any]]) -> int:
    """Score against the parties' running workers: each loads its part of the trained job from
    its own model folder and scores its own data file; the scores stay with the active party."""
    from flows._tasks import connected
    from flows.config import ConfigError

    for flag, given in (("--data", args.data), ("--out", args.out)):
        if given:
            raise ConfigError(f"{flag}: over RabbitMQ each worker scores its own data file and "
                              f"the active party keeps the scores in its model folder")
    with connected(config.model_copy(update={"job": job})):
        result = run()
    print(f"scored {result['n_scored']} rows in {result['seconds']:.1f} s ({args.mode} mode): "
          f"party {config.active} wrote {config.job}/{config.active}/{scores_file} in its "
          f"models folder")
    return 0


def _report(args: argparse.Namespace) -> int:
    from fedboost.report import write_report

    path = write_report(args.run_dir, party=args.party, out=args.out)
    print(f"wrote {path}")
    return 0


def _worker(args: argparse.Namespace) -> int:
    from fedboost.worker import run_workers
    from flows.config import load_worker_config
    from messages import MessageError
    from messages.rabbitmq import holds_password
    from messages.signing import Sealer
    from messages.tls import ssl_options_for

    config = load_worker_config(args.config, args.party)
    update: dict[str, Any] = {}
    if args.processes is not None:
        if args.processes < 1:
            print("fedboost: error: --processes must be at least 1", file=sys.stderr)
            return EXIT_USER_ERROR
        update["processes"] = args.processes
    if args.models is not None:
        update["models"] = args.models.resolve()
    config = config.model_copy(update=update)
    if holds_password(config.transport.url):
        _warn_broker_password(args.config)
    url = config.transport.amqp_url()  # a missing or unreadable password file: say so here
    for name, path in config.data_files().items():
        if not path.is_file():
            print(f"fedboost: error: party {config.party}: data set {name}: data file {path} "
                  f"not found", file=sys.stderr)
            return EXIT_USER_ERROR
    try:  # fail here, not in each process: the party's key must load
        Sealer.from_folder(config.signing.key_dir, config.party)
        ssl_options_for(config.party, url, config.transport.tls_options())
    except MessageError as exc:
        print(f"fedboost: error: party {config.party}: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    return run_workers(config, getattr(logging, args.log_level), args.health_file)


def _serve(args: argparse.Namespace) -> int:
    from prefect import serve

    from flows.config import ConfigError, load_config
    from flows.protocols import TITLES, TRAINING_FLOWS

    parameters: dict[str, dict[str, Any]] = {}
    for path in args.config:  # deployment parameters are stored in Prefect's database
        config = _keep_password_out(load_config(path), path)
        if config.protocol in parameters:
            raise ConfigError(f"--config {path}: a second job file of protocol "
                              f"{config.protocol}; give one per protocol")
        parameters[config.protocol] = {"config": json.loads(config.model_dump_json())}
    if args.cron and not parameters:
        raise ConfigError("--cron: a schedule needs the job it runs (--config JOB)")
    deployments = [
        flow.to_deployment(
            # a schedule runs a deployment's default job: only those given one have it
            name=args.name, parameters=parameters.get(protocol),
            cron=args.cron if protocol in parameters else None,
            tags=["fedboost", protocol],
            description=f"{TITLES[protocol]} over RabbitMQ: the parameter is a job file's "
                        f"content (protocol {protocol}, transport.kind rabbitmq); the parties' "
                        f"workers must be running.")
        for protocol, flow in TRAINING_FLOWS.items()]
    serve(*deployments)
    return 0


def _definitions(args: argparse.Namespace) -> int:
    from fedboost.broker import definitions, password_from

    passwords = {}
    for item in args.party:
        name, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", name) or (sep and not value):
            print(f"fedboost: error: --party {item!r}: expected NAME or NAME=@FILE",
                  file=sys.stderr)
            return EXIT_USER_ERROR
        passwords[name] = password_from(f"--party {name}", name, value if sep else None)
    flow = password_from("--flow-password", "flow", args.flow_password)
    content = json.dumps(definitions(passwords, flow, args.vhost), indent=2) + "\n"
    args.out.write_text(content)  # salted hashes only, never a password
    print(f"wrote users, permissions and queues for {', '.join(sorted(passwords))} and flows "
          f"to {args.out}")
    return 0


def _keys(args: argparse.Namespace) -> int:
    from messages.signing import write_key_pair

    names = list(dict.fromkeys(args.name))
    if len(names) > 1 and not args.local_trial:
        print("fedboost: error: --name given several times: each party makes its own key on its "
              "own machine ('fedboost keys --name PARTY') and shares only the .pub; "
              "--local-trial makes them all here, for a trial run by one operator",
              file=sys.stderr)
        return EXIT_USER_ERROR
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", name):
            print(f"fedboost: error: --name {name!r}: a party name is 1-32 letters, digits, "
                  f"'_', '-'", file=sys.stderr)
            return EXIT_USER_ERROR
    for name in names:
        made = write_key_pair(args.out, name)
        print(f"{'wrote' if made else 'kept existing'} {args.out / (name + '.key')} and .pub")
    if args.local_trial:
        print("local trial: this folder holds every identity's private key; in a federation each "
              "party makes its own")
    else:
        print(f"keep {names[0]}.key here; send {names[0]}.pub to every party and the flows' "
              f"runner, and put theirs in {args.out}")
    return 0


def _centralized(args: argparse.Namespace) -> int:
    from boosting.params import BoostParams
    from boosting.train import TreeReport, train
    from boosting.tree import save_model
    from fedboost.joined import join_parties, pool_members
    from flows.config import JobConfig, load_config

    config = load_config(args.config)
    out = args.out or Path("runs") / f"{config.job}-centralized"
    params = BoostParams.from_dict(config.params.model_dump(exclude={"lsh"}))
    cuts = None
    if not isinstance(config, JobConfig):  # the union of the members' rows (ALL-IN)
        pooled = pool_members(config)
        # horizontal: the cuts its members share; SimFL's builders each bin with their own
        cuts = [pooled.cuts] if config.protocol == "horizontal" else None
        blocks, y, valid = [pooled.block], pooled.y, None
        n_rows, n_valid = len(pooled.ids), 0
    else:
        joined = join_parties(config)
        blocks, y = joined.part(valid=False)
        valid = joined.part(valid=True) if joined.valid.any() else None
        n_rows, n_valid = len(joined.ids), int(joined.valid.sum())
    trees: list[dict[str, Any]] = []

    def report(r: TreeReport) -> None:
        trees.append({"tree": r.tree, "seconds": r.seconds, **r.metrics})
        print(f"tree {r.tree + 1}/{r.n_trees}: " + ", ".join(f"{k}={v:.4f}" for k, v in r.metrics.items()))

    start = time.perf_counter()
    model = train(params, blocks, y, valid=valid, on_tree=report, cuts=cuts)
    result: dict[str, Any] = {"n_aligned": n_rows, "n_train": int(y.size),
                              "n_valid": n_valid, "n_trees": len(model.trees),
                              **{k: v for k, v in trees[-1].items() if k not in ("tree", "seconds")},
                              "train_seconds": time.perf_counter() - start,
                              "tree_seconds": [t["seconds"] for t in trees], "trees": trees}
    save_model(model, out / "model.json")
    _write_json(out / "metrics.json", result)
    print(f"centralized: {_metrics_summary(result)}; model in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
