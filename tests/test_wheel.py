"""The package as a wheel gives it: built from the source files alone, installed in a fresh
virtualenv outside the checkout, it trains the breast job (embedded default) and runs a worker
against the real RabbitMQ until the worker serves. Editable installs map the checkout's folders
and once hid a wheel without workers.vertical; this test runs nothing from the checkout.

The new virtualenv gets only the wheel (``--no-deps``) and sees the test environment's
dependencies through a ``.pth`` line (installing them afresh from the mirror takes minutes)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
import zipfile
from pathlib import Path

import pytest
import yaml

from fedboost.local_workers import start_worker
from messages.rabbit_queues import delete_party_queues
from tests.scenarios import DATA, wait_until

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["boosting", "crypto", "messages", "workers", "flows", "fedboost"]
"""The top-level packages of pyproject.toml's package discovery."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding the wheel of a copy of the source (its bin folder)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # pip builds in the source folder: never in the checkout
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")  # built anew by the wheel
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # as a user's 'pip wheel .': in an isolated build environment with pyproject's setuptools
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(root / "dist"), str(source)],
                   check=True, timeout=300)
    (wheel,) = (root / "dist").glob("fedboost-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {Path(name).parent for name in archive.namelist()
                   if name.endswith("/__init__.py")}
    found = {path.parent.relative_to(source) for package in PACKAGES
             for path in (source / package).rglob("__init__.py")}
    assert found == shipped, found ^ shipped  # every subpackage, workers.vertical too
    with zipfile.ZipFile(wheel) as archive:  # the C bin-products kernel, built for this Python
        assert [n for n in archive.namelist() if n.startswith("crypto/_bin_products.")
                and n.endswith(".so")], archive.namelist()

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # after the venv's own site-packages: the wheel's fedboost comes first; a plain path line
    # does not run that folder's .pth files, so the checkout's editable install stays out
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=300)
    return venv / "bin"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PREFECT_API_URL")}
    return {**env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def test_the_wheel_imports_from_its_own_virtualenv(installed: Path, tmp_path: Path) -> None:
    code = ("import fedboost, workers.vertical, workers.horizontal, workers.simfl, "
            "workers.forest, workers.column_partitioned.serving, crypto._bin_products; "
            "print(fedboost.__file__); "
            "print(workers.vertical.__file__); print(crypto._bin_products.__file__)")
    done = subprocess.run([str(installed / "python"), "-c", code], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for file in done.stdout.split():
        assert Path(file).is_relative_to(installed.parent), file
        assert not Path(file).is_relative_to(REPO), file


def test_the_wheel_trains_the_breast_job_embedded(installed: Path, tmp_path: Path,
                                                  prefect_harness: None) -> None:
    from prefect.settings import PREFECT_API_URL

    raw = yaml.safe_load((REPO / "configs" / "breast.yaml").read_text())
    for party in raw["parties"].values():
        party["data"] = str(DATA / Path(party["data"]).name)
    raw["params"]["n_trees"] = 2
    raw["crypto"]["key_bits"] = 1024
    job = tmp_path / "breast.yaml"
    job.write_text(yaml.safe_dump(raw))
    done = subprocess.run([str(installed / "fedboost"), "train", str(job), "--out",
                           str(tmp_path / "run"), "--quiet"], cwd=tmp_path,
                          # the session's Prefect server: no ephemeral one to wait for
                          env={**_env(), "PREFECT_API_URL": str(PREFECT_API_URL.value())},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert list((tmp_path / "run").rglob("model.json"))


def test_the_wheel_runs_a_worker_on_rabbitmq(installed: Path, tmp_path: Path,
                                             rabbit_url: str) -> None:
    party = f"wheel{uuid.uuid4().hex[:6]}"
    fedboost = str(installed / "fedboost")
    subprocess.run([fedboost, "keys", "--out", str(tmp_path / "keys"), "--name", party],
                   check=True, cwd=tmp_path, env=_env(), capture_output=True, timeout=120)
    worker = tmp_path / "worker.yaml"
    worker.write_text(yaml.safe_dump({
        "party": party, "data": str(DATA / "breast_hetero_host.csv"), "id": "id",
        "models": str(tmp_path / "models"), "transport": {"kind": "rabbitmq"},
        "signing": {"key_dir": str(tmp_path / "keys")}}))
    alive = tmp_path / "alive"
    proc = start_worker(party, worker, log=tmp_path / "worker.log", cwd=tmp_path,
                        command=[fedboost], args=["--health-file", str(alive)],
                        env={**_env(), "FEDBOOST_AMQP_URL": rabbit_url})
    try:
        # the worker touches its health file once it consumes its queue
        wait_until(lambda: alive.exists() or proc.poll() is not None, 120, "the worker serving")
        assert proc.poll() is None, (tmp_path / "worker.log").read_text()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        delete_party_queues(rabbit_url, [party])
