"""The scoring service end to end: a real 'fedboost serve-model' (uvicorn) in front of three real
'fedboost worker' processes on RabbitMQ, asked with a real HTTP client (httpx). The model is
trained over the same workers with 'fedboost train'; 'fedboost predict' over RabbitMQ scores the
same rows for reference."""

from __future__ import annotations

import asyncio
import csv
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from fedboost.cli import main
from messages.rabbitmq import delete_party_queues
from messages.signing import write_key_pair
from tests.conftest import _free_port
from tests.scenarios import DATA, REPO

pytestmark = pytest.mark.usefixtures("prefect_harness")
FEDBOOST = [sys.executable, "-m", "fedboost.cli"]
ROUND_TIMEOUT = 3.0
HOST_COLUMNS = {"bureau": [f"x{k}" for k in range(10)], "telco": [f"x{k}" for k in range(10, 20)]}


@dataclass
class Federation:
    """Three running workers, a trained model and a running scoring service."""

    root: Path
    tag: str
    url: str
    base: str
    workers: dict[str, subprocess.Popen[bytes]]
    service: subprocess.Popen[bytes]
    runs: Path

    def name(self, party: str) -> str:
        return f"{party}{self.tag}"

    def start_worker(self, party: str) -> None:
        name = self.name(party)
        self.workers[party] = subprocess.Popen(
            [*FEDBOOST, "worker", "--party", name, "--config", str(self.root / f"{name}.yaml")],
            stdout=(self.root / f"{name}.log").open("a"), stderr=subprocess.STDOUT,
            env=_env(), cwd=self.root)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    return env


def _worker_file(root: Path, party: str, name: str, url: str) -> None:
    """A party's own worker file: its data sets by name, its policy (batched answers allowed)."""
    file = "guest" if party == "guest" else "host"
    applicants = {"data": str(DATA / f"breast_hetero_{file}.csv"), "id": "id"}
    if party == "guest":
        applicants["label"] = "y"
    else:
        applicants["columns"] = HOST_COLUMNS[party]
    raw = {"party": name, "datasets": {"applicants": applicants}, "models": str(root / "models"),
           "policy": {"min_key_bits": 1024, "predict_modes": ["path", "batched"]},
           "transport": {"kind": "rabbitmq", "url": url},
           "signing": {"key_dir": str(root / "keys")}}
    (root / f"{name}.yaml").write_text(yaml.safe_dump(raw))


