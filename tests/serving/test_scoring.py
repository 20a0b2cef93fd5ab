"""The scoring service end to end: a real 'fedboost serve-model' (uvicorn, over HTTPS with a
client certificate and an API key) in front of three real 'fedboost worker' processes on
RabbitMQ, asked with a real HTTP client (httpx). The model is trained over the same workers with
'fedboost train'; 'fedboost predict' over RabbitMQ scores the same rows for reference. What
crosses the broker is read from its firehose."""

from __future__ import annotations

import asyncio
import csv
import signal
import time

import httpx
import pytest

from fedboost.cli import main
from messages.envelope import MsgType
from tests.conftest import _free_port
from tests.serving.federation import (ROUND_TIMEOUT, Crossed, Federation, Firehose, Service,
                                      breast_ids)


def _predicted(fed: Federation) -> dict[str, float]:
    """'fedboost predict --mode batched' over RabbitMQ against the running workers."""
    folder = fed.root / "models" / f"breast-serve-{fed.tag}" / fed.name("guest")
    before = set(folder.glob("scores-*.csv"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FEDBOOST_AMQP_URL", fed.url)
        assert main(["predict", str(fed.runs), "--mode", "batched"]) == 0
    (scores,) = set(folder.glob("scores-*.csv")) - before
    with scores.open(newline="") as handle:
        return {row["id"]: float(row["score"]) for row in csv.DictReader(handle)}


def test_scores_by_id_equal_fedboost_predict_over_rabbitmq(
        federation: Federation, service: Service, api_key: str) -> None:
    expected = _predicted(federation)
    assert len(expected) == 568  # every row the three parties share, by the running workers
    ids = breast_ids()
    with federation.client(service, api_key) as client:
        for chosen in (ids[:100], ids[300:301], [ids[5], ids[5], ids[9]]):
            reply = client.post("/v1/score", json={"ids": chosen})
            assert reply.status_code == 200, reply.text
            body = reply.json()
            assert body["ids"] == chosen and body["objective"] == "binary"
            assert body["ensemble"] == "boosting"
            assert body["scores"] == [expected[i] for i in chosen]
        numeric = client.post("/v1/score", json={"ids": [int(ids[0])]})
        assert numeric.json()["scores"] == [expected[ids[0]]]
        health = client.get("/healthz").json()
        assert health["status"] == "ok" and len(health["parties"]) == 3


@pytest.mark.parametrize("body, status, detail", [
    ({"ids": "133"}, 422, "ids: Input should be a valid list"),
    ({"ids": []}, 422, "ids: give at least one id"),
    ({"idz": ["133"]}, 422, "idz: Extra inputs are not permitted"),
    ({"ids": [1.5]}, 422, "ids.0"),
    ({"ids": ["x" * 300]}, 422, "ids[0]: an id is 1 to 256 characters"),
    ({"ids": [str(k) for k in range(101)]}, 413, "at most 100 ids per request, got 101"),
])
def test_bad_requests_get_a_4xx_with_one_line(federation: Federation, service: Service,
                                              api_key: str, body: object, status: int,
                                              detail: str) -> None:
    with federation.client(service, api_key) as client:
        reply = client.post("/v1/score", json=body)
    assert reply.status_code == status, reply.text
    assert detail in reply.json()["detail"]
    assert "\n" not in reply.json()["detail"]


def _crossed(firehose: Firehose, until: int = 0, seconds: float = 5.0) -> list[Crossed]:
    """What crossed the broker since the last look: after ``seconds`` (a round's stray
    messages would have arrived), or as soon as ``until`` decision messages did."""
    crossed: list[Crossed] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        crossed += firehose.drain()
        if until and len(_decisions(crossed)) >= until:
            break
        time.sleep(0.1)
    return crossed


def _decisions(crossed: list[Crossed]) -> list[Crossed]:
    return [c for c in crossed
            if c.envelope is not None and c.envelope.kind == MsgType.ROUND_DECISIONS]


def test_a_request_with_an_id_one_party_lacks_sends_no_decisions_and_names_no_party(
        federation: Federation, service: Service, api_key: str, firehose: Firehose) -> None:
    """Issue 23, item 6: the telco holds every id of the request, the bureau lacks one; the
    telco must not send the lender's worker its decisions on the rows it holds."""
    missing, bureau = federation.missing_at_bureau, federation.name("bureau")
    chosen = [*breast_ids()[20:23], missing]
    with federation.client(service, api_key) as client:
        firehose.drain()
        reply = client.post("/v1/score", json={"ids": chosen})
        crossed = _crossed(firehose, seconds=1.5)
        assert reply.status_code == 404, reply.text
        assert reply.json() == {"detail": f"1 of 4 ids cannot be scored: '{missing}'",
                                "unknown": [missing]}
        assert _decisions(crossed) == []  # nothing of the request reached the active party
        to_guest = {c.envelope.kind for c in crossed
                    if c.envelope and c.queue == f"fedboost.{federation.name('guest')}"}
        assert to_guest == {MsgType.FIND_ROWS}
        # which party lacks it is the operator's to know, not the caller's
        assert any(f"{bureau} has no row for '{missing}'" in line for line in service.lines())
        # the control: the same rows without it are scored, and then decisions do cross
        reply = client.post("/v1/score", json={"ids": chosen[:3]})
        assert reply.status_code == 200, reply.text
        crossed = _crossed(firehose, until=2)
    decisions = _decisions(crossed)
    assert sorted(d.envelope.sender for d in decisions if d.envelope) == [
        bureau, federation.name("telco")]
    assert all(d.envelope and d.envelope.body.n_rows == 3 for d in decisions)
    # decisions go to the active party's worker only; which ids a party lacks, to the service
    assert {d.queue for d in decisions} == {f"fedboost.{federation.name('guest')}"}
    found = [c for c in crossed if c.envelope and c.envelope.kind == MsgType.ROWS_FOUND]
    assert found and all(c.queue.startswith("fedboost.flow.") for c in found)


def test_unknown_ids_get_one_404_and_other_requests_go_on(
        federation: Federation, service: Service, api_key: str) -> None:
    ids = breast_ids()

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with federation.async_client(service, api_key) as client:
            return await asyncio.gather(
                client.post("/v1/score", json={"ids": [ids[0], "no-such", ids[1], "nor-this"]}),
                client.post("/v1/score", json={"ids": ids[10:12]}))

    unknown, fine = asyncio.run(both())
    assert unknown.status_code == 404, unknown.text
    assert unknown.json() == {"detail": "2 of 4 ids cannot be scored: 'no-such', 'nor-this'",
                              "unknown": ["no-such", "nor-this"]}
    assert fine.status_code == 200 and len(fine.json()["scores"]) == 2


def test_concurrent_single_row_requests_are_micro_batched(
        federation: Federation, service: Service, api_key: str) -> None:
    ids = breast_ids()[:40]
    with federation.client(service, api_key) as client:
        expected = client.post("/v1/score", json={"ids": ids}).json()
        before = client.get("/healthz").json()

        async def singles() -> list[httpx.Response]:
            async with federation.async_client(service, api_key) as http:
                return await asyncio.gather(*(http.post("/v1/score", json={"ids": [i]})
                                              for i in ids))

        replies = asyncio.run(singles())
        after = client.get("/healthz").json()
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies][:3]
    assert [r.json()["scores"][0] for r in replies] == expected["scores"]
    rounds = after["rounds"] - before["rounds"]
    assert after["requests"] - before["requests"] == 40
    assert after["membership_rounds"] == before["membership_rounds"]  # ids found already
    assert rounds < 40, rounds  # fewer rounds than requests: batched
    assert max(r.json()["rows_in_round"] for r in replies) > 1


def test_a_session_that_cannot_open_stops_serve_model_with_one_line(
        federation: Federation, service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    bureau = federation.name("bureau")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FEDBOOST_AMQP_URL", federation.url)
        code = main(["serve-model", str(federation.runs), "--port", str(_free_port()),
                     "--dataset", f"{bureau}=nowhere", "--timeout", "10",
                     "--insecure-no-auth"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"fedboost: error: party {bureau} has no data set 'nowhere' in its worker "
                       f"file (it has: applicants)")
    assert service.proc.poll() is None  # the other goes on


def test_a_passive_worker_that_is_gone_fails_requests_at_once_naming_it_until_it_is_back(
        federation: Federation, service: Service, api_key: str) -> None:
    """Issue 37, item 5: after a kill -9 the first error came 10 s later (a round timeout),
    requests queued behind it up to 20 s, /healthz stayed 200. A party with no worker on the
    broker is known gone: requests fail at once naming it, with Retry-After, /healthz and
    /readyz say so, and scoring resumes without a restart when its worker is back."""
    ids = breast_ids()[:3]
    telco = federation.name("telco")

    async def five() -> list[tuple[httpx.Response, float]]:
        async with federation.async_client(service, api_key) as http:
            async def timed(k: int) -> tuple[httpx.Response, float]:
                started = time.monotonic()
                reply = await http.post("/v1/score", json={"ids": ids[k % 3:]})
                return reply, time.monotonic() - started
            return await asyncio.gather(*(timed(k) for k in range(5)))

    with federation.client(service, api_key, timeout=60) as client:
        assert client.get("/readyz").json()["status"] == "ready"
        federation.workers["telco"].send_signal(signal.SIGKILL)
        federation.workers["telco"].wait(timeout=30)
        try:
            answered = asyncio.run(five()) + asyncio.run(five())
            health, ready = client.get("/healthz"), client.get("/readyz")
        finally:  # the other tests need the telco
            federation.start_worker("telco")
        for reply, _ in answered:
            assert reply.status_code == 503, reply.text
            assert reply.json()["detail"].startswith(
                f"party {telco}: no worker of it is connected to the broker"), reply.text
            assert 1 <= int(reply.headers["retry-after"]) <= 5
        waits = sorted(seconds for _, seconds in answered)
        # was: the round timeout (--timeout 3) for the first, as long again for the next;
        # now within a second of the kill (a loaded machine adds its TLS handshakes)
        assert waits[-1] < ROUND_TIMEOUT - 0.5, waits
        assert health.status_code == 503 and telco in health.json()["detail"], health.text
        assert ready.status_code == 503 and ready.json()["detail"].startswith(
            f"party {telco}: no worker of it is connected"), ready.text
        # it is back: the service opens its session again and scores, without a restart
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            reply = client.post("/v1/score", json={"ids": ids})
            if reply.status_code == 200:
                break
            time.sleep(0.5)
        assert reply.status_code == 200, reply.text
        assert client.get("/readyz").json()["status"] == "ready"
        assert client.get("/healthz").status_code == 200
    assert service.proc.poll() is None


def test_a_passive_worker_that_does_not_answer_gets_a_503_naming_it(
        federation: Federation, service: Service, api_key: str) -> None:
    """A worker still connected but silent (stopped): the round timeout names it."""
    ids = breast_ids()[:3]
    telco = federation.name("telco")
    with federation.client(service, api_key, timeout=60) as client:
        assert client.post("/v1/score", json={"ids": ids}).status_code == 200
        federation.workers["telco"].send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            reply = client.post("/v1/score", json={"ids": ids})
            waited = time.monotonic() - started
        finally:
            federation.workers["telco"].send_signal(signal.SIGCONT)
        assert reply.status_code == 503, reply.text
        assert reply.json()["detail"].startswith(f"party {telco}: no answer to scoring round")
        assert waited < ROUND_TIMEOUT + 2.0
        deadline = time.monotonic() + 30
        while client.post("/v1/score", json={"ids": ids}).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
