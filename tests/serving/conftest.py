"""One federation for every scoring service test: three workers on a virtual host of their own,
a model trained over them, and a service as it should be deployed (HTTPS, client certificates
and API keys), started once."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from fedboost.api_keys import add_key
from fedboost.cli import main
from messages.signing import write_key_pair
from tests.serving.federation import (PARTIES, Federation, Firehose, Service, make_certs,
                                      new_tag, private_vhost, write_job_file, write_worker_file)

SERVICE_FLAGS = ["--max-connections", "48", "--header-timeout", "2", "--body-timeout", "2",
                 "--rate", "1000"]


@pytest.fixture(scope="package")
def federation(rabbit_url: str, prefect_harness: None,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    root = tmp_path_factory.mktemp("serving")
    tag = new_tag()
    with private_vhost(rabbit_url, tag) as url:
        fed = Federation(root, tag, url, root / "runs")
        for party in PARTIES:
            write_key_pair(root / "keys", fed.name(party))
            write_worker_file(fed, party)
        write_key_pair(root / "keys", "flow")
        make_certs(fed.tls, ["client_a", "client_b"])
        with pytest.MonkeyPatch.context() as environ:
            environ.setenv("FEDBOOST_AMQP_URL", url)  # the job file names no broker password
            for party in PARTIES:
                fed.start_worker(party)
            try:
                assert main(["train", str(write_job_file(fed)), "--out", str(fed.runs)]) == 0
                yield fed
            finally:
                for proc in fed.workers.values():
                    proc.send_signal(signal.SIGTERM)
                for proc in fed.workers.values():
                    proc.wait(timeout=60)


@pytest.fixture(scope="package")
def api_key(federation: Federation) -> str:
    """The key of client ``tests``, both scopes (the service reads the keys file)."""
    return add_key(federation.keys, "tests", scopes=("score", "metrics"),
                   certificates=("client_a", "client_b"))


@pytest.fixture(scope="package")
def service(federation: Federation, api_key: str) -> Iterator[Service]:
    """serve-model over HTTPS, asking for a client certificate and an API key."""
    tls = federation.tls
    running = federation.serve(
        "--api-keys", str(federation.keys), "--tls-cert", str(tls / "server.pem"),
        "--tls-key", str(tls / "server.key"), "--tls-client-ca", str(tls / "ca.pem"),
        *SERVICE_FLAGS)
    yield running
    running.stop()


@pytest.fixture
def firehose(federation: Federation) -> Iterator[Firehose]:
    hose = Firehose(federation.url)
    yield hose
    hose.close()
