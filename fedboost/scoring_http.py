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
- a cap on open connections, counted from the moment a connection is accepted, before its
  TLS handshake: when a new one would exceed it, the connection that has been in its handshake,
  sending its request (or idling) the longest is closed, so clients that complete their
  requests promptly keep being served while slow ones hold connections; with none to evict,
  the new one is closed. The TLS handshake is ours (``loop.start_tls`` on the accepted
  connection, with a deadline of its own), not the listening socket's: there, asyncio hands a
  connection to the protocol only once its handshake is done, so 1,100 sockets that never sent
  a ClientHello held every descriptor of a 1,024-descriptor service (and 256 KiB of TLS
  buffers each) while counting against no limit;
- the verified client certificate's subject (``CN``) in the request scope (the ASGI TLS
  extension's ``client_cert_name``), for ``fedboost.scoring_guard``.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fedboost.scoring_metrics import log_access

READING = ("idle", "headers", "body")
"""Phases of a connection that is not waiting for the service: it may be closed to make room."""
SPARE_DESCRIPTORS = 256
"""Descriptors kept beyond the connection cap: the broker, logs, files, the listening socket,
and the connections accepted in one turn of the loop before those beyond the cap are closed
(the next turn: see ``ACCEPT_BACKLOG``)."""
ACCEPT_BACKLOG = 64
"""The listen backlog, which is also how many connections asyncio accepts at once (uvicorn's
default, 2,048, accepted a whole flood of idle sockets in one turn of the loop, past any cap and
into "Too many open files"): two turns' worth stay within ``SPARE_DESCRIPTORS``."""
TLS_RELOAD_SECONDS = 1.0
"""How often, at most, the TLS files are looked at (at a connection's accept)."""
QUIET_SECONDS = 60.0
"""asyncio's "out of system resource" on accept is logged at most this often, without its
traceback (it was one traceback per failed accept: 11 MB of log in 30 s)."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Limits of the HTTP layer."""

    max_connections: int
    header_seconds: float
    body_seconds: float
    max_header_bytes: int
    handshake_seconds: float = 5.0
    """A TLS handshake not done within this is aborted (asyncio's default: 60 s)."""


class ServerTLS:
    """The server's TLS context, made again when one of its files changes (looked at, at most
    every ``TLS_RELOAD_SECONDS``, when a connection is accepted): a renewed certificate, a new
    client CA or revocation list takes effect without a restart; files that do not load are
    logged and the last good context is kept."""

    def __init__(self, make: Callable[[], ssl.SSLContext], files: list[Path]) -> None:
        self.make = make
        self.files = files
        self._seen = self._stat()
        self.current = make()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in
                         (path.stat() for path in self.files))
        except OSError:
            return None

    def __call__(self) -> ssl.SSLContext:
        """The context for a connection accepted now."""
        now = time.monotonic()
        if now - self._checked < TLS_RELOAD_SECONDS:
            return self.current
        self._checked = now
        seen = self._stat()
        if seen is None or seen == self._seen:
            return self.current
        self._seen = seen  # a file that does not load is tried again when it changes again
        log = logging.getLogger("fedboost.serving")
        try:
            self.current = self.make()
            log.warning("TLS files reloaded: %s", ", ".join(str(p) for p in self.files))
        except Exception as exc:  # noqa: BLE001 - keep serving with the last good files
            log.error("TLS files not reloaded (keeping the last good ones): %s", exc)
        return self.current


