"""Over the real broker: each party's worker is its own OS process, started through the CLI,
serving several jobs; the flow reaches them through RabbitMQ, from the test process or from a
Prefect deployment triggered through a real Prefect server's API."""

from __future__ import annotations

import json
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

from fedboost.embedded import train_embedded
from flows.config import JobConfig
from flows.secureboost import vertical_secureboost
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair
from tests.scenarios import REPO, create_flow_run, served_deployment, wait_until

pytestmark = pytest.mark.usefixtures("prefect_harness")
FEDBOOST = [sys.executable, "-m", "fedboost.cli"]


@dataclass
class Federation:
    job_file: Path
    models: Path
    config: JobConfig
    logs: dict[str, Path]


def _job(tag: str, url: str, keys: Path, **params: int) -> dict:
    """default_credit with this run's own party names (own queues), fewer trees, 1024-bit."""
    raw = yaml.safe_load((REPO / "configs" / "default_credit.yaml").read_text())
    guest, host = raw["parties"]["guest"], raw["parties"]["host"]
    for party in (guest, host):
        party["data"] = str((REPO / "configs" / party["data"]).resolve())
        party["policy"] = {"min_key_bits": 1024}  # the workers' own policy allows test keys
    raw["parties"] = {f"guest{tag}": guest, f"host{tag}": host}
    raw["job"] = f"dc-{tag}"
    raw["params"].update(n_trees=2, **params)
    raw["crypto"]["key_bits"] = 1024
    raw["transport"] = {"kind": "rabbitmq", "url": url}
    raw["signing"] = {"key_dir": str(keys)}
    for name in (*raw["parties"], "flow"):
        write_key_pair(keys, name)
    return raw


@pytest.fixture(scope="module")
def federation(rabbit_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """guest: one process; host: two processes (one coordinates, one takes shards)."""
    tag = uuid.uuid4().hex[:6]
    root = tmp_path_factory.mktemp("federation")
    job_file = root / "job.yaml"
    job_file.write_text(yaml.safe_dump(_job(tag, rabbit_url, root / "keys")))
    models = root / "models"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    procs, logs = [], {}
    for party, processes in ((f"guest{tag}", 1), (f"host{tag}", 2)):
        logs[party] = root / f"{party}.log"
        procs.append(subprocess.Popen(
            [*FEDBOOST, "worker", "--party", party, "--config", str(job_file), "--models",
             str(models), "--processes", str(processes), "--health-file", str(root / party)],
            stdout=logs[party].open("w"), stderr=subprocess.STDOUT, env=env, cwd=root))
    from flows.config import load_config

    try:
        yield Federation(job_file, models, load_config(job_file), logs)
        for party in logs:  # the workers kept their health files fresh while serving
            assert time.time() - (root / party).stat().st_mtime < 30, party
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in procs]
        delete_party_queues(rabbit_url, [f"guest{tag}", f"host{tag}"])
        assert codes == [0, 0], f"workers did not stop cleanly on SIGTERM: {codes}"


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
