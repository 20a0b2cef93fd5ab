"""Organisations on hosts of their own (issue 38, item 1): each in its own network namespace,
with its own address and its own RabbitMQ node, links that can be cut and rate-limited.

Every client here runs inside a namespace (``ip netns exec``), as an organisation's process would;
nothing is reached from the test's own namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedboost.embedded import train_embedded
from flows.config import load_config
from flows.secureboost import vertical_secureboost
from tests.cli_federation import CliFederation
from tests.netns import (AMQP_PORT, STREAM_SINK, STREAM_SOURCE, NetnsFederation,  # noqa: F401
                         NetnsHost, netns_federation, up_or_skip)

# Declares a queue, publishes one message and reads it back, over the broker at argv[1].
ROUND_TRIP = textwrap.dedent("""
    import json, sys, pika
    try:
        connection = pika.BlockingConnection(pika.URLParameters(sys.argv[1] + "?socket_timeout=5"
                                                                "&connection_attempts=1"))
    except Exception as exc:
        print(json.dumps({"connected": False, "error": type(exc).__name__}))
        raise SystemExit(0)
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"hello from " + sys.argv[2].encode())
    method, _, body = channel.basic_get(queue, auto_ack=True)
    print(json.dumps({"connected": True, "body": body.decode() if body else None}))
    connection.close()
""")


def round_trip(host: NetnsHost, url: str) -> dict[str, object]:
    """An AMQP round trip from inside ``host``'s namespace to the broker at ``url``."""
    done = host.python(ROUND_TRIP, url, host.name)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_broker_answers_its_own_organisation_on_its_own_address(
        netns_federation: NetnsFederation) -> None:  # noqa: F811
    guest, host, machine = netns_federation["guest"], netns_federation["host"], netns_federation["host-2"]
    assert len({guest.address, host.address, machine.address}) == 3
    assert machine.kind == "machine" and machine.password is None

    # each organisation reaches its own broker at its own address, as its own user
    assert round_trip(guest, guest.broker_url) == {"connected": True, "body": "hello from guest"}
    assert round_trip(host, host.broker_url) == {"connected": True, "body": "hello from host"}
    # the data provider's second machine reaches its organisation's broker over the bridge
    assert round_trip(machine, host.broker_url) == {"connected": True, "body": "hello from host-2"}

    # a broker listens on its own namespace's address only: not on the namespace's loopback,
    # and nobody else's namespace has it at that address's loopback either
    on_loopback = guest.broker_url.replace(guest.address, "127.0.0.1")
    assert round_trip(guest, on_loopback)["connected"] is False
    assert round_trip(host, on_loopback)["connected"] is False
    # the default guest/guest login is gone; another organisation's user is unknown here
    assert round_trip(guest, f"amqp://guest:guest@{guest.address}:{AMQP_PORT}/%2F")["connected"] is False
    foreign = host.broker_url.replace(host.address, guest.address)
    assert round_trip(host, foreign)["connected"] is False

    # a cut link: the host's machine no longer reaches its broker; mended, it does again
    netns_federation.cut("host-2")
    try:
        assert round_trip(machine, host.broker_url)["connected"] is False
    finally:
        netns_federation.mend("host-2")
    assert round_trip(machine, host.broker_url)["connected"] is True




