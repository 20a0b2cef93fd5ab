"""Faults with real processes and the real broker: a passive worker killed mid-tree, the flow
killed mid-run, RabbitMQ restarted mid-run. Every job completes with the model of an
uninterrupted run, and no completed tree is trained twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pika
import pytest
import yaml

from fedboost.embedded import train_embedded
from fedboost.local_workers import FEDBOOST
from flows.coordinator import StepTimeout
from flows.config import load_config
from flows.secureboost import vertical_secureboost
from messages.rabbit_queues import INBOX_ARGUMENTS, delete_party_queues, queue_of
from tests.cli_federation import CliFederation
from tests.scenarios import create_flow_run, rabbitmqctl, served_deployment, wait_until

pytestmark = pytest.mark.usefixtures("prefect_harness")
N_TREES = 4


class Federation(CliFederation):
    """Guest and host workers as CLI processes, restartable, with their logs kept
    (``tests.cli_federation``): default_credit, 1024-bit, a few trees."""

    def __init__(self, root: Path, url: str, **job: Any) -> None:
        super().__init__(root, url, **{"prefix": "faults", "params": {"n_trees": N_TREES}, **job})

    def start_helper(self) -> tuple[subprocess.Popen[bytes], Path]:
        """Another host process, started after the host's: it stands by for the inbox and
        takes histogram shards (a helper)."""
        log = self.root / f"{self.host}-helper-{uuid.uuid4().hex[:4]}.log"
        return self.start(self.host, log=log, helper=True), log

    def train(self, job_file: Path, command: str = "train") -> subprocess.Popen[str]:
        """The flow in its own process (and process group: its Prefect server goes with it)."""
        config = load_config(job_file)
        target = job_file if command == "train" else config.job
        out = self.root / "runs" / config.job
        # job.json keeps no broker password: 'resume' gets it from the environment, as a user's
        env = self.env if command == "train" else {**self.env, "FEDBOOST_AMQP_URL": self.url}
        return subprocess.Popen([*FEDBOOST, command, str(target), "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=self.root, start_new_session=True)


@pytest.fixture(scope="module")
def federation(rabbit_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    fed = Federation(tmp_path_factory.mktemp("faults"), rabbit_url)
    fed.start(fed.guest)
    fed.start(fed.host)
    try:
        yield fed
    finally:
        codes = fed.stop()
        delete_party_queues(rabbit_url, [fed.guest, fed.host])
        assert codes == [0, 0], f"workers did not stop cleanly on SIGTERM: {codes}"


@pytest.fixture(scope="module")
def reference(federation: Federation, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job, uninterrupted, on the embedded default."""
    config = load_config(federation.job_file)
    memory = config.model_copy(update={"transport": config.transport.model_copy(
        update={"kind": "memory"})})
    out = tmp_path_factory.mktemp("reference")
    train_embedded(memory, out)
    return out


