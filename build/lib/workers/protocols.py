"""Every protocol a worker serves, by the name a job file's ``protocol:`` gives it."""

from __future__ import annotations

from workers.forest.steps import FOREST
from workers.horizontal.steps import HORIZONTAL
from workers.runtime import Protocol
from workers.simfl.steps import SIMFL
from workers.vertical.steps import VERTICAL

PROTOCOLS: dict[str, Protocol] = {protocol.name: protocol
                                  for protocol in (VERTICAL, HORIZONTAL, SIMFL, FOREST)}
