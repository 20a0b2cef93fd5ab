"""The ``fedboost`` command: train, predict, inspect, report, export, centralized, worker,
serve; a thin layer over the Python API (``fedboost.api``) where one exists.

User errors (bad config, bad data, empty intersection) end with one line on stderr naming the
party and file, and exit status 1 (2 for command-line usage); faults keep their traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from fedboost import _prefect_env, api  # api imports flows late: Prefect's settings come first
from fedboost import deployment_commands as deployment
from fedboost.exit_codes import EXIT_INTERRUPTED, EXIT_USER_ERROR
from fedboost.provision_command import add_command as add_provision
from fedboost.serving import add_command as add_serve_model
from fedboost.serving import serve_model
from fedboost.run_lines import metrics_summary, quietly, report_training, resume_line
from workers.model_folder import RunFolder


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    _prefect_env.configure()
    warnings.showwarning = _show_warning
    warnings.simplefilter("always", api.FedboostWarning)
    args = _parser().parse_args(argv)
    if argv is None and args.run in _STARTS_PROCESSES:
        # the command owns this process (console script, python -m): whatever it starts, and
        # whatever Prefect starts for it, is stopped when it ends, SIGKILL included; a caller
        # passing argv (a test, a host program) keeps its process's environment to itself
        from workers.lifeline import guard_descendants

        guard_descendants()
    # errors printed as one line; none of these imports Prefect (a bad job file answers fast)
    from boosting import BoostingError
    from flows.config import ConfigError
    from flows.errors import JobStopped, PartyError, StepTimeout
    from workers import DataError

    try:
        return int(args.run(args))
    except KeyboardInterrupt:  # 'train' and 'resume' catch it themselves, with the resume line
        print("fedboost: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConfigError, DataError, BoostingError, JobStopped, StepTimeout) as exc:
        return _user_error(str(exc), exc)
    except PartyError as exc:
        if not exc.user_error:
            raise
        return _user_error(exc.reply.message, exc)
    except ValueError as exc:  # fedboost.report is loaded only by the command that raises it
        report = sys.modules.get("fedboost.report")
        if report is None or not isinstance(exc, report.ReportError):
            raise
        print(f"fedboost: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


def _user_error(message: str, exc: BaseException) -> int:
    """One line for the error, then any line the command added (the resume command)."""
    print(f"fedboost: error: {message}", file=sys.stderr)
    for note in getattr(exc, "__notes__", ()):
        print(note, file=sys.stderr)
    return EXIT_USER_ERROR


def _parser() -> argparse.ArgumentParser:
    """Every command and its flags; those that set up a federation over RabbitMQ (worker,
    serve, definitions, keys) run in ``fedboost.deployment_commands``."""
    parser = argparse.ArgumentParser(prog="fedboost", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fedboost {_version()}")
    sub = parser.add_subparsers(metavar="COMMAND")
    parser.set_defaults(run=lambda _: _usage(parser))
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
    predict.add_argument("--batch-size", type=int, default=4096,
                         help="rows scored per batch (default 4096): fewer hold less in memory")
    predict.add_argument("--mode", choices=["path", "batched"], default="path",
                         help="path (default): each passive party reveals only the decisions on "
                              "each row's path, one round per tree level; batched: all its "
                              "decisions for every row, two rounds per batch")
    _log_level_option(predict)
    predict.set_defaults(run=_predict)
    inspect = sub.add_parser("inspect", help="show each party's model part in a model folder "
                             "(trees, the thresholds it holds, lookup tables)")
    inspect.add_argument("model_dir", type=Path, help="a run folder, or one party's folder")
    inspect.add_argument("--party", help="only this party's part")
    inspect.add_argument("--json", action="store_true", help="one JSON object, for tools")
    inspect.set_defaults(run=_inspect)
    export = sub.add_parser("export", help="write a model a party holds whole (a horizontal or "
                            "SimFL member's, an active party's without passive splits) in "
                            "another format: xgboost-json, XGBoost's JSON model")
    export.add_argument("model_dir", type=Path, help="a run folder, or one party's folder")
    export.add_argument("--format", default="xgboost-json", choices=["xgboost-json"],
                        help="xgboost-json (default): xgboost.Booster(model_file=OUT) reads it")
    export.add_argument("--out", type=Path, required=True, help="file to write")
    export.add_argument("--party", help="whose model (default: the active party, or the first "
                        "member)")
    export.set_defaults(run=_export)
    central = sub.add_parser("centralized", help="train the same model on the joined data")
    central.add_argument("config", type=Path, help="job file (YAML)")
    central.add_argument("--out", type=Path, help="output folder (default runs/<job>-centralized)")
    central.set_defaults(run=_centralized)
    worker = sub.add_parser("worker", help="run a party's long-running worker on RabbitMQ")
    worker.add_argument("--party", required=True, help="this party's name")
    worker.add_argument("--config", required=True, type=Path,
                        help="the party's worker file, or a job file naming the party")
    worker.add_argument("--processes", type=int, help="processes to start (default: the file's "
                        "'processes', 1): the extra ones share histogram work (a passive "
                        "party) or encryption and decryption (the active party)")
    worker.add_argument("--crypto-processes", type=int,
                        help="cores each process encrypts and decrypts on (default: the "
                        "file's 'crypto_processes', every core)")
    worker.add_argument("--no-make-ahead", action="store_true",
                        help="as the active party, make no Paillier obfuscators ahead on idle "
                        "CPU (the file's 'make_ahead: false')")
    worker.add_argument("--models", type=Path, help="model folder (default: the file's 'models')")
    worker.add_argument("--health-file", help="touch this file while serving (health checks)")
    worker.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="the worker's log lines at this level and above (default INFO: a "
                             "line per protocol step it answers; WARNING: problems only)")
    worker.set_defaults(run=deployment.worker)
    serve = sub.add_parser("serve", help="serve every protocol's training flow as a Prefect "
                           "deployment (vertical_secureboost/NAME, horizontal/NAME, "
                           "simfl/NAME, vertical_random_forest/NAME)")
    serve.add_argument("--name", default="fedboost", help="deployment name (default fedboost)")
    serve.add_argument("--config", type=Path, action="append", default=[],
                       help="a job file whose content becomes its protocol's deployment's default "
                            "parameter (repeat: one per protocol)")
    serve.add_argument("--cron", help="optional schedule, e.g. '0 2 * * *'")
    serve.set_defaults(run=deployment.serve)
    add_serve_model(sub)
    defs = sub.add_parser("definitions", help="write RabbitMQ users and permissions per party")
    defs.add_argument("--party", action="append", required=True, metavar="NAME[=@FILE]",
                      help="a party (repeat per party); its broker password comes from "
                           "FEDBOOST_<NAME>_PASSWORD or the first line of FILE (NAME=PASSWORD "
                           "works but shows in ps and shell history)")
    defs.add_argument("--flow-password", metavar="@FILE",
                      help="the flows' user's password file (default: FEDBOOST_FLOW_PASSWORD)")
    defs.add_argument("--vhost", default="/", help="the federation's virtual host (default /)")
    defs.add_argument("--out", type=Path, required=True, help="definitions.json to write")
    defs.set_defaults(run=deployment.definitions)
    keys = sub.add_parser("keys", help="make this party's (or the flows') Ed25519 signing key")
    keys.add_argument("--out", type=Path, required=True, help="key folder (signing.key_dir)")
    keys.add_argument("--name", action="append", required=True,
                      help="the identity: this party's name, or 'flow' on the flows' runner")
    keys.add_argument("--local-trial", action="store_true",
                      help="allow several --name: every identity's private key on this one "
                           "machine, for trials where one operator runs the whole federation")
    keys.set_defaults(run=deployment.keys)
    add_provision(sub)
    return parser


_DESCRIPTION = """Federated gradient-boosted trees: train a model with other parties without
sharing data (vertical SecureBoost, vertical random forest, horizontal, SimFL), score with it,
report and inspect it. 'fedboost COMMAND --help' shows a command's flags."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedboost")
    except PackageNotFoundError:  # a checkout on sys.path without an install
        return "(not installed)"


