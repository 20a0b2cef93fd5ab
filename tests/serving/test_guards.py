"""The scoring service's guards against a real uvicorn (serve-model over HTTPS, with client
certificates and API keys) in front of three real workers: who may ask, which Host, how much
and how fast, slow clients, metrics and the access log. Attacks stay on loopback and are
bounded in count and time."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedboost.api_keys import add_key, digest
from fedboost.cli import main
from tests.scenarios import REPO
from tests.serving.federation import Federation, Service, breast_ids

SLOW_HEADERS = 90
SLOW_BODIES = 20


def _raw(fed: Federation, service: Service, cert: str | None = "client_b") -> ssl.SSLSocket:
    """A TLS connection of our own, to send exactly the bytes a test wants."""
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    return fed.tls_context(cert).wrap_socket(sock, server_hostname="localhost")


def _answer(sock: ssl.SSLSocket, seconds: float = 10.0) -> bytes | None:
    """What the server sends until it closes the connection; None if still open after
    ``seconds``."""
    got = b""
    sock.settimeout(seconds)
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        return None
    except (OSError, ssl.SSLError):
        pass
    return got


def _rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _metrics(fed: Federation, service: Service, key: str) -> dict[tuple[str, tuple], float]:
    with fed.client(service, key) as client:
        text = client.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_client_needs_a_key_and_a_certificate(federation: Federation, service: Service,
                                                api_key: str) -> None:
    with federation.client(service, None) as client:  # a certificate, no key
        reply = client.post("/v1/score", json={"ids": breast_ids()[:1]})
    assert reply.status_code == 401 and reply.headers["www-authenticate"].startswith("Bearer")
    assert reply.json()["detail"] == "an API key is required (Authorization: Bearer <key>)"
    forged = api_key[:13] + ("A" if api_key[13] != "A" else "B") + api_key[14:]
    with federation.client(service, forged) as client:
        assert client.get("/healthz").status_code == 401
    with pytest.raises(httpx.TransportError):  # a key, no certificate: no TLS session
        with federation.client(service, api_key, cert=None) as client:
            client.get("/healthz")
    with pytest.raises(httpx.TransportError):  # plain HTTP to the HTTPS port
        httpx.get(f"http://127.0.0.1:{service.port}/healthz", timeout=10)


def test_keys_are_hashed_at_rest_named_in_the_log_and_revoked_without_a_restart(
        federation: Federation, service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    keys = str(federation.keys)
    assert main(["serve-model-keys", "--keys", keys, "add", "analyst", "--certificate",
                 "client_a"]) == 0
    key = capsys.readouterr().out.strip()
    text = federation.keys.read_text()
    assert key not in text and key[13:] not in text and digest(key) in text
    assert federation.keys.stat().st_mode & 0o077 == 0

    def status() -> int:
        with federation.client(service, key) as client:
            return client.post("/v1/score", json={"ids": breast_ids()[:2]}).status_code

    deadline = time.monotonic() + 10
    while (code := status()) == 401 and time.monotonic() < deadline:
        time.sleep(0.2)  # the service looks at the file once a second
    assert code == 200
    assert main(["serve-model-keys", "--keys", keys, "revoke", "analyst"]) == 0
    deadline = time.monotonic() + 10
    while (code := status()) == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert code == 401
    assert service.proc.poll() is None  # no restart
    capsys.readouterr()
    assert main(["serve-model-keys", "--keys", keys, "list"]) == 0
    (listed,) = [r for r in capsys.readouterr().out.splitlines() if r.startswith("analyst\t")]
    assert "\trevoked 20" in listed
    lines = service.lines()
    assert not [line for line in lines if key[13:] in line]  # never logged
    served = [json.loads(line) for line in lines if '"client":"analyst"' in line]
    assert served and all(entry["path"] == "/v1/score" for entry in served)
    assert {entry["status"] for entry in served} == {200}


def test_a_host_header_outside_the_allowlist_is_refused(
        federation: Federation, service: Service, api_key: str) -> None:
    with federation.client(service, api_key) as client:
        rebound = client.get("/healthz", headers={"Host": f"attacker.example:{service.port}"})
        assert rebound.status_code == 400, rebound.text
        assert client.get("/healthz", headers={"Host": f"localhost:{service.port}"}
                          ).status_code == 200
        assert client.get("/healthz").status_code == 200  # Host: 127.0.0.1:port


def test_an_oversize_body_is_refused_before_it_is_read(
        federation: Federation, service: Service, api_key: str) -> None:
    rss = _rss_kib(service.proc.pid)
    with _raw(federation, service) as sock:  # declares 40 MB, sends none of it
        started = time.monotonic()
        sock.sendall(f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                     f"{api_key}\r\nContent-Type: application/json\r\nContent-Length: "
                     f"40000000\r\n\r\n".encode())
        answer = _answer(sock) or b""
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert time.monotonic() - started < 5
    with _raw(federation, service) as sock:  # chunked: no length declared, 40 MB streamed
        sock.sendall(f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                     f"{api_key}\r\nContent-Type: application/json\r\nTransfer-Encoding: "
                     f"chunked\r\n\r\n".encode())
        chunk = b"100000\r\n" + b" " * 0x100000 + b"\r\n"
        sent = 0
        try:
            while sent < 40 * 2**20:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the service answered and closed while we were still sending
        answer = _answer(sock) or b""
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert sent < 40 * 2**20
    assert _rss_kib(service.proc.pid) - rss < 40 * 1024  # the 40 MB never sat in memory


def test_a_client_over_its_rate_gets_429_with_retry_after(
        federation: Federation, service: Service) -> None:
    key = add_key(federation.keys, "hasty", rate=1.0, scopes=("metrics",),  # bursts of 2
                  certificates=("client_a",))
    with federation.client(service, key) as client:
        deadline = time.monotonic() + 10
        while client.get("/healthz").status_code == 401 and time.monotonic() < deadline:
            time.sleep(0.3)  # until the service reloaded the keys file
        replies = [client.get("/healthz") for _ in range(4)]
    assert replies[-1].status_code == 429, [r.status_code for r in replies]
    assert int(replies[-1].headers["retry-after"]) >= 1
    assert replies[-1].json()["detail"] == "too many requests: at most 1 a second"


def test_slow_clients_neither_exhaust_the_service_nor_keep_others_out(
        federation: Federation, service: Service, api_key: str) -> None:
    """Slowloris: clients that send half their headers, or half their body, and wait."""
    before = _metrics(federation, service, api_key)
    started = time.monotonic()
    slow = []
    for k in range(SLOW_HEADERS + SLOW_BODIES):
        sock = _raw(federation, service)
        if k < SLOW_HEADERS:
            sock.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        else:
            sock.sendall(f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                         f"{api_key}\r\nContent-Length: 1000\r\n\r\n{{\"ids\": [".encode())
        slow.append(sock)
    try:  # the others are served while the slow ones hold their connections
        descriptors = len(os.listdir(f"/proc/{service.proc.pid}/fd"))
        assert descriptors < 48 + 100, descriptors  # --max-connections 48
        with federation.client(service, api_key) as client:
            for k in range(10):
                reply = client.post("/v1/score", json={"ids": breast_ids()[k:k + 1]},
                                    headers={"Connection": "close"})
                assert reply.status_code == 200, reply.text
        time.sleep(max(0.0, started + 2.0 + 3.0 - time.monotonic()))  # --*-timeout 2
        answers = [_answer(sock, 0.2) for sock in slow]  # every one closed by the service
    finally:
        for sock in slow:
            sock.close()
    assert all(a is not None and (a == b"" or a.split(b" ")[1] in (b"408", b"503"))
               for a in answers), answers[:3]
    after = _metrics(federation, service, api_key)
    dropped = {reason: after.get(("fedboost_scoring_connections_dropped_total",
                                  (("reason", reason),)), 0.0)
               - before.get(("fedboost_scoring_connections_dropped_total",
                             (("reason", reason),)), 0.0)
               for reason in ("evicted", "header_timeout", "body_timeout")}
    assert sum(dropped.values()) >= SLOW_HEADERS + SLOW_BODIES, dropped
    assert dropped["evicted"] > 0 and dropped["header_timeout"] > 0, dropped


def test_a_connection_that_never_starts_tls_is_closed_after_the_handshake_timeout(
        service: Service) -> None:
    with socket.create_connection(("127.0.0.1", service.port), timeout=20) as sock:
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the service, not by our timeout
    assert time.monotonic() - started < 8  # --tls-handshake-timeout 5 (asyncio's: 60 s)


def test_metrics_count_requests_rows_and_each_partys_rounds(
        federation: Federation, service: Service, api_key: str) -> None:
    before = _metrics(federation, service, api_key)
    with federation.client(service, api_key) as client:
        assert client.post("/v1/score", json={"ids": breast_ids()[400:450]}).status_code == 200
    with federation.client(service, None) as client:
        assert client.get("/healthz").status_code == 401
    after = _metrics(federation, service, api_key)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("fedboost_scoring_rows_total") == 50
    assert grew("fedboost_scoring_requests_total", path="/v1/score", status="200") == 1
    assert grew("fedboost_scoring_requests_total", path="/healthz", status="401") == 1
    assert grew("fedboost_scoring_request_seconds_count", path="/v1/score") == 1
    for party in ("guest", "bureau", "telco"):
        for kind in ("find", "score"):  # new ids: a membership round, then the scoring one
            assert grew("fedboost_scoring_party_round_seconds_count",
                        party=federation.name(party), kind=kind) == 1, (party, kind)
    assert after[("fedboost_scoring_api_keys", ())] >= 1


def test_access_log_lines_are_json_naming_the_client(
        federation: Federation, service: Service, api_key: str) -> None:
    with federation.client(service, api_key) as client:
        client.post("/v1/score", json={"ids": breast_ids()[:7]})
    deadline = time.monotonic() + 10
    while True:  # the line is written once the response has gone
        entries = [json.loads(line) for line in service.lines() if line.startswith("{")]
        scored = [e for e in entries if e.get("path") == "/v1/score" and e.get("ids") == 7]
        if scored or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert scored and set(scored[-1]) >= {"ts", "event", "client", "peer", "method", "path",
                                          "status", "ms", "ids"}
    assert scored[-1]["client"] == "tests" and scored[-1]["status"] == 200
    assert scored[-1]["peer"] == "127.0.0.1" and scored[-1]["event"] == "request"


def test_livez_answers_ok_without_a_key_or_an_allowed_host_and_tells_nothing(
        federation: Federation, service: Service) -> None:
    """Issue 37, item 4: a container or Kubernetes probe sends no key (and asks by the pod's
    address, not an allowed Host); every endpoint used to answer it 401."""
    with federation.client(service, None) as client:
        reply = client.get("/livez", headers={"Host": "10.1.2.3:8443"})
        assert (reply.status_code, reply.text) == (200, "ok")
        assert client.get("/healthz").status_code == 401  # the rest still needs a key
    probe = [sys.executable, str(REPO / "deploy" / "healthcheck.py"), "live",
             f"{service.base}/livez", str(federation.tls / "ca.pem"),
             str(federation.tls / "client_a.pem"), str(federation.tls / "client_a.key")]
    assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    stranger = subprocess.run(probe[:5], capture_output=True, timeout=30)  # no certificate
    assert stranger.returncode == 1  # --tls-client-ca: the handshake needs one


def test_metrics_and_health_need_a_key_with_the_metrics_scope(
        federation: Federation, service: Service, api_key: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37, item 4: /metrics (party names, session id, per-party round times) was
    readable by every scoring key."""
    assert main(["serve-model-keys", "--keys", str(federation.keys), "add",
                 "scorer-only", "--certificate", "client_a"]) == 0  # no --scope: scoring
    scorer = capsys.readouterr().out.strip()
    time.sleep(1.2)  # the service rereads the keys file at most once a second
    with federation.client(service, scorer) as client:
        assert client.post("/v1/score", json={"ids": breast_ids()[:1]}).status_code == 200
        for path in ("/metrics", "/healthz", "/readyz"):
            refused = client.get(path)
            assert refused.status_code == 403, (path, refused.text)
            assert "needs the metrics scope" in refused.json()["detail"]
    assert main(["serve-model-keys", "--keys", str(federation.keys), "add", "watcher",
                 "--scope", "metrics", "--certificate", "client_a"]) == 0
    watcher = capsys.readouterr().out.strip()
    assert main(["serve-model-keys", "--keys", str(federation.keys), "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("scorer-only\t") and "\tscopes score\t" in line
               for line in listed), listed
    assert any(line.startswith("watcher\t") and "\tscopes metrics\t" in line
               for line in listed), listed
    assert any(line.startswith("tests\t") and "\tscopes score,metrics\t" in line
               for line in listed), listed
    time.sleep(1.2)
    with federation.client(service, watcher) as client:
        assert client.get("/metrics").status_code == 200
        assert client.get("/healthz").status_code == 200
        refused = client.post("/v1/score", json={"ids": breast_ids()[:1]})
        assert refused.status_code == 403 and "score scope" in refused.json()["detail"]
    with federation.client(service, api_key) as client:  # both scopes
        assert client.get("/metrics").status_code == 200


def test_a_key_goes_with_its_own_clients_certificate_only(
        federation: Federation, service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37, item 3: with client certificates and keys both asked for, client_b's
    certificate with lender-web's key was served, and logged as lender-web."""
    assert main(["serve-model-keys", "--keys", str(federation.keys), "add",
                 "lender-web", "--certificate", "client_a"]) == 0
    key = capsys.readouterr().out.strip()
    assert main(["serve-model-keys", "--keys", str(federation.keys), "add", "client_b"]) == 0
    own = capsys.readouterr().out.strip()  # named as its certificate: no --certificate needed
    time.sleep(1.2)  # the service rereads the keys file at most once a second
    ids = breast_ids()[:1]
    with federation.client(service, key, cert="client_a") as client:
        assert client.post("/v1/score", json={"ids": ids}).status_code == 200
    with federation.client(service, key, cert="client_b") as client:
        refused = client.post("/v1/score", json={"ids": ids})
    assert refused.status_code == 403, refused.text
    assert refused.json()["detail"] == ("the API key of client lender-web does not go with "
                                        "the client certificate of client_b")
    with federation.client(service, own, cert="client_b") as client:
        assert client.post("/v1/score", json={"ids": ids}).status_code == 200
    with federation.client(service, own, cert="client_a") as client:
        assert client.post("/v1/score", json={"ids": ids}).status_code == 403
