"""The deployment files: docker-compose.yml (checked by Debian's docker-compose when it is
installed, with and without the profiles) and structural checks that always run: every service,
health checks, restart policies, one image built once, capabilities dropped and read-only
roots, each party mounting only its own data, broker users that match the definitions' and
passwords only as mounted files (never in an environment), the Prefect API behind basic auth
that only the runner holds, the scoring service, and every worker and job file under deploy/
valid and consistent with the others (the data sets a job names, the roles and protocols it
asks)."""

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

from fedboost.broker import definitions, user_of
from flows.config import (AnyJobConfig, ForestJobConfig, HorizontalJobConfig, JobConfig,
                          SimflJobConfig, load_config)
from flows.worker_config import WorkerConfig, load_worker_config
from messages.rabbitmq import DEFAULT_CHUNK_BYTES

REPO = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
PARTIES = {"guest": "worker-guest", "host": "worker-host", "host_1": "worker-host1",
           "host_2": "worker-host2", "aggregator": "worker-aggregator"}
"""Every party of the compose file and its worker service."""
PROFILE = "horizontal"
PROFILED = {"worker-host1", "worker-host2", "worker-aggregator"}
"""The services only 'docker compose --profile horizontal' starts."""
SCORING = "scoring"
"""The scoring service, of the profile of that name."""
JOBS = {"vertical_secureboost": "/config/job.yaml", "horizontal": "/config/horizontal-job.yaml",
        "vertical_random_forest": "/config/forest-job.yaml", "simfl": "/config/simfl-job.yaml"}
"""The runner's job file per protocol (each the default parameter of its deployment)."""
IDENTITIES = {**{service: party for party, service in PARTIES.items()}, "runner": "flow"}
"""Each service that holds a private key, and whose key it is."""
PREFECT_AUTH_FILE = "/passwords/prefect-auth"
"""Where the entry point finds Prefect's user:password (FEDBOOST_PREFECT_AUTH_FILE)."""
SECRETS_CAPS = {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID"}
"""The capabilities an entry point that copies secrets and changes user needs, and no more."""


def _docker_compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60, env=env)


@pytest.mark.skipif(shutil.which("docker-compose") is None and not os.environ.get("CI"),
                    reason="Debian's docker-compose is not installed (apt-get install docker-compose)")
def test_docker_compose_accepts_the_file() -> None:
    # no password variable is needed: passwords are files
    env = {k: v for k, v in os.environ.items()
           if not re.search(r"PASSWORD|AUTH_STRING|^FEDBOOST_PREFECT_PORT$", k)}
    for profile in ([], ["--profile", PROFILE], ["--profile", PROFILE, "--profile", SCORING]):
        done = _docker_compose(*profile, "config", "-q", env=env)
        assert done.returncode == 0, (profile, done.stderr)
    # compose's own resolution: ${VAR:-default} and paths relative to the project folder
    resolved = yaml.safe_load(_docker_compose("--profile", PROFILE, "--profile", SCORING,
                                              "config", env=env).stdout)
    assert {n for n, s in resolved["services"].items() if s.get("profiles")} == \
        PROFILED | {SCORING}
    assert all(resolved["services"][n]["profiles"] == [PROFILE] for n in PROFILED)
    assert _published(resolved["services"]["prefect-server"]) == "127.0.0.1:4200:4200"
    other = _docker_compose("config", env={**env, "FEDBOOST_PREFECT_PORT": "14200"})
    server = yaml.safe_load(other.stdout)["services"]["prefect-server"]
    assert _published(server) == "127.0.0.1:14200:4200"
    assert server["environment"]["PREFECT_UI_URL"] == "http://localhost:14200"
    assert server["environment"]["PREFECT_UI_API_URL"] == "http://localhost:14200/api"
    # every party's data files resolve to shipped files (a check a later edit had left as
    # dead lines after _published's return; ruff's F821 found it)
    for party, service in PARTIES.items():
        data = [v.split(":")[0] for v in resolved["services"][service]["volumes"]
                if ":/data/" in v]
        assert all(Path(d).is_file() for d in data), (party, data)


