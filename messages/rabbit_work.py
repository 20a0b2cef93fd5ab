"""A party's processes sharing work over RabbitMQ: work shards and claim pools.

The coordinating process (the one the broker lets consume the party's inbox) hands a level's
histogram shards to the party's other processes through its work queue, and deals units of
work (features) through claim pools; see ``messages.rabbit_queues`` for the queues. This is the
half of ``RabbitTransport`` that only a party's worker uses (a flow run has no work queue); it
relies on the transport's connection (``_channel``, ``_connect``, ``_publish_one``, ``_ack``,
``_nack``, ``acknowledge``).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions as px

from messages import TransportError
from messages._pika import CONNECTION_ERRORS as _CONNECTION_ERRORS
from messages._work_publisher import Publication, WorkPublisher
from messages.chunks import Reassembly, chunk_messages
from messages.rabbit_queues import DATA_QUEUE_ARGUMENTS

log = logging.getLogger("fedboost.transport")

WORK_CHUNK_BYTES = 2 * 1024 * 1024
"""Chunks of a shard's data: small, so a helper pulls one while the next is published."""


@dataclass(slots=True)
class Delivery:
    """A whole message ready to hand over (or a work ticket whose data is still queued)."""

    queue: str
    data: bytes
    tags: list[tuple[int, int]]
    message_id: str
    data_queue: str | None = None
    data_count: int = 0
    data_digest: str = ""


@dataclass(slots=True)
class _Partial:
    """Chunks of one message received so far."""

    count: int
    digest: str
    chunks: dict[int, bytes] = field(default_factory=dict)
    tags: list[tuple[int, int]] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


