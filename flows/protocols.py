"""Every protocol's training flow and title, by the name a job file's ``protocol:`` gives it,
as the protocols declare them (``flows.declared``).

Imported late (by the CLI, after Prefect's settings are in place): it imports the flows.
"""

from __future__ import annotations

from typing import Any

from flows.declared import declared

TRAINING_FLOWS: dict[str, Any] = {name: protocol.training_flow()
                                  for name, protocol in declared().items()}
"""protocol -> its Prefect flow (each takes the job's config as its one parameter)."""
TITLES = {name: protocol.title for name, protocol in declared().items()}
