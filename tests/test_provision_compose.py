"""Each organisation's compose file from its start kit (issue 38, item 7): ``fedboost provision
finish`` writes ``compose/compose.yml`` for the organisation's own broker and workers, and at
the lender the Prefect server on PostgreSQL and the runner. Debian's docker-compose accepts
every kit's file (CI installs it); every file a service mounts is in the kit; no password is in
a compose file or any container's environment; the broker's configuration names the TLS files
where its shovels' URIs look for them; the lender's job file is a valid job over every
organisation's parties."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.config import JobConfig, load_config
from tests.test_provision import BANK, PARTIES, Federation, provisioned

ADDRESSES = {org: f"broker.{org}.example" for org in PARTIES}


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    return provisioned(tmp_path_factory.mktemp("provision-compose"), ADDRESSES)


def resolved(fed: Federation, org: str) -> dict[str, Any]:
    """The organisation's compose file as Debian's docker-compose resolves it (its variables'
    defaults, paths from the file's folder), with no password in the environment."""
    env = {k: v for k, v in os.environ.items() if not re.search(r"PASSWORD|AUTH|^FEDBOOST_", k)}
    done = subprocess.run(["docker-compose", "-f", "compose.yml", "-p", f"fedboost-{org}",
                           "config"], cwd=fed.kit(org) / "compose", capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@pytest.mark.skipif(shutil.which("docker-compose") is None and not os.environ.get("CI"),
                    reason="Debian's docker-compose is not installed (apt-get install docker-compose)")
def test_every_kits_compose_file_is_accepted_and_mounts_only_its_kit(three: Federation) -> None:
    for org, parties in PARTIES.items():
        kit = three.kit(org).resolve()
        services = resolved(three, org)["services"]
        expected = {"broker", *(f"worker-{p}" for p in parties)}
        if org == BANK:
            expected |= {"postgres", "prefect-server", "runner"}
        assert set(services) == expected, org
        for name, service in services.items():
            assert service["healthcheck"]["test"][0] == "CMD", (org, name)
            assert service["restart"] == "unless-stopped", (org, name)
            for volume in service.get("volumes", []):
                source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
                if source.startswith("/"):  # a bind mount (else a named volume)
                    assert Path(source).exists() and Path(source).is_relative_to(kit), \
                        (org, name, source)
        published = {name: service["ports"] for name, service in services.items()
                     if service.get("ports")}
        assert set(published) == ({"broker", "prefect-server"} if org == BANK else {"broker"})
        for party in parties:
            env = services[f"worker-{party}"]["environment"]
            assert env["FEDBOOST_AMQP_URL"] == f"amqp://fedboost-{party}@broker:5672/%2F"


def test_no_password_in_a_compose_file_or_an_environment(three: Federation) -> None:
    for org in PARTIES:
        kit = three.kit(org)
        compose = (kit / "compose" / "compose.yml").read_text()
        config = (kit / "compose" / "rabbitmq.conf").read_text()
        for password in three.passwords(org).values():
            secret = password.split(":")[-1]  # prefect-auth is user:password
            assert secret not in compose and secret not in config, org
        for service in yaml.safe_load(compose)["services"].values():
            for key, value in service.get("environment", {}).items():
                assert "PASSWORD" not in key or key.endswith("_FILE"), (org, key)
                assert "@" not in value or ":" not in value.split("@")[0].split("//")[-1]


def test_the_brokers_tls_files_are_where_its_shovels_look(three: Federation) -> None:
    for org in PARTIES:
        kit = three.kit(org)
        definitions = json.loads((kit / "broker" / "definitions.json").read_text())
        config = (kit / "compose" / "rabbitmq.conf").read_text()
        compose = yaml.safe_load((kit / "compose" / "compose.yml").read_text())
        broker = compose["services"]["broker"]
        tls = f"/etc/fedboost/tls/{org}"
        assert tls in broker["tmpfs"]
        assert f"ssl_options.certfile = {tls}/server.pem" in config
        assert "listeners.ssl.1 = 5671" in config and "listeners.tcp.default = 5672" in config
        shovels = [p["value"]["dest-uri"] for p in definitions["parameters"]
                   if p["component"] == "shovel"]
        assert shovels and all(f"certfile={tls.replace('/', '%2F')}%2Flink.pem" in uri
                               for uri in shovels)
        # what the broker's entry point copies is what the kit holds
        held = {p.name for p in (kit / "broker" / "tls").iterdir() if p.is_file()}
        assert {"ca.pem", "server.pem", "server.key", "link.pem", "link.key"} <= held
        assert (kit / "compose" / "enabled_plugins").read_text() == "[rabbitmq_shovel].\n"


def test_the_lenders_job_is_valid_over_every_organisations_parties(three: Federation) -> None:
    job = load_config(three.kit(BANK) / "jobs" / "job.yaml")
    assert isinstance(job, JobConfig)
    assert job.active == PARTIES[BANK][0]
    assert sorted(job.passives) == sorted(p for org, ps in PARTIES.items() if org != BANK
                                          for p in ps)
    assert job.transport.password_file == Path("/passwords/fedboost-flow")
    assert all(not (three.kit(org) / "jobs").exists() for org in PARTIES if org != BANK)