class PartyWork:
    """Work shards and claim pools of a party's ``RabbitTransport`` (a mixin: the transport
    holds the connection and the state named below)."""

    name: str
    work: str | None
    chunk_bytes: int
    max_message_bytes: int
    reconnect_seconds: float
    heartbeat: int
    _channel: Any
    _generation: int
    _taking_work: bool
    _work_tag: str | None
    _ready: deque[Delivery]
    _unacked: list[tuple[int, int]]
    _publisher: WorkPublisher | None
    _chunks: Reassembly
    _stop: Any
    """The transport's ``StopFlag``: a stop asked ends a wait below at once."""

    if TYPE_CHECKING:  # the transport's own, which the methods below call
        def _connect(self, first: bool = False) -> None: ...
        def _parameters(self, purpose: str = "") -> pika.URLParameters: ...
        def _on_message(self, queue: str) -> Any: ...
        def _ack(self, tags: list[tuple[int, int]]) -> None: ...
        def _nack(self, tags: list[tuple[int, int]]) -> None: ...
        def _publish_one(self, queue: str, recipient: str, body: bytes, props: Any,
                         wait_for_queue: bool, exchange: str = "") -> bool: ...

    def _consume_work(self) -> None:
        if self.work is None:  # a flow's endpoint: no work queue
            return
        # one shard at a time per process, so shards spread over the party's processes
        self._channel.basic_qos(prefetch_count=1)
        self._work_tag = self._channel.basic_consume(self.work, self._on_message(self.work),
                                                     auto_ack=False)

    def _file_ticket(self, queue: str, tag: tuple[int, int], message_id: str,
                     headers: dict[str, Any], data_queue: str | bytes) -> None:
        """A work ticket: queued to hand over once its shard's data is fetched (or dropped,
        acknowledged, if malformed)."""
        data_queue = data_queue.decode() if isinstance(data_queue, bytes) else data_queue
        count, digest = headers.get("fb-count"), headers.get("fb-sha256")
        digest = digest.decode() if isinstance(digest, bytes) else digest
        if (data_queue.startswith(f"{self.work}.") and message_id
                and isinstance(count, int) and not isinstance(count, bool)
                and 1 <= count <= self.max_message_bytes // 1024 + 1
                and isinstance(digest, str)):
            self._ready.append(Delivery(queue, b"", [tag], message_id, data_queue,
                                         count, digest))
        else:
            self._chunks.rejections.refuse("malformed work ticket", "", "dropped a malformed "
                                           "work ticket naming %r", data_queue,
                                           authenticated=False)
            self._ack([tag])

    def _fetch_work_data(self, data_queue: str, count: int, digest: str) -> bytes | None:
        """Pull every chunk of a ticket's shard from its private queue (this process only),
        as the coordinating process publishes them."""
        partial = _Partial(count, digest)
        size, deadline = 0, time.monotonic() + self.reconnect_seconds
        try:
            while len(partial.chunks) < partial.count:
                method, props, body = self._channel.basic_get(data_queue, auto_ack=False)
                if method is None:  # not published yet
                    if time.monotonic() > deadline or self._stop.is_set():
                        log.warning("%s: work data in %s is incomplete", self.name, data_queue)
                        return None
                    time.sleep(0.002)
                    continue
                tag = (self._generation, method.delivery_tag)
                self._unacked.append(tag)
                headers = props.headers or {}
                index = headers.get("fb-index")
                if (not isinstance(index, int) or not 0 <= index < partial.count
                        or headers.get("fb-count") != partial.count):
                    log.warning("%s: malformed work chunk in %s", self.name, data_queue)
                    return None
                if index in partial.chunks:
                    continue  # published again after a lost connection
                size += len(body)
                if size > self.max_message_bytes:
                    log.warning("%s: work data in %s exceeds %d bytes", self.name, data_queue,
                                self.max_message_bytes)
                    return None
                partial.chunks[index] = body
        except px.ChannelClosedByBroker as exc:  # e.g. the queue is gone (done by another)
            log.warning("%s: work data %s unavailable: %s", self.name, data_queue, exc.reply_text)
            self._connect()
            return None
        data = b"".join(partial.chunks[i] for i in range(partial.count))
        if hashlib.sha256(data).hexdigest() != partial.digest:
            log.warning("%s: work data in %s fails its SHA-256", self.name, data_queue)
            return None
        return data

    def _become_coordinator(self) -> None:
        """This process is the party's active inbox consumer: leave shard work to helpers."""
        self._taking_work = False
        tag, self._work_tag = self._work_tag, None
        try:
            self._channel.basic_cancel(tag)
            keep: deque[Delivery] = deque()
            for item in self._ready:
                if item.queue == self.work:
                    self._nack(item.tags)
                else:
                    keep.append(item)
            self._ready = keep
        except _CONNECTION_ERRORS:
            self._connect()

    def submit_work(self, data: bytes, *, before_ack: bool = True) -> None:
        """Queue a shard of work for this party's helper processes; returns at once (a thread
        publishes it, see ``messages._work_publisher``). Unless ``before_ack`` is False (work
        that only saves time), ``acknowledge`` waits for it to reach the broker's disk; with
        False it is transient: not waited for, and not written to disk.

        A shard above one chunk goes to a private queue, and a ticket naming it to the work
        queue: whichever helper takes the ticket reads every chunk.
        """
        if self.work is None:
            raise TransportError(f"{self.name} has no work queue")
        if len(data) > self.max_message_bytes:
            raise TransportError(f"{self.name}: work of {len(data)} bytes exceeds the "
                                 f"{self.max_message_bytes}-byte limit")
        if self._publisher is None:
            self._publisher = WorkPublisher(self.name, self._parameters(" work"),
                                            reconnect_seconds=self.reconnect_seconds,
                                            heartbeat=self.heartbeat)
        if len(data) <= self.chunk_bytes:
            self._publisher.submit(Publication(
                chunk_messages(self.work, data, self.chunk_bytes, persistent=before_ack),
                before_ack=before_ack))
            return
        data_queue = f"{self.work}.{uuid.uuid4().hex}"
        # the ticket goes first: a helper pulls each chunk while the next one is published
        digest = hashlib.sha256(data).hexdigest()
        chunks = chunk_messages(data_queue, data, min(self.chunk_bytes, WORK_CHUNK_BYTES),
                                digest=digest, persistent=before_ack)
        ticket = pika.BasicProperties(delivery_mode=chunks[0][2].delivery_mode,
                                      message_id=uuid.uuid4().hex,
                                      headers={"fb-data-queue": data_queue,
                                               "fb-count": len(chunks), "fb-sha256": digest})
        self._publisher.submit(Publication([(self.work, b"", ticket), *chunks],
                                           declare=data_queue,
                                           declare_arguments=DATA_QUEUE_ARGUMENTS,
                                           before_ack=before_ack))

    # ---- party processes --------------------------------------------------------------------

    def open_claims(self, count: int) -> str:
        """A pool of ``count`` units: a private queue of that many tokens, each taken (and so
        claimed) by exactly one of the party's processes."""
        if self.work is None:
            raise TransportError(f"{self.name} has no work queue")
        pool = f"{self.work}.{uuid.uuid4().hex}.units"
        try:
            self._channel.queue_declare(pool, durable=True, arguments=DATA_QUEUE_ARGUMENTS)
        except _CONNECTION_ERRORS:
            self._connect()
            self._channel.queue_declare(pool, durable=True, arguments=DATA_QUEUE_ARGUMENTS)
        props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Transient)
        for unit in range(count):
            self._publish_one(pool, f"{self.name} processes", str(unit).encode(), props, True)
        return pool

    def claim(self, pool: str) -> int | None:
        """Take the pool's next token; None when it is empty or gone (the level is over), or
        when the connection dropped (the coordinating process sums what nobody claimed)."""
        if self.work is None or not pool.startswith(self.work + ".") or len(pool) > 255:
            raise TransportError(f"{self.name}: {pool!r} is not a pool of this party")
        try:
            method, _props, body = self._channel.basic_get(pool, auto_ack=True)
        except px.ChannelClosedByBroker:  # deleted: every unit was done
            self._connect()
            return None
        except _CONNECTION_ERRORS as exc:
            log.warning("%s: connection lost while claiming work (%r)", self.name, exc)
            self._connect()
            return None
        if method is None:
            return None
        try:
            return int(body.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            log.warning("%s: dropped a malformed token in %s", self.name, pool)
            return None

    def close_claims(self, pool: str) -> None:
        """Delete the pool's queue (tokens nobody took go with it)."""
        try:
            self._channel.queue_delete(pool)
        except _CONNECTION_ERRORS as exc:
            log.warning("%s: could not delete %s (%r)", self.name, pool, exc)

    def helpers(self) -> int:
        """Other processes of this party ready to take shards of work."""
        if self.work is None:
            return 0
        try:
            method = self._channel.queue_declare(self.work, durable=True, passive=True).method
        except _CONNECTION_ERRORS:
            self._connect()
            return 0
        return int(method.consumer_count) - (1 if self._work_tag is not None else 0)

