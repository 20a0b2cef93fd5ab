"""The RabbitMQ transport against the real local broker: delivery, chunking, integrity,
redelivery without duplicates, competing helpers, and clear errors."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator

import pika
import pytest

from messages import TransportError
from messages._work_publisher import Publication, WorkPublisher
from messages.rabbit_queues import delete_party_queues, queue_of
from messages.rabbitmq import RabbitTransport


@pytest.fixture
def names(rabbit_url: str) -> Iterator[tuple[str, str]]:
    """Two fresh party names; their queues are deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    pair = (f"a{tag}", f"b{tag}")
    yield pair
    delete_party_queues(rabbit_url, list(pair))


def _receive(t: RabbitTransport, timeout: float = 10.0) -> bytes:
    data = t.receive(timeout)
    assert data is not None, f"{t.name}: nothing arrived in {timeout} s"
    t.acknowledge()
    return data


def test_round_trip_and_chunking(rabbit_url: str, names: tuple[str, str]) -> None:
    a = RabbitTransport(names[0], rabbit_url, party=True, chunk_bytes=1024)
    b = RabbitTransport(names[1], rabbit_url, party=True, chunk_bytes=1024)
    try:
        small, big = b"hello", bytes(range(256)) * 41  # 10,496 bytes: 11 chunks
        a.send(names[1], small)
        a.send(names[1], big)
        assert _receive(b) == small
        assert _receive(b) == big
        assert b.receive(0.3) is None
    finally:
        a.close()
        b.close()


def test_corrupt_or_duplicate_chunks_are_dropped(rabbit_url: str, names: tuple[str, str]) -> None:
    b = RabbitTransport(names[1], rabbit_url, party=True, chunk_bytes=1024)
    raw = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    channel = raw.channel()
    try:
        payload = b"x" * 2000
        good = hashlib.sha256(payload).hexdigest()

        def chunk(message_id: str, index: int, body: bytes, digest: str) -> None:
            props = pika.BasicProperties(message_id=message_id, headers={
                "fb-index": index, "fb-count": 2, "fb-sha256": digest})
            channel.basic_publish("", queue_of(names[1]), body, props)

        chunk("m1", 0, payload[:1024], "0" * 64)  # wrong digest: dropped whole
        chunk("m1", 1, payload[1024:], "0" * 64)
        chunk("m2", 0, payload[:1024], good)
        chunk("m2", 0, payload[:1024], good)      # duplicate chunk: ignored
        chunk("m2", 1, payload[1024:], good)
        channel.basic_publish("", queue_of(names[1]), b"bad", pika.BasicProperties(
            message_id="m3", headers={"fb-index": 5, "fb-count": 2, "fb-sha256": good}))
        assert _receive(b) == payload
        assert b.receive(0.5) is None
    finally:
        raw.close()
        b.close()


def test_unacknowledged_message_is_redelivered_once(rabbit_url: str, names: tuple[str, str]) -> None:
    a = RabbitTransport(names[0], rabbit_url, party=True)
    b = RabbitTransport(names[1], rabbit_url, party=True)
    try:
        a.send(names[1], b"step-1")
        assert b.receive(10) == b"step-1"
        b.close()  # lost before the outcome was done: the broker keeps the message
        b = RabbitTransport(names[1], rabbit_url, party=True)
        assert _receive(b) == b"step-1"
        assert b.receive(0.5) is None  # acknowledged now: gone for good
    finally:
        a.close()
        b.close()


def test_reconnect_drops_a_redelivered_duplicate(rabbit_url: str, names: tuple[str, str]) -> None:
    a = RabbitTransport(names[0], rabbit_url, party=True)
    b = RabbitTransport(names[1], rabbit_url, party=True)
    try:
        a.send(names[1], b"once")
        assert b.receive(10) == b"once"
        b._connection.close()  # the link dies after the work, before the ack reaches the broker
        b.acknowledge()        # the ack fails; the transport reconnects
        assert b.receive(1.0) is None  # the redelivered copy is recognised and dropped
    finally:
        a.close()
        b.close()


