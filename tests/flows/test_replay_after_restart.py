"""Issue 12 item 4, over the real broker: a finished run's OPEN_JOB and CLOSE_JOB, captured as
the flow published them and replayed verbatim after the passive worker restarted, used to
reopen the job and delete the checkpoints a later run left for resuming. The restarted worker
refuses both (its record of answered commands is on disk), the checkpoints stay, and the next
run resumes from them to the model of an uninterrupted run."""

from __future__ import annotations

import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedboost.local_workers import start_worker, stop_workers
from flows.coordinator import Coordinator, align_entities, attached
from flows.config import load_config
from flows.secureboost import bin_features, job_spec, open_job, vertical_secureboost
from messages.envelope import MsgType
from messages.rabbit_queues import delete_party_queues
from messages.rabbitmq import RabbitTransport
from messages.signing import FLOW_IDENTITY, Sealer, write_key_pair
from tests.scenarios import DATA, wait_until

pytestmark = pytest.mark.usefixtures("prefect_harness")


class Tap:
    """The flow's endpoint, keeping a copy of every sealed message it publishes (what a
    broker user could capture)."""

    def __init__(self, inner: RabbitTransport) -> None:
        self.inner, self.sent = inner, []

    def send(self, recipient: str, data: bytes) -> None:
        self.sent.append((recipient, data))
        self.inner.send(recipient, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _job_file(root: Path, url: str, tag: str) -> Path:
    guest, host = f"guest{tag}", f"host{tag}"
    party = {"id": "id", "policy": {"min_key_bits": 1024}}
    raw = {"job": f"replay-{tag}",
           "parties": {guest: {**party, "role": "active", "label": "y",
                               "data": str(DATA / "breast_hetero_guest.csv")},
                       host: {**party, "role": "passive",
                              "data": str(DATA / "breast_hetero_host.csv")}},
           "params": {"n_trees": 2, "max_depth": 3},
           "crypto": {"key_bits": 1024},
           "transport": {"kind": "rabbitmq", "url": url, "step_timeout": 300},
           "signing": {"key_dir": str(root / "keys")}}
    for name in (guest, host, FLOW_IDENTITY):
        write_key_pair(root / "keys", name)
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _start(root: Path, job_file: Path, party: str, log: Path) -> subprocess.Popen[bytes]:
    proc = start_worker(party, job_file, log=log, cwd=root, args=["--models", str(root / "models")])
    wait_until(lambda: "serving" in log.read_text(), 60, f"worker {party}")
    return proc


def test_replayed_open_and_close_after_a_restart_are_refused(rabbit_url: str,
                                                             tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    job_file = _job_file(tmp_path, rabbit_url, tag)
    config = load_config(job_file)
    job, guest, host = config.job, config.active, config.passives[0]
    logs = {p: tmp_path / f"{p}.log" for p in (guest, host)}
    procs = {p: _start(tmp_path, job_file, p, logs[p]) for p in (guest, host)}
    flow_sealer = Sealer.from_folder(tmp_path / "keys", FLOW_IDENTITY)
    first = Tap(RabbitTransport(f"flow.{job}.first", rabbit_url, party=False))
    second = RabbitTransport(f"flow.{job}.second", rabbit_url, party=False)
    try:
        # run 1, complete; the tap keeps what the flow sent the host
        with attached(Coordinator(job, first, flow_sealer, timeout=300)):  # type: ignore[arg-type]
            vertical_secureboost(config)
        model = tmp_path / "models" / job / guest / "model.json"
        uninterrupted = model.read_bytes()
        reader = Sealer.from_folder(tmp_path / "keys", FLOW_IDENTITY)
        captured = {reader.open(data).kind: data for to, data in first.sent if to == host}
        replays = [captured[MsgType.OPEN_JOB], captured[MsgType.CLOSE_JOB]]

        # run 2 stops after binning (its flow died): the host holds a checkpoint to resume
        with attached(Coordinator(job, second, flow_sealer, timeout=300)):
            open_job.fn(job, [guest, host], job_spec(config))
            align_entities.fn(job, guest, [host])
            bin_features.fn(job, guest, [host])
        checkpoints = tmp_path / "models" / job / host / "checkpoints"
        held = sorted(p.name for p in checkpoints.iterdir())
        assert held == ["trees-000000.ckpt"]

        procs[host].send_signal(signal.SIGTERM)  # the host's worker restarts
        assert procs[host].wait(timeout=60) == 0
        logs[host] = tmp_path / f"{host}-restarted.log"
        procs[host] = _start(tmp_path, job_file, host, logs[host])
        for data in replays:  # replayed verbatim, well within the accepted age
            first.inner.send(host, data)
        wait_until(lambda: logs[host].read_text().count("rejected replayed") == 2, 30,
                   "the replays' refusal")
        text = logs[host].read_text()
        assert "rejected replayed OPEN_JOB" in text and "rejected replayed CLOSE_JOB" in text
        for _ in replays:  # answered only with a refusal: the flow of a session long over
            data = first.inner.receive(timeout=10.0)
            assert data is not None, "a replay went unanswered"
            refusal = reader.open(data)
            first.inner.acknowledge()
            assert refusal.kind == MsgType.ERROR and "answered before" in refusal.body.message
        assert first.inner.receive(timeout=2.0) is None
        assert sorted(p.name for p in checkpoints.iterdir()) == held

        # run 3: the worker still serves, and resumes from the checkpoint the replay spared
        with attached(Coordinator(job, second, flow_sealer, timeout=300)):
            result = vertical_secureboost(config)
        assert result["n_trees"] == 2 and "step=RESUME_JOB" in logs[host].read_text()
        assert model.read_bytes() == uninterrupted
    finally:
        for endpoint in (first.inner, second):
            endpoint.delete_inbox()
            endpoint.close()
        stop_workers(procs.values())
        delete_party_queues(rabbit_url, [guest, host])
