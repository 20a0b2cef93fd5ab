"""Broker security on the real local RabbitMQ: the shipped definitions give each party a user
that can use only its own queues; the host's credentials cannot consume the guest's queue."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions as px
import pytest

from fedboost.broker import FLOW_USER, check_password, definitions, user_of
from messages import TransportError
from messages.rabbitmq import RabbitTransport, queue_of
from tests.scenarios import rabbitmqctl

REPO = Path(__file__).resolve().parents[1]
DEFINITIONS = REPO / "deploy" / "definitions.json"
# the development passwords the shipped definitions and docker-compose.yml use
PASSWORDS = {"guest": "guest-dev-secret", "host": "host-dev-secret", FLOW_USER: "flow-dev-secret"}


def _url(user: str, password: str) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:5672/%2F"


def test_shipped_definitions_match_the_generator() -> None:
    shipped = json.loads(DEFINITIONS.read_text())
    fresh = definitions({"guest": PASSWORDS["guest"], "host": PASSWORDS["host"]},
                        PASSWORDS[FLOW_USER])
    strip = lambda d: {**d, "users": [{**u, "password_hash": ""} for u in d["users"]]}  # noqa: E731
    assert strip(shipped) == strip(fresh)
    for user in shipped["users"]:
        party = user["name"].removeprefix("fedboost-")
        assert check_password(user["password_hash"], PASSWORDS.get(party, PASSWORDS[FLOW_USER]))
    assert not shipped["bindings"] and not shipped["exchanges"]


@pytest.fixture(scope="module")
def secured_broker(rabbit_url: str) -> Iterator[None]:
    """Apply the shipped definitions to the local broker with rabbitmqctl."""
    ctl = rabbitmqctl()
    subprocess.run([ctl, "import_definitions", str(DEFINITIONS)], check=True,
                   capture_output=True, timeout=120)
    deadline = time.monotonic() + 60  # the import is asynchronous
    while True:
        try:
            pika.BlockingConnection(pika.URLParameters(
                _url(user_of("host"), PASSWORDS["host"]))).close()
            break
        except px.AMQPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    yield
    admin = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    admin.channel().queue_purge(queue_of("guest"))  # our probe message must not reach a worker
    admin.close()


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


def _as(user: str, password: str) -> tuple[pika.BlockingConnection, object]:
    connection = pika.BlockingConnection(pika.URLParameters(_url(user, password)))
    return connection, connection.channel()


@pytest.mark.usefixtures("secured_broker")
def test_host_cannot_consume_the_guest_queue() -> None:
    host_user = (user_of("host"), PASSWORDS["host"])

    def consume_guest():  # type: ignore[no-untyped-def]
        connection, channel = _as(*host_user)
        channel.basic_consume(queue_of("guest"), lambda *a: None)
        return connection, channel

    assert _refused(consume_guest) == 403  # ACCESS_REFUSED from the real broker

    def bind_guest_traffic():  # type: ignore[no-untyped-def]
        connection, channel = _as(*host_user)
        channel.queue_bind(queue_of("host"), "amq.direct", routing_key="guest")
        return connection, channel

    assert _refused(bind_guest_traffic) == 403

    def flow_reads_host():  # type: ignore[no-untyped-def]
        connection, channel = _as(FLOW_USER, PASSWORDS[FLOW_USER])
        channel.basic_consume(queue_of("host"), lambda *a: None)
        return connection, channel

    assert _refused(flow_reads_host) == 403
    with pytest.raises(TransportError, match="403"):  # host's user cannot act as the guest
        RabbitTransport("guest", _url(*host_user), party=True)


@pytest.mark.usefixtures("secured_broker")
def test_each_user_can_do_its_own_job(rabbit_url: str) -> None:
    admin = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    consumers = admin.channel().queue_declare(queue_of("host"), passive=True).method.consumer_count
    admin.close()
    assert consumers == 0, "a worker of party 'host' is running on this broker: stop it first"
    host = RabbitTransport("host", _url(user_of("host"), PASSWORDS["host"]), party=True)
    flow = RabbitTransport("flow.security-test", _url(FLOW_USER, PASSWORDS[FLOW_USER]),
                           party=False)
    try:
        flow.send("host", b"command")             # flows publish commands
        assert host.receive(10) == b"command"     # the host reads its own inbox
        host.acknowledge()
        host.send("flow.security-test", b"reply")  # and replies to the flow
        assert flow.receive(10) == b"reply"
        flow.acknowledge()
        host.send("guest", b"probe")              # a party may address another's inbox
        assert host.helpers() == 0
    finally:
        flow.delete_inbox()
        flow.close()
        host.close()
