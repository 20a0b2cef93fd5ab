"""Publishing a party's work shards from a thread of their own (RabbitMQ).

A coordinating process hands a level's histogram shards to its helpers and then sums its own
range. Publishing a 15 MB shard with confirms takes 0.1-0.2 s; on the calling thread, that time
is lost to the coordinating process's own work. Here a thread with its own connection (pika
connections are not shared between threads) publishes while the caller computes. ``flush``
waits until everything submitted reached the broker (or was given up after
``reconnect_seconds``), so a message that led to work is acknowledged only after its work was
handed out; work that only saves time (``before_ack=False``: a tree's ciphertexts, which helpers
can do without) is not waited for.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions as px

from messages._pika import CONNECTION_ERRORS, close_quietly
from messages.tls import certificate_problem

log = logging.getLogger("fedboost.transport")


@dataclass(frozen=True, slots=True)
class Publication:
    """Messages to publish in order, after declaring ``declare`` (a shard's data queue)."""

    messages: list[tuple[str, bytes, Any]]
    """(queue, body, pika.BasicProperties)"""
    declare: str | None = None
    declare_arguments: dict[str, Any] | None = None
    before_ack: bool = True
    """Whether ``flush`` waits for it."""


class WorkPublisher:
    """A publishing thread for one party process; see the module docstring."""

    def __init__(self, name: str, parameters: pika.URLParameters, *,
                 reconnect_seconds: float, heartbeat: int) -> None:
        self.name = name
        self._parameters = parameters
        self._reconnect_seconds = reconnect_seconds
        self._idle_poll = max(1.0, heartbeat / 4)
        self._jobs: queue.Queue[Publication | None] = queue.Queue()
        self._pending = 0
        self._done = threading.Condition()
        self._connection: Any = None
        self._channel: Any = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-work-publisher",
                                        daemon=True)
        self._thread.start()

    def submit(self, publication: Publication) -> None:
        """Publish in the background; returns at once."""
        if publication.before_ack:
            with self._done:
                self._pending += 1
        self._jobs.put(publication)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every publication submitted ``before_ack`` is done (and what was submitted
        before it: they go in order); False if ``timeout`` passed first."""
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Finish what was submitted (waiting up to ``timeout``, by default
        ``reconnect_seconds``), then stop the thread and close its connection."""
        self.flush(self._reconnect_seconds if timeout is None else timeout)
        self._jobs.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_poll)
            except queue.Empty:
                self._keep_alive()
                continue
            if job is None:
                self._disconnect()
                return
            try:
                self._publish(job)
            finally:
                if job.before_ack:
                    with self._done:
                        self._pending -= 1
                        self._done.notify_all()

    def _publish(self, job: Publication) -> None:
        """Publish with confirms until the broker has everything; a chunk or ticket published
        twice after a lost connection is dropped by its receiver."""
        deadline, delay = time.monotonic() + self._reconnect_seconds, 0.5
        while True:
            try:
                channel = self._open_channel()
                if job.declare is not None:
                    channel.queue_declare(job.declare, durable=True,
                                          arguments=job.declare_arguments)
                for queue_name, body, props in job.messages:
                    channel.basic_publish("", queue_name, body, props, mandatory=True)
                return
            except px.ChannelClosedByBroker as exc:
                log.error("%s: broker refused work: %s %s", self.name, exc.reply_code,
                          exc.reply_text)
                self._disconnect()
                return
            except (px.UnroutableError, px.NackError, *CONNECTION_ERRORS) as exc:
                self._disconnect()
                problem = certificate_problem(exc)
                if problem is not None:
                    log.error("%s: cannot hand out work: %s", self.name, problem)
                    return
                if time.monotonic() + delay > deadline:
                    log.error("%s: gave up handing out work after %.0f s: %r", self.name,
                              self._reconnect_seconds, exc)
                    return
                log.warning("%s: handing out work failed (%r); again in %.1f s", self.name,
                            exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _open_channel(self) -> Any:
        if self._channel is None or not self._channel.is_open:
            self._disconnect()
            self._connection = pika.BlockingConnection(self._parameters)
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
        return self._channel

    def _keep_alive(self) -> None:
        """Answer the broker's heartbeats while idle, or drop a connection that died."""
        if self._connection is None:
            return
        try:
            self._connection.process_data_events(time_limit=0)
        except CONNECTION_ERRORS:
            self._disconnect()

    def _disconnect(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        close_quietly(connection, f"{self.name} work publisher")
