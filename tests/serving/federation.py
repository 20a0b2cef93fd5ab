"""A federation for the scoring service's tests: three real 'fedboost worker' processes on a
RabbitMQ virtual host of their own (with the broker's firehose on, so a test sees every
message that crosses it), a model trained over them with 'fedboost train', a test CA's
certificates, and 'fedboost serve-model' processes (real uvicorn) in front of them."""

from __future__ import annotations

import csv
import os
import resource
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import msgpack
import pika
import yaml

from fedboost.local_workers import start_worker
from messages.envelope import Envelope, decode_envelope
from tests.conftest import _free_port
from tests.scenarios import DATA, REPO, rabbitmqctl

FEDBOOST = [sys.executable, "-m", "fedboost.cli"]
ROUND_TIMEOUT = 3.0
HOST_COLUMNS = {"bureau": [f"x{k}" for k in range(10)], "telco": [f"x{k}" for k in range(10, 20)]}
PARTIES = ("guest", *HOST_COLUMNS)


def env() -> dict[str, str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    environ.pop("PREFECT_API_URL", None)
    return environ


def breast_ids() -> list[str]:
    with open(DATA / "breast_hetero_guest.csv", newline="") as handle:
        return [row["id"] for row in csv.DictReader(handle)]


@contextmanager
def private_vhost(broker_url: str, tag: str) -> Iterator[str]:
    """A virtual host of our own with the firehose on (``rabbitmqctl trace_on``): its URL.
    Deleting it at the end deletes every queue left in it."""
    ctl = rabbitmqctl()
    vhost = f"fedboost-serving-{tag}"

    def run(*args: str) -> str:
        return subprocess.run([ctl, "-q", *args], check=True, capture_output=True, text=True,
                              timeout=120).stdout

    run("add_vhost", vhost)
    try:
        run("set_permissions", "-p", vhost, urlsplit(broker_url).username or "guest",
            ".*", ".*", ".*")
        run("trace_on", "-p", vhost)
        parts = urlsplit(broker_url)
        yield urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    finally:
        run("delete_vhost", vhost)


def queues_of(url: str) -> list[str]:
    """The queues of the URL's virtual host (``rabbitmqctl list_queues``)."""
    vhost = urlsplit(url).path.lstrip("/").replace("%2F", "/").replace("%2f", "/")
    out = subprocess.run([rabbitmqctl(), "-q", "list_queues", "-p", vhost, "name"],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    return [line.strip() for line in out.splitlines()[1:] if line.strip()]


@dataclass(frozen=True)
class Crossed:
    """One message published on the broker, as the firehose saw it."""

    queue: str
    envelope: Envelope | None


class Firehose:
    """Every message published in a virtual host (``amq.rabbitmq.trace``), decoded."""

    def __init__(self, url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.queue = self.channel.queue_declare("", exclusive=True, arguments={
            "x-max-length": 200_000}).method.queue
        self.channel.queue_bind(self.queue, "amq.rabbitmq.trace", "publish.#")

    def drain(self) -> list[Crossed]:
        """What was published since the last drain."""
        crossed = []
        while True:
            method, props, body = self.channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                return crossed
            for queue in (props.headers or {}).get("routing_keys", []):
                crossed.append(Crossed(str(queue), _envelope(body)))

    def close(self) -> None:
        self.connection.close()


def _envelope(body: bytes) -> Envelope | None:
    try:
        return decode_envelope(msgpack.unpackb(body, raw=False)["envelope"])
    except Exception:  # a chunk of a larger message, a claim token: not an envelope
        return None


def make_certs(folder: Path, clients: list[str]) -> Path:
    """A test CA, a server certificate for localhost and 127.0.0.1, a certificate per client
    (``deploy/make-certs.sh``)."""
    subprocess.run(["sh", str(REPO / "deploy" / "make-certs.sh"), "-o", str(folder), "-s",
                    "localhost", *clients], check=True, capture_output=True, timeout=120)
    return folder


@dataclass
class Service:
    """A running 'fedboost serve-model'."""

    proc: subprocess.Popen[bytes]
    base: str
    log: Path
    port: int

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=90)


@dataclass
class Federation:
    """Three running workers and a model trained over them."""

    root: Path
    tag: str
    url: str
    runs: Path
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    missing_at_bureau: str = ""
    """An id every party but bureau has a row for."""

    def name(self, party: str) -> str:
        return f"{party}{self.tag}"

    @property
    def tls(self) -> Path:
        return self.root / "tls"

    @property
    def keys(self) -> Path:
        return self.root / "api-keys.json"

    def start_worker(self, party: str) -> None:
        name = self.name(party)
        self.workers[party] = start_worker(name, self.root / f"{name}.yaml",
                                           log=self.root / f"{name}.log", append=True,
                                           env=env(), cwd=self.root)

    def serve(self, *flags: str, log_name: str = "serve", files: int | None = None) -> Service:
        """Start 'fedboost serve-model' on the trained model; wait until it listens. ``files``:
        the process's descriptor limit (soft and hard), as ``ulimit -n`` sets it."""
        port = _free_port()
        log = self.root / f"{log_name}-{port}.log"

        def limited() -> None:
            if files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

        proc = subprocess.Popen(
            [*FEDBOOST, "serve-model", str(self.runs), "--port", str(port), "--timeout",
             str(ROUND_TIMEOUT), "--max-ids", "100", "--round-rows", "512", *flags],
            stdout=log.open("w"), stderr=subprocess.STDOUT,
            env={**env(), "FEDBOOST_AMQP_URL": self.url}, cwd=self.root, preexec_fn=limited)
        scheme = "https" if "--tls-cert" in flags else "http"
        service = Service(proc, f"{scheme}://127.0.0.1:{port}", log, port)
        deadline = time.monotonic() + 120
        while "/v1/score (session" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                service.stop()
                raise AssertionError(f"serve-model did not start: {log.read_text()}")
            time.sleep(0.2)
        _wait_listening(port)
        return service

    def serve_https(self, *flags: str, log_name: str, files: int | None = None) -> Service:
        """``serve`` as the package's service is deployed: HTTPS, client certificates signed
        by the test CA, the API keys file."""
        tls = self.tls
        return self.serve("--api-keys", str(self.keys), "--tls-cert", str(tls / "server.pem"),
                          "--tls-key", str(tls / "server.key"), "--tls-client-ca",
                          str(tls / "ca.pem"), *flags, log_name=log_name, files=files)

    def tls_context(self, client: str | None = "client_a") -> ssl.SSLContext:
        """Trusts the test CA; presents ``client``'s certificate (None: none)."""
        context = ssl.create_default_context(cafile=str(self.tls / "ca.pem"))
        if client is not None:
            context.load_cert_chain(self.tls / f"{client}.pem", self.tls / f"{client}.key")
        return context

    def client(self, service: Service, key: str | None, cert: str | None = "client_a",
               **options: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        verify: Any = self.tls_context(cert) if service.base.startswith("https") else True
        return httpx.Client(base_url=service.base, headers=headers, verify=verify,
                            timeout=options.pop("timeout", 30), **options)

    def async_client(self, service: Service, key: str, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=service.base, headers={
            "Authorization": f"Bearer {key}"}, verify=self.tls_context(), timeout=30, **options)


def _wait_listening(port: int) -> None:
    import socket

    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def write_worker_file(fed: Federation, party: str) -> None:
    """A party's own worker file: its data set, its policy (batched answers allowed). The
    bureau's data set lacks one row the others have."""
    file = "guest" if party == "guest" else "host"
    data = DATA / f"breast_hetero_{file}.csv"
    if party == "bureau":
        rows = list(csv.DictReader(data.open(newline="")))
        fed.missing_at_bureau = rows[-1]["id"]
        data = fed.root / "bureau.csv"
        with data.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows[:-1])
    applicants: dict[str, Any] = {"data": str(data), "id": "id"}
    if party == "guest":
        applicants["label"] = "y"
    else:
        applicants["columns"] = HOST_COLUMNS[party]
    name = fed.name(party)
    raw = {"party": name, "datasets": {"applicants": applicants},
           "models": str(fed.root / "models"),
           "policy": {"min_key_bits": 1024, "predict_modes": ["path", "batched"]},
           "transport": {"kind": "rabbitmq", "url": fed.url},
           "signing": {"key_dir": str(fed.root / "keys")}}
    (fed.root / f"{name}.yaml").write_text(yaml.safe_dump(raw))


def write_job_file(fed: Federation) -> Path:
    tag = fed.tag
    parties = {f"guest{tag}": {"role": "active", "dataset": "applicants", "label": "y"},
               **{f"{p}{tag}": {"role": "passive", "dataset": "applicants"} for p in HOST_COLUMNS}}
    raw = {"job": f"breast-serve-{tag}", "protocol": "vertical_secureboost", "parties": parties,
           "params": {"n_trees": 4, "max_depth": 3, "learning_rate": 0.3, "max_bin": 32,
                      "objective": "binary"},
           "crypto": {"key_bits": 1024}, "transport": {"kind": "rabbitmq"},
           "signing": {"key_dir": str(fed.root / "keys")}}
    path = fed.root / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def new_tag() -> str:
    return uuid.uuid4().hex[:6]
