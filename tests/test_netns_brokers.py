"""One broker per organisation (issue 38, item 2): each organisation's processes use only their
own broker; messages for another organisation cross between brokers by RabbitMQ's shovel over
TLS, into an exchange of the receiving broker that the sender's link user may write to (with its
own parties' routing keys) and nothing else (``messages.broker_links``).

The federation (``deploy/netns-federation.sh up --per-org``): organisations ``guest`` (the
lender, where the flows run) and ``host``, each in its own namespace with its own broker, and
``host-2``, the host's second machine.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from fedboost.embedded import train_embedded
from flows.config import load_config
from flows.secureboost import vertical_secureboost
from tests.cli_federation import CliFederation
from tests.netns import NetnsFederation, up_or_skip

TAG = uuid.uuid4().hex[:6]
GUEST, HOST = f"guest{TAG}", f"host{TAG}"


@pytest.fixture(scope="module")
def per_org() -> Iterator[NetnsFederation]:
    federation = up_or_skip(NetnsFederation(per_org=True, bridge_address=True,
                                            parties={"guest": [GUEST], "host": [HOST]}))
    try:
        federation.await_links()
        yield federation
    finally:
        federation.down()


# Logs in to a broker over TLS as argv[1]'s user and tries each of argv[2]'s actions on a channel
# of its own; prints each one's outcome ("ok" or the broker's reply code).
PROBE = textwrap.dedent("""
    import json, ssl, sys, pika
    spec = json.loads(sys.argv[1])
    context = ssl.create_default_context(cafile=spec["ca"])
    if spec.get("cert"):
        context.load_cert_chain(spec["cert"], spec["key"])
    params = pika.ConnectionParameters(spec["address"], spec["port"], "/",
        pika.PlainCredentials(spec["user"], spec["password"]),
        ssl_options=pika.SSLOptions(context, spec["server_name"]), connection_attempts=1,
        socket_timeout=10)
    try:
        connection = pika.BlockingConnection(params)
    except Exception as exc:
        print(json.dumps({"login": type(exc).__name__}))
        raise SystemExit(0)
    outcome = {"login": "ok"}
    for name, action, *args in spec["actions"]:
        channel = connection.channel()
        channel.confirm_delivery()
        try:
            if action == "publish":
                channel.basic_publish(args[0], args[1], b"probe")
            elif action == "declare":
                channel.queue_declare(args[0])
            elif action == "get":
                channel.basic_get(args[0])
            outcome[name] = "ok"
        except pika.exceptions.UnroutableError:
            outcome[name] = "ok"
        except pika.exceptions.ChannelClosedByBroker as exc:
            outcome[name] = exc.reply_code
        if channel.is_open:
            channel.close()
    print(json.dumps(outcome))
    connection.close()
""")


def link_credentials(federation: NetnsFederation, sender: str, receiver: str) -> tuple[str, str]:
    """The link user and password ``sender`` holds for ``receiver``'s broker (in its shovels)."""
    found = set()
    for parameter in federation.definitions(sender)["parameters"]:
        uri = urlparse(parameter["value"]["dest-uri"])
        if uri.hostname == federation[receiver].address:
            found.add((unquote(uri.username or ""), unquote(uri.password or "")))
    assert len(found) == 1, found
    return found.pop()


