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
        user, password = re.match(r"amqps://([^:]+):\$\{\w+:-([^}]+)\}@", url).groups()  # type: ignore[union-attr]
        assert user == f"fedboost-{party}" and check_password(users[user], password)
        assert SERVICES[service]["command"][:3] == ["worker", "--party", party]
    runner_url = SERVICES["runner"]["environment"]["FEDBOOST_AMQP_URL"]
    assert runner_url.startswith("amqps://fedboost-flow:")
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


def _conf(key: str) -> str:
    conf = (REPO / _mounts("rabbitmq")["/etc/rabbitmq/rabbitmq.conf"]).read_text()
    found = re.findall(rf"^{re.escape(key)} = (.+)$", conf, re.M)
    assert len(found) == 1, key
    return str(found[0])


def test_the_broker_speaks_only_tls_and_requires_client_certificates() -> None:
    assert _conf("listeners.tcp") == "none" and _conf("listeners.ssl.default") == "5671"
    assert _conf("ssl_options.verify") == "verify_peer"
    assert _conf("ssl_options.fail_if_no_peer_cert") == "true"
    mounts = _mounts("rabbitmq")
    for key, file in (("cacertfile", "ca.pem"), ("certfile", "server.pem"),
                      ("keyfile", "server.key")):
        assert mounts[_conf(f"ssl_options.{key}")] == f"./deploy/tls/{file}"
    assert all(v.endswith(":ro") for v in SERVICES["rabbitmq"]["volumes"] if "/tls/" in v)


def test_each_party_presents_only_its_own_client_certificate_over_amqps() -> None:
    identities = {**{service: party for party, service in PARTIES.items()}, "runner": "flow"}
    for service, identity in identities.items():
        volumes = [v for v in SERVICES[service]["volumes"] if ":/tls/" in v]
        assert volumes and all(v.endswith(":ro") for v in volumes), service
        assert {c: h for c, h in _mounts(service).items() if c.startswith("/tls/")} == {
            "/tls/ca.pem": "./deploy/tls/ca.pem", f"/tls/{identity}.pem":
            f"./deploy/tls/{identity}.pem", f"/tls/{identity}.key": f"./deploy/tls/{identity}.key"}
        url = SERVICES[service]["environment"]["FEDBOOST_AMQP_URL"]
        assert url.startswith("amqps://") and "@rabbitmq:5671/" in url, service
        if service == "runner":
            transport = load_config(REPO / _mounts(service)["/config/job.yaml"]).transport
        else:
            transport = load_worker_config(REPO / _mounts(service)[f"/config/{identity}.yaml"],
                                           identity).transport
        assert transport.url is not None and transport.url.startswith("amqps://rabbitmq:5671/")
        assert transport.tls is not None and transport.tls.server_hostname is None  # "rabbitmq"
        assert (str(transport.tls.ca_file), str(transport.tls.cert_file),
                str(transport.tls.key_file)) == ("/tls/ca.pem", f"/tls/{identity}.pem",
                                                 f"/tls/{identity}.key")


def test_make_certs_gives_a_broker_certificate_for_rabbitmq_and_client_certificates(
        tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        from tests.scenarios import unavailable
        unavailable("openssl is not installed (apt-get install openssl)")
    subprocess.run(["sh", str(REPO / "deploy" / "make-certs.sh"), "-o", str(tmp_path), "guest",
                    "host", "flow"], check=True, capture_output=True, timeout=60)

    def verify(purpose: str, name: str) -> bool:
        return subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"),
                               "-purpose", purpose, str(tmp_path / f"{name}.pem")],
                              capture_output=True, timeout=30).returncode == 0

    assert verify("sslserver", "server") and not verify("sslclient", "server")
    names = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                            str(tmp_path / "server.pem")], capture_output=True, text=True,
                           timeout=30).stdout
    assert "DNS:rabbitmq" in names  # the name compose's workers expect
    for party in ("guest", "host", "flow"):
        assert verify("sslclient", party)
        assert not verify("sslserver", party)  # a party cannot pose as the broker
        assert (tmp_path / f"{party}.key").stat().st_mode & 0o077 == 0
