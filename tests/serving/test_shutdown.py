"""Starting and stopping the scoring service: no authentication only when asked for, with a
warning; SIGTERM finishes the requests in flight, closes the session at every party and
leaves no queue on the broker."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time

import httpx
import pytest

from fedboost.cli import main
from messages.envelope import MsgType
from tests.conftest import _free_port
from tests.serving.federation import Federation, Firehose, breast_ids, queues_of


def test_serve_model_without_authentication_needs_insecure_no_auth(
        federation: Federation, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve-model", str(federation.runs), "--port", str(_free_port())])
    assert code == 1
    assert capsys.readouterr().err.strip().startswith(
        "fedboost: error: serve-model needs authentication: --api-keys FILE")


def test_a_port_in_use_fails_the_start_at_once_naming_it(
        federation: Federation, capsys: pytest.CaptureFixture[str]) -> None:
    """Bound before the session opens: a port another process holds is one line and exit 1
    before any party hears of a session (a CI run's service, whose port was taken while it
    opened its session, logged 'serving ... at' and then listened nowhere until SIGTERM)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        code = main(["serve-model", str(federation.runs), "--port", str(port),
                     "--insecure-no-auth"])
    assert code == 1 and time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert f"fedboost: error: cannot listen on 127.0.0.1:{port}: Address already in use" in err
    assert "serving" not in capsys.readouterr().out


def test_the_listening_socket_gives_its_connections_tcp_nodelay() -> None:
    """A response goes out at once, not after the client's delayed ACK: the pre-bound socket
    must say TCP, or asyncio leaves Nagle on for every connection it accepts (p50 of a single
    row 56 ms against 14 ms before the socket was bound by hand, benchmarks.serving A/B)."""
    import asyncio

    from fedboost.serving import listening_socket

    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    class Record(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        sock.listen()
        server = await asyncio.get_running_loop().create_server(Record, sock=sock)
        async with server:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(accept_one())
    assert seen and seen[0] != 0


def test_sigterm_drains_requests_closes_the_session_and_deletes_its_queue(
        federation: Federation, firehose: Firehose) -> None:
    service = federation.serve("--insecure-no-auth", "--timeout", "30", log_name="insecure")
    assert any(line.startswith("fedboost: warning: serving without authentication")
               for line in service.lines())
    (session,) = re.findall(r"\(session ([^;]+);", service.log.read_text())
    reply_queue = f"fedboost.flow.{session}."
    assert any(q.startswith(reply_queue) for q in queues_of(federation.url))
    bureau = federation.workers["bureau"]
    replies: list[httpx.Response] = []
    firehose.drain()
    bureau.send_signal(signal.SIGSTOP)  # the round waits for the bureau's answer
    try:
        asking = threading.Thread(target=lambda: replies.append(httpx.post(
            f"{service.base}/v1/score", json={"ids": breast_ids()[30:40]}, timeout=60)))
        asking.start()
        deadline = time.monotonic() + 30
        while not any(c.queue == f"fedboost.{federation.name('bureau')}"
                      for c in firehose.drain()):
            assert time.monotonic() < deadline, "the round never went out"
            time.sleep(0.05)
        service.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        with pytest.raises(httpx.TransportError):  # no new connection is taken meanwhile
            httpx.get(f"{service.base}/healthz", timeout=5)
    finally:
        bureau.send_signal(signal.SIGCONT)
    asking.join(timeout=60)
    assert replies and replies[0].status_code == 200, replies  # drained, not dropped
    assert service.proc.wait(timeout=60) == 0
    closed = {c.queue.removeprefix("fedboost.") for c in firehose.drain()
              if c.envelope is not None and c.envelope.kind == MsgType.CLOSE_JOB}
    assert closed == {federation.name(p) for p in ("guest", "bureau", "telco")}
    assert [q for q in queues_of(federation.url) if q.startswith(reply_queue)] == []
