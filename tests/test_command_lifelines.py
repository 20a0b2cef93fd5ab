"""Killed with SIGKILL, a fedboost command leaves no process behind (issue 28, item 2: a killed
'fedboost train' left Prefect's ephemeral server running, in a session of its own).

Each test starts a command for real with a tag of its own in its environment, which every
process it starts inherits at any depth (the embedded default's workers and their crypto
processes, Prefect's ephemeral server, a served deployment's flow run, the command's guardian);
waits until those are up; kills the command; and lists what still carries the tag."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pika
import pytest
import yaml

from messages.rabbit_queues import INBOX_ARGUMENTS, delete_party_queues, queue_of
from messages.signing import write_key_pair
from tests.scenarios import (CONFIGS, DATA, REPO, create_flow_run, passive_worker_file,
                             rabbitmqctl, wait_until)

FEDBOOST = [sys.executable, "-m", "fedboost.cli"]
TAG = "FEDBOOST_TEST_COMMAND"
GONE_WITHIN = 15.0
"""Seconds the command's processes may take to stop: a worker finishes the step in hand."""


def _tagged(tag: str) -> dict[int, tuple[int, str]]:
    """Live processes carrying ``tag`` in their environment: pid -> (parent pid, command)."""
    needle = f"{TAG}={tag}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or needle not in (entry / "environ").read_bytes().split(
                    b"\0"):
                continue
            parent = int((entry / "stat").read_bytes().rpartition(b")")[2].split()[1])
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        found[int(entry.name)] = (parent, command)
    return found


