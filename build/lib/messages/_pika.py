"""What both RabbitMQ connections of a party process (its own, its work publisher's) share."""

from __future__ import annotations

import logging
import ssl
from typing import Any

import pika.exceptions as px

log = logging.getLogger("fedboost.transport")

CONNECTION_ERRORS = (px.AMQPConnectionError, px.ConnectionClosed, px.StreamLostError,
                     px.ChannelWrongStateError, px.ChannelClosed, ConnectionError, ssl.SSLError)
"""A lost or closed connection or channel: reconnect and try again (pika raises a failed TLS
handshake as a bare ``ssl.SSLError``; ``messages.tls.certificate_problem`` tells the ones not
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


def close_quietly(connection: Any, owner: str) -> None:
    """Close a connection that may already be broken; nothing in it is left to save."""
    if connection is not None and connection.is_open:
        try:
            connection.close()
        except Exception as exc:  # noqa: BLE001 - already broken; nothing to save
            log.debug("%s: closing a broken connection: %r", owner, exc)
