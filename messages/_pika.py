"""What both RabbitMQ connections of a party process (its own, its work publisher's) share."""

from __future__ import annotations

import logging
import socket
import ssl
from typing import Any

import pika.exceptions as px

log = logging.getLogger("fedboost.transport")

CONNECTION_ERRORS = (px.AMQPConnectionError, px.ConnectionClosed, px.StreamLostError,
                     px.ChannelWrongStateError, px.ChannelClosed, ConnectionError, ssl.SSLError,
                     socket.gaierror)
"""A lost or closed connection or channel: reconnect and try again (pika raises a failed TLS
handshake as a bare ``ssl.SSLError``, and a broker name that does not resolve, perhaps not
yet, as a bare ``socket.gaierror``; ``messages.tls.certificate_problem`` tells the ones not
worth retrying)."""


class _NoReturnedBodies(logging.Filter):
    """pika logs a returned (unroutable) message with the first 255 bytes of its body, which
    may be a party's data: keep the line, without properties or body."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Published message was returned"):
            args = record.args if isinstance(record.args, tuple) else ()
            record.msg = "Published message was returned: method=%r"
            record.args = (args[2] if len(args) > 2 else None,)
        return True


for _adapter in ("pika.adapters.blocking_connection", "pika.adapters.twisted_connection"):
    logging.getLogger(_adapter).addFilter(_NoReturnedBodies())


class _NoConnectAttempts(logging.Filter):
    """pika logs every failed connection attempt six times at ERROR, once with a traceback;
    the transport says in one line per attempt what it tried and what to check."""

    _ATTEMPT_LINES = ("Connection workflow failed", "Error in _create_connection",
                      "Address resolution failed")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self._ATTEMPT_LINES))


for _adapter in ("pika.adapters.blocking_connection", "pika.adapters.utils.selector_ioloop_adapter"):
    logging.getLogger(_adapter).addFilter(_NoConnectAttempts())
for _quiet in ("pika.adapters.utils.connection_workflow", "pika.adapters.utils.io_services_utils"):
    # these two log only a connection's set-up, every step of a failed one at ERROR
    logging.getLogger(_quiet).setLevel(logging.CRITICAL)


def why_unreachable(exc: BaseException) -> str:
    """The cause of a failed connection in a few words ('connection refused', 'timed out',
    'name not known'), from the OS error pika wraps several layers deep."""
    seen: set[int] = set()
    pending: list[object] = [exc]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError) and not isinstance(item, ssl.SSLError):
            return (item.strerror or type(item).__name__).lower()
        if isinstance(item, BaseException):
            # pika keeps the cause in .exception (a connector) or .exceptions (a workflow)
            pending.extend([*item.args, *getattr(item, "exceptions", ()),
                            getattr(item, "exception", None), item.__cause__, item.__context__])
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def close_quietly(connection: Any, owner: str) -> None:
    """Close a connection that may already be broken; nothing in it is left to save."""
    if connection is not None and connection.is_open:
        try:
            connection.close()
        except Exception as exc:  # noqa: BLE001 - already broken; nothing to save
            log.debug("%s: closing a broken connection: %r", owner, exc)


def close_channel_quietly(channel: Any) -> None:
    """Close a channel the broker may already have closed."""
    if channel is not None and channel.is_open:
        try:
            channel.close()
        except Exception as exc:  # noqa: BLE001 - closed under us; nothing to save
            log.debug("closing a channel: %r", exc)


class _QuietProbes(logging.Filter):
    """Drops pika's warning about the channel a missing probed exchange closed: the answer
    "no" is expected (a single-broker federation has no link exchanges), not a fault a user
    should read in a worker's terminal."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("NOT_FOUND" in message
                    and any(f"no exchange '{name}'" in message for name in self.names))


_QUIET_PROBES = _QuietProbes()
logging.getLogger("pika.channel").addFilter(_QUIET_PROBES)


def exchange_exists(connection: Any, exchange: str) -> bool:
    """Whether the broker has ``exchange`` (a passive declare needs no permission; a missing
    exchange closes the channel it was asked on, so a channel of its own)."""
    _QUIET_PROBES.names.add(exchange)
    channel = connection.channel()
    try:
        channel.exchange_declare(exchange, passive=True)
        return True
    except px.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return False
        raise
    finally:
        close_channel_quietly(channel)
