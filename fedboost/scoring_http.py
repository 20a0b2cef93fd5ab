"""The scoring service's HTTP server: uvicorn, with limits on connections uvicorn lacks.

uvicorn (0.54) has no deadline for a request's headers or body and no cap on connections:
``limit_concurrency`` answers 503 only to a request whose headers are complete, so clients that
send half a request hold their connections, and file descriptors, for as long as they like
(1,100 such clients exhausted a service's 1,024 descriptors). ``guarded_protocol`` subclasses
uvicorn's httptools protocol to add:

- a deadline for the headers (from the connection's start, or the end of the previous
  response) and one for the body (from the end of the headers): a client that misses it gets
  ``408`` and the connection is closed;
- a cap on the bytes of the request line and headers (``431``);
- a cap on open connections: when a new one would exceed it, the connection that has been
  sending its request (or idling) the longest is closed, so clients that complete their
  requests promptly keep being served while slow ones hold connections; with none to evict,
  the new one is closed;
- the verified client certificate's subject (``CN``) in the request scope (the ASGI TLS
  extension's ``client_cert_name``), for ``fedboost.scoring_guard``.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fedboost.scoring_metrics import log_access

READING = ("idle", "headers", "body")
"""Phases of a connection that is not waiting for the service: it may be closed to make room."""
SPARE_DESCRIPTORS = 256
"""Descriptors kept beyond the connection cap: the broker, logs, files, the listening socket."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Limits of the HTTP layer."""

    max_connections: int
    header_seconds: float
    body_seconds: float
    max_header_bytes: int


def guarded_protocol(limits: ConnectionLimits,
                     dropped: Callable[[str], None]) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``limits``; ``dropped(reason)`` counts closures."""

    class GuardedProtocol(HttpToolsProtocol):
        _phase = "idle"
        _since = 0.0
        _header_bytes = 0
        _deadline: asyncio.TimerHandle | None = None
        _tls_name: str | None = None
        _too_large = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._tls_name = _certificate_name(transport)
            self._enter("idle", limits.header_seconds, "header_timeout")
            if len(self.connections) > limits.max_connections:
                self._make_room()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._phase, self._header_bytes = "headers", 0
            if self._tls_name is not None:
                self.scope["extensions"] = {"tls": {"client_cert_name": self._tls_name}}

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._enter("body", limits.body_seconds, "body_timeout")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()
            self._phase = "busy"

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._enter("idle", limits.header_seconds, "header_timeout")

        def send_400_response(self, msg: str) -> None:
            if not self._too_large:
                super().send_400_response(msg)
                return
            self._drop("header_too_large", b"431 Request Header Fields Too Large")

        # ---- ours ---------------------------------------------------------------------------

        def _count(self, size: int) -> None:
            self._header_bytes += size
            if self._header_bytes > limits.max_header_bytes:
                self._too_large = True
                raise ValueError("request headers too large")  # httptools: a parser error

        def _enter(self, phase: str, seconds: float, reason: str) -> None:
            self._disarm()
            self._phase, self._since = phase, self.loop.time()
            self._deadline = self.loop.call_later(seconds, self._expired, reason)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self, reason: str) -> None:
            self._deadline = None
            if self._phase in READING:
                self._drop(reason, b"408 Request Timeout")

        def _make_room(self) -> None:
            waiting = [c for c in self.connections
                       if c is not self and getattr(c, "_phase", "busy") in READING]
            if waiting:
                min(waiting, key=lambda c: c._since)._drop("evicted", b"503 Service Unavailable")
            else:
                self._drop("refused", b"503 Service Unavailable")

        def _drop(self, reason: str, status: bytes) -> None:
            """Answer ``status`` unless a response started, and close the connection."""
            self._disarm()
            self._phase = "closed"
            if self.transport.is_closing():
                return
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n"
                                     b"connection: close\r\n\r\n")
            self.transport.close()
            dropped(reason)
            log_access(event="dropped", reason=reason, peer=self.client[0] if self.client
                       else None)

    return GuardedProtocol


def _certificate_name(transport: asyncio.Transport) -> str | None:
    """The common name of the client certificate the handshake verified, if any."""
    cert: dict[str, Any] | None = transport.get_extra_info("peercert")
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def descriptors_for(connections: int) -> int:
    """Raise this process's descriptor limit so ``connections`` fit (up to the hard limit);
    the connections that fit in the limit there is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + SPARE_DESCRIPTORS
    if soft < wanted and (hard == resource.RLIM_INFINITY or soft < hard):
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return max(1, min(connections, soft - SPARE_DESCRIPTORS))