def _published(service: dict[str, Any]) -> str:
    """A resolved service's one published port as HOST_IP:PUBLISHED:TARGET (docker-compose
    1.29 writes that string, compose v2 a mapping)."""
    (port,) = service["ports"]
    if isinstance(port, str):
        return port.removesuffix("/tcp")
    return f"{port['host_ip']}:{port['published']}:{port['target']}"


def test_the_federation_has_every_service_with_health_and_restart() -> None:
    assert set(SERVICES) == {"rabbitmq", "prefect-server", "runner", SCORING, *PARTIES.values()}
    for name, service in SERVICES.items():
        assert service.get("restart") == "unless-stopped", name
        health = service.get("healthcheck", {}).get("test")
        assert health and health[0] == "CMD", f"{name} has no health check"
        # podman 4 joins a health check's words with spaces and splits them again
        assert not [word for word in health if " " in word], name
        assert service.get("profiles", []) == ([PROFILE] if name in PROFILED else [SCORING]
                                               if name == SCORING else []), name
        # compose names a container SERVICE-1 (SERVICE_1 before v2): no service is named so
        assert not re.search(r"[-_]\d+$", name), name
    assert SERVICES["rabbitmq"]["stop_grace_period"] == "60s"  # a stop lets it close queues
    for name in (*PARTIES.values(), "runner"):
        assert SERVICES[name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy", name
    for name in PARTIES.values():  # SIGTERM: a worker finishes the message in hand
        assert SERVICES[name]["stop_grace_period"] == "60s", name
    assert SERVICES["runner"]["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    # compose refuses to start a service that depends on one whose profile is off
    assert not PROFILED & set(SERVICES["runner"]["depends_on"])
    assert SERVICES["runner"]["command"][0] == "serve"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["fedboost-entrypoint"]' in dockerfile and "USER fedboost" in dockerfile
    for name in IDENTITIES:  # a worker's crash ends the container, which is restarted
        assert SERVICES[name]["init"] is True, name


def _mounts(service: str) -> dict[str, str]:
    """container path -> host path (defaults of ${VAR:-default} substituted)."""
    out = {}
    for volume in SERVICES[service].get("volumes", []):
        host, container = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", volume).split(":")[:2]
        out[container] = host
    return out


def _worker_file(party: str) -> WorkerConfig:
    """The worker file the party's service mounts."""
    return load_worker_config(REPO / _mounts(PARTIES[party])[f"/config/{party}.yaml"], party)


def _runner_jobs() -> dict[str, AnyJobConfig]:
    """The job file of each protocol the runner serves."""
    mounts = _mounts("runner")
    return {protocol: load_config(REPO / mounts[path]) for protocol, path in JOBS.items()}


def _header(party: str, file: Path) -> list[str]:
    """The columns of a data file as the party's service mounts it."""
    with (REPO / _mounts(PARTIES[party])[str(file)]).open() as f:
        return f.readline().strip().split(",")


def test_broker_loads_definitions_and_caps_message_size() -> None:
    mounts = _mounts("rabbitmq")
    conf = (REPO / mounts["/etc/rabbitmq/rabbitmq.conf"]).read_text()
    assert "load_definitions = /etc/rabbitmq/definitions.json" in conf
    assert (REPO / mounts["/etc/rabbitmq/definitions.json"]).is_file()
    size = int(re.search(r"^max_message_size = (\d+)$", conf, re.M).group(1))  # type: ignore[union-attr]
    assert DEFAULT_CHUNK_BYTES < size <= 16 * 1024 * 1024  # chunks fit RabbitMQ 4's cap


def test_the_broker_users_are_fedboost_definitions_of_every_party() -> None:
    shipped = json.loads((REPO / _mounts("rabbitmq")["/etc/rabbitmq/definitions.json"]).read_text())
    fresh = definitions({party: "x" for party in PARTIES}, "x")
    # 'fedboost definitions --party guest --party host ... --party aggregator', minus the hashes
    assert shipped == {**fresh, "users": [{**u, "password_hash": ""} for u in fresh["users"]]}


def test_each_party_mounts_only_its_own_data_and_uses_its_own_user() -> None:
    shipped = json.loads((REPO / "deploy" / "definitions.json").read_text())
    users = {u["name"] for u in shipped["users"]}
    for party, service in PARTIES.items():
        mounts = _mounts(service)
        config = _worker_file(party)
        data_mounts = {c: h for c, h in mounts.items() if c.startswith("/data")}
        # every data set of its worker file is mounted, and no other file
        assert {str(file) for file in config.data_files().values()} == set(data_mounts), party
        for host in data_mounts.values():
            assert host.endswith(f"_{party}.csv") and (REPO / host).is_file(), (party, host)
        others = [p for p in PARTIES if p != party]
        assert not any(host.endswith(f"_{o}.csv") for o in others for host in mounts.values())
        environment = SERVICES[service]["environment"]
        user = re.fullmatch(r"amqps://([^:@/]+)@rabbitmq:5671/%2F",  # type: ignore[union-attr]
                            environment["FEDBOOST_AMQP_URL"]).group(1)
        assert user == user_of(party) and user in users
        # its password: the file 'fedboost definitions --party NAME=@FILE' hashed, mounted for
        # the entry point to hand to fedboost
        assert environment["FEDBOOST_AMQP_PASSWORD_FILE"] == "/passwords/amqp"
        assert mounts["/secrets/passwords/amqp"] == f"./deploy/passwords/{party}"
        assert SERVICES[service]["command"][:5] == ["worker", "--party", party, "--config",
                                                    f"/config/{party}.yaml"]
        assert mounts["/models"] == f"{party.replace('_', '')}-models"  # a volume of its own
    assert not _worker_file("aggregator").data_files()  # the aggregator holds no data
    assert SERVICES["runner"]["environment"]["FEDBOOST_AMQP_URL"] == \
        "amqps://fedboost-flow@rabbitmq:5671/%2F"
    assert _mounts("runner")["/secrets/passwords/amqp"] == "./deploy/passwords/flow"
    assert not any(c.startswith("/data") for c in _mounts("runner"))


def test_the_runner_serves_one_deployment_per_protocol() -> None:
    command = SERVICES["runner"]["command"]
    assert command[:3] == ["serve", "--name", "default-credit"]  # FLOW/default-credit
    assert [command[i + 1] for i, arg in enumerate(command) if arg == "--config"] == \
        list(JOBS.values())
    for protocol, job in _runner_jobs().items():
        assert job.protocol == protocol and job.transport.kind == "rabbitmq", protocol
        assert all(party.data is None for party in job.parties.values())  # no paths sent
    assert isinstance(_runner_jobs()["vertical_secureboost"], JobConfig)
    assert isinstance(_runner_jobs()["horizontal"], HorizontalJobConfig)
    assert isinstance(_runner_jobs()["vertical_random_forest"], ForestJobConfig)
    assert isinstance(_runner_jobs()["simfl"], SimflJobConfig)


def test_a_silent_party_fails_a_shipped_job_within_minutes() -> None:
    # a worker stopped by hand ('docker kill') is not restarted under any policy: the run names
    # it after step_timeout rather than waiting the default hour
    for protocol, job in _runner_jobs().items():
        assert job.transport.step_timeout <= 600, protocol
        for party in job.parties:
            assert _worker_file(party).max_message_age > job.transport.step_timeout


def test_each_job_asks_only_what_its_parties_workers_serve() -> None:
    jobs = _runner_jobs()
    for party in PARTIES:  # a party opts into exactly the protocols of the jobs naming it
        assert set(_worker_file(party).policy.protocols) == \
            {protocol for protocol, job in jobs.items() if party in job.parties}, party
    for protocol, job in jobs.items():
        for name, entry in job.parties.items():
            worker = _worker_file(name)
            assert worker.role in (None, entry.role), (protocol, name)
            if entry.role == "aggregator":
                continue
            name_of_set = entry.dataset or "default"
            assert name_of_set in worker.data_files(), (protocol, name, name_of_set)
            data = worker.datasets.get(name_of_set) or worker
            assert (data.id, data.label) == (entry.id, entry.label), (protocol, name)
            columns = _header(name, worker.data_files()[name_of_set])
            assert entry.id in columns and (entry.label is None or entry.label in columns)
    vertical = jobs["vertical_secureboost"]
    for protocol in ("horizontal", "simfl"):
        rows = jobs[protocol]
        assert isinstance(rows, HorizontalJobConfig | SimflJobConfig)
        headers = {tuple(_header(m, _worker_file(m).data_files()[rows.parties[m].dataset or
                                                             "default"]))
                   for m in rows.members}
        assert len(headers) == 1, protocol  # members hold the same columns
        # the profile starts every party of the row-partitioned jobs that the vertical one lacks
        assert {PARTIES[p] for p in rows.parties if p not in vertical.parties} == PROFILED
    assert set(jobs["vertical_random_forest"].parties) == set(vertical.parties)
    assert not PROFILED & {PARTIES[p] for p in vertical.parties}


def test_every_worker_and_job_file_under_deploy_is_valid_and_mounted() -> None:
    mounted = {(REPO / host).resolve() for service in SERVICES
               for container, host in _mounts(service).items() if container.startswith("/config/")}
    files = sorted((REPO / "deploy").glob("*.yaml"))
    assert len(files) == len(PARTIES) + len(JOBS)
    for path in files:
        assert path.resolve() in mounted, f"{path.name}: no service mounts it"
        raw = yaml.safe_load(path.read_text())
        if "parties" in raw:  # a job file: its protocol's schema
            assert load_config(path).protocol in JOBS, path.name
        else:
            assert load_worker_config(path, raw["party"]).party == path.stem, path.name


def test_each_service_mounts_only_its_own_signing_key() -> None:
    for service, identity in IDENTITIES.items():
        mounts = _mounts(service)
        private = [c for c in mounts if c.endswith(".key")]
        # under /secrets: deploy/entrypoint.sh copies them to /keys and /tls for fedboost alone
        assert sorted(private) == [f"/secrets/keys/{identity}.key",
                                   f"/secrets/tls/{identity}.key"], (service, private)
        assert mounts[private[0]] == f"./deploy/keys/{identity}.key"
        keys = {c: h for c, h in mounts.items() if c.startswith("/keys/")}
        assert set(keys) == {f"/keys/{name}.pub" for name in [*PARTIES, "flow"]}
    for party in PARTIES:
        assert str(_worker_file(party).signing.key_dir) == "/keys"
    for job in _runner_jobs().values():
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
    for key, file in (("cacertfile", "ca.pem"), ("certfile", "server.pem")):
        assert mounts[_conf(f"ssl_options.{key}")] == f"./deploy/tls/{file}"
    # the private key: mounted under /secrets, copied to the keyfile for the user rabbitmq alone
    assert mounts["/secrets/tls/server.key"] == "./deploy/tls/server.key"
    assert not [c for c in mounts if c.endswith(".key") and not c.startswith("/secrets/")]
    entrypoint = SERVICES["rabbitmq"]["entrypoint"]
    script = (REPO / mounts[f"/usr/local/bin/{entrypoint[0]}"]).read_text()
    assert (f"install -D -o rabbitmq -g rabbitmq -m 0400 /secrets/tls/server.key "
            f"{_conf('ssl_options.keyfile')}\n") in script
    assert "exec docker-entrypoint.sh" in script  # the image's own, which drops to rabbitmq
    assert all(v.endswith(":ro") for v in SERVICES["rabbitmq"]["volumes"] if "/tls/" in v)


def test_each_party_presents_only_its_own_client_certificate_over_amqps() -> None:
    for service, identity in IDENTITIES.items():
        volumes = [v for v in SERVICES[service]["volumes"] if "/tls/" in v]
        assert volumes and all(v.endswith(":ro") for v in volumes), service
        assert {c: h for c, h in _mounts(service).items() if "/tls/" in c} == {
            "/tls/ca.pem": "./deploy/tls/ca.pem", f"/tls/{identity}.pem":
            f"./deploy/tls/{identity}.pem",
            f"/secrets/tls/{identity}.key": f"./deploy/tls/{identity}.key"}
        url = SERVICES[service]["environment"]["FEDBOOST_AMQP_URL"]
        assert url.startswith("amqps://") and "@rabbitmq:5671/" in url, service
        if service == "runner":
            transports = [job.transport for job in _runner_jobs().values()]
        else:
            transports = [_worker_file(identity).transport]
        for transport in transports:
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
    identities = [*PARTIES, "flow"]  # the compose file's header makes these
    subprocess.run(["sh", str(REPO / "deploy" / "make-certs.sh"), "-o", str(tmp_path),
                    *identities], check=True, capture_output=True, timeout=60)

    def verify(purpose: str, name: str) -> bool:
        return subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"),
                               "-purpose", purpose, str(tmp_path / f"{name}.pem")],
                              capture_output=True, timeout=30).returncode == 0

    assert verify("sslserver", "server") and not verify("sslclient", "server")
    names = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                            str(tmp_path / "server.pem")], capture_output=True, text=True,
                           timeout=30).stdout
    assert "DNS:rabbitmq" in names  # the name compose's workers expect
    for party in identities:
        assert verify("sslclient", party)
        assert not verify("sslserver", party)  # a party cannot pose as the broker
        assert (tmp_path / f"{party}.key").stat().st_mode & 0o077 == 0