def _usage(parser: argparse.ArgumentParser) -> int:
    """Bare ``fedboost``: the help, as 'fedboost --help' prints it."""
    parser.print_help()
    return 0


def _progress_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--quiet", action="store_true",
                         help="no progress display: only the final line (and errors)")
    _log_level_option(command)


def _log_level_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--log-level", default="WARNING",
                         choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                         help="Prefect's log lines on the console (default WARNING; INFO shows "
                              "the flow's lines, DEBUG every task's too)")


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """fedboost's own warnings as one line, like its errors; others as Python shows them."""
    if issubclass(category, api.FedboostWarning):
        print(f"fedboost: warning: {message}", file=sys.stderr)
    else:
        _SHOW_WARNING(message, category, filename, lineno, file, line)


_SHOW_WARNING = warnings.showwarning


def _train(args: argparse.Namespace) -> int:
    def resume_hint(interrupted: bool, trees_reached: bool) -> str | None:
        from flows.config import load_config

        config = load_config(args.config)
        out = args.out or Path("runs") / config.job
        return resume_line(config, f"fedboost resume {config.job} --out {out}", out,
                            interrupted, trees_reached,
                            f"'fedboost train {args.config}' starts it again")

    return _with_progress(args, lambda: api.train(args.config, args.out,
                                                  log_level=args.log_level), resume_hint)