def test_shards_go_to_helpers_not_the_coordinator(rabbit_url: str, names: tuple[str, str]) -> None:
    party = names[0]
    coordinator = RabbitTransport(party, rabbit_url, party=True)
    helper = RabbitTransport(party, rabbit_url, party=True)
    flow = RabbitTransport(f"flow.{names[1]}", rabbit_url, party=False)
    try:
        flow.send(party, b"command")
        assert _receive(coordinator) == b"command"  # the first consumer is the active one
        assert coordinator.helpers() == 1
        for k in range(4):
            coordinator.submit_work(b"shard-%d" % k)
        assert sorted(_receive(helper) for _ in range(4)) == [b"shard-%d" % k for k in range(4)]
        assert coordinator.receive(0.5) is None
    finally:
        flow.delete_inbox()
        for t in (coordinator, helper, flow):
            t.close()


def test_claims_hand_each_unit_to_exactly_one_process(rabbit_url: str,
                                                       names: tuple[str, str]) -> None:
    party = names[0]
    coordinator = RabbitTransport(party, rabbit_url, party=True)
    helper = RabbitTransport(party, rabbit_url, party=True)
    try:
        pool = coordinator.open_claims(40)
        taken: dict[str, list[int]] = {"coordinator": [], "helper": []}
        while True:  # alternate, as two processes racing would
            a, b = coordinator.claim(pool), helper.claim(pool)
            taken["coordinator"] += [a] if a is not None else []
            taken["helper"] += [b] if b is not None else []
            if a is None and b is None:
                break
        assert sorted(taken["coordinator"] + taken["helper"]) == list(range(40))
        assert taken["coordinator"] and taken["helper"]
        coordinator.close_claims(pool)
        assert helper.claim(pool) is None  # the pool is gone: the level is over
        with pytest.raises(TransportError, match="not a pool of this party"):
            helper.claim("fedboost.someone-else.work.x.units")
    finally:
        coordinator.close()
        helper.close()


def test_big_shards_reach_one_helper_whole_even_if_a_helper_dies(
        rabbit_url: str, names: tuple[str, str]) -> None:
    party = names[0]
    coordinator = RabbitTransport(party, rabbit_url, party=True, chunk_bytes=1024)
    first = RabbitTransport(party, rabbit_url, party=True, chunk_bytes=1024)
    second = RabbitTransport(party, rabbit_url, party=True, chunk_bytes=1024)
    flow = RabbitTransport(f"flow.{names[1]}", rabbit_url, party=False)
    try:
        flow.send(party, b"command")
        assert _receive(coordinator) == b"command"
        shards = [bytes([k]) * 5000 for k in range(4)]  # 5 chunks each
        for shard in shards:
            coordinator.submit_work(shard)
        taken = first.receive(10)
        assert taken in shards
        first.close()  # dies before finishing: its shard goes back, chunks and all
        got = sorted(_receive(second) for _ in range(4))
        assert got == sorted(shards)
        assert second.receive(0.5) is None
    finally:
        flow.delete_inbox()
        for t in (coordinator, second, flow):
            t.close()


def test_the_message_that_handed_out_work_is_acknowledged_after_the_work_is_out(
        rabbit_url: str, names: tuple[str, str]) -> None:
    party = names[0]
    coordinator = RabbitTransport(party, rabbit_url, party=True, chunk_bytes=1024)
    flow = RabbitTransport(f"flow.{names[1]}", rabbit_url, party=False)
    try:
        flow.send(party, b"command")
        assert coordinator.receive(10) == b"command"
        coordinator.submit_work(b"\x01" * 200_000)  # returns before it is published
        coordinator.submit_work(b"small")
        coordinator.acknowledge()  # waits for the publishing thread
        probe = pika.BlockingConnection(pika.URLParameters(rabbit_url))
        try:
            method = probe.channel().queue_declare(f"fedboost.{party}.work", durable=True,
                                                   passive=True).method
        finally:
            probe.close()
        assert method.message_count == 2  # the big shard's ticket and the small shard
        helper = RabbitTransport(party, rabbit_url, party=True, chunk_bytes=1024)
        try:  # taking them also removes the big shard's data queue
            assert sorted(_receive(helper) for _ in range(2)) == [b"\x01" * 200_000, b"small"]
        finally:
            helper.close()
    finally:
        flow.delete_inbox()
        coordinator.close()
        flow.close()


