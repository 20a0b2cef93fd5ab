"""Nothing one client can stop (issue 37, item 1): a request that cannot be scored fails that
request, never the scoring link, and a link that still dies takes the process with it (non-zero
exit, for a supervisor to restart). Against a real 'fedboost serve-model' (HTTPS, client
certificates, API keys) in front of the three real workers; each test has a service of its own,
since on the code before the fix one request stopped its service's scoring for good."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.serving.conftest import SERVICE_FLAGS
from tests.serving.federation import Federation, Service, breast_ids
from tests.scenarios import rabbitmqctl

ANSWER_SECONDS = 10.0
"""A valid request's answer, at most: rounds answer in milliseconds (--timeout 3)."""


@pytest.fixture(scope="module")
def fuzzed(federation: Federation, api_key: str) -> Iterator[Service]:
    running = federation.serve_https(*SERVICE_FLAGS, log_name="fuzzed")
    yield running
    running.stop()


_text = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=12)
"""Strings as JSON can carry them: lone surrogates (``"\\ud800"``) included."""
_leaves = (st.none() | st.booleans() | st.integers() | st.integers(-10**300, 10**300)
           | st.floats(allow_nan=True, allow_infinity=True) | _text
           | st.sampled_from(["\ud800", "\udfff", "\x00", "\u2028", "", "x" * 257]))
_json = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_text, inner, max_size=3), max_leaves=12)
_bodies = (st.builds(lambda ids: {"ids": ids}, _json | st.lists(_leaves, min_size=1,
                                                                 max_size=5))
           | st.builds(lambda ids, extra: {"ids": ids, **extra}, st.lists(_leaves, max_size=3),
                       st.dictionaries(_text, _json, max_size=2))
           | _json)


@settings(max_examples=60, deadline=None, database=None,
          phases=(Phase.explicit, Phase.generate),  # no shrinking: the service has state
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_bodies | st.binary(max_size=64))
@example(body={"ids": ["\ud800"]})  # the report's request: it stopped scoring for good
@example(body={"ids": ["25115", "\udfff"]})
@example(body=b'{"ids": [' + b"9" * 4400 + b"]}")  # beyond what int() reads
@example(body=b'{"ids": [1e999999]}')
def test_after_any_json_body_the_next_valid_request_is_answered(
        federation: Federation, fuzzed: Service, api_key: str, body: Any) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()  # \ud800 escaped
    with federation.client(fuzzed, api_key, timeout=ANSWER_SECONDS) as client:
        reply = client.post("/v1/score", content=data,
                            headers={"Content-Type": "application/json"})
        assert reply.status_code < 500, (body, reply.status_code, reply.text)
        assert "\n" not in reply.json()["detail"] if reply.status_code >= 400 else True
        after = client.post("/v1/score", json={"ids": breast_ids()[:2]})
    assert after.status_code == 200, (body, after.text)


@contextmanager
def _direct_link(federation: Federation) -> Iterator[Any]:
    """A scoring link in this process (no HTTP) at the federation's workers, started."""
    from fedboost.scoring_link import ScoringLink
    from fedboost.scoring_session import SessionPlan
    from fedboost.serving import _datasets, _job_of
    from flows.coordinator import broker_coordinator

    config = _job_of(federation.runs)
    plan = SessionPlan(job=f"{config.job[:40]}-link-{uuid.uuid4().hex[:6]}",
                       model_job=config.job, protocol=config.protocol, active=config.active,
                       passives=list(config.passives), datasets=_datasets(config, []),
                       max_rows=64, timeout=3.0)
    with pytest.MonkeyPatch.context() as environ:
        environ.setenv("FEDBOOST_AMQP_URL", federation.url)
        coordinator = broker_coordinator(config, plan.job, plan.timeout)
    link = ScoringLink(plan, coordinator)
    link.open()
    link.start()
    try:
        yield link
    finally:
        link.stop()
        coordinator.transport.delete_inbox()  # type: ignore[attr-defined]
        coordinator.transport.close()


def _answer(link: Any, ids: list[str]) -> Any:
    from fedboost.scoring_session import ScoringFailure

    got: list[Any] = []
    link.submit(ids, got.append)
    deadline = time.monotonic() + ANSWER_SECONDS
    while not got and time.monotonic() < deadline:
        time.sleep(0.002)
    return got[0] if got else ScoringFailure(0, "no answer")


