"""Over the real broker: each party's worker is its own OS process, started through the CLI,
serving several jobs; the flow reaches them through RabbitMQ, from the test process or from a
Prefect deployment triggered through a real Prefect server's API."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fedboost.embedded import train_embedded
from flows.config import JobConfig
from flows.secureboost import vertical_secureboost
from tests.cli_federation import CliFederation
from tests.scenarios import REPO, create_flow_run, served_deployment, wait_until

pytestmark = pytest.mark.usefixtures("prefect_harness")


@dataclass
class Federation:
    job_file: Path
    models: Path
    config: JobConfig
    logs: dict[str, Path]


@pytest.fixture(scope="module")
def federation(rabbit_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """guest: one process; host: two processes (one coordinates, one takes shards):
    default_credit with this run's own party names (own queues), 2 trees, 1024-bit."""
    fed = CliFederation(tmp_path_factory.mktemp("federation"), rabbit_url, prefix="dc",
                        params={"n_trees": 2}, step_timeout=None)
    for party, processes in ((fed.guest, 1), (fed.host, 2)):
        fed.start(party, processes=processes, args=["--health-file", str(fed.root / party)])
    from flows.config import load_config

    try:
        yield Federation(fed.job_file, fed.models, load_config(fed.job_file),
                         {party: logs[0] for party, logs in fed.logs.items()})
        for party in fed.logs:  # the workers kept their health files fresh while serving
            assert time.time() - (fed.root / party).stat().st_mtime < 30, party
    finally:
        codes = fed.stop()
        fed.delete_queues()
        assert codes == [0, 0], f"workers did not stop cleanly on SIGTERM: {codes}"


# 81 s in CI: make test-all; CI keeps RabbitMQ runs equal to embedded ones over TLS
# (tests/test_broker_tls.py), horizontal (test_rabbitmq_horizontal.py) and the fault drills
@pytest.mark.heavy
def test_rabbitmq_training_equals_the_in_memory_run(federation: Federation, tmp_path: Path) -> None:
    config = federation.config
    result = vertical_secureboost(config)
    memory = config.model_copy(update={"transport": config.transport.model_copy(
        update={"kind": "memory"})})
    expected = train_embedded(memory, tmp_path)
    assert result["train_auc"] == expected["train_auc"]
    guest, host = config.active, config.passives[0]
    got = federation.models / config.job
    assert (got / guest / "model.json").read_bytes() == (tmp_path / guest / "model.json").read_bytes()
    records = [json.loads((d / host / "lookup.json").read_text())["records"]
               for d in (got, tmp_path)]
    assert records[0] == records[1]
    # the host's second process took histogram shards: the party scaled out over the broker
    shard_lines = [line for line in federation.logs[host].read_text().splitlines()
                   if "step=HISTOGRAM_SHARD" in line]
    assert shard_lines, "no histogram shard reached the host's helper process"
    assert all(f"job={config.job}" in line for line in shard_lines)


# 91 s in CI: make test-all; CI keeps the served deployments' check
# (tests/flows/test_no_password_at_rest.py), make compose-test runs deployments for real
@pytest.mark.heavy
def test_deployment_run_through_the_prefect_api(federation: Federation, prefect_server: str,
                                                tmp_path: Path) -> None:
    serve_log = tmp_path / "serve.log"
    with served_deployment("test", federation.job_file, prefect_server, REPO,
                           serve_log) as deployment:
        # one runner serves every protocol (registered one after the other); the others have
        # no default job here
        for protocol in ("horizontal", "simfl"):
            url = f"{prefect_server}/deployments/name/{protocol}/test"
            wait_until(lambda: httpx.get(url, timeout=5).status_code == 200, 60,
                       f"the {protocol} deployment")
            assert httpx.get(url, timeout=5).json()["parameters"] == {}
        parameters = deployment["parameters"]
        parameters["config"]["job"] = f"{federation.config.job}-deployed"
        parameters["config"]["params"]["n_trees"] = 1
        run_id = create_flow_run(prefect_server, deployment["id"], parameters)
        state: dict = {}

        def finished() -> bool:
            state.update(httpx.get(f"{prefect_server}/flow_runs/{run_id}", timeout=5).json()["state"])
            return state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

        wait_until(finished, 300, "the deployed flow run")
        assert state["type"] == "COMPLETED", f"{state} / {serve_log.read_text()[-3000:]}"
        artifacts = httpx.post(f"{prefect_server}/artifacts/filter", timeout=5, json={
            "artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()
        assert {"table", "progress", "markdown"} <= {a["type"] for a in artifacts}
        charts = [a["data"] for a in artifacts if a["type"] == "markdown"]
        assert "data:image/svg+xml;base64," in charts[0]  # the learning curves, inline
        job = f"{federation.config.job}-deployed"
        assert (federation.models / job / federation.config.active / "model.json").is_file()