def _job_file(root: Path, tag: str) -> Path:
    parties = {f"guest{tag}": {"role": "active", "dataset": "applicants", "label": "y"},
               **{f"{p}{tag}": {"role": "passive", "dataset": "applicants"} for p in HOST_COLUMNS}}
    raw = {"job": f"breast-serve-{tag}", "protocol": "vertical_secureboost", "parties": parties,
           "params": {"n_trees": 4, "max_depth": 3, "learning_rate": 0.3, "max_bin": 32,
                      "objective": "binary"},
           "crypto": {"key_bits": 1024}, "transport": {"kind": "rabbitmq"},
           "signing": {"key_dir": str(root / "keys")}}
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _wait_healthy(base: str, service: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if service.poll() is not None:
            raise AssertionError(f"serve-model exited {service.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"serve-model not healthy: {log.read_text()}")


@pytest.fixture(scope="module")
def federation(rabbit_url: str, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Federation]:
    root = tmp_path_factory.mktemp("serving")
    tag = uuid.uuid4().hex[:6]
    names = [f"{p}{tag}" for p in ("guest", *HOST_COLUMNS)]
    for name in (*names, "flow"):
        write_key_pair(root / "keys", name)
    for party, name in zip(("guest", *HOST_COLUMNS), names):
        _worker_file(root, party, name, rabbit_url)
    job_file = _job_file(root, tag)
    port = _free_port()
    fed = Federation(root, tag, rabbit_url, f"http://127.0.0.1:{port}", {},
                     None, root / "runs")  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FEDBOOST_AMQP_URL", rabbit_url)  # the job file names no broker password
        for party in ("guest", *HOST_COLUMNS):
            fed.start_worker(party)
        try:
            assert main(["train", str(job_file), "--out", str(fed.runs)]) == 0
            log = root / "serve.log"
            fed.service = subprocess.Popen(
                [*FEDBOOST, "serve-model", str(fed.runs), "--port", str(port), "--timeout",
                 str(ROUND_TIMEOUT), "--max-ids", "100", "--round-rows", "512"],
                stdout=log.open("w"), stderr=subprocess.STDOUT,
                env={**_env(), "FEDBOOST_AMQP_URL": rabbit_url}, cwd=root)
            _wait_healthy(fed.base, fed.service, log)
            yield fed
        finally:
            procs = [p for p in (fed.service, *fed.workers.values()) if p is not None]
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
            delete_party_queues(rabbit_url, names)


def _ids() -> list[str]:
    with open(DATA / "breast_hetero_guest.csv", newline="") as handle:
        return [row["id"] for row in csv.DictReader(handle)]


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


def test_scores_by_id_equal_fedboost_predict_over_rabbitmq(federation: Federation) -> None:
    expected = _predicted(federation)
    assert len(expected) == 569  # every row, scored by the three running workers
    ids = _ids()
    with httpx.Client(base_url=federation.base, timeout=30) as client:
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
def test_bad_requests_get_a_4xx_with_one_line(federation: Federation, body: object,
                                              status: int, detail: str) -> None:
    reply = httpx.post(f"{federation.base}/v1/score", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    assert detail in reply.json()["detail"]
    assert "\n" not in reply.json()["detail"]


def test_unknown_ids_get_a_404_naming_them_and_other_requests_go_on(
        federation: Federation) -> None:
    ids = _ids()

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=federation.base, timeout=30) as client:
            return await asyncio.gather(
                client.post("/v1/score", json={"ids": [ids[0], "no-such", ids[1], "nor-this"]}),
                client.post("/v1/score", json={"ids": ids[10:12]}))

    unknown, fine = asyncio.run(both())
    assert unknown.status_code == 404, unknown.text
    body = unknown.json()
    assert body["unknown"] == ["no-such", "nor-this"]
    assert body["detail"] == "2 of 4 ids cannot be scored: 'no-such', 'nor-this'"
    assert fine.status_code == 200 and len(fine.json()["scores"]) == 2


def test_concurrent_single_row_requests_are_micro_batched(federation: Federation) -> None:
    ids = _ids()[:60]
    expected = httpx.post(f"{federation.base}/v1/score", json={"ids": ids}, timeout=30).json()
    before = httpx.get(f"{federation.base}/healthz").json()

    async def singles() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=federation.base, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/score", json={"ids": [i]})
                                          for i in ids))

    replies = asyncio.run(singles())
    after = httpx.get(f"{federation.base}/healthz").json()
    assert all(r.status_code == 200 for r in replies)
    assert [r.json()["scores"][0] for r in replies] == expected["scores"]
    rounds = after["rounds"] - before["rounds"]
    assert after["requests"] - before["requests"] == 60
    assert rounds < 60, rounds  # fewer rounds than requests: batched
    assert max(r.json()["rows_in_round"] for r in replies) > 1


def test_a_session_that_cannot_open_stops_serve_model_with_one_line(
        federation: Federation, capsys: pytest.CaptureFixture[str]) -> None:
    bureau = federation.name("bureau")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FEDBOOST_AMQP_URL", federation.url)
        code = main(["serve-model", str(federation.runs), "--port", str(_free_port()),
                     "--dataset", f"{bureau}=nowhere", "--timeout", "10"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"fedboost: error: party {bureau} has no data set 'nowhere' in its worker "
                       f"file (it has: applicants)")
    assert httpx.get(f"{federation.base}/healthz").status_code == 200  # the other goes on


def test_a_passive_worker_that_is_down_gets_a_503_naming_it(federation: Federation) -> None:
    ids = _ids()[:3]
    telco = federation.workers["telco"]
    telco.send_signal(signal.SIGKILL)
    telco.wait(timeout=30)
    started = time.monotonic()
    reply = httpx.post(f"{federation.base}/v1/score", json={"ids": ids}, timeout=60)
    waited = time.monotonic() - started
    assert reply.status_code == 503, reply.text
    assert reply.json()["detail"].startswith(f"party {federation.name('telco')}: no answer")
    assert waited < ROUND_TIMEOUT + 2.0
    # it comes back: the service opens its session again and scores
    federation.start_worker("telco")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        reply = httpx.post(f"{federation.base}/v1/score", json={"ids": ids}, timeout=60)
        if reply.status_code == 200:
            break
        time.sleep(0.5)
    assert reply.status_code == 200, reply.text
