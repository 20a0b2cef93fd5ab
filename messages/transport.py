"""Transports: one interface; the embedded implementation here, RabbitMQ in ``rabbitmq.py``.

A transport endpoint belongs to one named participant (a party or a flow); it sends bytes to
another participant's inbox and receives from its own. Only bytes cross: every message goes
through the msgpack codec, so no Python object is ever shared between parties.

A party may run several processes: one coordinates (reads the party's inbox and holds the
job's state), the others are helpers that take shards of work (histograms of feature subsets)
from the party's own work queue and answer to its inbox.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from multiprocessing.context import SpawnContext
from typing import Any, Protocol

from messages import TransportError


class Transport(Protocol):
    """A participant's connection to the others."""

    name: str

    def send(self, recipient: str, data: bytes, *, persistent: bool = True) -> None:
        """Deliver ``data`` to ``recipient``'s inbox (``persistent=False``: a broker need not
        keep it across its own restart)."""

    def receive(self, timeout: float) -> bytes | None:
        """Next message for this process, or None after ``timeout`` seconds."""

    def acknowledge(self) -> None:
        """The last received message is fully handled (a broker may now forget it)."""

    def hold(self) -> object | None:
        """Keep the last received message from ``acknowledge``: its handler waits (a step
        waiting for peer data), and if this process dies first the broker gives it to the
        next one. A token for :meth:`release`, or None when nothing can be held (the message
        is then acknowledged as usual)."""

    def release(self, held: object) -> None:
        """Acknowledge a held message (its outcome is done)."""

    def submit_work(self, data: bytes, *, before_ack: bool = True) -> None:
        """Queue work for this party's helper processes; unless ``before_ack`` is False (work
        that only saves time), acknowledging the message that led to it waits until it is
        handed over."""

    def helpers(self) -> int:
        """How many helper processes of this party take shards of work now."""

    def open_claims(self, count: int) -> str:
        """A pool of work units ``0 .. count-1`` that this party's processes claim one at a
        time (coordinating process); returns the pool's name for the shards to carry."""

    def claim(self, pool: str) -> int | None:
        """The next unclaimed unit of ``pool``, or None when none is left (or the pool is
        gone). Each unit goes to exactly one process."""

    def close_claims(self, pool: str) -> None:
        """Retire a pool: later claims get None."""

    def close(self) -> None:
        """Release resources."""


class MemoryHub:
    """Inboxes for a fixed set of participants, shared with spawned worker processes.

    ``tap``, if enabled, receives ``(sender, recipient, data)`` for every message (tests use it
    to inspect everything that crossed between parties).
    """

    def __init__(self, names: list[str], *, record: bool = False,
                 helpers: dict[str, int] | None = None) -> None:
        self.context: SpawnContext = mp.get_context("spawn")
        self.inboxes: dict[str, Any] = {name: self.context.Queue() for name in names}
        self.helpers = dict(helpers or {})
        self.work: dict[str, Any] = {name: self.context.Queue() for name in self.helpers}
        # per party: [pool number, next unit, units]; its lock makes a claim atomic
        self.claims: dict[str, Any] = {name: self.context.Array("q", 3)
                                       for name in self.helpers}
        self.tap: Any = self.context.Queue() if record else None
        self._records: list[tuple[str, str, bytes]] = []
        if record:
            # drain continuously: a sender blocked on a full tap pipe could not exit cleanly
            threading.Thread(target=self._drain, name="memory-hub-tap", daemon=True).start()

    def _drain(self) -> None:
        try:
            while True:
                self._records.append(self.tap.get())
        except (OSError, EOFError, ValueError):  # the queue closes at interpreter exit
            return

    def endpoint(self, name: str, *, helper: bool = False) -> MemoryTransport:
        """The transport of participant ``name``'s coordinating process, or of a helper."""
        if name not in self.inboxes:
            raise TransportError(f"no inbox for {name!r}")
        if helper and not self.helpers.get(name):
            raise TransportError(f"{name!r} has no helper processes")
        return MemoryTransport(name, self.inboxes, self.tap, work=self.work.get(name),
                               helper=helper, n_helpers=self.helpers.get(name, 0),
                               claims=self.claims.get(name))

    def close(self) -> None:
        """The run is over: drop what the queues still hold. A queue keeps a thread that
        flushes what this process sent into its pipe, and the process waits for it at exit:
        into the inbox of a worker that died, it waited for ever."""
        for queue_ in [*self.inboxes.values(), *self.work.values()]:
            queue_.cancel_join_thread()
            queue_.close()

    def recorded(self, settle: float = 1.0) -> list[tuple[str, str, bytes]]:
        """Everything recorded so far, once the tap has been quiet for ``settle`` seconds."""
        count = -1
        while count != len(self._records):
            count = len(self._records)
            time.sleep(settle)
        return list(self._records)


