"""The scoring service's HTTP API (``fedboost serve-model``, ``fedboost.serving``).

``POST /v1/score {"ids": [...]}`` answers ``{"ids", "scores", "model", "objective", "ensemble",
"round", "rows_in_round"}``; ``GET /healthz`` says whether the session is open, ``GET /readyz``
whether every party answers, ``GET /metrics`` gives Prometheus metrics, and ``GET /livez``,
the one endpoint without authentication, says ``ok`` and nothing else. Bad requests get a 4xx
with one line in ``detail``: 422 for a malformed body, 413 for too many ids or bytes, 404 for
ids that cannot be scored (the ``unknown`` list; which party lacks them is only logged); a
party that does not answer within the round timeout, or answers with an error, gets a 503
naming it.

``make_app`` wraps the API in its guards, outermost first: the access log and metrics
(``fedboost.scoring_metrics``), the ``Host`` allowlist (Starlette's ``TrustedHostMiddleware``:
a page in a browser on this machine that rebinds its DNS name to 127.0.0.1 sends its own name),
then authentication, rate and body size (``fedboost.scoring_guard``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import Receive, Scope, Send

from fedboost.scoring_guard import Gate, GatePolicy
from fedboost.scoring_link import ScoringLink
from fedboost.scoring_session import Scored, ScoringFailure
from fedboost.scoring_metrics import CONTENT_TYPE, AccessLog, ScoringMetrics

MAX_ID_CHARS = 256
"""Longer ids are refused before they reach the parties (envelopes carry short strings)."""
_INT_IDS = 10**MAX_ID_CHARS
"""Numeric ids are below this in magnitude (``str`` refuses ints of over 4,300 digits)."""
LIVEZ = "/livez"
READY_SECONDS = 2.0
"""``/readyz`` answers at once when every party answered a round this recently; else it asks
them (a membership round of no ids)."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a response says about the model (from the run folder's job.json)."""

    job: str
    objective: str
    ensemble: str


class ScoreRequest(BaseModel):
    """The body of ``POST /v1/score``."""

    model_config = ConfigDict(extra="forbid")
    ids: list[StrictStr | StrictInt]


