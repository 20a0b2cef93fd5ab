"""The active party scaled out over the real broker: 'fedboost worker --party guest' with two
processes (one crypto core each) encrypts and decrypts with its helper, and the model is the
one-process model byte for byte; a helper killed mid-tree costs time, not the model."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedboost.embedded import train_embedded
from flows.config import JobConfig, load_config
from flows.secureboost import vertical_secureboost
from tests.cli_federation import CliFederation

pytestmark = pytest.mark.usefixtures("prefect_harness")


class Federation(CliFederation):
    """A guest of several worker processes and a one-process host, as CLI processes
    (``tests.cli_federation``): default_credit, 1024-bit, 2 trees; 64 bins and depth 4, so
    levels have histograms enough to share their decryption."""

    def __init__(self, root: Path, url: str) -> None:
        super().__init__(root, url, prefix="scale",
                         params={"n_trees": 2, "max_bin": 64, "max_depth": 4})

    def job(self, name: str) -> JobConfig:
        return load_config(self.write_job(name))

    def start_processes(self, party: str, processes: int, log: Path) -> subprocess.Popen[bytes]:
        """A worker of ``party`` with ``processes`` processes of one crypto core each (a
        further one of the same party is a helper of the first)."""
        return self.start(party, processes=processes, log=log, args=["--crypto-processes", "1"],
                          helper=party in self.procs)


@pytest.fixture(scope="module")
def federation(rabbit_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    fed = Federation(tmp_path_factory.mktemp("active-scale"), rabbit_url)
    try:
        yield fed
    finally:
        fed.stop()
        codes = fed.exit_codes()
        fed.delete_queues()
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
    federation.start_processes(federation.guest, 2, guest_log)
    federation.start_processes(federation.host, 1, federation.root / "host.log")
    config = federation.job("two")
    vertical_secureboost(config)
    _same_model(federation, config.job, reference)
    log = guest_log.read_text()
    shards = re.findall(rf"job={re.escape(config.job)} step=CRYPTO_SHARD task=\S+/(\w+)/t", log)
    assert "encrypt_gradients" in shards, "the guest's helper took no encryption shard"
    assert any(s != "encrypt_gradients" for s in shards), "nor any decryption shard"
    done = re.findall(r"encrypted and sent \d+ rows in \S+, (\d+) of (\d+) chunks by helpers", log)
    assert done and any(int(k) > 0 for k, _ in done)


# make test-all: CI keeps the two guest processes' shared work above and the passive
# party's killed helper (tests/flows/test_faults.py)
@pytest.mark.heavy
def test_a_guest_helper_killed_mid_tree_costs_time_not_the_model(federation: Federation,
                                                                 reference: Path) -> None:
    """A further guest process joins (as one on another machine would), takes a share of
    tree 1's encryption and is killed in the middle of it: the coordinating process encrypts
    the chunks it never returned, and the job ends with the same model."""
    helper_log = federation.root / "helper.log"
    helper = federation.start_processes(federation.guest, 1, helper_log)
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
