"""Every protocol a worker serves, by the name a job file's ``protocol:`` gives it: fedboost's
own (one line each), then the ``steps`` module of every package ``FEDBOOST_PROTOCOLS`` names,
each holding its ``PROTOCOL`` (``messages.kinds``; docs/protocols.md)."""

from __future__ import annotations

import importlib

from messages.kinds import extra_protocols
from workers.forest.steps import FOREST
from workers.handlers import Protocol
from workers.horizontal.steps import HORIZONTAL
from workers.simfl.steps import SIMFL
from workers.vertical.steps import VERTICAL


def _extra() -> list[Protocol]:
    return [importlib.import_module(f"{package}.steps").PROTOCOL
            for package in extra_protocols()]


PROTOCOLS: dict[str, Protocol] = {protocol.name: protocol
                                  for protocol in (VERTICAL, HORIZONTAL, SIMFL, FOREST, *_extra())}
