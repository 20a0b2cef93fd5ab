"""The deployment files: docker-compose.yml (checked by Debian's docker-compose when it is
installed) and structural checks that always run: every service, health checks, restart
policies, each party mounting only its own data, broker users that match the definitions'
and passwords without defaults, the Prefect API behind basic auth that only the runner holds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedboost.broker import password_env
from flows.config import load_config, load_worker_config
from messages.rabbitmq import DEFAULT_CHUNK_BYTES

REPO = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
PARTIES = {"guest": "worker-guest", "host": "worker-host"}
PREFECT_AUTH = "FEDBOOST_PREFECT_AUTH_STRING"
REQUIRED = {password_env(name) for name in [*PARTIES, "flow"]} | {PREFECT_AUTH}
"""The variables docker compose refuses to start without."""


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="Debian's docker-compose is not installed (apt-get install docker-compose)")
def test_docker_compose_accepts_the_file() -> None:
    secrets = {v: "x" for v in REQUIRED}
    done = subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env={**os.environ, **secrets})
    assert done.returncode == 0, done.stderr
    missing = subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config",
                              "-q"], capture_output=True, text=True, cwd=REPO, timeout=60,
                             env={k: v for k, v in os.environ.items() if k not in REQUIRED})
    assert missing.returncode != 0  # no password has a default


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

    shipped = json.loads((REPO / "deploy" / "definitions.json").read_text())
    users = {u["name"] for u in shipped["users"]}
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
        user, variable = re.match(r"amqps://([^:]+):\$\{(\w+):\?[^}]+\}@", url).groups()  # type: ignore[union-attr]
        # the variable 'fedboost definitions --party NAME' reads the same password from
        assert user == f"fedboost-{party}" and user in users and variable == password_env(party)
        assert SERVICES[service]["command"][:3] == ["worker", "--party", party]
    runner_url = SERVICES["runner"]["environment"]["FEDBOOST_AMQP_URL"]
    assert runner_url.startswith(f"amqps://fedboost-flow:${{{password_env('flow')}:?")
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


def _required(value: str) -> str:
    """The variable of a value that is exactly a required ``${VAR:?message}``."""
    match = re.fullmatch(r"\$\{(\w+):\?[^}]+\}", value)
    assert match, f"{value!r} is not a required variable"
    return match.group(1)


def test_every_secret_is_required_without_a_default() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    secret_vars = set(re.findall(r"\$\{(\w*(?:PASSWORD|AUTH)\w*)", text))
    assert secret_vars == REQUIRED
    for variable in secret_vars:  # each use is ${VAR:?...}: no fallback, no empty default
        assert not re.search(rf"\$\{{{variable}(?!:\?)", text), variable
    assert not re.search(r"dev-secret|:-\w*(?:guest|host|flow)\b", text)


def test_prefect_api_behind_basic_auth_that_only_the_runner_holds() -> None:
    server = SERVICES["prefect-server"]["environment"]
    runner = SERVICES["runner"]["environment"]
    assert _required(server["PREFECT_SERVER_API_AUTH_STRING"]) == PREFECT_AUTH
    assert _required(runner["PREFECT_API_AUTH_STRING"]) == PREFECT_AUTH
    assert runner["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    for service in PARTIES.values():  # party workers never talk to Prefect
        environment = SERVICES[service].get("environment", {})
        assert not [k for k in environment if k.startswith("PREFECT_")], service
        assert "prefect-server" not in SERVICES[service].get("depends_on", {}), service
        assert not any(PREFECT_AUTH in str(v) for v in environment.values()), service


def test_broker_keeps_guest_on_loopback() -> None:
    conf = (REPO / _mounts("rabbitmq")["/etc/rabbitmq/rabbitmq.conf"]).read_text()
    settings = [line for line in conf.splitlines() if line and not line.startswith("#")]
    assert not [line for line in settings if line.startswith("loopback_users")]
