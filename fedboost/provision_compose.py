"""One organisation's compose file (issue 38, item 7), written into its start kit by ``fedboost
provision finish`` as ``compose/compose.yml`` beside the broker's ``rabbitmq.conf`` and
``enabled_plugins``: its own broker (its shovels to the other organisations' brokers, TLS
published on ``tls_port`` for theirs), one worker per party, and at the lender the Prefect
server on PostgreSQL and the runner its flows run in.

Every path is relative to the kit (compose resolves them from the file's folder), so the kit
is the whole deployment: no password in the file or in any container's environment (each is a
mounted file the entry point copies to its service's user), no private key outside its kit.
The containers follow docker-compose.yml's rules: every capability dropped but the entry
points' copy and user change, no new privileges, fedboost's roots read-only.
"""

from __future__ import annotations

from typing import Any

import yaml

from fedboost.broker import FLOW_USER, user_of
from messages.broker_links import Federation

PREFECT_DB_PASSWORD = "prefect-db"
PREFECT_AUTH = "prefect-auth"
PREFECT_DB = {"user": "prefect", "name": "prefect"}

# the fedboost image's services that hold a key or a password (docker-compose.yml's
# x-holds-keys and x-fedboost): root only for deploy/entrypoint.sh's copy and change of user
# (KILL: the init passes the engine's SIGTERM on to a process of another user)
_FEDBOOST = {
    "image": "${FEDBOOST_IMAGE:-fedboost:latest}", "restart": "unless-stopped", "init": True,
    "user": "root", "cap_drop": ["ALL"],
    "cap_add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"],
    "security_opt": ["no-new-privileges:true"], "read_only": True,
    "tmpfs": ["/tmp", "/home/fedboost:mode=1777", "/keys", "/passwords"],
}
_HEALTHY = {"condition": "service_healthy"}


def rabbitmq_conf(federation: Federation, org: str) -> str:
    """The broker's configuration in its container: plain AMQP for the organisation's own
    processes on the compose network (never published), TLS with a client certificate for the
    other brokers' shovels."""
    return "\n".join([
        f"# {org}'s broker in its container (fedboost provision finish; compose/compose.yml)",
        "load_definitions = /etc/rabbitmq/private/definitions.json",
        "max_message_size = 16777216",
        "consumer_timeout = 3600000",
        f"listeners.tcp.default = {federation.amqp_port}",
        federation.tls_conf(org, listen_on_all=True)])


def compose_file(federation: Federation, org: str) -> str:
    me = federation.organisations[org]
    lender = org == federation.lender
    services: dict[str, Any] = {"broker": _broker(federation, org)}
    volumes: dict[str, Any] = {"broker-data": {}}
    for party in me.parties:
        services[f"worker-{_service(party)}"] = _worker(federation, party)
        volumes[f"models-{_service(party)}"] = {}
    if lender:
        services["postgres"] = _postgres()
        services["prefect-server"] = _prefect_server()
        services["runner"] = _runner(federation, [f"worker-{_service(p)}" for p in me.parties])
        volumes.update({"postgres-data": {}, "prefect-data": {}, "runs": {}})
    head = f"""# {org}'s deployment in federation {federation.name} (written by 'fedboost provision
# finish'; paths are the kit's). Build or load the image fedboost:latest (FEDBOOST_IMAGE:
# another), set each worker file's data: (a path under /data, the folder FEDBOOST_DATA, default
# ../data), then, from this folder:
#   docker compose -p fedboost-{org} up -d
# The broker publishes {federation.tls_port} for the other organisations' brokers (open it to
# them alone; FEDBOOST_LINK_PORT: another host port); nothing else is published{
    ', but the Prefect UI on 127.0.0.1:4200 (FEDBOOST_PREFECT_PORT)' if lender else ''}.
# START.md in the kit says more; docs/operations.md ("Across organisations") too.
"""
    body = {"services": services, "volumes": volumes}
    return head + yaml.dump(body, Dumper=_Plain, sort_keys=False, width=100)


