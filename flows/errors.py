"""Errors a flow raises when a party fails, stops answering or ends the job.

Kept apart from the flows' tasks so that the command line can name them without importing
Prefect (a bad job file is then one line in a second, not after Prefect has loaded).
"""

from __future__ import annotations

from messages import TransportError
from messages.bodies import ErrorReply


class PartyError(RuntimeError):
    """A party answered a step with an error."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(f"party {reply.party}: step {reply.step}: {reply.message}")
        self.reply = reply

    @property
    def user_error(self) -> bool:
        """True for bad input (data, config) rather than a fault."""
        return self.reply.user_error


class JobStopped(RuntimeError):
    """The job cannot go on, for a reason its one-line message says (e.g. too few parties
    left): the command line prints that line, not a traceback."""


class StepTimeout(TransportError):
    """Parties did not answer a step in time (``missing``: which)."""

    def __init__(self, message: str, missing: list[str] | None = None) -> None:
        super().__init__(message)
        self.missing = list(missing or [])


class PartyGone(StepTimeout):
    """Parties a step waits for are known to be gone (their worker process exited): as a
    timeout, at once (a horizontal flow drops such members as it drops silent ones)."""


__all__ = ["JobStopped", "PartyError", "PartyGone", "StepTimeout"]