class MemoryTransport:
    """Embedded transport over multiprocessing queues (bytes only).

    The coordinating process reads the inbox; helpers read the party's work queue.
    """

    def __init__(self, name: str, inboxes: dict[str, Any], tap: Any, *, work: Any = None,
                 helper: bool = False, n_helpers: int = 0, claims: Any = None) -> None:
        self.name = name
        self._claims = claims
        self._inboxes = inboxes
        self._tap = tap
        self._work = work
        self._source = work if helper else inboxes[name]
        self._n_helpers = n_helpers

    def send(self, recipient: str, data: bytes, *, persistent: bool = True) -> None:
        """Put ``data`` in the recipient's inbox (in memory: every message is transient)."""
        try:
            inbox = self._inboxes[recipient]
        except KeyError:
            raise TransportError(f"{self.name}: unknown recipient {recipient!r}") from None
        if not isinstance(data, bytes):
            raise TypeError("transports carry bytes only")
        inbox.put(data)
        if self._tap is not None:
            self._tap.put((self.name, recipient, data))

    def receive(self, timeout: float) -> bytes | None:
        """Wait up to ``timeout`` s for the next message."""
        try:
            data = self._source.get(timeout=timeout)
        except queue.Empty:
            return None
        return bytes(data)

    def acknowledge(self) -> None:
        """Nothing to do: a process-local queue has no redelivery."""

    def hold(self) -> object | None:
        """Nothing to hold: a process-local queue dies with its process."""
        return None

    def release(self, held: object) -> None:
        """Nothing to do (``hold`` gives no token)."""

    def submit_work(self, data: bytes, *, before_ack: bool = True) -> None:
        """Put work on the party's work queue (at once: ``before_ack`` changes nothing here)."""
        if self._work is None:
            raise TransportError(f"{self.name} has no helper processes")
        self._work.put(data)

    def helpers(self) -> int:
        """The helper processes started with the hub."""
        return self._n_helpers

    def open_claims(self, count: int) -> str:
        """A new pool of ``count`` units in the party's shared counter (the previous one ends)."""
        claims = self._require_claims()
        with claims.get_lock():
            claims[0], claims[1], claims[2] = claims[0] + 1, 0, count
            return str(claims[0])

    def claim(self, pool: str) -> int | None:
        """The next unit of the current pool, atomically."""
        claims = self._require_claims()
        with claims.get_lock():
            if str(claims[0]) != pool or claims[1] >= claims[2]:
                return None
            claims[1] += 1
            return int(claims[1] - 1)

    def close_claims(self, pool: str) -> None:
        """Exhaust the pool if it is still the current one."""
        claims = self._require_claims()
        with claims.get_lock():
            if str(claims[0]) == pool:
                claims[1] = claims[2]

    def _require_claims(self) -> Any:
        if self._claims is None:
            raise TransportError(f"{self.name} has no helper processes to share work with")
        return self._claims

    def close(self) -> None:
        """Nothing to release: the hub owns the queues."""