def _one_line(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(_shown_key(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts[:5]) + ("; ..." if len(parts) > 5 else "")


def _shown_key(part: object) -> str:
    """A key of the body as an error line shows it: the caller's own text, but one line."""
    text = str(part)[:64]
    return text if text.isprintable() else repr(text)


def _checked_ids(raw: list[str | int], max_ids: int) -> list[str]:
    """The ids as the parties' rounds carry them: 1 to ``MAX_ID_CHARS`` characters of text
    the envelope's encoder takes (UTF-8: valid JSON may still hold a lone surrogate, ``\ud800``,
    which no UTF-8 encoder takes), else the 4xx naming the first bad one."""
    if not raw:
        raise ScoringFailure(422, "ids: give at least one id")
    if len(raw) > max_ids:
        raise ScoringFailure(413, f"ids: at most {max_ids} ids per request, got {len(raw)}")
    ids = []
    for k, item in enumerate(raw):
        if isinstance(item, int) and not -_INT_IDS < item < _INT_IDS:
            raise ScoringFailure(422, f"ids[{k}]: an id is 1 to {MAX_ID_CHARS} characters")
        ident = str(item)
        if not ident or len(ident) > MAX_ID_CHARS:
            raise ScoringFailure(422, f"ids[{k}]: an id is 1 to {MAX_ID_CHARS} characters")
        try:
            ident.encode("utf-8")
        except UnicodeEncodeError:
            raise ScoringFailure(422, f"ids[{k}]: not valid Unicode text (a lone surrogate "
                                      f"such as \\ud800 cannot be encoded)") from None
        ids.append(ident)
    return ids


def _failure(failure: ScoringFailure) -> JSONResponse:
    content: dict[str, Any] = {"detail": failure.message}
    if failure.unknown:
        content["unknown"] = failure.unknown
    headers = ({"Retry-After": str(failure.retry_after)} if failure.retry_after is not None
               else None)
    return JSONResponse(status_code=failure.status, content=content, headers=headers)


def make_app(link: ScoringLink, info: ModelInfo, max_ids: int, *, policy: GatePolicy,
             allowed_hosts: list[str], metrics: ScoringMetrics,
             deadline: float | None = None) -> Any:
    """The HTTP API in front of a scoring link, behind its guards (an ASGI app). A request
    the link has not answered within ``deadline`` seconds (default: three round timeouts, a
    reopen, a membership and a scoring round) gets a 504."""
    seconds = deadline if deadline is not None else 3 * link.plan.timeout
    app = FastAPI(title="fedboost scoring", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": _one_line(exc)})

    async def settled(submit: Any) -> Scored | ScoringFailure:
        """The outcome ``submit(done)`` hands to ``done`` from the link's thread."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Scored | ScoringFailure] = loop.create_future()

        def settle(outcome: Scored | ScoringFailure) -> None:
            if not future.done():
                future.set_result(outcome)

        submit(lambda outcome: loop.call_soon_threadsafe(settle, outcome))
        try:
            return await asyncio.wait_for(future, seconds)
        except TimeoutError:  # the link's own deadlines failed: never leave a client hanging
            return ScoringFailure(504, f"no answer from the scoring link within {seconds:g} s")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        stats = link.stats
        ok = link.alive() and not link.problem
        return JSONResponse(status_code=200 if ok else 503, content={
            "status": "ok" if ok else "unavailable", "detail": link.problem,
            "model": info.job, "session": link.plan.job,
            "parties": link.plan.parties, "max_ids": max_ids,
            "requests": stats.requests, "rounds": stats.rounds, "rows": stats.rows,
            "failed": stats.failed, "membership_rounds": stats.membership_rounds})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        problem = link.problem or ("" if link.alive() else "the scoring link has stopped")
        if not problem and time.monotonic() - link.stats.all_answered_at > READY_SECONDS:
            outcome = await settled(link.ping)
            problem = outcome.message if isinstance(outcome, ScoringFailure) else ""
        return JSONResponse(status_code=503 if problem else 200, content={
            "status": "unavailable" if problem else "ready", "detail": problem,
            "parties": link.plan.parties})

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.keys.set(policy.keys.in_use if policy.keys is not None else 0)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/v1/score")
    async def score(body: ScoreRequest, request: Request) -> JSONResponse:
        request.scope["fedboost.ids"] = len(body.ids)
        try:
            ids = _checked_ids(body.ids, max_ids)
        except ScoringFailure as failure:
            return _failure(failure)
        client = request.scope.get("fedboost.client") or ""
        outcome = await settled(lambda done: link.submit(ids, done, client))
        if isinstance(outcome, ScoringFailure):
            return _failure(outcome)
        metrics.rows.inc(len(ids))
        values = outcome.values
        scores: list[Any] = (values[:, 0].tolist() if values.shape[1] == 1
                             else values.tolist())
        return JSONResponse({"ids": ids, "scores": scores, "model": info.job,
                             "objective": info.objective, "ensemble": info.ensemble,
                             "round": outcome.round, "rows_in_round": outcome.rows_in_round})

    guarded = TrustedHostMiddleware(Gate(app, policy), allowed_hosts=allowed_hosts)
    return AccessLog(Liveness(guarded, link), metrics)


class Liveness:
    """ASGI middleware: ``GET /livez`` answers before the ``Host`` check and authentication,
    for probes that can send neither; it tells nothing but whether the scoring link runs
    (``ok``, or 503 ``unavailable``: a failed request says as much)."""

    def __init__(self, app: Any, link: ScoringLink) -> None:
        self.app = app
        self.link = link

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != LIVEZ:
            await self.app(scope, receive, send)
            return
        live = self.link.alive()
        body = b"ok" if live else b"unavailable"
        await send({"type": "http.response.start", "status": 200 if live else 503,
                    "headers": [(b"content-type", b"text/plain"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
