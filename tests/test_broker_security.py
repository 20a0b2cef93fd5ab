"""Broker security on the real local RabbitMQ: definitions written by 'fedboost definitions'
(passwords from the environment and from a file) give each party a user that can use only its
own queues; the host's credentials cannot consume the guest's queue; the shipped definitions
hold users that cannot log in with any password."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pika
import pika.exceptions as px
import pytest

from fedboost.broker import FLOW_USER, definitions, password_env, user_of
from messages import TransportError
from messages.rabbit_queues import delete_party_queues, queue_of
from messages.rabbitmq import RabbitTransport
from tests.scenarios import rabbitmqctl

REPO = Path(__file__).resolve().parents[1]
DEFINITIONS = REPO / "deploy" / "definitions.json"
FEDBOOST = [sys.executable, "-m", "fedboost.cli"]


def test_shipped_definitions_hold_no_usable_password() -> None:
    shipped = json.loads(DEFINITIONS.read_text())
    # docker-compose.yml's parties: vertical (guest, host) and its horizontal profile
    fresh = definitions({"guest": "a", "host": "b", "host_1": "d", "host_2": "e",
                         "aggregator": "f"}, "c")
    strip = lambda d: {**d, "users": [{**u, "password_hash": ""} for u in d["users"]]}  # noqa: E731
    assert shipped == strip(fresh)  # the generator's file, minus the hashes
    assert all(user["password_hash"] == "" for user in shipped["users"])
    assert not shipped["bindings"] and not shipped["exchanges"]


@dataclass
class Broker:
    """Users of this test's parties on the test's virtual host."""

    vhost: str
    tag: str
    parties: dict[str, str]
    """party (or ``flow``) -> its broker user's password"""

    @property
    def guest(self) -> str:
        return f"guest{self.tag}"

    @property
    def host(self) -> str:
        return f"host{self.tag}"

    @property
    def flow_user(self) -> str:
        return f"{FLOW_USER}-{self.tag}"

    def url(self, user: str, password: str) -> str:
        vhost = quote(self.vhost, safe="")
        return f"amqp://{user}:{quote(password, safe='')}@127.0.0.1:5672/{vhost}"

    def party(self, name: str) -> str:
        return self.url(user_of(name), self.parties[name])


