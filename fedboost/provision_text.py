"""The text files of a start kit (``fedboost.provision``): an outbox's README, each party's
worker file, the lender's job transport and the start commands."""

from __future__ import annotations

from pathlib import Path

from fedboost.broker import FLOW_USER, user_of
from messages.broker_links import Federation, broker_name


def outbox_readme(org: str, to: str, link_password: str) -> str:
    return f"""# From {org} to {to}

Made by `fedboost provision init` at {org}, for {to}'s `fedboost provision finish
--from {org}=THIS_FOLDER`.

- `{link_password}` is a **secret for {to} alone**: the password {to}'s broker logs in to
  {org}'s broker with (link user `from-{to}`). Send it over a confidential channel (not the
  one that carries the rest), and delete it here once sent.
- Everything else is public: `ca.pem` ({org}'s CA certificate), the `.pub` signing keys of
  {org}'s parties, `outbox.json` (who made this for whom, from which description).

No private key is in here; {to} refuses an outbox that holds one.
"""


def worker_file(federation: Federation, org: str, party: str) -> str:
    me = federation.organisations[org]
    return f"""# The worker of party {party} (organisation {org}, federation {federation.name}),
# written by 'fedboost provision finish'. Set its data set (data:, id: and, at the active
# party, label:), then start it: fedboost worker --party {party} --config THIS_FILE
# Relative paths are from this file's folder; docs/operations.md lists every key. Under
# compose/compose.yml the data sets are under /data (the kit's data/ folder, FEDBOOST_DATA).
party: {party}
data: CHANGE-ME.csv
id: id
# label: y
models: ../models
transport:
  kind: rabbitmq
  # its own organisation's broker (plain AMQP inside {org}); the password: a file, never here
  url: amqp://{user_of(party)}@{me.address}:{federation.amqp_port}/%2F
  password_file: ../passwords/{user_of(party)}
signing:
  key_dir: ../keys/{party}
"""


def flow_transport(federation: Federation, kit: Path) -> str:
    me = federation.organisations[federation.lender]
    return f"""# The transport and signing of the job files {federation.lender}'s flows run (federation
# {federation.name}): put these two keys in each job file (docs/job-files.md).
transport:
  kind: rabbitmq
  url: amqp://{FLOW_USER}@{me.address}:{federation.amqp_port}/%2F
  password_file: {kit / "passwords" / FLOW_USER}
signing:
  key_dir: {kit / "keys" / "flow"}
"""


def start_commands(federation: Federation, org: str, kit: Path) -> str:
    me, kit = federation.organisations[org], kit.resolve()
    tls = f"{federation.tls_dir}/{org}"
    others = ", ".join(f"{o.name} ({o.address})" for o in federation.organisations.values()
                       if o.name != org)
    workers = "\n".join(f"    fedboost worker --party {party} --config {kit}/workers/{party}.yaml"
                        for party in me.parties)
    text = f"""# Start kit of {org}, federation {federation.name}

Written by `fedboost provision finish`. Private, never to leave {org}: `ca/`,
`broker/tls/*.key`, `broker/definitions.json` (it holds the other brokers' link passwords),
`keys/*/*.key`, `passwords/`. The rest is public.

## 1. The broker ({broker_name(org)}, which the others reach at {me.address}:{federation.tls_port})

As root on the broker's machine (RabbitMQ with its shovel plugin, which ships with it):

    install -d -m 700 -o rabbitmq -g rabbitmq {tls} {tls}/peers
    install -m 600 -o rabbitmq -g rabbitmq {kit}/broker/tls/*.pem {kit}/broker/tls/*.key {tls}/
    install -m 600 -o rabbitmq -g rabbitmq {kit}/broker/tls/peers/*.pem {tls}/peers/
    rabbitmq-plugins enable rabbitmq_shovel
    # the TLS listener for the other brokers' shovels (a client certificate required)
    cat {kit}/broker/tls.conf >> /etc/rabbitmq/rabbitmq.conf
    systemctl restart rabbitmq-server
    rabbitmqctl delete_user guest
    # rabbitmqctl reads the file as the broker's user: a copy it may read, removed after
    install -m 600 -o rabbitmq -g rabbitmq {kit}/broker/definitions.json /tmp/fedboost-definitions.json
    rabbitmqctl import_definitions /tmp/fedboost-definitions.json
    rm /tmp/fedboost-definitions.json
    rabbitmqctl shovel_status        # every shovel 'running' once the others' brokers are up

Open port {federation.tls_port} to the other organisations' brokers: {others}. Keep port
{federation.amqp_port} (the parties' own logins) inside {org}.

## 2. Each party's worker

Set the data set in its worker file, then:

{workers}

In a container, mount `passwords/{user_of(me.parties[0])}` read-only (e.g. as
`/run/secrets/broker-password`), set `FEDBOOST_AMQP_PASSWORD_FILE=/run/secrets/broker-password`
and mount `keys/{me.parties[0]}/` where `signing.key_dir` says: no password in the environment.
"""
    text += f"""
## Or all of it in containers

`compose/compose.yml` runs the broker, {"the workers" if len(me.parties) > 1 else "the worker"}{
        " and the Prefect server on PostgreSQL with the runner of the flows"
        if org == federation.lender else ""} (the image fedboost:latest:
`docker compose build` in fedboost's checkout). Put the data sets in `{kit}/data/`, set each
worker file's `data:` to `/data/FILE`, then:

    cd {kit}/compose && docker compose -p fedboost-{org} up -d

The broker publishes port {federation.tls_port} for the other brokers; every password and key
reaches its container as a mounted file.
"""
    if org == federation.lender:
        text += f"""
## 3. Jobs ({org} is the lender: its flows run the jobs)

Put the `transport` and `signing` of `{kit}/flows/transport.yaml` in the job file, start
every party's worker (here and at the others), then:

    fedboost train JOB.yaml --out runs/JOB
"""
    return text
