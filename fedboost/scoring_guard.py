"""Who may ask the scoring service, and how much: checked before any work is done.

``Gate`` is ASGI middleware in front of the API (behind the ``Host`` check): the client
authenticates (an API key, ``fedboost.api_keys``, and/or a client certificate the TLS layer
verified, ``fedboost.scoring_http``), its key has the scope the path needs (``score`` for
scoring, ``metrics`` for the operator's endpoints; a certificate alone may ask both), stays within its rate (a token bucket per client: 429
with ``Retry-After``), and sends a body no larger than the limit, by its ``Content-Length`` and
by the bytes that actually arrive (413 without reading the rest). Every refusal closes the
connection, so nothing more of that body is read.

The rate limit is a token bucket of our own: ``limits`` (what ``slowapi`` uses) keeps its
in-memory counters with a timer thread started every 10 ms, which would compete for the GIL
with the threads that score; a bucket touched only by the event loop needs no thread or lock.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from fedboost.api_keys import KeyRing

METRICS_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
"""Paths a key needs the ``metrics`` scope for (the operator's view); any other needs
``score``."""

BURST_SECONDS = 2.0
"""A client may send this many seconds' worth of its rate at once."""
MAX_BUCKETS = 10_000
"""Clients remembered by the rate limiter (peers by address without authentication)."""
CLOSE = [(b"connection", b"close")]


@dataclass(frozen=True, slots=True)
class GatePolicy:
    """What a request must satisfy before the API sees it."""

    keys: KeyRing | None
    """API keys required (None: no key asked)."""
    certificates: bool
    """Client certificates required (the TLS handshake verified them against the CA)."""
    rate: float
    """Requests per second per client, unless its key says otherwise."""
    max_body_bytes: int


class RateLimiter:
    """Token buckets per client: ``rate`` tokens a second, ``rate * BURST_SECONDS`` at most."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, client: str, rate: float) -> float:
        """Take one token: 0.0 if there was one, else the seconds until there is."""
        now = self.clock()
        capacity = max(1.0, rate * BURST_SECONDS)
        tokens, since = self._buckets.get(client, (capacity, now))
        tokens = min(capacity, tokens + (now - since) * rate)
        if tokens >= 1.0:
            if len(self._buckets) >= MAX_BUCKETS and client not in self._buckets:
                self._forget_full(now)
            self._buckets[client] = (tokens - 1.0, now)
            return 0.0
        self._buckets[client] = (tokens, now)
        return (1.0 - tokens) / rate

    def _forget_full(self, now: float) -> None:
        """Drop the buckets idle long enough to be full again (they hold nothing)."""
        idle = [c for c, (_, since) in self._buckets.items() if now - since > 60.0]
        for client in idle or list(self._buckets)[: MAX_BUCKETS // 10]:
            del self._buckets[client]


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class Gate:
    """ASGI middleware: authentication, per-client rate, body size."""

    def __init__(self, app: Any, policy: GatePolicy) -> None:
        self.app = app
        self.policy = policy
        self.limiter = RateLimiter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._authenticate(scope)
        if refusal is None:
            refusal = self._within_rate(scope)
        if refusal is None:
            refusal = self._declared_size(scope)
        if refusal is not None:
            status, detail, headers = refusal
            scope["fedboost.refused"] = detail
            await _answer(send, status, detail, headers)
            return
        await self.app(scope, self._counted(receive), send)

    def _authenticate(self, scope: Scope) -> tuple[int, str, list[Any]] | None:
        policy = self.policy
        tls = scope.get("extensions", {}).get("tls", {})
        cert_name = tls.get("client_cert_name")
        if policy.certificates and not cert_name:  # the handshake requires one: a bug if not
            return 401, "a client certificate is required", CLOSE
        scope["fedboost.client"] = cert_name
        if policy.keys is None:
            return None
        challenge = [(b"www-authenticate", b'Bearer realm="fedboost"'), *CLOSE]
        header = _header(scope, b"authorization")
        scheme, _, key = (header or b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return 401, "an API key is required (Authorization: Bearer <key>)", challenge
        record = policy.keys.identify(key.strip())
        if record is None:
            return 401, "the API key is not valid (unknown or revoked)", challenge
        if policy.certificates and not record.belongs_to(cert_name):
            # one client, one identity: another client's certificate does not make a key valid
            return 403, (f"the API key of client {record.name} does not go with the client "
                         f"certificate of {cert_name[:64]}"), CLOSE
        scope["fedboost.client"] = record.name
        scope["fedboost.rate"] = record.rate
        needed = "metrics" if scope["path"] in METRICS_PATHS else "score"
        if needed not in record.scopes:
            return 403, (f"this API key may not ask {scope['path'][:100]}: it needs the "
                         f"{needed} scope (serve-model-keys add --scope {needed})"), CLOSE
        return None

    def _within_rate(self, scope: Scope) -> tuple[int, str, list[Any]] | None:
        client = scope.get("fedboost.client")
        if client is None:
            peer = scope.get("client")
            client = f"peer {peer[0] if peer else '?'}"
        rate = scope.get("fedboost.rate") or self.policy.rate
        wait = self.limiter.take(client, rate)
        if wait <= 0.0:
            return None
        retry = str(max(1, math.ceil(wait))).encode()
        return 429, f"too many requests: at most {rate:g} a second", [
            (b"retry-after", retry), *CLOSE]

    def _declared_size(self, scope: Scope) -> tuple[int, str, list[Any]] | None:
        declared = _header(scope, b"content-length")
        limit = self.policy.max_body_bytes
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return 413, f"the body is larger than {limit} bytes", CLOSE
        return None

    def _counted(self, receive: Callable[..., Any]) -> Callable[..., Any]:
        """``receive`` that stops the request once more body arrived than the limit allows
        (a chunked body declares no length)."""
        limit = self.policy.max_body_bytes
        total = 0

        async def receiving() -> dict[str, Any]:
            nonlocal total
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > limit:
                    raise HTTPException(413, f"the body is larger than {limit} bytes",
                                        headers={"connection": "close"})
            return message

        return receiving


async def _answer(send: Callable[..., Any], status: int, detail: str,
                  headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *headers]})
    await send({"type": "http.response.body", "body": body})
