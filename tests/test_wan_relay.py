"""The WAN's delay relay (``benchmarks.wan_relay``, issue 38 item 3): a round trip through it
takes twice its one-way delay, a stream through it arrives whole and in order, and behind a
rate-limited link a bulk transfer through it still reaches the link's rate."""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import subprocess
import sys
import time

import pytest

from benchmarks.wan_relay import PROFILES, serve, turns
from tests.netns import STREAM_SINK, STREAM_SOURCE, NetnsFederation, up_or_skip


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _through_relay(delay: float, exchange):  # type: ignore[no-untyped-def]
    """Run ``exchange(reader, writer)`` against an echo server behind a relay of ``delay``."""
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    target = echo.sockets[0].getsockname()[:2]
    started = asyncio.Event()
    # port 0 would not tell us where it listens; a fixed high port of this test's own
    relay = asyncio.ensure_future(serve(("127.0.0.1", 47391), target, delay, started=started))
    await started.wait()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", 47391)
        result = await exchange(reader, writer)
        writer.close()
        return result
    finally:
        relay.cancel()
        echo.close()
        await asyncio.gather(relay, return_exceptions=True)


def test_a_round_trip_through_the_relay_takes_twice_its_delay() -> None:
    delay = 0.05

    async def ping(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> list[float]:
        times = []
        for k in range(8):
            started = time.perf_counter()
            writer.write(b"ping %d" % k)
            await writer.drain()
            assert await reader.readexactly(len(b"ping %d" % k)) == b"ping %d" % k
            times.append(time.perf_counter() - started)
        return times

    times = asyncio.run(_through_relay(delay, ping))
    print("round trips (ms):", " ".join(f"{t * 1000:.1f}" for t in times))
    assert min(times) >= 2 * delay - 0.001, times  # never early: each way holds the delay
    # and adds little else: the best round trip within 10 ms of the delays (a busy machine's
    # scheduling spreads the others: median 111 ms in a CI run at load 7 on 2 cores)
    assert min(times) <= 2 * delay + 0.010, times
    assert statistics.median(times) <= 2 * delay + 0.050, times


def test_a_stream_through_the_relay_arrives_whole_and_in_order() -> None:
    payload = b"".join(b"%08d" % k for k in range(400_000))  # 3.2 MB, every position numbered

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        async def send() -> None:
            for at in range(0, len(payload), 10_000):
                writer.write(payload[at:at + 10_000])
                await writer.drain()
        sending = asyncio.ensure_future(send())
        back = await reader.readexactly(len(payload))
        await sending
        return back

    back = asyncio.run(_through_relay(0.02, stream))
    assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()


def test_turns_count_answers_that_followed_what_came_down() -> None:
    chunks = [(0.0, "down", 500), (0.1, "up", 8), (0.2, "up", 900),  # a heartbeat, an answer
              (0.3, "down", 300), (0.4, "down", 300), (0.5, "up", 21), (0.6, "up", 400),
              (0.7, "up", 400), (0.8, "down", 8), (0.9, "up", 200)]  # a heartbeat between
    assert turns(chunks) == 2
    assert turns(chunks, since=0.25) == 1




@pytest.mark.parametrize("name", ["10mbit-50ms"])
def test_a_bulk_transfer_through_the_relay_reaches_the_link_rate(name: str) -> None:
    """Namespace ``a`` with ``name``'s link: 3 MB from ``a`` through the relay (in ``a``, 50 ms
    each way) to ``b`` arrive at the tbf rate (at least 80% of it, not above it)."""
    profile = PROFILES[name]
    rate = profile.rate_bits / 8  # type: ignore[operator]
    size = 3_000_000
    federation = up_or_skip(NetnsFederation(orgs=("a", "b"), machines=(), brokers=False))
    try:
        a, b = federation["a"], federation["b"]
        sink = b.popen([sys.executable, "-c", STREAM_SINK, b.address, "7202", "60"],
                       stdout=subprocess.PIPE, text=True)
        try:
            assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
            with federation.wan("a", profile, (b.address, 7202), listen_port=7201) as (host, port):
                started = time.monotonic()
                subprocess.run(a.command([sys.executable, "-c", STREAM_SOURCE, host, str(port),
                                          str(size), "60"]), check=True, timeout=120)
                got = json.loads(sink.stdout.readline())
                elapsed = time.monotonic() - started
            assert sink.wait(timeout=30) == 0
        finally:
            if sink.poll() is None:
                sink.kill()
                sink.wait()
        assert "link=unlimited" in federation.status()  # lifted after the block
    finally:
        federation.down()
    assert got["bytes"] == size
    speed = size / got["seconds"]
    print(f"{name}: {speed / 1e6:.2f} MB/s through the relay ({rate / 1e6:.2f} MB/s the rate), "
          f"{elapsed:.1f} s in all")
    assert 0.8 * rate <= speed <= 1.1 * rate, speed
    assert elapsed >= profile.delay  # the first byte waited for the delay
