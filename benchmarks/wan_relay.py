"""A WAN's latency in user space: a TCP relay that holds every chunk for the one-way delay.

    python -m benchmarks.wan_relay --listen 127.0.0.1:5673 --to 10.231.7.11:5672 --delay-ms 50
                                   [--record FILE]

This kernel has no netem, so a link's rate comes from ``tc tbf`` (``deploy/netns-federation.sh
shape``) and its latency from this relay, placed on the path of an organisation's connection:
it runs inside the organisation's namespace, its processes connect to it (``--listen``), and it
connects on to the broker (``--to``) over the namespace's rate-limited link. Each chunk read on
either side is written to the other ``delay`` seconds after it was read, in the order read, so a
request and its answer through it take 2 x delay more than without it and a stream's throughput
is the link's (the relay buffers up to ``MAX_BUFFERED`` bytes per direction, far more than a
100 Mbit/s x 50 ms link holds in flight). Nothing is parsed or changed: TLS passes through alike.

``--record FILE``: every chunk's arrival (wall clock), direction (``up``: from the organisation's
processes towards the broker; ``down``: back) and size, written as JSON when the relay stops
(SIGTERM or SIGINT); ``turns`` reads them back as request/answer turns.

Profiles (``PROFILES``) name a link: ``lan``, ``1gbit-5ms``, ``100mbit-50ms`` (SecretFlow's SGB
setting), ``10mbit-50ms``; the delay is one way (a round trip over ``100mbit-50ms`` takes 100 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 16
MAX_BUFFERED = 32 << 20
"""Bytes a direction may hold in its delay line before the relay stops reading that side."""


@dataclass(frozen=True)
class Profile:
    """A link: its rate (a ``tc`` rate, None: unlimited) and its one-way delay in seconds."""

    name: str
    rate: str | None
    delay: float

    @property
    def rate_bits(self) -> float | None:
        """The rate in bits per second (None: unlimited)."""
        if self.rate is None:
            return None
        units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
        for suffix, scale in units.items():
            if self.rate.endswith(suffix):
                return float(self.rate[:-len(suffix)]) * scale
        raise ValueError(f"rate {self.rate!r}: a number and kbit, mbit or gbit")

    @property
    def burst(self) -> str:
        """A token bucket deep enough for the rate: 10 ms of it, at least 32 kbit (a
        1 Gbit/s bucket of 32 kbit would empty between two timer ticks)."""
        bits = self.rate_bits or 0.0
        return f"{max(32_000, int(bits / 100)) // 1000}kbit"


PROFILES = {p.name: p for p in (
    Profile("lan", None, 0.0),
    Profile("1gbit-5ms", "1gbit", 0.005),
    Profile("100mbit-50ms", "100mbit", 0.050),
    Profile("10mbit-50ms", "10mbit", 0.050),
)}


class Recorder:
    """Every chunk's (wall-clock time, direction, bytes), in the order read."""

    def __init__(self) -> None:
        self.chunks: list[tuple[float, str, int]] = []

    def note(self, direction: str, size: int) -> None:
        self.chunks.append((time.time(), direction, size))

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({"chunks": self.chunks}))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                direction: str, recorder: Recorder | None) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` s after it was read, in order."""
    line: deque[tuple[float, bytes]] = deque()
    buffered = 0
    arrived, room = asyncio.Event(), asyncio.Event()
    room.set()
    done = False

    async def read() -> None:
        nonlocal buffered, done
        try:
            while chunk := await reader.read(CHUNK):
                if recorder is not None:
                    recorder.note(direction, len(chunk))
                line.append((time.monotonic() + delay, chunk))
                buffered += len(chunk)
                arrived.set()
                if buffered >= MAX_BUFFERED:
                    room.clear()
                    await room.wait()
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            arrived.set()

    async def write() -> None:
        nonlocal buffered
        while True:
            if not line:
                if done:
                    break
                arrived.clear()
                await arrived.wait()
                continue
            due, chunk = line[0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            line.popleft()
            writer.write(chunk)
            buffered -= len(chunk)
            if buffered < MAX_BUFFERED:
                room.set()
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    reading = asyncio.ensure_future(read())
    try:
        await write()
    except (ConnectionError, OSError):
        reading.cancel()
    await asyncio.gather(reading, return_exceptions=True)


async def _connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                      target: tuple[str, int], delay: float, recorder: Recorder | None) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(
            _pump(client_reader, server_writer, delay, "up", recorder),
            _pump(server_reader, client_writer, delay, "down", recorder))
    except asyncio.CancelledError:
        pass  # the relay stops (a cancelled connection task trips asyncio's streams in 3.11)
    finally:
        for writer in (client_writer, server_writer):
            writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int], delay: float,
                recorder: Recorder | None = None,
                started: asyncio.Event | None = None) -> None:
    """Relay connections to ``listen`` to ``target`` with ``delay`` s each way, until cancelled."""
    server = await asyncio.start_server(
        lambda r, w: _connection(r, w, target, delay, recorder), *listen)
    if started is not None:
        started.set()
    async with server:
        await server.serve_forever()


def turns(chunks: Iterable[tuple[float, str, int]], *, smallest: int = 100,
          since: float = float("-inf"), until: float = float("inf")) -> int:
    """Request/answer turns among ``chunks`` read between ``since`` and ``until``: how often a
    message going up (the organisation answering or asking) followed messages coming down,
    so that one side had to wait a round trip over the link for the other. Chunks under
    ``smallest`` bytes (AMQP heartbeats, acknowledgements, flow control) are not messages."""
    count, last = 0, None
    for at, direction, size in chunks:
        if size < smallest or not since <= at < until:
            continue
        if direction == "up" and last == "down":
            count += 1
        last = direction
    return count


def start_relay(prefix: Sequence[str], listen: tuple[str, int], target: tuple[str, int],
                delay: float, record: Path | None = None) -> subprocess.Popen[str]:
    """This relay as a process of its own started by ``prefix`` (e.g. ``ip netns exec NS``: in
    that namespace), once it listens; SIGTERM stops it (and writes ``record``)."""
    command = [*prefix, sys.executable, "-m", "benchmarks.wan_relay", "--listen",
               f"{listen[0]}:{listen[1]}", "--to", f"{target[0]}:{target[1]}",
               "--delay-ms", str(delay * 1000)]
    if record is not None:
        command += ["--record", str(record)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the relay did not start: {' '.join(command)} exited {proc.returncode}")
    return proc


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT to accept on")
    parser.add_argument("--to", type=_address, required=True, help="HOST:PORT to relay to")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay")
    parser.add_argument("--record", type=Path, help="write every chunk's time and size here")
    args = parser.parse_args(argv)
    recorder = Recorder() if args.record else None

    async def run() -> None:
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        task = asyncio.ensure_future(serve(args.listen, args.to, args.delay_ms / 1000,
                                           recorder, started))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        waiting = asyncio.ensure_future(started.wait())
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiting.cancel()
            task.result()  # it could not listen: say why
        print("ready", flush=True)
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(run())
    if recorder is not None:
        recorder.dump(args.record)
    sys.exit(0)


if __name__ == "__main__":
    main()