class _Plain(yaml.SafeDumper):
    """Every service spelled out: the lists the fedboost services share (``_FEDBOOST``) are
    one object each, which a plain dump writes as YAML anchors and aliases (&id001)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _service(party: str) -> str:
    """A compose service name for ``party`` (no '_': compose names containers SERVICE-1)."""
    return party.replace("_", "-").lower()


def _broker(federation: Federation, org: str) -> dict[str, Any]:
    tls = f"{federation.tls_dir}/{org}"
    # as root: the broker's private files (TLS keys, definitions.json with the link passwords)
    # copied to the user rabbitmq, readable by it alone, then the image's own entry point
    copy = (f"set -eu; install -d -o rabbitmq -g rabbitmq -m 0700 {tls} {tls}/peers; "
            f"for f in /secrets/tls/*.pem /secrets/tls/*.key; do "
            f"install -o rabbitmq -g rabbitmq -m 0400 \"$$f\" {tls}/; done; "
            f"for f in /secrets/tls/peers/*.pem; do "
            f"install -o rabbitmq -g rabbitmq -m 0400 \"$$f\" {tls}/peers/; done; "
            "install -o rabbitmq -g rabbitmq -m 0400 /secrets/definitions.json "
            "/etc/rabbitmq/private/definitions.json; exec docker-entrypoint.sh \"$$@\"")
    return {
        "image": "rabbitmq:3.13", "restart": "unless-stopped",
        # a stop lets the broker write its queues (the shovels' messages in flight) first
        "stop_grace_period": "60s", "cap_drop": ["ALL"],
        "cap_add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID"],
        "security_opt": ["no-new-privileges:true"],
        "tmpfs": [tls, "/etc/rabbitmq/private"],
        "entrypoint": ["sh", "-c", copy, "fedboost-broker"],
        "command": ["rabbitmq-server"],
        "volumes": ["./rabbitmq.conf:/etc/rabbitmq/rabbitmq.conf:ro",
                    "./enabled_plugins:/etc/rabbitmq/enabled_plugins:ro",
                    "../broker/definitions.json:/secrets/definitions.json:ro",
                    "../broker/tls:/secrets/tls:ro",
                    "broker-data:/var/lib/rabbitmq"],
        "ports": [f"${{FEDBOOST_LINK_PORT:-{federation.tls_port}}}:{federation.tls_port}"],
        "healthcheck": {"test": ["CMD", "rabbitmq-diagnostics", "-q", "check_port_connectivity"],
                        "interval": "10s", "timeout": "10s", "retries": 12,
                        "start_period": "20s"},
    }


def _amqp(federation: Federation, identity: str) -> dict[str, str]:
    """The environment that puts ``identity`` on its own broker: the user, never the password
    (a file the entry point copied)."""
    user = user_of(identity)
    return {"FEDBOOST_AMQP_URL": f"amqp://{user}@broker:{federation.amqp_port}/%2F",
            "FEDBOOST_AMQP_PASSWORD_FILE": f"/passwords/{user}"}


def _worker(federation: Federation, party: str) -> dict[str, Any]:
    user = user_of(party)
    return {
        **_FEDBOOST,
        "command": ["worker", "--party", party, "--config", f"/config/{party}.yaml",
                    "--health-file", "/tmp/fedboost-alive"],
        "environment": _amqp(federation, party),
        # the worker file's relative paths land where these mounts put things: ../keys/PARTY,
        # ../passwords/USER and ../models from /config
        "volumes": [f"../workers/{party}.yaml:/config/{party}.yaml:ro",
                    f"../passwords/{user}:/secrets/passwords/{user}:ro",
                    f"../keys/{party}:/secrets/keys/{party}:ro",
                    "${FEDBOOST_DATA:-../data}:/data:ro",
                    f"models-{_service(party)}:/models"],
        "depends_on": {"broker": _HEALTHY},
        "healthcheck": {"test": ["CMD", "fedboost-healthcheck", "fresh", "/tmp/fedboost-alive",
                                 "60"],
                        "interval": "15s", "timeout": "5s", "retries": 4,
                        "start_period": "30s"},
        "stop_grace_period": "60s",
    }


def _postgres() -> dict[str, Any]:
    return {
        "image": "postgres:16", "restart": "unless-stopped", "stop_grace_period": "60s",
        "cap_drop": ["ALL"],
        "cap_add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID"],
        "security_opt": ["no-new-privileges:true"],
        "environment": {"POSTGRES_USER": PREFECT_DB["user"], "POSTGRES_DB": PREFECT_DB["name"],
                        # read by the image's entry point as root, before it drops to postgres
                        "POSTGRES_PASSWORD_FILE": f"/run/secrets/{PREFECT_DB_PASSWORD}"},
        "volumes": [f"../passwords/{PREFECT_DB_PASSWORD}:/run/secrets/{PREFECT_DB_PASSWORD}:ro",
                    "postgres-data:/var/lib/postgresql/data"],
        "healthcheck": {"test": ["CMD", "pg_isready", "-q", "-U", PREFECT_DB["user"], "-d",
                                 PREFECT_DB["name"]],
                        "interval": "10s", "timeout": "5s", "retries": 12,
                        "start_period": "20s"},
    }


def _prefect_env() -> dict[str, str]:
    """Basic auth on the API and UI (/api/health stays open): user:password in a file the
    entry point writes into the Prefect profile."""
    return {"FEDBOOST_PREFECT_AUTH_FILE": f"/passwords/{PREFECT_AUTH}",
            "PREFECT_PROFILES_PATH": "/home/fedboost/.prefect/profiles.toml",
            "PREFECT_UI_URL": "http://${FEDBOOST_PREFECT_UI_HOST:-localhost}:"
                              "${FEDBOOST_PREFECT_PORT:-4200}"}


def _prefect_server() -> dict[str, Any]:
    return {
        **_FEDBOOST,
        "command": ["prefect", "server", "start", "--host", "0.0.0.0", "--port", "4200"],
        "environment": {
            "PREFECT_HOME": "/prefect", "PREFECT_UI_STATIC_DIRECTORY": "/prefect/ui",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **_prefect_env(),
            "PREFECT_UI_API_URL": "http://${FEDBOOST_PREFECT_UI_HOST:-localhost}:"
                                  "${FEDBOOST_PREFECT_PORT:-4200}/api",
            # the flow runs' history in PostgreSQL; its password: a file the entry point
            # writes into the Prefect profile (PREFECT_SERVER_DATABASE_PASSWORD)
            "PREFECT_SERVER_DATABASE_DRIVER": "postgresql+asyncpg",
            "PREFECT_SERVER_DATABASE_HOST": "postgres", "PREFECT_SERVER_DATABASE_PORT": "5432",
            "PREFECT_SERVER_DATABASE_USER": PREFECT_DB["user"],
            "PREFECT_SERVER_DATABASE_NAME": PREFECT_DB["name"],
            "FEDBOOST_PREFECT_DATABASE_PASSWORD_FILE": f"/passwords/{PREFECT_DB_PASSWORD}"},
        "volumes": [f"../passwords/{PREFECT_AUTH}:/secrets/passwords/{PREFECT_AUTH}:ro",
                    f"../passwords/{PREFECT_DB_PASSWORD}:"
                    f"/secrets/passwords/{PREFECT_DB_PASSWORD}:ro",
                    "prefect-data:/prefect"],
        "ports": ["127.0.0.1:${FEDBOOST_PREFECT_PORT:-4200}:4200"],
        "depends_on": {"postgres": _HEALTHY},
        "healthcheck": {"test": ["CMD", "fedboost-healthcheck", "url",
                                 "http://127.0.0.1:4200/api/health"],
                        "interval": "10s", "timeout": "10s", "retries": 12,
                        "start_period": "30s"},
    }


def _runner(federation: Federation, workers: list[str]) -> dict[str, Any]:
    """The lender's flows: ``../jobs/job.yaml`` served as the deployment
    ``vertical_secureboost/FEDERATION`` (Run in the Prefect UI, or 'docker compose exec -u
    fedboost runner prefect deployment run ...'); 'exec ... fedboost train /jobs/JOB.yaml' runs
    another job file of that folder."""
    return {
        **_FEDBOOST,
        "command": ["serve", "--name", federation.name or "fedboost", "--config",
                    "/jobs/job.yaml"],
        "working_dir": "/app",
        "environment": {"PREFECT_API_URL": "http://prefect-server:4200/api", **_prefect_env(),
                        **_amqp(federation, "flow")},
        "volumes": [f"../passwords/{PREFECT_AUTH}:/secrets/passwords/{PREFECT_AUTH}:ro",
                    f"../passwords/{FLOW_USER}:/secrets/passwords/{FLOW_USER}:ro",
                    "../keys/flow:/secrets/keys/flow:ro",
                    "${FEDBOOST_JOBS:-../jobs}:/jobs:ro"],
        "depends_on": {"broker": _HEALTHY, "prefect-server": _HEALTHY,
                       **{w: {"condition": "service_started"} for w in workers}},
        "healthcheck": {"test": ["CMD", "fedboost-healthcheck", "url",
                                 "http://prefect-server:4200/api/health"],
                        "interval": "30s", "timeout": "10s", "retries": 3},
    }


def job_file(federation: Federation) -> str:
    """The lender's first job for the runner: its own first party active, every other
    organisation's parties passive; the parameters are the user's to set."""
    me = federation.organisations[federation.lender]
    parties = {me.parties[0]: {"role": "active", "id": "id", "label": "y"}}
    for org in federation.organisations.values():
        for party in org.parties:
            parties.setdefault(party, {"role": "passive", "id": "id"})
    job = {"job": federation.name or "fedboost", "protocol": "vertical_secureboost",
           "parties": parties,
           "params": {"n_trees": 30, "max_depth": 3, "learning_rate": 0.3, "max_bin": 32,
                      "objective": "binary", "seed": 0},
           "crypto": {"scheme": "paillier", "key_bits": 2048},
           # the URL (the flow's user on this organisation's broker) comes from the container's
           # FEDBOOST_AMQP_URL; its password is a file
           "transport": {"kind": "rabbitmq", "password_file": f"/passwords/{FLOW_USER}",
                         "step_timeout": 300},
           "signing": {"key_dir": "/keys/flow"}}
    return (f"# A job of federation {federation.name} for the runner of compose/compose.yml "
            "(fedboost provision finish):\n# set the parties' id and label columns and the "
            "parameters (docs/job-files.md)\n" + yaml.safe_dump(job, sort_keys=False))