def test_no_password_reaches_a_container_as_a_variable() -> None:
    """No environment of any service holds a password or interpolates one: 'docker inspect'
    shows a container's environment to whoever may ask the engine (deploy/compose-smoke.sh
    checks every running container's inspect too)."""
    text = (REPO / "docker-compose.yml").read_text()
    assert not re.search(r"\$\{\w*(?:PASSWORD|AUTH|SECRET|KEY)\w*", text)
    for name, service in SERVICES.items():
        environment = service.get("environment", {})
        assert isinstance(environment, dict), name
        for variable, value in environment.items():
            assert not re.search(r"PASSWORD$|AUTH_STRING$|SECRET|TOKEN", variable), (name, variable)
            # a URL names a user, never user:password
            assert not re.search(r"://[^/@:]+:[^/@]+@", str(value)), (name, variable)
        for variable, path in environment.items():  # each password file is mounted
            if variable.endswith("_FILE") and path.startswith("/passwords/"):
                mounts = _mounts(name)
                assert path in mounts or f"/secrets{path}" in mounts, (name, path)
    assert not re.search(r"dev-secret|:-(?:guest|host|flow)\b", text)  # no default password


def test_prefect_api_behind_basic_auth_that_only_the_runner_holds() -> None:
    server = SERVICES["prefect-server"]["environment"]
    runner = SERVICES["runner"]["environment"]
    for name, environment in (("prefect-server", server), ("runner", runner)):
        # the entry point writes the file's user:password into this Prefect profile
        assert environment["FEDBOOST_PREFECT_AUTH_FILE"] == PREFECT_AUTH_FILE, name
        assert environment["PREFECT_PROFILES_PATH"].startswith("/home/fedboost/"), name
        assert _mounts(name)[f"/secrets{PREFECT_AUTH_FILE}"] == "./deploy/passwords/prefect-auth"
        # the links it prints are the address the user opens, not the in-network name
        assert environment["PREFECT_UI_URL"] == \
            "http://${FEDBOOST_PREFECT_UI_HOST:-localhost}:${FEDBOOST_PREFECT_PORT:-4200}", name
    assert runner["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    entrypoint = (REPO / "deploy" / "entrypoint.sh").read_text()
    assert "PREFECT_API_AUTH_STRING = {value}" in entrypoint
    assert "PREFECT_SERVER_API_AUTH_STRING = {value}" in entrypoint
    for service in [*PARTIES.values(), SCORING]:  # party workers never talk to Prefect
        environment = SERVICES[service].get("environment", {})
        assert not [k for k in environment if k.startswith("PREFECT_")], service
        assert "FEDBOOST_PREFECT_AUTH_FILE" not in environment, service
        assert "prefect-server" not in SERVICES[service].get("depends_on", {}), service
        assert not any("prefect-auth" in v for v in SERVICES[service].get("volumes", [])), service


def test_broker_keeps_guest_on_loopback() -> None:
    conf = (REPO / _mounts("rabbitmq")["/etc/rabbitmq/rabbitmq.conf"]).read_text()
    settings = [line for line in conf.splitlines() if line and not line.startswith("#")]
    assert not [line for line in settings if line.startswith("loopback_users")]


def test_keys_are_handed_to_each_service_user_by_its_entry_point() -> None:
    entrypoint = (REPO / "deploy" / "entrypoint.sh").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "COPY deploy/entrypoint.sh /usr/local/bin/fedboost-entrypoint" in dockerfile
    assert 'install -D -o fedboost -g fedboost -m 0400 "$secret" "${secret#/secrets}"' in entrypoint
    assert entrypoint.rstrip().endswith('exec setpriv --reuid=fedboost --regid=fedboost '
                                        '--init-groups --no-new-privs "$@"')
    for name, service in SERVICES.items():
        secrets = [c for c in _mounts(name) if c.startswith("/secrets/")]
        # root only where there is a key or password to hand over
        assert (service.get("user") == "root") == (name in (*IDENTITIES, "prefect-server")), name
        assert bool(secrets) == (name in (*IDENTITIES, "prefect-server", "rabbitmq")), name
        assert "entrypoint" not in service or name in ("rabbitmq", SCORING), name
        assert all(v.endswith(":ro") for v in service.get("volumes", []) if "/secrets/" in v)


def test_no_key_certificate_run_or_model_enters_the_build_context() -> None:
    rules = [line for line in (REPO / ".dockerignore").read_text().splitlines()
             if line and not line.startswith("#")]
    assert rules[0] == "*"  # everything is out, but for what the Dockerfile copies
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "setup.py", "boosting", "crypto", "messages",
                       "workers", "flows", "fedboost", "deploy/entrypoint.sh", "deploy/healthcheck.py"}
    copied = re.findall(r"^COPY (.+) \S+$", (REPO / "Dockerfile").read_text(), re.M)
    assert {c for line in copied for c in line.split()} <= allowed