@dataclass
class Command:
    """A fedboost command started by a test, with its tag and log."""

    proc: subprocess.Popen[bytes]
    tag: str
    log: Path

    def processes(self) -> dict[int, tuple[int, str]]:
        """Its live processes, itself included."""
        return _tagged(self.tag)

    def descendants(self, depth: int) -> list[str]:
        """The commands of its processes ``depth`` generations below it."""
        found = self.processes()
        level = {self.proc.pid}
        for _ in range(depth):
            level = {pid for pid, (parent, _) in found.items() if parent in level}
        return [found[pid][1] for pid in level]

    def kill(self) -> tuple[int, list[str], float]:
        """SIGKILL the command: how many processes it had, those still alive after
        ``GONE_WITHIN`` seconds (then killed, so no test leaves any), the seconds it took."""
        had = len(self.processes())
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        started = time.monotonic()
        while (left := self.processes()) and time.monotonic() - started < GONE_WITHIN:
            time.sleep(0.1)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return had, [command for _, command in left.values()], time.monotonic() - started

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Command]]:
    """Start ``fedboost ARGS`` in a folder of its own; every command still running at the end
    is killed with whatever it left."""
    root = tmp_path_factory.mktemp("lifelines")
    prefect_home = root / "prefect-home"  # one database for the module's ephemeral servers
    commands: list[Command] = []

    def start(*args: str, cwd: Path | None = None) -> Command:
        tag = uuid.uuid4().hex
        env = {**os.environ, "PYTHONPATH": str(REPO), TAG: tag,
               "PREFECT_HOME": str(prefect_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
        env.pop("PREFECT_API_URL", None)  # each command starts Prefect's ephemeral server
        log = root / f"{args[0]}-{tag[:8]}.log"
        proc = subprocess.Popen([*FEDBOOST, *args], cwd=cwd or root, env=env,
                                stdout=log.open("w"), stderr=subprocess.STDOUT)
        commands.append(Command(proc, tag, log))
        return commands[-1]

    yield start
    for command in commands:
        if command.proc.poll() is None:
            command.kill()


def _breast_job(folder: Path, **sections: object) -> Path:
    """The breast job at 1024 bits, long enough to be killed mid-run."""
    raw = yaml.safe_load((CONFIGS / "breast.yaml").read_text())
    for party, side in (("guest", "guest"), ("host", "host")):
        raw["parties"][party]["data"] = str(DATA / f"breast_hetero_{side}.csv")
    raw["crypto"]["key_bits"] = 1024
    raw["params"]["n_trees"] = 300
    raw.update(sections)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{raw['job']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _assert_stopped(command: Command, what: str) -> None:
    had, left, seconds = command.kill()
    assert left == [], f"{what}: {len(left)} of its {had} processes outlived it: {left}"
    print(f"{what}: its {had} processes stopped {seconds:.1f} s after SIGKILL")


@pytest.fixture(scope="module")
def killed_run(started: Callable[..., Command],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Command, Path]]:
    """A 'fedboost train' on the embedded default, up to its second tree: the command, and
    the run folder it leaves (its parties' checkpoints are what 'fedboost resume' continues)."""
    folder = tmp_path_factory.mktemp("train")
    out = folder / "run"
    train = started("train", str(_breast_job(folder)), "--out", str(out))
    wait_until(lambda: "trees 2/300" in train.text() or train.proc.poll() is not None, 180,
               "the second tree")
    yield train, out


def test_killed_train_leaves_no_process(killed_run: tuple[Command, Path]) -> None:
    train, _ = killed_run
    assert train.proc.poll() is None, train.text()[-3000:]
    children, grandchildren = train.descendants(1), train.descendants(2)
    assert any("uvicorn" in c for c in children), children  # Prefect's ephemeral server
    assert sum("spawn_main" in c for c in children) >= 2, children  # the parties' workers
    assert any("spawn_main" in c for c in grandchildren), grandchildren  # the guest's crypto
    _assert_stopped(train, "fedboost train")


# make test-all; CI keeps the same check of a killed train and a killed serve
@pytest.mark.heavy
def test_killed_resume_leaves_no_process(killed_run: tuple[Command, Path],
                                         started: Callable[..., Command]) -> None:
    train, out = killed_run
    if train.proc.poll() is None:  # run alone
        train.kill()
    resume = started("resume", "breast", "--out", str(out))
    wait_until(lambda: re.search(r"^trees \d+/300", resume.text(), re.M)
               or resume.proc.poll() is not None, 180, "a resumed tree")
    assert resume.proc.poll() is None, resume.text()[-3000:]
    assert any("uvicorn" in c for c in resume.descendants(1)), resume.descendants(1)
    _assert_stopped(resume, "fedboost resume")


def test_killed_worker_leaves_no_process(started: Callable[..., Command], rabbit_url: str,
                                         tmp_path: Path) -> None:
    party = f"lifeline{uuid.uuid4().hex[:6]}"
    worker_file = passive_worker_file(tmp_path, party, rabbit_url)
    worker = started("worker", "--party", party, "--config", str(worker_file), cwd=tmp_path)
    try:
        wait_until(lambda: worker.text().count(f"worker {party} serving") == 2, 120,
                   f"both processes of {party}")
        assert sum("spawn_main" in c for c in worker.descendants(1)) == 2, worker.processes()
        _assert_stopped(worker, "fedboost worker --processes 2")
    finally:
        delete_party_queues(rabbit_url, [party])


@pytest.fixture
def federation_files(rabbit_url: str, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A RabbitMQ job file and its keys, whose parties (names of their own) never answer: the
    test consumes their inboxes and leaves every message unanswered, so a flow waits."""
    tag = uuid.uuid4().hex[:6]
    job = f"lifeline-{tag}"
    parties = {"guest": f"guest{tag}", "host": f"host{tag}"}
    keys = tmp_path / "keys"
    for name in ("flow", *parties.values()):
        write_key_pair(keys, name)
    path = _breast_job(tmp_path, job=job, transport={"kind": "rabbitmq", "url": rabbit_url},
                       signing={"key_dir": str(keys)})
    raw = yaml.safe_load(path.read_text())
    raw["parties"] = {parties[name]: party for name, party in raw["parties"].items()}
    path.write_text(yaml.safe_dump(raw))
    params = pika.URLParameters(rabbit_url)
    params.heartbeat = 0  # nobody processes this connection's events
    silent = pika.BlockingConnection(params)
    channel = silent.channel()
    for party in parties.values():
        channel.queue_declare(queue_of(party), durable=True, arguments=INBOX_ARGUMENTS)
        channel.basic_consume(queue_of(party), lambda *_: None, auto_ack=False)
    try:
        yield path, job
    finally:
        silent.close()
        delete_party_queues(rabbit_url, list(parties.values()))
        _delete_flow_queues(rabbit_url, job)


def _delete_flow_queues(rabbit_url: str, job: str) -> None:
    """A killed flow endpoint's reply queue outlives it (for a day): delete the job's."""
    listed = subprocess.run([rabbitmqctl(), "-q", "list_queues", "name"], check=True,
                            capture_output=True, text=True, timeout=120).stdout.split()
    connection = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    try:
        channel = connection.channel()
        for queue in listed:
            if queue.startswith(f"fedboost.flow.{job}"):
                channel.queue_delete(queue)
    finally:
        connection.close()


def test_killed_serve_model_leaves_no_process(started: Callable[..., Command],
                                              federation_files: tuple[Path, str],
                                              tmp_path: Path) -> None:
    """The scoring service starts nothing but its guardian: killed while it opens its session
    (no party answers), nothing is left."""
    job_file, _ = federation_files
    run = tmp_path / "run"
    run.mkdir()
    raw = yaml.safe_load(job_file.read_text())
    (run / "job.json").write_text(json.dumps(raw))
    serve = started("serve-model", str(run), "--port", "0", "--insecure-no-auth",
                    "--timeout", "120", cwd=tmp_path)
    wait_until(lambda: "serving without authentication" in serve.text(), 60, "serve-model")
    time.sleep(2.0)  # it opens the session: its reply queue, an OPEN_SCORING to each party
    assert serve.proc.poll() is None, serve.text()
    assert any("workers.lifeline" in c for c in serve.descendants(1)), serve.processes()
    _assert_stopped(serve, "fedboost serve-model")


def test_killed_serve_leaves_no_process(started: Callable[..., Command],
                                        federation_files: tuple[Path, str],
                                        tmp_path: Path) -> None:
    """'fedboost serve' on its ephemeral server, with a flow run of a deployment under way
    (the runner starts it in a session of its own; it waits for parties nobody serves)."""
    job_file, job = federation_files
    serve = started("serve", "--name", job, "--config", str(job_file), cwd=tmp_path)
    wait_until(lambda: "being served" in serve.text() or serve.proc.poll() is not None, 120,
               "the deployments")
    servers = [c for c in serve.descendants(1) if "uvicorn" in c]
    assert servers, serve.text()[-3000:]
    api = f"http://127.0.0.1:{servers[0].split('--port ')[1].split()[0]}/api"
    deployment = httpx.get(f"{api}/deployments/name/vertical_secureboost/{job}",
                           timeout=30).json()
    create_flow_run(api, deployment["id"])
    wait_until(lambda: any("prefect.engine" in c for _, c in serve.processes().values()), 120,
               "the flow run's process")
    time.sleep(2.0)  # the run opens the job at the parties
    _assert_stopped(serve, "fedboost serve")
