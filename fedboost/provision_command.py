"""``fedboost provision init|finish``: its flags and bodies (the logic: ``fedboost.provision``,
loaded only when the command runs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_command(sub: Any) -> None:
    """``fedboost provision`` on the CLI's subcommands."""
    provision = sub.add_parser("provision", help="make this organisation's start kit for a "
                               "federation of one broker per organisation")
    steps = provision.add_subparsers(metavar="STEP", required=True)
    init = steps.add_parser("init", help="make this organisation's keys, certificates and "
                            "passwords, and an outbox for each other organisation")
    finish = steps.add_parser("finish", help="import the others' outboxes; write the broker's "
                              "definitions, the worker files and the start commands")
    for step in (init, finish):
        step.add_argument("description", type=Path, metavar="FEDERATION.yaml",
                          help="the federation description (the same at every organisation)")
        step.add_argument("--org", required=True, help="this organisation's name in it")
    init.add_argument("--out", type=Path, required=True, help="the kit folder to make (0700)")
    init.set_defaults(run=run_init)
    finish.add_argument("--kit", type=Path, required=True, help="the kit folder init made")
    finish.add_argument("--from", dest="sent", action="append", default=[], metavar="ORG=DIR",
                        help="the outbox ORG sent (repeat: one per other organisation)")
    finish.set_defaults(run=run_finish)


def run_init(args: argparse.Namespace) -> int:
    """This organisation's private material and its outboxes."""
    from fedboost.provision import Description, init

    for line in init(Description.load(args.description), args.org, args.out):
        print(line)
    return 0


def run_finish(args: argparse.Namespace) -> int:
    """The others' outboxes in, the start kit out."""
    from fedboost.provision import Description, ProvisionError, finish

    sent: dict[str, Path] = {}
    for item in args.sent:
        org, sep, folder = item.partition("=")
        if not sep or not org or not folder:
            raise ProvisionError(f"--from {item!r}: expected ORG=DIR")
        if org in sent:
            raise ProvisionError(f"--from {org}: given twice")
        sent[org] = Path(folder)
    for line in finish(Description.load(args.description), args.org, args.kit, sent):
        print(line)
    return 0
