"""Sockets that never start TLS (issue 37, item 2): the drill of the report, bounded. A service
under ``ulimit -n 1024`` (systemd's usual default) and its default ``--max-connections``; 1,100
TCP connections that never send a ClientHello. Before, a connection counted against the cap only
once its handshake was done: the idle ones took every descriptor, normal requests waited behind
them in the listen backlog (0 of 2 served in 30 s) and asyncio logged a "Too many open files"
traceback per failed accept."""

from __future__ import annotations

import os
import socket
import time

from tests.serving.federation import Federation, breast_ids

FILES = 1024
IDLE = 1100
ANSWER_SECONDS = 5.0
"""Well under the handshake deadline the idle sockets had before (the header timeout, 10 s)."""


def _rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_idle_sockets_that_never_send_a_client_hello_keep_no_request_out(
        federation: Federation, api_key: str) -> None:
    service = federation.serve_https("--header-timeout", "10", "--rate", "1000",
                                     log_name="flooded", files=FILES)
    idle: list[socket.socket] = []
    try:
        with federation.client(service, api_key, timeout=ANSWER_SECONDS) as client:
            assert client.post("/v1/score", json={"ids": breast_ids()[:2]}).status_code == 200
        lines, rss = len(service.lines()), _rss_mib(service.proc.pid)
        for _ in range(IDLE):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", service.port))
            idle.append(sock)
        time.sleep(1.0)  # the service accepts them
        descriptors = len(os.listdir(f"/proc/{service.proc.pid}/fd"))
        served = []
        for k in range(5):  # a new connection each: it must get past the idle ones
            with federation.client(service, api_key, timeout=ANSWER_SECONDS) as client:
                started = time.monotonic()
                reply = client.post("/v1/score", json={"ids": breast_ids()[k:k + 2]},
                                    headers={"Connection": "close"})
                served.append((reply.status_code, round(time.monotonic() - started, 2)))
        grown = _rss_mib(service.proc.pid) - rss
        logged = service.lines()[lines:]
    finally:
        for sock in idle:
            sock.close()
        service.stop()
    assert [status for status, _ in served] == [200] * 5, served
    assert descriptors < FILES - 100, descriptors  # room left for the broker, logs, files
    assert len(logged) < 20, logged[:5]  # no traceback per accept or handshake
    # at most --max-connections handshakes at once, 256 KiB of asyncio TLS buffers each
    assert grown < 200, grown
