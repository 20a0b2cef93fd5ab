"""Shared fixtures: real Prefect (ephemeral test harness), real keys, real data."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fedboost import _prefect_env

_prefect_env.configure()

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    if not DATA.is_dir():
        raise pytest.UsageError(f"real data not found at {DATA}: clone the repo beside shared/")


LONGEST_FILES = [
    "tests/test_netns_brokers.py", "tests/flows/test_lossless.py", "tests/flows/test_faults.py",
    "tests/test_first_hour.py", "tests/privacy/test_horizontal_long.py", "tests/test_api.py",
    "tests/flows/test_rabbitmq_training.py", "tests/flows/test_forest_faults.py",
    "tests/test_cli.py", "tests/flows/test_horizontal_resume.py", "tests/serving/test_flood.py",
    "tests/flows/test_forest.py", "tests/flows/test_rabbitmq_active_scale.py",
    "tests/flows/test_lossless_ou.py", "tests/serving/test_scoring.py", "tests/test_provision.py",
]
"""The files whose tests take longest in all (a CI run's --durations, 2026-12-04), longest
first. ``--dist loadfile`` hands whole files to the three workers in collection order, so a
long file collected last (tests/test_netns_brokers.py, ~6 minutes) ran alone at the end while
the other workers idled; handed out first, the short files fill in around them."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: k for k, name in enumerate(LONGEST_FILES)}

    def first(item: pytest.Item) -> int:
        return rank.get(Path(item.path).relative_to(REPO).as_posix(), len(rank))

    items.sort(key=first)  # stable: each file's tests keep their order


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One real ephemeral Prefect server for the whole session."""
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path_factory.mktemp("prefect-storage"))
    from prefect.testing.utilities import prefect_test_harness

    # a loaded machine may need longer: the variable Prefect's own ephemeral server reads
    wait = int(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90"))
    with prefect_test_harness(server_startup_timeout=max(90, wait)):
        yield


BROKER_URL = os.environ.get("FEDBOOST_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


@pytest.fixture(scope="session")
def rabbit_url() -> str:
    """The real local RabbitMQ. Under CI=true a missing broker fails the test, never skips it."""
    import pika
    import pika.exceptions

    try:
        pika.BlockingConnection(pika.URLParameters(BROKER_URL)).close()
    except pika.exceptions.AMQPError as exc:
        message = f"RabbitMQ is not reachable at {BROKER_URL}: {exc!r} (rabbitmq-server -detached)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return BROKER_URL


@pytest.fixture(scope="session")
def keypair_1024():  # type: ignore[no-untyped-def]
    """A real 1024-bit Paillier key pair, made once."""
    from crypto.paillier import generate_keypair

    return generate_keypair(1024)


@pytest.fixture(scope="session")
def ou_keypair_1024():  # type: ignore[no-untyped-def]
    """A real 1024-bit Okamoto-Uchiyama key pair (n = p^2 q, a 341-bit p), made once."""
    from crypto.ou import generate_keypair

    return generate_keypair(1024)


@pytest.fixture(params=["paillier", "ou"])
def scheme_keypair(request, keypair_1024, ou_keypair_1024):  # type: ignore[no-untyped-def]
    """The 1024-bit key pair of each scheme in turn (tests that hold for both)."""
    return keypair_1024 if request.param == "paillier" else ou_keypair_1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[str]:
    """A real 'prefect server start' on loopback with its own database."""
    from tests.scenarios import wait_until

    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api"
    try:
        wait_until(lambda: httpx.get(f"{api}/health", timeout=2).status_code == 200, 120,
                   f"prefect server on {api}")
        yield api
    finally:
        proc.terminate()
        proc.wait(timeout=30)
