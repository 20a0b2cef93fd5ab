"""The commands that set up and run a federation over RabbitMQ: ``worker`` (a party's
long-running worker), ``serve`` (the training flows as Prefect deployments), ``definitions``
(the broker's users and permissions) and ``keys`` (a party's signing key). Their flags are
declared with every other command's in ``fedboost.cli``."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import warnings
from typing import Any

from fedboost import api
from fedboost.exit_codes import EXIT_USER_ERROR


def worker(args: argparse.Namespace) -> int:
    """``fedboost worker``: check the party's file, key and data files, then serve."""
    from fedboost.worker import run_workers
    from flows.worker_config import load_worker_config
    from messages import MessageError
    from messages.broker_url import holds_password
    from messages.signing import Sealer
    from messages.tls import ssl_options_for

    config = load_worker_config(args.config, args.party)
    update: dict[str, Any] = {}
    if args.processes is not None:
        if args.processes < 1:
            print("fedboost: error: --processes must be at least 1", file=sys.stderr)
            return EXIT_USER_ERROR
        update["processes"] = args.processes
    if args.crypto_processes is not None:
        if args.crypto_processes < 1:
            print("fedboost: error: --crypto-processes must be at least 1", file=sys.stderr)
            return EXIT_USER_ERROR
        update["crypto_processes"] = args.crypto_processes
    if args.no_make_ahead:
        update["make_ahead"] = False
    if args.models is not None:
        update["models"] = args.models.resolve()
    config = config.model_copy(update=update)
    if holds_password(config.transport.url):
        warnings.warn(api.broker_password_warning(args.config), api.FedboostWarning)
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


def serve(args: argparse.Namespace) -> int:
    """``fedboost serve``: every protocol's training flow as a deployment, until stopped."""
    from prefect import serve as serve_deployments

    from flows.config import ConfigError, load_config
    from flows.protocols import TITLES, TRAINING_FLOWS

    parameters: dict[str, dict[str, Any]] = {}
    for path in args.config:  # deployment parameters are stored in Prefect's database
        config = api.keep_password_out(load_config(path), path)
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
    serve_deployments(*deployments)
    return 0


def definitions(args: argparse.Namespace) -> int:
    """``fedboost definitions``: the broker's definitions file (salted hashes only)."""
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


def keys(args: argparse.Namespace) -> int:
    """``fedboost keys``: this party's (or the flows') signing key pair."""
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