def test_only_the_prefect_ui_is_published_and_on_loopback() -> None:
    published = {name: service["ports"] for name, service in SERVICES.items()
                 if service.get("ports")}
    # no management page: no user of the definitions may log in to one
    assert published == {"prefect-server": ["127.0.0.1:${FEDBOOST_PREFECT_PORT:-4200}:4200"],
                         SCORING: ["127.0.0.1:${FEDBOOST_SCORING_PORT:-8443}:8443"]}
    assert not SERVICES["rabbitmq"]["image"].endswith("-management")
    server = SERVICES["prefect-server"]
    assert server["environment"]["PREFECT_UI_STATIC_DIRECTORY"].startswith(
        server["environment"]["PREFECT_HOME"] + "/")  # the UI's files where the server may write
    assert _mounts("prefect-server")[server["environment"]["PREFECT_HOME"]] == "prefect-data"


def test_the_image_is_built_once_and_every_fedboost_service_runs_it() -> None:
    built = [name for name, service in SERVICES.items() if "build" in service]
    assert built == ["prefect-server"]  # seven builds at once took 828 s and left 4.6 GB
    assert SERVICES["prefect-server"]["build"] == "."
    for name, service in SERVICES.items():
        assert service["image"] == ("rabbitmq:3.13" if name == "rabbitmq" else "fedboost:latest")
    dockerfile = (REPO / "Dockerfile").read_text()
    # the downloaded packages and the lists go in the layer that fetched them
    assert "apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*" in dockerfile


