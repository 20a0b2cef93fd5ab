"""``fedboost serve-model``: a real-time scoring API over the parties' running workers.

The command opens a scoring session at every party's worker (``fedboost.scoring_link``) and
serves ``POST /v1/score`` and ``GET /healthz`` (``fedboost.scoring_api``) with uvicorn until
interrupted; then it closes the session.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

DEFAULT_MAX_IDS = 1000


def add_command(sub: Any) -> None:
    """``fedboost serve-model`` on the CLI's subcommands."""
    cmd = sub.add_parser("serve-model", help="serve a trained vertical model over HTTP "
                         "(POST /v1/score), scoring rows by id at the parties' running workers")
    cmd.add_argument("model_dir", type=Path, help="run folder written by 'fedboost train' "
                     "over RabbitMQ (its job.json)")
    cmd.add_argument("--port", type=int, required=True)
    cmd.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                     "127.0.0.1)")
    cmd.add_argument("--dataset", action="append", default=[], metavar="PARTY=NAME",
                     help="the data set (in PARTY's worker file) whose rows are scored by id "
                          "(default: the one the job trained on)")
    cmd.add_argument("--max-ids", type=int, default=DEFAULT_MAX_IDS,
                     help=f"ids per request at most (default {DEFAULT_MAX_IDS})")
    cmd.add_argument("--round-rows", type=int, default=4096,
                     help="rows per round at most: concurrent requests are batched up to it")
    cmd.add_argument("--in-flight", type=int, default=2, help="rounds out at once (default 2)")
    cmd.add_argument("--timeout", type=float, default=10.0,
                     help="seconds a round may take before the silent parties are named in a "
                          "503 (default 10)")
    cmd.set_defaults(run=serve_model)


def serve_model(args: argparse.Namespace) -> int:
    """Open the scoring session, serve HTTP until interrupted, close the session."""
    import uvicorn

    from workers.runtime import SWITCH_INTERVAL

    from fedboost.scoring_api import ModelInfo, make_app
    from fedboost.scoring_link import ScoringLink, SessionPlan
    from flows._tasks import PartyError, StepTimeout, broker_coordinator
    from messages import TransportError
    from flows.config import ConfigError

    if not 1 <= args.max_ids <= args.round_rows or args.in_flight < 1 or args.timeout <= 0:
        raise ConfigError("--max-ids must be 1 to --round-rows, --in-flight at least 1 and "
                          "--timeout positive")
    config = _job_of(args.model_dir)
    plan = SessionPlan(job=f"{config.job[:40]}-serve-{uuid.uuid4().hex[:8]}",
                       model_job=config.job, protocol=config.protocol, active=config.active,
                       passives=list(config.passives),
                       datasets=_datasets(config, args.dataset),
                       max_rows=args.round_rows, timeout=args.timeout)
    coordinator = broker_coordinator(config, plan.job, plan.timeout)
    link = ScoringLink(plan, coordinator, max_in_flight=args.in_flight)
    # the HTTP thread and the link's thread hand requests and scores to each other: at
    # Python's default a thread waits up to 5 ms for the other to give up the GIL
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        try:
            link.open()
        except (PartyError, TransportError) as exc:
            link.close_session()  # at the parties that did open it
            if isinstance(exc, StepTimeout):
                raise ConfigError(f"cannot open the scoring session: {exc}") from None
            raise
        link.start()
        info = ModelInfo(config.job, config.params.objective,
                         "forest" if "forest" in config.protocol else "boosting")
        print(f"serving {config.job} at http://{args.host}:{args.port}/v1/score (session "
              f"{plan.job}; parties {', '.join(plan.parties)})", flush=True)
        uvicorn.run(make_app(link, info, args.max_ids), host=args.host, port=args.port,
                    log_level="warning", access_log=False)
    finally:
        if link.alive():
            link.stop()
        coordinator.transport.delete_inbox()  # type: ignore[attr-defined]
        coordinator.transport.close()
    return 0


def _job_of(model_dir: Path) -> Any:
    from flows.config import ConfigError, validate_job

    job_file = model_dir / "job.json"
    try:
        raw = json.loads(job_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{job_file}: not a fedboost run folder ({exc})") from None
    config = validate_job(raw, str(job_file))
    if not config.protocol.startswith("vertical_"):
        raise ConfigError(f"{job_file}: a {config.protocol} model is every member's own: score "
                          f"it with 'fedboost predict' (the scoring service is for vertical "
                          f"models)")
    if config.transport.kind != "rabbitmq":
        raise ConfigError(f"{job_file}: transport {config.transport.kind!r}: the scoring "
                          f"service reaches the parties' running workers over rabbitmq")
    return config


def _datasets(config: Any, given: list[str]) -> dict[str, str]:
    from flows.config import ConfigError

    datasets = {name: party.dataset or "" for name, party in config.parties.items()}
    for item in given:
        party, sep, name = item.partition("=")
        if not sep or party not in datasets or not name:
            raise ConfigError(f"--dataset {item!r}: expected PARTY=NAME with PARTY one of "
                              f"{', '.join(datasets)}")
        datasets[party] = name
    return datasets