def throughput(sender: NetnsHost, receiver: NetnsHost, size: int, port: int) -> float:
    """Bytes per second of one TCP stream of ``size`` bytes from ``sender`` to ``receiver``."""
    sink = receiver.popen([sys.executable, "-c", STREAM_SINK, receiver.address, str(port), "30"],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
        subprocess.run(sender.command([sys.executable, "-c", STREAM_SOURCE, receiver.address, str(port),
                                       str(size), "30"]), check=True, timeout=60)
        result = json.loads(sink.stdout.readline())
        assert sink.wait(timeout=30) == 0
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    assert result["bytes"] == size
    return size / result["seconds"]


def test_a_rate_limit_on_a_link_bounds_the_throughput_between_two_namespaces(
        netns_federation: NetnsFederation) -> None:  # noqa: F811
    guest, machine = netns_federation["guest"], netns_federation["host-2"]
    size = 3_000_000  # 3 MB: ~3 s at 8 Mbit/s
    free = throughput(guest, machine, size, 7101)
    rate = 8e6 / 8  # 8mbit in bytes per second
    netns_federation.shape("host-2", "8mbit")
    try:
        started = time.monotonic()
        limited = throughput(guest, machine, size, 7102)
        elapsed = time.monotonic() - started
        assert "link=8Mbit" in netns_federation.status()
        back = throughput(machine, guest, size // 2, 7103)  # the other direction is limited too
    finally:
        netns_federation.shape("host-2", "off")
    print(f"unlimited {free / 1e6:.1f} MB/s, 8mbit {limited / 1e6:.2f} MB/s "
          f"(back {back / 1e6:.2f} MB/s), {elapsed:.1f} s")
    assert 0.6 * rate <= limited <= 1.15 * rate, limited
    assert 0.6 * rate <= back <= 1.15 * rate, back
    assert free >= 5 * rate, free  # without the limit the same stream is far faster
    assert throughput(guest, machine, size, 7104) >= 5 * rate  # lifted again


def test_down_leaves_nothing_of_a_federation_behind() -> None:
    """A second federation of its own (no brokers, quick): after ``down`` none of its
    namespaces, links or processes remain, also after processes were started inside it."""
    federation = up_or_skip(NetnsFederation(orgs=("a", "b"), machines=(), brokers=False))
    try:
        sleeper = federation["a"].popen(["sleep", "300"])
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"{federation.prefix}-a" in names and f"{federation.prefix}-b" in names
        again = federation.script("up", "--orgs", "a", "--no-brokers")
        assert again.returncode != 0 and "already up" in again.stderr
    finally:
        federation.down()
    assert sleeper.wait(timeout=20) != 0  # killed by down
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert federation.prefix not in names
    assert federation.prefix not in links
    assert not federation.state.exists()


@pytest.mark.usefixtures("prefect_harness")
def test_secureboost_between_workers_in_two_namespaces_over_a_broker_in_a_third(
        netns_federation: NetnsFederation, tmp_path: Path) -> None:  # noqa: F811
    """breast, 2 trees, 1024-bit: the guest's worker in the guest's namespace, the host's on the
    host's second machine, both over the host organisation's broker in its own namespace (the
    shared-broker topology, across hosts); the flow runs in the test's namespace. The model is
    the in-memory run's, byte for byte."""
    guest_host, host_machine = netns_federation["guest"], netns_federation["host-2"]
    broker = netns_federation["host"]
    fed = CliFederation(tmp_path / "federation", broker.broker_url, prefix="netns",
                        job_file="breast.yaml", params={"n_trees": 2}, step_timeout=None)
    fed.start(fed.guest, command=guest_host.fedboost)
    fed.start(fed.host, command=host_machine.fedboost)
    try:
        config = load_config(fed.job_file)
        result = vertical_secureboost(config)
        # the workers' connections reached the broker from their own namespaces' addresses
        peers = netns_federation.rabbitmqctl("host", "list_connections", "peer_host").split()
    finally:
        codes = fed.stop()
    assert codes == [0, 0], f"{codes}: {fed.log(fed.guest)[-2000:]} {fed.log(fed.host)[-2000:]}"
    assert guest_host.address in peers and host_machine.address in peers, peers
    memory = config.model_copy(update={"transport": config.transport.model_copy(
        update={"kind": "memory"})})
    expected = train_embedded(memory, tmp_path / "memory")
    assert result["train_auc"] == expected["train_auc"]
    got = fed.models / config.job / config.active / "model.json"
    assert got.read_bytes() == (tmp_path / "memory" / config.active / "model.json").read_bytes()


def test_a_partial_up_is_removed_whole() -> None:
    """``up`` stopping half-way (a bad third name, after two namespaces were made): the fixture's
    ``down`` removes what was made."""
    federation = NetnsFederation(orgs=("a", "b", "Bad!"), machines=(), brokers=False)
    try:
        up_or_skip(federation)
    except RuntimeError as exc:
        assert "bad organisation name 'Bad!'" in str(exc)
    else:
        federation.down()
        raise AssertionError("up accepted a bad name")
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert federation.prefix not in names and federation.prefix not in links
    assert not federation.state.exists()