def test_a_round_that_cannot_be_sent_fails_its_requests_not_the_link(
        federation: Federation, api_key: str) -> None:
    """Past the API's checks (a caller of the link itself): the encoder refuses the round's
    ids in the link's thread; that round's request fails, the next is scored."""
    from fedboost.scoring_session import Scored, ScoringFailure

    with _direct_link(federation) as link:
        outcomes = [_answer(link, ids) for ids in (["\ud800"], breast_ids()[:3])]
    failed, scored = outcomes
    assert isinstance(failed, ScoringFailure) and failed.status == 500, vars(failed)
    assert "could not be sent (UnicodeEncodeError)" in failed.message
    assert isinstance(scored, Scored) and scored.values.shape == (3, 1)


def _own_user(url: str, tag: str) -> tuple[str, str]:
    """A broker user of its own for one service, allowed on the federation's virtual host."""
    parts = urlsplit(url)
    vhost = parts.path.lstrip("/").replace("%2F", "/").replace("%2f", "/")
    user, password = f"serve-{tag}", uuid.uuid4().hex
    for args in (["add_user", user, password],
                 ["set_permissions", "-p", vhost, user, ".*", ".*", ".*"]):
        subprocess.run([rabbitmqctl(), "-q", *args], check=True, capture_output=True,
                       timeout=120)
    netloc = f"{quote(user)}:{password}@{parts.hostname}:{parts.port or 5672}"
    return user, urlunsplit(parts._replace(netloc=netloc))


def test_a_scoring_link_that_stops_ends_the_process_non_zero(
        federation: Federation, api_key: str) -> None:
    """The service's broker user is deleted (its connection closed, its login refused from
    then on): the link's thread cannot go on, so the process must not keep a port that
    answers nothing; it exits 3 and the requests waiting get a 503."""
    user, url = _own_user(federation.url, federation.tag)
    original = federation.url
    try:
        federation.url = url  # serve() hands the service this URL
        service = federation.serve_https(*SERVICE_FLAGS, log_name="doomed")
    finally:
        federation.url = original
    try:
        with federation.client(service, api_key, timeout=ANSWER_SECONDS) as client:
            assert client.post("/v1/score", json={"ids": breast_ids()[:2]}).status_code == 200
            subprocess.run([rabbitmqctl(), "-q", "delete_user", user], check=True,
                           capture_output=True, timeout=120)
            started = time.monotonic()
            try:
                client.post("/v1/score", json={"ids": breast_ids()[2:4]})
            except httpx.TransportError:
                pass  # the process may be gone already
        code = service.proc.wait(timeout=60)
        assert code == 3, service.log.read_text()[-2000:]
        assert time.monotonic() - started < 40
        assert any("the scoring link stopped" in line for line in service.lines())
    finally:
        service.stop()
        subprocess.run([rabbitmqctl(), "-q", "delete_user", user], capture_output=True,
                       timeout=120)


def test_the_watch_on_gone_parties_waits_for_an_idle_link_not_between_requests(
        federation: Federation, api_key: str) -> None:
    """The watch asks the broker about every party (round trips on the link's thread): one
    client asking row after row for 3.5 s must not wait for it (on the code before, it ran in
    the gap after an answer once a second: 3 times); an idle link still watches."""
    from fedboost.scoring_session import Scored

    with _direct_link(federation) as link:
        asked: list[float] = []
        real = link.coordinator.presence

        def presence(parties: list[str]) -> dict[str, str]:
            asked.append(time.monotonic())
            return real(parties)

        link.coordinator.presence = presence
        deadline = time.monotonic() + ANSWER_SECONDS
        while not asked and time.monotonic() < deadline:  # a new link is idle: it watches
            time.sleep(0.01)
        asked.clear()
        ids = breast_ids()
        started, k = time.monotonic(), 0
        while time.monotonic() - started < 3.5:
            outcome = _answer(link, [ids[k % len(ids)]])
            assert isinstance(outcome, Scored), vars(outcome)
            k += 1
        busy = list(asked)
        time.sleep(2.5)  # idle: the watch runs (a party killed now is still named at once)
        # one: a round late by a second on a loaded machine is watched, rightly
        assert len(busy) <= 1, f"{len(busy)} watches during {k} requests one after another"
        assert asked, "an idle link did not watch the parties"
