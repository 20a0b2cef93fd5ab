"""Every protocol's training flow, by the name a job file's ``protocol:`` gives it.

Imported late (by the CLI, after Prefect's settings are in place): it imports the flows.
"""

from __future__ import annotations

from typing import Any

from flows.config import JOB_SCHEMAS
from flows.forest import vertical_random_forest
from flows.horizontal import horizontal
from flows.secureboost import vertical_secureboost
from flows.simfl import simfl

TRAINING_FLOWS: dict[str, Any] = {"vertical_secureboost": vertical_secureboost,
                                  "horizontal": horizontal, "simfl": simfl,
                                  "vertical_random_forest": vertical_random_forest}
"""protocol -> its Prefect flow (each takes the job's config as its one parameter)."""
TITLES = {"vertical_secureboost": "Vertical SecureBoost",
          "horizontal": "Horizontal GBDT with secure aggregation (FedTree)",
          "simfl": "SimFL: similarity-based horizontal boosting",
          "vertical_random_forest": "Vertical federated random forest (seed 002)"}
assert set(TRAINING_FLOWS) == set(JOB_SCHEMAS) == set(TITLES)
