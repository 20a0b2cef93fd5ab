"""RabbitMQ transport (pika): the same ``Transport`` interface over a broker.

Queues (``messages.rabbit_queues``): a party's inbox, its work queue and claim pools
(``messages.rabbit_work``), a flow run's reply queue. Where a broker is one of several
organisations' (``messages.broker_links``), flow replies leave by ``fedboost.flows.out`` and
a flow binds its queue to ``fedboost.flows.in``, if the broker has them.

Delivery: messages are persistent and published with confirms, to a queue that must exist
(``mandatory``), so a send either reached the broker's disk or raises. A received message is
acknowledged only when the caller says its outcome is done (``acknowledge``); a connection lost
before that redelivers it, and the ids of recently completed messages drop the duplicate.
Its lines on purpose: one class owns one pika connection, which only its own thread may touch:
connecting (and stopping while it retries), receiving, acknowledging and publishing share that
connection's channels and state, so splitting them would hand the connection across modules.

Payloads above ``chunk_bytes`` travel as numbered chunks with a SHA-256 of the whole, and are
reassembled and checked before they are handed over; with a ``FrameSigner`` every chunk carries
the sender's signed manifest, and partial messages are capped per sender and expire (see
``messages.chunks``: no broker user can fill the prefetch window). Lost connections are
re-established with exponential backoff for up to ``reconnect_seconds``; a stop asked meanwhile
(``request_stop``: a worker's SIGTERM) ends that wait at once with ``StopRequested``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions as px

from messages import StopRequested, TransportError
from messages._pika import CONNECTION_ERRORS as _CONNECTION_ERRORS
from messages._pika import close_channel_quietly, close_quietly, exchange_exists, why_unreachable
from messages._work_publisher import WorkPublisher
from messages.broker_url import host_of, redact
from messages.chunks import (DEFAULT_MAX_PARTIALS, DEFAULT_PARTIAL_SECONDS, ORDINARY_ROOM,
                             FrameSigner, Manifest, Reassembly, chunk_messages)
from messages.rabbit_queues import (FLOW_QUEUE_ARGUMENTS, FLOWS_IN, FLOWS_OUT, INBOX_ARGUMENTS,
                                    queue_of, work_queue_of)
from messages.rabbit_work import Delivery, PartyWork
from messages.tls import TlsOptions, certificate_problem, ssl_options_for

log = logging.getLogger("fedboost.transport")

DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
"""Below RabbitMQ 4's default 16 MiB ``max_message_size``."""
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MAX_PREFETCH = 65_535
"""RabbitMQ's limit on unacknowledged deliveries per consumer."""
_COMPLETED_IDS = 100_000
_STOP_CHECK_SECONDS = 0.1
"""How often a wait for the broker looks whether a stop was asked."""
_STOPPING_FLUSH_SECONDS = 10.0
"""After a stop, how long ``close`` waits for submitted work to reach the broker."""


HELD_FRAMES = ORDINARY_ROOM // 2
"""Frames of waiting steps' messages a process keeps unacknowledged at once
(``RabbitTransport.hold``)."""


@dataclass(slots=True)
class _Held:
    """A held delivery: its (connection generation, tag) pairs."""

    tags: list[tuple[int, int]]
    released: bool = False


class StopFlag:
    """A stop asked by a signal handler and polled by the waits for the broker: a plain
    attribute, so setting it never blocks (a ``threading.Event`` takes a lock that the handler
    could find held by the very thread it interrupted)."""

    def __init__(self) -> None:
        self._asked = False

    def set(self) -> None:
        self._asked = True

    def is_set(self) -> bool:
        return self._asked


def _nothing() -> None:
    """What ``RabbitTransport.wake`` asks the connection's thread to run: it only interrupts
    the wait."""


