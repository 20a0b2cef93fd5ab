"""The scoring service's metrics (``GET /metrics``, Prometheus text format) and access log.

Metrics live in a registry of their own (not prometheus-client's process-wide one), so two
services in one process, as in tests, count apart. Access log lines are JSON objects, one per
request or dropped connection, on the ``fedboost.serving.access`` logger: who asked (the API
key's client name or the client certificate's name, never a key), what, the status, how long.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import Receive, Scope, Send

access_log = logging.getLogger("fedboost.serving.access")
PATHS = frozenset({"/v1/score", "/healthz", "/readyz", "/metrics", "/livez"})
"""Paths counted by name; any other is counted as ``other`` (a scanner cannot add labels)."""
LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds: fine around the single-row goals (p50 10 ms, p99 30 ms)."""
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ScoringMetrics:
    """Counters and histograms of one scoring service."""

    def __init__(self, session: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("fedboost_scoring_requests", "HTTP requests answered, by path "
                                "and status", ["path", "status"], registry=r)
        self.latency = Histogram("fedboost_scoring_request_seconds", "Time from a request's "
                                 "headers to its response's end", ["path"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.rows = Counter("fedboost_scoring_rows", "Rows scored", registry=r)
        self.party_round = Histogram("fedboost_scoring_party_round_seconds", "Time from sending "
                                     "a round to each party's answer (kind: find = membership, "
                                     "score = decisions and scores)", ["party", "kind"],
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.dropped = Counter("fedboost_scoring_connections_dropped", "Connections the "
                               "service closed before a response (evicted: the oldest unfinished "
                               "one when the connection limit was reached; header_timeout, "
                               "body_timeout; header_too_large; refused: no room at all)",
                               ["reason"], registry=r)
        self.connections = Gauge("fedboost_scoring_connections", "Open HTTP connections",
                                 registry=r)
        self.keys = Gauge("fedboost_scoring_api_keys", "API keys in use", registry=r)
        Gauge("fedboost_scoring_session_info", "The scoring session at the parties",
              ["session"], registry=r).labels(session).set(1)

    def observe_round(self, party: str, kind: str, seconds: float) -> None:
        """A party answered a round (``ScoringLink``'s observer, called from its thread)."""
        self.party_round.labels(party, kind).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def log_access(**fields: Any) -> None:
    """One access log line (JSON), ``ts`` first."""
    if access_log.isEnabledFor(logging.INFO):
        line = {"ts": round(time.time(), 3), **fields}
        access_log.info(json.dumps(line, separators=(",", ":"), default=str))


class AccessLog:
    """ASGI middleware, outermost: every response is counted, timed and logged with the client
    the inner layers identified (``scope["fedboost.client"]``)."""

    def __init__(self, app: Any, metrics: ScoringMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            path = scope["path"] if scope["path"] in PATHS else "other"
            self.metrics.requests.labels(path, str(status[0])).inc()
            self.metrics.latency.labels(path).observe(seconds)
            client = scope.get("client")
            log_access(event="request", client=scope.get("fedboost.client"),
                       peer=client[0] if client else None, method=scope["method"],
                       path=scope["path"][:200], status=status[0], ms=round(seconds * 1e3, 2),
                       ids=scope.get("fedboost.ids"), refused=scope.get("fedboost.refused"))
