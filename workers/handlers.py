"""What a protocol gives a worker: its steps (handlers) per role, what a role does as peer
messages arrive, the work shards its helper processes take, and the ``StepContext`` a step
runs with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from messages.envelope import COMMANDS, PEER_MAIL, WORK, Envelope, Kind
from messages.signing import Sealer
from messages.transport import Transport
from workers.mailbox import Mailbox
from workers.party import PartySpec


@dataclass(slots=True)
class StepContext:
    """What a handler may use: its party, its job's state and mailbox, and a way to send."""

    party: PartySpec
    job: str
    task: str
    state: Any
    mailbox: Mailbox
    _send: Callable[[str, Kind, Any, str], None]
    _transport: Transport
    _sealer: Sealer

    def send(self, recipient: str, kind: Kind, body: Any) -> None:
        """Send a peer message for this job."""
        self._send(recipient, kind, body, self.task)

    def submit_work(self, kind: Kind, body: Any, *, before_ack: bool = True) -> None:
        """Hand a shard of this step to the party's helper processes (``before_ack=False``:
        data they can do without, which the message that led to it need not wait for)."""
        env = Envelope(job=self.job, task=self.task, sender=self.party.name,
                       recipient=self.party.name, kind=kind, body=body)
        self._transport.submit_work(self._sealer.seal(env), before_ack=before_ack)

    def own_key(self, purpose: bytes) -> bytes:
        """A key only this party's processes can derive (``messages.e2e.own_key``)."""
        return self._sealer.own_key(purpose)

    def helpers(self) -> int:
        """How many helper processes of this party take shards now."""
        return self._transport.helpers()

    def open_claims(self, count: int) -> str:
        """A pool of ``count`` units for this party's processes to claim (Transport)."""
        return self._transport.open_claims(count)

    def claim(self, pool: str) -> int | None:
        """The next unit of ``pool`` nobody has claimed, or None."""
        return self._transport.claim(pool)

    def close_claims(self, pool: str) -> None:
        self._transport.close_claims(pool)

    @property
    def model_dir(self) -> Path:
        """Where this job's model part lives (``PartySpec.model_folder``)."""
        return self.party.model_folder(self.job)


Handler = Callable[[StepContext, Any], tuple[Kind, Any] | None]
"""A step: its reply (kind, body). Only work steps may return None (nothing to answer)."""
Arrival = Callable[[StepContext, str, Any], None]
"""Runs with (sender, body) when a peer message of its kind is filed, before waiting steps are
retried."""


@dataclass(frozen=True, slots=True)
class RoleSteps:
    """What one role of a protocol does: the steps it answers and what it does as peer
    messages arrive."""

    handlers: dict[Kind, Handler]
    arrivals: dict[Kind, Arrival] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Protocol:
    """A protocol's steps per role, and the work shards its helper processes take. A worker
    serves jobs of every protocol it is given; each job's opener names its protocol and every
    party's role in it."""

    name: str
    roles: dict[str, RoleSteps]
    work: dict[Kind, Handler] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a step must answer a declared command: anything else would be filed as peer mail
        # (or work) and the step never run (messages.kinds.declare)
        for role, steps in self.roles.items():
            for kind in steps.handlers:
                if kind not in COMMANDS:
                    raise ValueError(f"{self.name} {role}: {kind!r} is not declared a command")
            for kind in steps.arrivals:
                if kind not in PEER_MAIL:
                    raise ValueError(f"{self.name} {role}: {kind!r} is not declared peer mail")
        for kind in self.work:
            if kind not in WORK:
                raise ValueError(f"{self.name}: {kind!r} is not declared work")