def test_every_container_drops_its_capabilities_and_has_a_read_only_root() -> None:
    for name, service in SERVICES.items():
        assert service["cap_drop"] == ["ALL"], name
        assert service["security_opt"] == ["no-new-privileges:true"], name
        tmpfs = {entry.split(":")[0] for entry in service["tmpfs"]}
        if name != "rabbitmq":  # the broker's start scripts write outside its data folder
            assert service["read_only"] is True and "/tmp" in tmpfs, name
        # only an entry point that starts as root gets back what its copy of the secrets and
        # its change of user need; and its init (PID 1, root) KILL, to pass a SIGTERM on to
        # the process of another user it started (without it, docker stop ended in SIGKILL)
        starts_as_root = service.get("user") == "root" or name == "rabbitmq"
        wanted = SECRETS_CAPS if starts_as_root else set()
        if starts_as_root and service.get("init"):
            wanted = wanted | {"KILL"}
        assert set(service.get("cap_add", [])) == wanted, name
        # where the entry point copies /secrets/X to X: a tmpfs, the root being read-only
        for copy in {c[len("/secrets"):] for c in _mounts(name) if c.startswith("/secrets/")}:
            if name != "rabbitmq":
                assert "/" + copy.split("/")[1] in tmpfs, (name, copy)
    assert SERVICES["rabbitmq"]["tmpfs"] == ["/etc/rabbitmq/tls"]  # its key's copy in memory
    assert "ENV NUMBA_CACHE_DIR=/tmp/numba-cache" in (REPO / "Dockerfile").read_text()
    home = [t for t in SERVICES["worker-host"]["tmpfs"] if t.startswith("/home/fedboost")]
    assert home == ["/home/fedboost:mode=1777"]  # fedboost writes its caches (podman: no uid=)