class RabbitTransport(PartyWork):
    """A participant's connection to the broker.

    ``party=True`` for a party's worker process (inbox with single active consumer, plus its
    work queue); ``False`` for a flow run (one private reply queue). ``frames`` (made from the
    endpoint's envelope ``Sealer``) signs the chunks it sends and drops received chunks that
    no trusted identity signed for it; without it chunks are unauthenticated (tests). Every
    connection it opens (its own, its work publisher's) uses TLS for an ``amqps://`` URL, with
    ``tls``'s CA, client certificate and expected broker name (``messages.tls``).
    """

    def __init__(self, name: str, url: str, *, party: bool, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, inbox_prefetch: int = 0,
                 reconnect_seconds: float = 300.0, heartbeat: int = 120,
                 frames: FrameSigner | None = None,
                 partial_seconds: float = DEFAULT_PARTIAL_SECONDS,
                 max_partials: int = DEFAULT_MAX_PARTIALS,
                 tls: TlsOptions | None = None,
                 stop: StopFlag | None = None) -> None:
        if chunk_bytes < 1024:
            raise ValueError("chunk_bytes must be at least 1024")
        self.name = name
        self.url = url
        self._ssl_options = ssl_options_for(name, url, tls)
        self.party = party
        self.chunk_bytes = chunk_bytes
        self.frames = frames
        # every signer's reservation (the chunks of one largest message), one whole message in
        # hand and a few ordinary ones must fit the prefetch window, or a message could never
        # complete
        senders = frames.signers if frames is not None else 1
        most_chunks = (MAX_PREFETCH - ORDINARY_ROOM) // (senders + 1)
        self.max_message_bytes = min(max_message_bytes, chunk_bytes * (most_chunks - 1))
        self._chunks = Reassembly(name, frames,
                                  max_frames=self.max_message_bytes // chunk_bytes + 1,
                                  max_bytes=self.max_message_bytes,
                                  partial_seconds=partial_seconds, max_partials=max_partials,
                                  drop=self._ack)
        self.inbox_prefetch = inbox_prefetch or self._chunks.window()
        self.reconnect_seconds = reconnect_seconds
        self.heartbeat = heartbeat
        self.inbox = queue_of(name)
        self.work = work_queue_of(name) if party else None
        self._taking_work = party
        self._generation = 0  # bumps on every reconnect: older delivery tags are void
        self._ready: deque[Delivery] = deque()
        self._completed: OrderedDict[str, None] = OrderedDict()
        self._unacked: list[tuple[int, int]] = []
        self._held_frames = 0
        self._last_id: str | None = None
        self._last_data_queue: str | None = None
        self._connection: Any = None
        self._channel: Any = None
        self._work_tag: str | None = None
        self._inbox_tag: str | None = None
        self._publisher: WorkPublisher | None = None
        """Hands out work shards in the background (made on the first shard)."""
        self._flows_out = ""  # FLOWS_OUT where flow replies go on to another organisation
        self._woken = False
        """Set by ``wake`` (another thread): the waiting ``receive`` returns."""
        self._unconfirmed: tuple[int, Any] | None = None
        """The connection generation and channel of ``send_unconfirmed``."""
        self._stop = stop if stop is not None else StopFlag()
        """Set by ``request_stop``; given, it can be set before the first connection is made
        (by a signal handler installed before this constructor runs)."""
        self._connect(first=True)

    # ---- connection -------------------------------------------------------------------------

    def request_stop(self) -> None:
        """End a wait for the broker now (``StopRequested``) rather than after
        ``reconnect_seconds``: a worker's SIGTERM handler calls it (safe in a signal handler)."""
        self._stop.set()

    def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless a stop is asked meanwhile; True if one was."""
        end = time.monotonic() + seconds
        while not self._stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, _STOP_CHECK_SECONDS))
        return True

    def _connect(self, first: bool = False) -> None:
        delay, deadline = 0.5, time.monotonic() + self.reconnect_seconds
        while True:
            try:
                self._open()
                if not first:
                    log.warning("%s: reconnected to %s", self.name, redact(self.url))
                return
            except (px.ProbableAuthenticationError, px.ProbableAccessDeniedError) as exc:
                raise TransportError(f"{self.name}: broker {redact(self.url)} refused the "
                                     f"login: {exc!r}") from None
            except px.ChannelClosedByBroker as exc:
                raise TransportError(f"{self.name}: broker refused queue setup "
                                     f"({exc.reply_code} {exc.reply_text})") from None
            except _CONNECTION_ERRORS as exc:
                problem = certificate_problem(exc)
                if problem is not None:  # waiting will not change a certificate
                    raise TransportError(f"{self.name}: broker {redact(self.url)}: "
                                         f"{problem}") from None
                where, why = host_of(self.url), why_unreachable(exc)
                if time.monotonic() + delay > deadline:
                    raise TransportError(f"{self.name}: cannot reach the broker at {where} "
                                         f"({why}) after {self.reconnect_seconds:.0f} s: is "
                                         f"RabbitMQ running there, and is the URL "
                                         f"(transport.url, FEDBOOST_AMQP_URL) right?") from None
                log.warning("%s: cannot reach the broker at %s (%s); trying again in %.0f s, "
                            "for %.0f s more (is RabbitMQ running there, and is the URL right?)",
                            self.name, where, why, delay,
                            max(0.0, deadline - time.monotonic()))
                if self._pause(delay):
                    raise StopRequested(f"{self.name}: stopped while waiting for the broker at "
                                        f"{where} ({why})") from None
                delay = min(delay * 2, 15.0)

    def _parameters(self, purpose: str = "") -> pika.URLParameters:
        params = pika.URLParameters(self.url)
        params.ssl_options = self._ssl_options
        params.heartbeat = self.heartbeat
        params.blocked_connection_timeout = 300
        params.client_properties = {"connection_name": f"fedboost {self.name}{purpose}"}
        return params

    def _open(self) -> None:
        self._drop_connection()
        connection = pika.BlockingConnection(self._parameters())
        channel = connection.channel()
        channel.confirm_delivery()
        self._connection, self._channel = connection, channel
        self._generation += 1
        # undelivered chunks and unacknowledged messages come back from the broker
        self._ready.clear()
        self._chunks.clear()
        self._unacked = []
        self._held_frames = 0  # held deliveries died with the old connection: redelivered
        arguments = INBOX_ARGUMENTS if self.party else FLOW_QUEUE_ARGUMENTS
        channel.queue_declare(self.inbox, durable=True, arguments=arguments)
        channel.basic_qos(prefetch_count=self.inbox_prefetch)
        self._inbox_tag = channel.basic_consume(self.inbox, self._on_message(self.inbox),
                                                auto_ack=False)
        if self.party:
            self._flows_out = FLOWS_OUT if exchange_exists(connection, FLOWS_OUT) else ""
        elif exchange_exists(connection, FLOWS_IN):  # replies shovelled in from other organisations
            channel.queue_bind(self.inbox, FLOWS_IN, routing_key=self.inbox)
        self._work_tag = None
        if self.work is not None:
            channel.queue_declare(self.work, durable=True)
            if self._taking_work:
                self._consume_work()

    def _drop_connection(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        close_quietly(connection, self.name)

    def _on_message(self, queue: str) -> Any:
        generation = self._generation

        def handle(_ch: Any, method: Any, props: Any, body: bytes) -> None:
            self._file(queue, (generation, method.delivery_tag), props, body,
                       bool(method.redelivered))
        return handle

    # ---- receiving --------------------------------------------------------------------------

    def _file(self, queue: str, tag: tuple[int, int], props: Any, body: bytes,
              redelivered: bool) -> None:
        headers = props.headers or {}
        message_id = props.message_id or ""
        if message_id in self._completed:
            self._chunks.rejections.refuse("duplicate", "", "dropped a redelivered duplicate of "
                                           "%s", message_id, authenticated=False,
                                           level=logging.INFO)
            self._ack([tag])
            return
        data_queue = headers.get("fb-data-queue")
        if queue == self.work and isinstance(data_queue, str | bytes):
            self._file_ticket(queue, tag, message_id, headers, data_queue)
            return
        if headers.get("fb-count") is None:
            self._ready.append(Delivery(queue, body, [tag], message_id))
            return
        whole = self._chunks.file(tag, headers, message_id, body)
        if whole is not None:
            self._ready.append(Delivery(queue, whole[0], whole[1], message_id))

    def receive(self, timeout: float) -> bytes | None:
        """The next whole message, or None after ``timeout`` s; acknowledge it when done."""
        if self._unacked:
            raise TransportError(f"{self.name}: acknowledge the previous message first")
        self._chunks.resume()
        try:
            return self._receive(time.monotonic() + timeout)
        finally:
            self._chunks.pause()  # time spent handling a message does not age partials

    def wake(self) -> None:
        """Make a ``receive`` waiting in another thread return None now (the one method another
        thread may call): a process that also takes work from elsewhere, such as the scoring
        service's requests, need not poll the broker."""
        self._woken = True
        connection = self._connection
        if connection is not None:
            try:
                connection.add_callback_threadsafe(_nothing)
            except (*_CONNECTION_ERRORS, px.ConnectionWrongStateError):
                pass  # closed or lost: the receiving thread sees the flag when it comes back

    def _receive(self, deadline: float) -> bytes | None:
        while not self._ready:
            left = deadline - time.monotonic()
            if left <= 0 or self._woken:
                self._woken = False
                return None
            try:
                self._connection.process_data_events(time_limit=min(left, 1.0))
            except _CONNECTION_ERRORS as exc:
                log.warning("%s: connection lost while receiving (%r)", self.name, exc)
                self._connect()
            self._chunks.expire()
        item = self._ready.popleft()
        if item.queue == self.inbox and self._work_tag is not None:
            self._become_coordinator()
        self._unacked, self._last_id = item.tags, item.message_id
        self._last_data_queue = item.data_queue
        if item.data_queue is None:
            return item.data
        data = self._fetch_work_data(item.data_queue, item.data_count, item.data_digest)
        if data is None:  # nothing usable: the ticket is done with
            self.acknowledge()
            return self._receive(deadline)
        return data

    def acknowledge(self) -> None:
        """The last received message is done: the broker may forget it (once the work it
        handed out has reached the broker)."""
        if self._publisher is not None:
            self._publisher.flush()
        tags, self._unacked = self._unacked, []
        if self._last_id:
            self._completed[self._last_id] = None
            if len(self._completed) > _COMPLETED_IDS:
                self._completed.popitem(last=False)
        self._ack(tags)
        data_queue, self._last_data_queue = self._last_data_queue, None
        if data_queue is not None:
            try:
                self._channel.queue_delete(data_queue)
            except _CONNECTION_ERRORS as exc:
                log.warning("%s: could not delete %s (%r)", self.name, data_queue, exc)

    def hold(self) -> object | None:
        """Keep the last received message unacknowledged past ``acknowledge`` (its step waits
        for peer data): a worker killed meanwhile leaves it to the broker, which gives it to
        the worker's next process, and that one tells the flow the job's state is gone instead
        of the flow waiting out its step timeout. At most ``HELD_FRAMES`` frames are held, so
        the prefetch window keeps room for the peer data the steps wait for; None beyond."""
        tags = self._unacked
        if not tags or self._last_data_queue is not None or \
                self._held_frames + len(tags) > HELD_FRAMES:
            return None
        self._unacked, self._last_id = [], None
        self._held_frames += len(tags)
        return _Held(tags)

    def release(self, held: object) -> None:
        """Acknowledge a held message (tags of a lost connection are already gone)."""
        if not isinstance(held, _Held) or held.released:
            return
        held.released = True
        current = [tag for tag in held.tags if tag[0] == self._generation]
        self._held_frames -= len(current)
        self._ack(current)

    def _ack(self, tags: list[tuple[int, int]]) -> None:
        try:
            for generation, tag in tags:
                if generation == self._generation:  # older tags died with their connection
                    self._channel.basic_ack(tag)
        except _CONNECTION_ERRORS as exc:
            log.warning("%s: connection lost while acknowledging (%r)", self.name, exc)
            self._connect()

    def _nack(self, tags: list[tuple[int, int]]) -> None:
        for generation, tag in tags:
            if generation == self._generation:
                self._channel.basic_nack(tag, requeue=True)

    # ---- sending ----------------------------------------------------------------------------

    def send(self, recipient: str, data: bytes, *, persistent: bool = True) -> None:
        """Deliver ``data`` to ``recipient``'s inbox (chunked if large); ``persistent=False``:
        never written to the broker's disk (lost if the broker restarts).

        A party's queue that does not exist yet is waited for (its worker may be starting); a
        flow run's queue that does not exist means the run is over, and the reply is dropped.
        """
        flow = recipient.startswith("flow.")
        self._publish(queue_of(recipient), recipient, data, wait_for_queue=not flow,
                      persistent=persistent, exchange=self._flows_out if flow else "")

    def send_unconfirmed(self, messages: list[tuple[str, bytes]]) -> None:
        """Deliver transient messages, each ``(recipient, data)`` to a party's inbox, without
        waiting for the broker's confirm of each: ``send`` costs a round trip to the broker per
        message before the next one goes, these are written out at once, on a channel of their
        own without publisher confirms (never written to the broker's disk either).

        Only for requests whose answer is their confirmation (the scoring service's rounds,
        given up when not answered in time): a message the broker cannot route (its party's
        queue is gone) or loses is logged, not raised, and its request goes unanswered. A
        message larger than ``chunk_bytes`` goes through ``send``, as do all of them when the
        channel cannot be had (``send`` reconnects)."""
        try:
            channel = self._unconfirmed_channel()
        except _CONNECTION_ERRORS as exc:
            log.warning("%s: no channel for unconfirmed sends (%r)", self.name, exc)
            channel = None
        for recipient, data in messages:
            if channel is None or len(data) > self.chunk_bytes:
                self.send(recipient, data, persistent=False)
                continue
            (_, body, props), = chunk_messages(queue_of(recipient), data, self.chunk_bytes,
                                               persistent=False)
            try:
                channel.basic_publish("", queue_of(recipient), body, props, mandatory=True)
            except _CONNECTION_ERRORS as exc:
                log.warning("%s: connection lost while sending (%r)", self.name, exc)
                channel = None
                self.send(recipient, data, persistent=False)  # reconnects

    def _unconfirmed_channel(self) -> Any:
        """The connection's channel without publisher confirms (made once per connection)."""
        made = self._unconfirmed
        if made is not None and made[0] == self._generation and made[1].is_open:
            return made[1]
        channel = self._connection.channel()

        def returned(_ch: Any, method: Any, _props: Any, _body: bytes) -> None:
            log.warning("%s: the broker returned a message for %s (%s): no such queue; its "
                        "request goes unanswered", self.name, method.routing_key,
                        method.reply_text)

        channel.add_on_return_callback(returned)
        self._unconfirmed = (self._generation, channel)
        return channel

    def _publish(self, queue: str, recipient: str, data: bytes, *,
                 wait_for_queue: bool, persistent: bool = True, exchange: str = "") -> None:
        if not isinstance(data, bytes):
            raise TypeError("transports carry bytes only")
        if len(data) > self.max_message_bytes:
            raise TransportError(f"{self.name}: message of {len(data)} bytes to {recipient} "
                                 f"exceeds the {self.max_message_bytes}-byte limit")
        chunks = chunk_messages(queue, data, self.chunk_bytes, persistent=persistent)
        if len(chunks) > 1 and self.frames is not None:
            first = chunks[0][2]
            signed = self.frames.headers(Manifest(first.message_id, first.headers["fb-sha256"],
                                                  len(chunks), len(data), recipient, self.name,
                                                  time.time()))
            for _, _, props in chunks:
                props.headers.update(signed)
        for _, chunk, props in chunks:
            if not self._publish_one(queue, recipient, chunk, props, wait_for_queue, exchange):
                return

    def _publish_one(self, queue: str, recipient: str, body: bytes, props: Any,
                     wait_for_queue: bool, exchange: str = "") -> bool:
        """Publish until the broker confirms; a chunk published twice is dropped on receipt."""
        deadline = time.monotonic() + self.reconnect_seconds
        delay = 0.5
        while True:
            try:
                self._channel.basic_publish(exchange, queue, body, props, mandatory=True)
                return True
            except px.UnroutableError:
                if not wait_for_queue:
                    log.warning("%s: dropped a message for %s: its queue is gone", self.name,
                                recipient)
                    return False
                # the recipient's queue does not exist yet: its worker has not started
                if time.monotonic() + delay > deadline:
                    raise TransportError(f"{self.name}: no queue {queue} for {recipient}: is "
                                         f"its worker running?") from None
                log.warning("%s: waiting for %s's queue %s", self.name, recipient, queue)
            except px.NackError:
                if time.monotonic() + delay > deadline:
                    raise TransportError(f"{self.name}: broker refused a message for "
                                         f"{recipient}") from None
            except px.ChannelClosedByBroker as exc:
                raise TransportError(f"{self.name}: broker refused to publish to {queue}: "
                                     f"{exc.reply_code} {exc.reply_text}") from None
            except _CONNECTION_ERRORS as exc:
                log.warning("%s: connection lost while sending (%r)", self.name, exc)
                self._connect()
                continue
            if self._pause(delay):
                raise StopRequested(f"{self.name}: stopped while waiting to send to "
                                    f"{recipient}")
            delay = min(delay * 2, 5.0)

    def consumers(self, participant: str) -> int | None:
        """How many processes consume ``participant``'s inbox now: 0 when no worker of that
        party is connected (its inbox exists but nobody reads it, or it was never made);
        None when the broker cannot be asked."""
        try:
            channel = self._connection.channel()  # a passive declare of a missing queue
        except _CONNECTION_ERRORS:               # closes its channel: not ours
            return None
        try:
            method = channel.queue_declare(queue_of(participant), durable=True,
                                           passive=True).method
            return int(method.consumer_count)
        except px.ChannelClosedByBroker as exc:
            return 0 if exc.reply_code == 404 else None
        except _CONNECTION_ERRORS:
            return None
        finally:
            close_channel_quietly(channel)

    def close(self) -> None:
        """Close the connections (after handing out submitted work); unacknowledged messages
        go back to their queues."""
        self._chunks.rejections.flush(final=True)
        if self._publisher is not None:  # after a stop, no long wait for an unreachable broker
            self._publisher.close(_STOPPING_FLUSH_SECONDS if self._stop.is_set() else None)
            self._publisher = None
        self._drop_connection()

    def delete_inbox(self) -> None:
        """Remove a flow run's reply queue once the run is over."""
        try:
            self._channel.basic_cancel(self._inbox_tag)
            self._channel.queue_delete(self.inbox)
        except _CONNECTION_ERRORS as exc:
            log.warning("%s: could not delete %s (%r)", self.name, self.inbox, exc)
