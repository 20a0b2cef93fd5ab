"""What a scoring session is and gives: its plan (the model, the parties, the round's limits),
what each request gets back (its scores, or a failure with its HTTP status), and the counters
the link keeps for ``/healthz``. The link itself is ``fedboost.scoring_link``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """What a scoring session scores with, and how long a round may take."""

    job: str
    """The session's own job name (its state at each party)."""
    model_job: str
    protocol: str
    active: str
    passives: list[str]
    datasets: dict[str, str]
    """Each party's data set, by its name in the party's worker file ("": its default)."""
    max_rows: int
    timeout: float
    """Seconds a round may take before the parties that did not answer are named (503)."""

    @property
    def parties(self) -> list[str]:
        return [self.active, *self.passives]


@dataclass(frozen=True, slots=True)
class Scored:
    """A request's predictions (rows x outputs) and the round that scored it."""

    values: np.ndarray
    round: int
    rows_in_round: int


class ScoringFailure(Exception):
    """A request that cannot be scored: an HTTP status, one line, the unknown ids, and when
    to try again."""

    def __init__(self, status: int, message: str, unknown: list[str] | None = None, *,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.unknown = unknown or []
        self.retry_after = retry_after
        """Seconds a client should wait before asking again (``Retry-After``), if known."""


Done = Callable[[Scored | ScoringFailure], None]
"""Called once per request, from the link's thread."""
Observer = Callable[[str, str, float], None]
"""Told (party, round kind: "find" or "score", seconds) for every party's answer to a round."""


@dataclass(slots=True)
class LinkStats:
    """Counters the HTTP layer shows (``/healthz``): written by the link's thread only."""

    requests: int = 0
    rounds: int = 0
    """Scoring rounds (membership rounds are counted in ``membership_rounds``)."""
    rows: int = 0
    failed: int = 0
    opened_at: float = 0.0
    membership_rounds: int = 0
    all_answered_at: float = 0.0
    """When every party last answered a round (monotonic; 0: never)."""