def test_acknowledging_waits_only_for_work_that_must_be_out_first(rabbit_url: str,
                                                                   names: tuple[str, str]) -> None:
    # Prepare: a publisher whose first job (to a queue that does not exist) keeps it retrying
    queue = f"fedboost.{names[0]}.work"
    setup = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    setup.channel().queue_declare(queue, durable=True)
    setup.close()
    publisher = WorkPublisher(names[0], pika.URLParameters(rabbit_url), reconnect_seconds=3.0,
                              heartbeat=60)
    props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    try:
        # Execute and assert: a job that only saves time is not waited for...
        publisher.submit(Publication([(f"{queue}.missing", b"x", props)], before_ack=False))
        assert publisher.flush(timeout=0.5)
        # ...but one that must be out is, and it goes out after what came before it
        publisher.submit(Publication([(queue, b"y", props)]))
        assert not publisher.flush(timeout=0.5)
        assert publisher.flush(timeout=30)
    finally:
        publisher.close()


def test_errors_are_clear(rabbit_url: str, names: tuple[str, str]) -> None:
    a = RabbitTransport(names[0], rabbit_url, party=True, reconnect_seconds=1.0)
    try:
        with pytest.raises(TransportError, match="is its worker running"):
            a.send(f"nobody{names[1]}", b"x")
        a.send(f"flow.gone{names[1]}", b"late reply")  # a finished flow: dropped, no error
        with pytest.raises(TransportError, match="exceeds"):
            RabbitTransport.send(a, names[0], b"x" * (a.max_message_bytes + 1))
    finally:
        a.close()
    with pytest.raises(TransportError, match="refused the login"):
        RabbitTransport(names[0], rabbit_url.replace("guest:guest", "guest:wrong"), party=True)
    with pytest.raises(TransportError, match=r"cannot reach the broker at 127.0.0.1:1 "
                                             r"\(connection refused\)"):
        RabbitTransport(names[0], "amqp://guest:guest@127.0.0.1:1/%2F", party=True,
                        reconnect_seconds=1.0)


def test_unconfirmed_sends_arrive_in_order_and_a_missing_queue_raises_nothing(
        rabbit_url: str, names: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """``send_unconfirmed`` (the scoring service's rounds): every message arrives, in order,
    a large one too (through ``send``); one for a party without a queue is logged as
    returned, and the next send still works (the channel survives the return)."""
    a = RabbitTransport(names[0], rabbit_url, party=True, chunk_bytes=1024)
    b = RabbitTransport(names[1], rabbit_url, party=True, chunk_bytes=1024)
    nobody = f"z{uuid.uuid4().hex[:8]}"
    try:
        big = bytes(range(256)) * 41  # above chunk_bytes: chunked, confirmed
        a.send_unconfirmed([(names[1], b"one"), (names[1], b"two"), (names[1], big)])
        assert [_receive(b), _receive(b), _receive(b)] == [b"one", b"two", big]
        with caplog.at_level("WARNING", logger="fedboost.transport"):
            a.send_unconfirmed([(nobody, b"lost")])
            assert a.receive(1.0) is None  # the broker's return is handled while receiving
        assert any("returned a message" in r.getMessage() and nobody in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        a.send_unconfirmed([(names[1], b"three")])
        assert _receive(b) == b"three"
    finally:
        a.close()
        b.close()