def test_the_scoring_service_probes_livez_and_mounts_the_keys_folder() -> None:
    service = SERVICES[SCORING]
    command = service["command"]
    assert command[:2] == ["serve-model", "/config/scoring-run"]
    option = {command[i]: command[i + 1] for i in range(2, len(command) - 1)
              if command[i].startswith("--")}
    mounts = _mounts(SCORING)
    # the folder, not the file: a revoke on the host replaces the file (a new inode), which a
    # file mount would never show the container
    keys = Path(option["--api-keys"])
    assert mounts[str(keys.parent)] == "./deploy/scoring-keys" and str(keys) not in mounts
    assert any(v.startswith("./deploy/scoring-keys:") and v.endswith(":ro")
               for v in service["volumes"])
    # as the operator, whose 0600 files it reads live; fedboost as the program, no entry point
    assert service["user"] == "${FEDBOOST_SCORING_USER:-10001:10001}"
    assert service["entrypoint"] == ["fedboost"]
    assert service["healthcheck"]["test"] == [
        "CMD", "fedboost-healthcheck", "live", "https://127.0.0.1:8443/livez", "/scoring-tls/ca.pem"]
    assert mounts["/scoring-tls/ca.pem"] == "./deploy/scoring-tls/ca.pem"
    assert option["--tls-cert"] in mounts and option["--tls-key"] in mounts
    # the run folder it serves is the vertical job of the runner's deployment
    run = REPO / mounts["/config/scoring-run"] / "job.json"
    assert json.loads(run.read_text()) == yaml.safe_load((REPO / "deploy" / "job.yaml").read_text())
    # it signs as flow and logs in as the flow's broker user, with the flow's password file
    assert service["environment"]["FEDBOOST_AMQP_URL"] == "amqps://fedboost-flow@rabbitmq:5671/%2F"
    assert mounts[service["environment"]["FEDBOOST_AMQP_PASSWORD_FILE"]] == "./deploy/passwords/flow"
    private = sorted(c for c in mounts if c.endswith(".key"))
    assert private == ["/keys/flow.key", "/scoring-tls/server.key", "/tls/flow.key"]