def guarded_protocol(limits: ConnectionLimits, dropped: Callable[[str], None],
                     tls: Callable[[], ssl.SSLContext] | None = None
                     ) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``limits``; ``dropped(reason)`` counts closures.
    With ``tls`` (the context for a connection accepted now, ``ServerTLS``) the protocol does
    the TLS handshake of every connection it is given (serve it without uvicorn's ``ssl_*``
    options)."""
    handshaking: dict[GuardedProtocol, tuple[asyncio.Transport, float]] = {}
    """Connections accepted whose TLS handshake is under way, with when they were accepted."""
    quieted: list[asyncio.AbstractEventLoop] = []

    class GuardedProtocol(HttpToolsProtocol):
        _phase = "idle"
        _since = 0.0
        _header_bytes = 0
        _deadline: asyncio.TimerHandle | None = None
        _tls_name: str | None = None
        _too_large = False

        def connection_made(  # type: ignore[override]  # uvicorn's stub: BaseTransport
                self, transport: asyncio.Transport) -> None:
            if self.loop not in quieted:
                quieted.append(self.loop)
                self.loop.set_exception_handler(_QuietAccept())
            if tls is None:
                self._made(transport)
                if len(self.connections) > limits.max_connections:
                    self._make_room()
                return
            transport.pause_reading()  # the bytes of the handshake are for the TLS layer
            handshaking[self] = (transport, self.loop.time())
            if len(self.connections) + len(handshaking) > limits.max_connections:
                self._make_room()
            if self in handshaking:
                self.loop.create_task(self._handshake(transport, tls()))

        async def _handshake(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
            early = _Early()
            try:
                secured = await self.loop.start_tls(
                    raw, early, context, server_side=True,
                    ssl_handshake_timeout=limits.handshake_seconds)
            except (OSError, RuntimeError) as exc:  # SSLError, a deadline missed, a reset
                if handshaking.pop(self, None) is not None:
                    dropped("tls_timeout" if isinstance(exc, ConnectionAbortedError)
                            else "tls_failed")
                raw.abort()
                return
            if handshaking.pop(self, None) is None or early.lost:  # evicted, or gone
                raw.abort()
                return
            if secured is None:  # (asyncio's type: start_tls returns a transport or raises)
                raw.abort()
                return
            secured.set_protocol(self)
            self._made(secured)
            if early.data:
                self.data_received(bytes(early.data))

        def _peers(self) -> list[GuardedProtocol]:
            """The server's open connections: all of this class (it serves no other)."""
            return [c for c in self.connections if isinstance(c, GuardedProtocol)]

        def _made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._tls_name = _certificate_name(transport)
            self._enter("idle", limits.header_seconds, "header_timeout")

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
            waiting = [(c._since, c) for c in self._peers()
                       if c is not self and c._phase in READING]
            if handshaking:
                oldest = min(handshaking.items(), key=lambda item: item[1][1])
                if oldest[0] is not self:
                    waiting.append((oldest[1][1], oldest[0]))
            if waiting:
                victim = min(waiting, key=lambda item: item[0])[1]
            else:
                closing = [c for c in self._peers() if c is not self and c._phase == "closed"]
                if closing:  # answered already: a TLS close waits up to 30 s for the peer
                    closing[0].transport.abort()
                    return
                victim = self
            if victim in handshaking:  # no response to write: TLS was never set up
                raw, _ = handshaking.pop(victim)
                raw.abort()
                dropped("evicted" if victim is not self else "refused")
            else:
                victim._drop("evicted" if victim is not self else "refused",
                             b"503 Service Unavailable")

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


class _QuietAccept:
    """The loop's exception handler: asyncio's accept failures (out of descriptors) in one
    line at most every ``QUIET_SECONDS``; anything else as asyncio logs it."""

    def __init__(self) -> None:
        self.said = -QUIET_SECONDS
        self.since = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system"):
            loop.default_exception_handler(context)
            return
        self.since += 1
        if loop.time() - self.said >= QUIET_SECONDS:
            logging.getLogger("fedboost.serving").warning(
                "cannot accept connections (%d times): %s; raise the descriptor limit "
                "(ulimit -n) or lower --max-connections", self.since, context.get("exception"))
            self.said, self.since = loop.time(), 0


class _Early(asyncio.Protocol):
    """What arrives between the end of a TLS handshake and the HTTP protocol taking the
    connection over (the next turn of the loop): a client may send its request in the same
    flight as its last handshake message."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


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