def _wait_for(check: Callable[[], bool], what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _finish(flow: subprocess.Popen[str], seconds: float = 600) -> str:
    output, _ = flow.communicate(timeout=seconds)
    assert flow.returncode == 0, output[-5000:]
    return output


def _assert_same_model(federation: Federation, job: str, reference: Path) -> None:
    """The parties' model files equal the uninterrupted run's, byte for byte."""
    got = federation.models / job
    for party, name in ((federation.guest, "model.json"), (federation.host, "lookup.json")):
        expected = json.loads((reference / party / name).read_text())
        actual = json.loads((got / party / name).read_text())
        for part in (expected, actual):
            part.pop("job", None)  # the reference ran under another job name
        assert actual == expected, f"{party}/{name} differs from the uninterrupted run"
    assert (got / federation.guest / "model.json").read_bytes() == \
        (reference / federation.guest / "model.json").read_bytes()


def _finished_trees(log: str, job: str) -> Counter[int]:
    """How often each tree was finished at a party (its worker's per-step log lines)."""
    return Counter(int(m.group(1)) for m in re.finditer(
        rf"job={re.escape(job)} step=FINISH_TREE task=\S+/finish_tree/t(\d+)/", log))


def test_passive_worker_killed_mid_tree_and_restarted(federation: Federation,
                                                      reference: Path) -> None:
    job = _kill_the_host_mid_tree_and_finish(federation, federation.write_job("kill-host"),
                                             reference)
    assert not (federation.models / job / federation.host / "checkpoints").exists()


def _kill_the_host_mid_tree_and_finish(federation: Federation, job_file: Path,
                                       reference: Path) -> str:
    """SIGKILL the host worker at tree 1, depth 1 (built as it applies depth 0's splits), start
    it again; the flow resumes from the checkpoints and ends with the reference model. Returns
    the job's name."""
    job = load_config(job_file).job
    flow = federation.train(job_file)
    mid_tree = re.compile(rf"job={re.escape(job)} step=APPLY_SPLITS task=\S+/t1/d0 ")
    _wait_for(lambda: bool(mid_tree.search(federation.log(federation.host))), "tree 1, depth 1")
    federation.procs[federation.host].send_signal(signal.SIGKILL)
    federation.procs[federation.host].wait()
    federation.start(federation.host)
    output = _finish(flow)
    assert "resuming from the parties' checkpoints" in output, output[-3000:]
    _assert_same_model(federation, job, reference)
    return job


# make test-all: CI keeps the Paillier job's kill and resume above and OU's lossless runs
@pytest.mark.heavy
def test_an_ou_job_resumes_after_the_passive_worker_is_killed_with_the_paillier_model(
        federation: Federation, reference: Path) -> None:
    """Okamoto-Uchiyama (crypto.scheme: ou): the checkpoints hold its key, the restarted host
    reads the key as the job names it, and the model is the Paillier run's (both are exact)."""
    _kill_the_host_mid_tree_and_finish(
        federation, federation.write_job("kill-host-ou", crypto={"scheme": "ou"}), reference)


def test_flow_killed_mid_run_resumes_without_retraining(federation: Federation,
                                                        reference: Path) -> None:
    job_file = federation.write_job("kill-flow")
    job = load_config(job_file).job
    flow = federation.train(job_file)
    seen: list[str] = []
    assert flow.stdout is not None
    for line in flow.stdout:
        seen.append(line)
        if f"trees 2/{N_TREES} " in line:  # the progress line after tree 2's checkpoint
            os.killpg(flow.pid, signal.SIGKILL)  # the flow and its Prefect server, no clean-up
            break
    flow.wait()
    assert flow.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    output = _finish(federation.train(job_file, "resume"))
    metrics = json.loads((federation.root / "runs" / job / "metrics.json").read_text())
    assert metrics["resumed_after"] >= 2, output[-3000:]
    assert metrics["trees_trained"] == N_TREES - metrics["resumed_after"]
    assert len(metrics["trees"]) == N_TREES
    finished = _finished_trees(federation.log(federation.guest), job)
    assert finished == Counter(range(N_TREES)), f"trees finished more than once: {finished}"
    _assert_same_model(federation, job, reference)


@pytest.mark.serial  # every other test's connections drop with it: 'make test' runs it alone
def test_broker_restarted_mid_run(federation: Federation, reference: Path) -> None:
    ctl = rabbitmqctl()
    job_file = federation.write_job("restart-broker")
    job = load_config(job_file).job
    flow = federation.train(job_file)
    started = re.compile(rf"job={re.escape(job)} step=FIND_BEST_SPLITS task=\S+/t1/d0 ")
    _wait_for(lambda: bool(started.search(federation.log(federation.guest))), "tree 1")
    subprocess.run([ctl, "stop_app"], check=True, capture_output=True, timeout=120)
    time.sleep(2.0)
    subprocess.run([ctl, "start_app"], check=True, capture_output=True, timeout=120)
    _finish(flow)
    _assert_same_model(federation, job, reference)
    assert "reconnected" in federation.log(federation.guest)


@pytest.mark.heavy
def test_a_helper_that_stops_answering_costs_time_not_the_model(federation: Federation,
                                                                reference: Path) -> None:
    """A helper frozen mid-training (SIGSTOP: its connection stays open, so the broker still
    hands it shards and the party still counts it) never answers its level: the coordinating
    process stops waiting, sums the features it left, and the job ends with the same model."""
    job_file = federation.write_job("lost-helper")
    job = load_config(job_file).job
    helper, helper_log = federation.start_helper()
    try:
        _wait_for(lambda: "serving" in helper_log.read_text(), "the helper to serve", 120)
        flow = federation.train(job_file)
        shared = re.compile(rf"job={re.escape(job)} step=HISTOGRAM_SHARD task=\S+/t1/d0 ")
        _wait_for(lambda: bool(shared.search(helper_log.read_text())), "the helper's share of t1")
        helper.send_signal(signal.SIGSTOP)
        _wait_for(lambda: "helpers did not answer" in federation.log(federation.host),
                  "the coordinating process to stop waiting", 120)
    finally:
        helper.send_signal(signal.SIGKILL)  # also ends a stopped process
        helper.wait()
    _finish(flow)
    _assert_same_model(federation, job, reference)


def test_a_party_that_never_answers_fails_the_job_naming_it(rabbit_url: str,
                                                            tmp_path: Path) -> None:
    """The host's queue exists (it ran once) but no worker serves it: the flow gives up after
    transport.step_timeout with an error naming the party and the step, not a silent hang."""
    fed = Federation(tmp_path, rabbit_url)
    raw = yaml.safe_load(fed.job_file.read_text())
    raw["transport"]["step_timeout"] = 5
    fed.job_file.write_text(yaml.safe_dump(raw))
    config = load_config(fed.job_file)
    connection = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    try:
        for party in (fed.guest, fed.host):
            connection.channel().queue_declare(queue_of(party), durable=True,
                                               arguments=INBOX_ARGUMENTS)
        started = time.monotonic()
        with pytest.raises(StepTimeout, match=rf"party {fed.guest}, {fed.host}: no answer to step "
                                              rf"open_job/t-1/d-1 within 5 s"):
            vertical_secureboost(config)
        assert time.monotonic() - started < 60
    finally:
        connection.close()
        delete_party_queues(rabbit_url, [fed.guest, fed.host])


@pytest.mark.heavy
def test_retry_of_a_failed_deployment_run_resumes(federation: Federation, reference: Path,
                                                  prefect_server: str) -> None:
    """A run of the served deployment fails when the host's worker dies for good (step
    timeout); the host comes back, the run is retried as the UI's Retry does, and it continues
    after the trees it had done."""
    job_file = federation.write_job("retry")
    raw = yaml.safe_load(job_file.read_text())
    raw["transport"]["step_timeout"] = 15
    job_file.write_text(yaml.safe_dump(raw))
    job = raw["job"]
    serve_log = federation.root / "serve-retry.log"
    api = prefect_server
    with served_deployment("retry", job_file, api, federation.root, serve_log) as deployment:
        run_id = create_flow_run(api, deployment["id"])

        def state() -> str:
            return str(httpx.get(f"{api}/flow_runs/{run_id}", timeout=5).json()["state"]["type"])

        done_two = re.compile(rf"job={re.escape(job)} step=FINISH_TREE task=\S+/t1/")
        _wait_for(lambda: bool(done_two.search(federation.log(federation.host))), "two trees")
        federation.procs[federation.host].send_signal(signal.SIGKILL)
        federation.procs[federation.host].wait()
        wait_until(lambda: state() in ("FAILED", "CRASHED"), 120, "the run to fail")
        federation.start(federation.host)
        retried = httpx.post(f"{api}/flow_runs/{run_id}/set_state", timeout=10, json={
            "state": {"type": "SCHEDULED", "name": "AwaitingRetry"}, "force": True})
        assert retried.status_code in (200, 201), retried.text
        wait_until(lambda: state() in ("COMPLETED", "FAILED", "CRASHED"), 300, "the retried run")
        assert state() == "COMPLETED", serve_log.read_text()[-4000:]
        tasks = httpx.post(f"{api}/task_runs/filter", timeout=10, json={
            "flow_runs": {"id": {"any_": [run_id]}}}).json()
        resumed = [t["name"] for t in tasks if t["name"].startswith("resume-after-")]
        assert resumed and int(resumed[0].split("-")[2]) >= 2, resumed
    finished = _finished_trees(federation.log(federation.guest), job)
    assert finished == Counter(range(N_TREES)), f"trees finished more than once: {finished}"
    _assert_same_model(federation, job, reference)
