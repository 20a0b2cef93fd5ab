"""The deployment files: docker-compose.yml (checked by Debian's docker-compose when it is
installed) and structural checks that always run: every service, health checks, restart
policies, each party mounting only its own data, and credentials that match the broker's."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedboost.broker import check_password
from flows.config import load_config, load_worker_config
from messages.rabbitmq import DEFAULT_CHUNK_BYTES

REPO = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
PARTIES = {"guest": "worker-guest", "host": "worker-host"}


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="Debian's docker-compose is not installed (apt-get install docker-compose)")
def test_docker_compose_accepts_the_file() -> None:
    done = subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_federation_has_every_service_with_health_and_restart() -> None:
    assert set(SERVICES) == {"rabbitmq", "prefect-server", "worker-guest", "worker-host", "runner"}
    for name, service in SERVICES.items():
        assert service.get("restart") == "unless-stopped", name
        health = service.get("healthcheck", {}).get("test")
        assert health and health[0] == "CMD", f"{name} has no health check"
    for name in ("worker-guest", "worker-host", "runner"):
        assert "rabbitmq" in SERVICES[name]["depends_on"], name
    assert SERVICES["runner"]["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    assert SERVICES["runner"]["command"][0] == "serve"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["fedboost"]' in dockerfile and "USER fedboost" in dockerfile


def _mounts(service: str) -> dict[str, str]:
    """container path -> host path (defaults of ${VAR:-default} substituted)."""
    out = {}
    for volume in SERVICES[service].get("volumes", []):
        host, container = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", volume).split(":")[:2]
        out[container] = host
    return out


def test_broker_loads_definitions_and_caps_message_size() -> None:
    mounts = _mounts("rabbitmq")
    conf = (REPO / mounts["/etc/rabbitmq/rabbitmq.conf"]).read_text()
    assert "load_definitions = /etc/rabbitmq/definitions.json" in conf
    assert (REPO / mounts["/etc/rabbitmq/definitions.json"]).is_file()
    size = int(re.search(r"^max_message_size = (\d+)$", conf, re.M).group(1))  # type: ignore[union-attr]
    assert DEFAULT_CHUNK_BYTES < size <= 16 * 1024 * 1024  # chunks fit RabbitMQ 4's cap


def test_each_party_mounts_only_its_own_data_and_uses_its_own_user() -> None:
    import json

    users = {u["name"]: u["password_hash"]
             for u in json.loads((REPO / "deploy" / "definitions.json").read_text())["users"]}
    for party, service in PARTIES.items():
        mounts = _mounts(service)
        config = load_worker_config(REPO / mounts[f"/config/{party}.yaml"], party)
        assert str(config.data) == f"/data/{party}.csv"
        data_mounts = [host for container, host in mounts.items() if container.startswith("/data")]
        assert len(data_mounts) == 1 and f"_{party}.csv" in data_mounts[0]
        assert (REPO / data_mounts[0]).is_file(), data_mounts[0]
        others = [p for p in PARTIES if p != party]
        assert not any(f"_{o}.csv" in host for o in others for host in mounts.values())
        url = SERVICES[service]["environment"]["FEDBOOST_AMQP_URL"]
        user, password = re.match(r"amqp://([^:]+):\$\{\w+:-([^}]+)\}@", url).groups()  # type: ignore[union-attr]
        assert user == f"fedboost-{party}" and check_password(users[user], password)
        assert SERVICES[service]["command"][:3] == ["worker", "--party", party]
    runner_url = SERVICES["runner"]["environment"]["FEDBOOST_AMQP_URL"]
    assert runner_url.startswith("amqp://fedboost-flow:")
    assert not any(c.startswith("/data") for c in _mounts("runner"))
    job = load_config(REPO / _mounts("runner")["/config/job.yaml"])
    assert job.transport.kind == "rabbitmq" and set(job.parties) == set(PARTIES)


def test_each_service_mounts_only_its_own_signing_key() -> None:
    identities = {**{service: party for party, service in PARTIES.items()}, "runner": "flow"}
    for service, identity in identities.items():
        keys = {c: h for c, h in _mounts(service).items() if c.startswith("/keys/")}
        private = [c for c in keys if c.endswith(".key")]
        assert private == [f"/keys/{identity}.key"], (service, private)
        assert keys[private[0]] == f"./deploy/keys/{identity}.key"
        assert {c for c in keys if c.endswith(".pub")} == \
            {f"/keys/{name}.pub" for name in [*PARTIES, "flow"]}
    for party, service in PARTIES.items():
        config = load_worker_config(REPO / _mounts(service)[f"/config/{party}.yaml"], party)
        assert str(config.signing.key_dir) == "/keys"
    job = load_config(REPO / _mounts("runner")["/config/job.yaml"])
    assert job.signing is not None and str(job.signing.key_dir) == "/keys"