def _resume(args: argparse.Namespace) -> int:
    stopped = api.stopped_early(args.job, args.out)
    if stopped:
        print(stopped)
        return 0

    def resume_hint(interrupted: bool, trees_reached: bool) -> str | None:
        from flows.config import validate_job

        out = args.out or Path("runs") / args.job
        job_file = RunFolder(out).job
        config = validate_job(json.loads(job_file.read_text()), str(job_file))
        command = f"fedboost resume {args.job} --out {out}"
        return resume_line(config, command, out, interrupted, trees_reached,
                            f"'{command}' starts it again")

    return _with_progress(args, lambda: api.resume(args.job, args.out,
                                                   log_level=args.log_level), resume_hint)


def _with_progress(args: argparse.Namespace, run: Callable[[], api.TrainResult],
                   resume_hint: Callable[[bool, bool], str | None]) -> int:
    """Train with the run's progress shown (a bar on a terminal, plain lines otherwise, none
    with --quiet); Ctrl-C ends in one line naming the command that continues the job (or
    saying there is nothing to continue yet); a failed run's error gets that line too when
    the parties hold checkpoints."""
    from contextlib import nullcontext

    from fedboost.progress_view import progress_view
    from flows.progress import TREES, ProgressEvent, TreeProgress, listening

    mode = "quiet" if args.quiet else "bar" if sys.stdout.isatty() else "lines"
    view = progress_view(mode, sys.stdout)
    interrupted: list[int] = []
    reached: list[str] = []  # stages past binning: the parties checkpoint after it

    def heard(event: ProgressEvent) -> None:
        if isinstance(event, TreeProgress) or getattr(event, "stage", "") in (
                TREES, "resuming", "validation", "saving"):
            reached.append("trees")
        if view is not None:
            view(event)

    def on_interrupt(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with view or nullcontext(), listening(None, heard):
            result = run()
    except BaseException as exc:
        # Ctrl-C also stops the ephemeral Prefect server, so what surfaces may be Prefect
        # failing to record the crash rather than KeyboardInterrupt itself
        if not interrupted:
            if isinstance(exc, Exception):
                hint = quietly(lambda: resume_hint(False, bool(reached)))
                if hint:
                    exc.add_note(f"fedboost: {hint}")  # printed after the error's line
            raise
        hint = quietly(lambda: resume_hint(True, bool(reached)))
        print(f"fedboost: interrupted{f'; {hint}' if hint else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, previous)
    return report_training(result)


def _predict(args: argparse.Namespace) -> int:
    from flows.config import ConfigError

    data: str | dict[str, str] | None = None
    if len(args.data) == 1 and "=" not in args.data[0]:
        data = args.data[0]  # a member's own copy of a shared model takes a bare file
    elif args.data:
        pairs = [item.partition("=") for item in args.data]
        bare = [item for item, (_, sep, _) in zip(args.data, pairs) if not sep]
        if bare:
            raise ConfigError(f"--data {bare[0]!r}: expected PARTY=CSV")
        data = {party: path for party, _, path in pairs}
    result = api.predict(args.model_dir, data, out=args.out, mode=args.mode,
                         batch_size=args.batch_size, log_level=args.log_level)
    done = f"scored {result.n_scored} rows"
    if result.remote_file is not None:
        print(f"{done} in {result.seconds:.1f} s ({result.mode} mode): party {result.party} "
              f"wrote {result.remote_file} in its models folder")
    elif result.mode == "local":
        print(f"{done} of member {result.party} in {result.seconds:.1f} s with its copy of the "
              f"model: {result.scores_file}")
    else:
        print(f"{done} in {result.seconds:.1f} s ({result.mode} mode): {result.scores_file}")
    return 0


def _report(args: argparse.Namespace) -> int:
    print(f"wrote {api.report(args.run_dir, party=args.party, out=args.out)}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    found = api.inspect(args.model_dir, args.party)
    print(json.dumps(found.to_dict(), indent=1) if args.json else found.text())
    return 0


def _export(args: argparse.Namespace) -> int:
    from fedboost.export import export_model

    done = export_model(args.model_dir, args.out, fmt=args.format, party=args.party)
    codes = (f"; {', '.join(done.categorical)} as category codes (categories.json)"
             if done.categorical else "")
    print(f"wrote {done.out}: {done.n_trees} trees of party {done.party}'s model, reading "
          f"{len(done.features)} columns in this order: {', '.join(done.features)}{codes}")
    return 0


def _centralized(args: argparse.Namespace) -> int:
    from boosting.train import TreeReport

    def report(r: TreeReport) -> None:
        shown = ", ".join(f"{k}={v:.4f}" for k, v in r.metrics.items())
        print(f"tree {r.tree} ({r.tree + 1}/{r.n_trees}): {shown}")

    result = api.centralized(args.config, args.out, on_tree=report)
    print(f"centralized: {metrics_summary(result.final_metrics)}; model in {result.run_dir}/")
    return 0


_STARTS_PROCESSES = (_train, _resume, _predict, deployment.worker, deployment.serve,
                     serve_model)
"""Commands that start processes (the embedded default's workers, a worker's processes and
crypto pools, Prefect's ephemeral server and flow runs), or serve until they are stopped."""


if __name__ == "__main__":
    sys.exit(main())
