"""The active party scaled out over the real broker: 'fedboost worker --party guest' with two
processes (one crypto core each) encrypts and decrypts with its helper, and the model is the
one-process model byte for byte; a helper killed mid-tree costs time, not the model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedboost.embedded import train_embedded
from flows.config import JobConfig, load_config
from flows.secureboost import vertical_secureboost
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair
from tests.scenarios import REPO

pytestmark = pytest.mark.usefixtures("prefect_harness")
FEDBOOST = [sys.executable, "-m", "fedboost.cli"]


class Federation:
    """A guest of several worker processes and a one-process host, as CLI processes."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url, self.tag = root, url, uuid.uuid4().hex[:6]
        self.guest, self.host = f"guest{self.tag}", f"host{self.tag}"
        self.models = root / "models"
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.env.pop("PREFECT_API_URL", None)
        self.procs: list[subprocess.Popen[bytes]] = []

    def job(self, name: str) -> JobConfig:
        """default_credit, 1024-bit, 2 trees; 64 bins and depth 4, so levels have histograms
        enough to share their decryption."""
        raw = yaml.safe_load((REPO / "configs" / "default_credit.yaml").read_text())
        guest, host = raw["parties"]["guest"], raw["parties"]["host"]
        for party in (guest, host):
            party["data"] = str((REPO / "configs" / party["data"]).resolve())
            party["policy"] = {"min_key_bits": 1024}
        raw["parties"] = {self.guest: guest, self.host: host}
        raw["job"] = f"scale-{self.tag}-{name}"
        raw["params"].update(n_trees=2, max_bin=64, max_depth=4)
        raw["crypto"]["key_bits"] = 1024
        raw["transport"] = {"kind": "rabbitmq", "url": self.url, "step_timeout": 600}
        raw["signing"] = {"key_dir": str(self.root / "keys")}
        for identity in (self.guest, self.host, "flow"):
            write_key_pair(self.root / "keys", identity)
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return load_config(path)

    def start(self, party: str, processes: int, log: Path) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [*FEDBOOST, "worker", "--party", party, "--config", str(self.root / "base.yaml"),
             "--models", str(self.models), "--processes", str(processes),
             "--crypto-processes", "1"],
            stdout=log.open("w"), stderr=subprocess.STDOUT, env=self.env, cwd=self.root)
        self.procs.append(proc)
        return proc


@pytest.fixture(scope="module")
def federation(rabbit_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    fed = Federation(tmp_path_factory.mktemp("active-scale"), rabbit_url)
    fed.job("base")
    try:
        yield fed
    finally:
        for proc in fed.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in fed.procs]
        delete_party_queues(rabbit_url, [fed.guest, fed.host])
        assert all(code in (0, -signal.SIGKILL) for code in codes), codes


@pytest.fixture(scope="module")
def reference(federation: Federation, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job on the embedded default, the guest one process."""
    config = federation.job("reference")
    memory = config.model_copy(update={"transport": config.transport.model_copy(
        update={"kind": "memory"})})
    out = tmp_path_factory.mktemp("reference")
    train_embedded(memory, out)
    return out


def _wait_for(check: object, what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _same_model(federation: Federation, job: str, reference: Path) -> None:
    """The guest's model file equals the one-process run's byte for byte (but the job name)."""
    expected = (reference / federation.guest / "model.json").read_bytes()
    got = (federation.models / job / federation.guest / "model.json").read_bytes()
    assert got.replace(job.encode(), b"JOB") == \
        expected.replace(f"scale-{federation.tag}-reference".encode(), b"JOB")


def test_two_guest_processes_share_encryption_and_decryption(federation: Federation,
                                                             reference: Path) -> None:
    guest_log = federation.root / "guest.log"
    federation.start(federation.guest, 2, guest_log)
    federation.start(federation.host, 1, federation.root / "host.log")
    config = federation.job("two")
    vertical_secureboost(config)
    _same_model(federation, config.job, reference)
    log = guest_log.read_text()
    shards = re.findall(rf"job={re.escape(config.job)} step=CRYPTO_SHARD task=\S+/(\w+)/t", log)
    assert "encrypt_gradients" in shards, "the guest's helper took no encryption shard"
    assert any(s != "encrypt_gradients" for s in shards), "nor any decryption shard"
    done = re.findall(r"encrypted and sent \d+ rows in \S+, (\d+) of (\d+) chunks by helpers", log)
    assert done and any(int(k) > 0 for k, _ in done)


def test_a_guest_helper_killed_mid_tree_costs_time_not_the_model(federation: Federation,
                                                                 reference: Path) -> None:
    """A further guest process joins (as one on another machine would), takes a share of
    tree 1's encryption and is killed in the middle of it: the coordinating process encrypts
    the chunks it never returned, and the job ends with the same model."""
    helper_log = federation.root / "helper.log"
    helper = federation.start(federation.guest, 1, helper_log)
    _wait_for(lambda: "serving" in helper_log.read_text(), "the extra guest process to serve")
    config = federation.job("kill")
    from threading import Thread

    result: dict[str, object] = {}
    flow = Thread(target=lambda: result.update(vertical_secureboost(config)))
    flow.start()
    taking = re.compile(rf"job={re.escape(config.job)} t1 d-1: taking encrypt units")
    try:
        _wait_for(lambda: bool(taking.search(helper_log.read_text())),
                  "the extra process's share of tree 1", 600)
        time.sleep(0.3)
    finally:
        helper.send_signal(signal.SIGKILL)
        helper.wait()
    flow.join(timeout=600)
    assert "train_auc" in result
    _same_model(federation, config.job, reference)
    guest_log = (federation.root / "guest.log").read_text()
    assert "did not come back from the helpers; encrypting them here" in guest_log