@pytest.fixture(scope="module")
def secured_broker(rabbit_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """'fedboost definitions' for this test's own parties and flow user, imported into the
    local broker with rabbitmqctl: the host's password from the environment, the guest's and
    the flow's from files. Users and queues are removed after."""
    ctl = rabbitmqctl()
    tag = uuid.uuid4().hex[:6]
    vhost = unquote(urlsplit(rabbit_url).path[1:]) or "/"
    guest, host, idle = f"guest{tag}", f"host{tag}", f"idle{tag}"
    broker = Broker(vhost, tag, {name: secrets.token_urlsafe(18) for name in (guest, host, "flow")})
    root = tmp_path_factory.mktemp("definitions")
    (root / "guest.pw").write_text(broker.parties[guest] + "\n")
    (root / "flow.pw").write_text(broker.parties["flow"] + "\n")
    for name in ("guest.pw", "flow.pw"):
        (root / name).chmod(0o600)  # 'fedboost definitions' refuses a file others may read
    env = {**os.environ, "PYTHONPATH": str(REPO), password_env(host): broker.parties[host]}
    out = root / "definitions.json"
    done = subprocess.run([*FEDBOOST, "definitions", "--party", f"{guest}=@{root / 'guest.pw'}",
                           "--party", host, "--flow-password", f"@{root / 'flow.pw'}",
                           "--vhost", vhost, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    written = out.read_text()
    assert not any(password in written for password in broker.parties.values())
    defs = json.loads(written)
    # a flow user of this test's own (the real one's name is global to the broker), and a user
    # like the shipped ones: no password
    defs["users"] = [{**u, "name": f"{u['name']}-{tag}"} if u["name"] == FLOW_USER else u
                     for u in defs["users"]]
    defs["permissions"] = [{**p, "user": f"{p['user']}-{tag}"} if p["user"] == FLOW_USER else p
                           for p in defs["permissions"]]
    defs["users"].append({**defs["users"][0], "name": user_of(idle), "password_hash": ""})
    # rabbitmqctl may run as the broker's user, who cannot read the test's folder
    fd, shared = tempfile.mkstemp(prefix="fedboost-definitions-", suffix=".json")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(defs, f)
    try:
        subprocess.run([ctl, "import_definitions", shared], check=True, capture_output=True,
                       timeout=120)
    finally:
        os.unlink(shared)
    users = [user_of(guest), user_of(host), user_of(idle), f"{FLOW_USER}-{tag}"]
    try:
        deadline = time.monotonic() + 60  # the import is asynchronous
        while True:
            try:
                pika.BlockingConnection(pika.URLParameters(broker.party(host))).close()
                break
            except px.AMQPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield broker
    finally:
        delete_party_queues(rabbit_url, [guest, host])
        for user in users:
            subprocess.run([ctl, "delete_user", user], capture_output=True, timeout=60)


def _refused(action) -> int:  # type: ignore[no-untyped-def]
    connection = None
    try:
        connection, channel = action()
        connection.process_data_events(time_limit=0.5)
    except px.ChannelClosedByBroker as exc:
        return int(exc.reply_code)
    finally:
        if connection is not None and connection.is_open:
            connection.close()
    return 0


def _connect(url: str) -> tuple[pika.BlockingConnection, object]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    return connection, connection.channel()


def test_host_cannot_consume_the_guest_queue(secured_broker: Broker) -> None:
    broker = secured_broker
    guest, host, flow_user = broker.guest, broker.host, broker.flow_user

    def consume_guest():  # type: ignore[no-untyped-def]
        connection, channel = _connect(broker.party(host))
        channel.basic_consume(queue_of(guest), lambda *a: None)
        return connection, channel

    assert _refused(consume_guest) == 403  # ACCESS_REFUSED from the real broker

    def bind_guest_traffic():  # type: ignore[no-untyped-def]
        connection, channel = _connect(broker.party(host))
        channel.queue_bind(queue_of(host), "amq.direct", routing_key=guest)
        return connection, channel

    assert _refused(bind_guest_traffic) == 403

    def flow_reads_host():  # type: ignore[no-untyped-def]
        connection, channel = _connect(broker.url(flow_user, broker.parties["flow"]))
        channel.basic_consume(queue_of(host), lambda *a: None)
        return connection, channel

    assert _refused(flow_reads_host) == 403
    with pytest.raises(TransportError, match="403"):  # host's user cannot act as the guest
        RabbitTransport(guest, broker.party(host), party=True)


def test_each_user_can_do_its_own_job(secured_broker: Broker) -> None:
    broker = secured_broker
    guest, host, flow_user = broker.guest, broker.host, broker.flow_user
    reply_to = f"flow.security-{host}"
    host_end = RabbitTransport(host, broker.party(host), party=True)
    flow = RabbitTransport(reply_to, broker.url(flow_user, broker.parties["flow"]), party=False)
    try:
        flow.send(host, b"command")               # flows publish commands
        assert host_end.receive(10) == b"command"  # the host reads its own inbox
        host_end.acknowledge()
        host_end.send(reply_to, b"reply")          # and replies to the flow
        assert flow.receive(10) == b"reply"
        flow.acknowledge()
        host_end.send(guest, b"probe")             # a party may address another's inbox
        assert host_end.helpers() == 0
    finally:
        flow.delete_inbox()
        flow.close()
        host_end.close()


def test_a_user_without_password_cannot_log_in(secured_broker: Broker) -> None:
    """What the shipped definitions load: users that no password opens, the old development
    one included."""
    idle = user_of(f"idle{secured_broker.tag}")
    for password in ("", "guest-dev-secret"):
        with pytest.raises(px.ProbableAuthenticationError):
            pika.BlockingConnection(pika.URLParameters(secured_broker.url(idle, password))).close()
