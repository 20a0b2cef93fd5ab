"""The scoring service's HTTP API (``fedboost serve-model``, ``fedboost.serving``).

``POST /v1/score {"ids": [...]}`` answers ``{"ids", "scores", "model", "objective", "ensemble",
"round", "rows_in_round"}``; ``GET /healthz`` says whether the session is open. Bad requests
get a 4xx with one line in ``detail``: 422 for a malformed body, 413 for too many ids, 404 for
ids a party has no row for (the ``unknown`` list); a party that does not answer within the
round timeout, or answers with an error, gets a 503 naming it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr

from fedboost.scoring_link import Scored, ScoringFailure, ScoringLink, SessionPlan

MAX_ID_CHARS = 256
"""Longer ids are refused before they reach the parties (envelopes carry short strings)."""


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
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts[:5]) + ("; ..." if len(parts) > 5 else "")


def _checked_ids(raw: list[str | int], max_ids: int) -> list[str]:
    if not raw:
        raise ScoringFailure(422, "ids: give at least one id")
    if len(raw) > max_ids:
        raise ScoringFailure(413, f"ids: at most {max_ids} ids per request, got {len(raw)}")
    ids = [str(i) for i in raw]
    for k, ident in enumerate(ids):
        if not ident or len(ident) > MAX_ID_CHARS:
            raise ScoringFailure(422, f"ids[{k}]: an id is 1 to {MAX_ID_CHARS} characters")
    return ids


def _failure(failure: ScoringFailure) -> JSONResponse:
    content: dict[str, Any] = {"detail": failure.message}
    if failure.unknown:
        content["unknown"] = failure.unknown
    return JSONResponse(status_code=failure.status, content=content)


def make_app(link: ScoringLink, info: ModelInfo, max_ids: int) -> FastAPI:
    """The HTTP API in front of a scoring link."""
    app = FastAPI(title="fedboost scoring", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": _one_line(exc)})

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        stats = link.stats
        ok = link.alive() and not link.problem
        return JSONResponse(status_code=200 if ok else 503, content={
            "status": "ok" if ok else "unavailable", "detail": link.problem,
            "model": info.job, "session": link.plan.job,
            "parties": link.plan.parties, "max_ids": max_ids,
            "requests": stats.requests, "rounds": stats.rounds, "rows": stats.rows,
            "failed": stats.failed})

    @app.post("/v1/score")
    async def score(body: ScoreRequest) -> JSONResponse:
        try:
            ids = _checked_ids(body.ids, max_ids)
        except ScoringFailure as failure:
            return _failure(failure)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Scored | ScoringFailure] = loop.create_future()

        def settle(outcome: Scored | ScoringFailure) -> None:
            if not future.done():
                future.set_result(outcome)

        link.submit(ids, lambda outcome: loop.call_soon_threadsafe(settle, outcome))
        outcome = await future
        if isinstance(outcome, ScoringFailure):
            return _failure(outcome)
        values = outcome.values
        scores: list[Any] = (values[:, 0].tolist() if values.shape[1] == 1
                             else values.tolist())
        return JSONResponse({"ids": ids, "scores": scores, "model": info.job,
                             "objective": info.objective, "ensemble": info.ensemble,
                             "round": outcome.round, "rows_in_round": outcome.rows_in_round})

    return app