def test_a_link_user_writes_only_its_organisations_traffic_into_the_receivers_queues(
        per_org: NetnsFederation) -> None:
    guest, host = per_org["guest"], per_org["host"]
    user, password = link_credentials(per_org, "host", "guest")
    assert user == "from-host"
    tls = per_org.tls_dir("host")
    spec = {"address": guest.address, "port": 5671, "server_name": "broker.guest",
            "ca": str(tls / "ca.pem"), "cert": str(tls / "link.pem"), "key": str(tls / "link.key"),
            "user": user, "password": password, "actions": [
                # a reply to a flow run at the lender: allowed (no such run: dropped there)
                ["flow_reply", "publish", "fedboost.from.host", "fedboost.flow.probe.0"],
                # the guest's own work queue, a queue of nobody's, the default exchange (any
                # queue by name), another exchange: refused
                ["guest_work", "publish", "fedboost.from.host", f"fedboost.{GUEST}.work"],
                ["other_key", "publish", "fedboost.from.host", "fedboost.someone"],
                ["default_exchange", "publish", "", f"fedboost.{GUEST}"],
                ["amq_topic", "publish", "amq.topic", f"fedboost.{GUEST}"],
                ["declare", "declare", "fedboost.mine"],
                ["read_inbox", "get", f"fedboost.{GUEST}"],
                ["read_link_queue", "get", f"fedboost.{HOST}"]]}
    done = host.python(PROBE, json.dumps(spec))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "login": "ok", "flow_reply": "ok", "guest_work": 403, "other_key": 403,
        "default_exchange": 403, "amq_topic": 403, "declare": 403, "read_inbox": 403,
        "read_link_queue": 403}

    # without the link's client certificate the TLS listener takes no login at all
    bare = {**spec, "cert": None, "actions": []}
    assert json.loads(host.python(PROBE, json.dumps(bare)).stdout)["login"] != "ok"
    # nor does a broker whose certificate carries another organisation's name
    wrong = {**spec, "server_name": "broker.host", "actions": []}
    assert json.loads(host.python(PROBE, json.dumps(wrong)).stdout)["login"] != "ok"

    # what each organisation holds of another's broker: one link user's password, in its
    # shovels; its own users are hashes
    for org, other in (("guest", "host"), ("host", "guest")):
        definitions = per_org.definitions(org)
        assert link_credentials(per_org, org, other)[0] == f"from-{org}"
        assert {u["name"] for u in definitions["users"]} == {f"from-{other}"}
        assert all("password" not in u for u in definitions["users"])


@pytest.mark.usefixtures("prefect_harness")
def test_secureboost_across_two_organisations_brokers_joined_by_shovels(
        per_org: NetnsFederation, tmp_path: Path) -> None:
    """breast, 2 trees, 1024-bit: the guest's worker on the guest's broker, the host's worker on
    its second machine on the host's broker, the flow (at the guest, the lender) on the guest's
    broker. The model is the in-memory run's, byte for byte; each broker saw only its own
    organisation's processes and the other's shovel."""
    guest, host, machine = per_org["guest"], per_org["host"], per_org["host-2"]
    fed = CliFederation(tmp_path / "federation", guest.broker_url, prefix="perorg",
                        job_file="breast.yaml", params={"n_trees": 2}, step_timeout=None, tag=TAG)
    fed.start(fed.guest, command=guest.fedboost)
    fed.start(fed.host, command=machine.fedboost, url=host.broker_url)
    try:
        config = load_config(fed.job_file)
        result = vertical_secureboost(config)
        # network connections (a shovel's own end on its broker is a direct one)
        seen = {org: [line.split("\t")[1:] for line in per_org.rabbitmqctl(
                    org, "list_connections", "type", "user", "peer_host").splitlines()
                      if line.startswith("network")] for org in ("guest", "host")}
    finally:
        codes = fed.stop()
    assert codes == [0, 0], f"{codes}: {fed.log(fed.guest)[-2000:]} {fed.log(fed.host)[-2000:]}"
    pairs = {org: {(user, peer) for user, peer in rows} for org, rows in seen.items()}
    assert {user for user, _ in pairs["host"]} == {"host", "from-guest"}, pairs
    assert ("host", machine.address) in pairs["host"] and ("from-guest", guest.address) in pairs["host"]
    assert {user for user, _ in pairs["guest"]} <= {"guest", "from-host"}, pairs
    assert ("from-host", host.address) in pairs["guest"]
    memory = config.model_copy(update={"transport": config.transport.model_copy(
        update={"kind": "memory"})})
    expected = train_embedded(memory, tmp_path / "memory")
    assert result["train_auc"] == expected["train_auc"]
    got = fed.models / config.job / config.active / "model.json"
    assert got.read_bytes() == (tmp_path / "memory" / config.active / "model.json").read_bytes()
