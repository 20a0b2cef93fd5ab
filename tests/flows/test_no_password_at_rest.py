"""No broker password at rest: a training run over the real RabbitMQ, as a broker user with a
random password made for the test, whose password the job file carries in its URL (the guest's
worker file too; the host's worker reads it from a password file). Afterwards no file that
fedboost or Prefect wrote holds the password: the run folder, the parties' model and private
folders, the worker logs, and the Prefect home with its database. Each party's key folder
holds only its own private key (made by its own 'fedboost keys --name') and every public key."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pytest
import yaml

from fedboost.local_workers import start_worker
from messages.rabbit_queues import delete_party_queues
from tests.scenarios import DATA, REPO, rabbitmqctl, served_deployment, wait_until

FEDBOOST = [sys.executable, "-m", "fedboost.cli"]


@dataclass
class BrokerUser:
    name: str
    password: str
    vhost: str

    def url(self, with_password: bool = True) -> str:
        secret = f":{self.password}" if with_password else ""
        return f"amqp://{self.name}{secret}@127.0.0.1:5672/{quote(self.vhost, safe='')}"


@pytest.fixture
def broker_user(rabbit_url: str) -> Iterator[BrokerUser]:
    """A real broker user with a random password and every right on the test's vhost."""
    ctl = rabbitmqctl()
    vhost = unquote(urlsplit(rabbit_url).path[1:]) or "/"
    user = BrokerUser(f"fedboost-creds-{uuid.uuid4().hex[:6]}", secrets.token_urlsafe(24), vhost)
    subprocess.run([ctl, "add_user", user.name, user.password], check=True,
                   capture_output=True, timeout=60)
    try:
        subprocess.run([ctl, "set_permissions", "-p", vhost, user.name, ".*", ".*", ".*"],
                       check=True, capture_output=True, timeout=60)
        yield user
    finally:
        subprocess.run([ctl, "delete_user", user.name], capture_output=True, timeout=60)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "FEDBOOST_AMQP_URL", "FEDBOOST_AMQP_PASSWORD_FILE")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _own_keys(root: Path, names: list[str]) -> dict[str, Path]:
    """Each identity's folder: its own 'fedboost keys --name', then every .pub copied in."""
    folders = {name: root / "keys" / name for name in names}
    for name, folder in folders.items():
        done = subprocess.run([*FEDBOOST, "keys", "--out", str(folder), "--name", name],
                              env=_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    for name, folder in folders.items():
        for other in names:
            if other != name:
                shutil.copy(folders[other] / f"{other}.pub", folder)
    for name, folder in folders.items():
        assert sorted(p.name for p in folder.iterdir()) == \
            sorted([f"{name}.key", *(f"{n}.pub" for n in names)])
        assert (folder / f"{name}.key").stat().st_mode & 0o777 == 0o600
    return folders


def _worker_file(root: Path, party: str, role: str, keys: Path,
                 transport: dict[str, str]) -> Path:
    side = "guest" if role == "active" else "host"
    raw = {"party": party, "role": role, "data": str(DATA / f"breast_hetero_{side}.csv"),
           "id": "id", "models": str(root / f"models-{party}"),
           "state": str(root / f"state-{party}"), "policy": {"min_key_bits": 1024},
           "transport": {"kind": "rabbitmq", **transport}, "signing": {"key_dir": str(keys)}}
    if role == "active":
        raw["label"] = "y"
    path = root / f"{party}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _files_holding(folders: list[Path], secret: bytes) -> list[str]:
    hits, seen = [], 0
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                seen += 1
                if secret in path.read_bytes():
                    hits.append(str(path))
    assert seen, "nothing was written"
    return hits


def test_no_password_in_any_file_after_a_rabbitmq_run(broker_user: BrokerUser,
                                                       rabbit_url: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    guest, host = f"guest{tag}", f"host{tag}"
    keys = _own_keys(tmp_path, [guest, host, "flow"])
    password_file = tmp_path / "host.pw"
    password_file.write_text(broker_user.password + "\n")
    password_file.chmod(0o600)
    workers = {guest: _worker_file(tmp_path, guest, "active", keys[guest],
                                   {"url": broker_user.url()}),
               host: _worker_file(tmp_path, host, "passive", keys[host],
                                  {"url": broker_user.url(with_password=False),
                                   "password_file": str(password_file)})}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "job": f"creds-{tag}", "protocol": "vertical_secureboost",
        "parties": {guest: {"role": "active", "id": "id", "label": "y"},
                    host: {"role": "passive", "id": "id"}},
        "params": {"n_trees": 2, "max_depth": 3, "objective": "binary"},
        "crypto": {"key_bits": 1024},
        "transport": {"kind": "rabbitmq", "url": broker_user.url(), "step_timeout": 300},
        "signing": {"key_dir": str(keys["flow"])}}))
    logs, procs = tmp_path / "logs", []
    logs.mkdir()
    try:
        for party, worker_file in workers.items():
            procs.append(start_worker(party, worker_file, log=logs / f"{party}.log",
                                      cwd=tmp_path, env=_env(), args=[
                                          "--health-file", str(tmp_path / f"{party}.alive")]))
        for party in workers:  # serving: connected as the user, its key loaded
            wait_until(lambda: (tmp_path / f"{party}.alive").exists(), 120, f"worker {party}")
        prefect_home = tmp_path / "prefect-home"
        done = subprocess.run(
            [*FEDBOOST, "train", str(job), "--out", str(tmp_path / "run")], cwd=tmp_path,
            env=_env(PREFECT_HOME=str(prefect_home),
                     PREFECT_LOCAL_STORAGE_PATH=str(prefect_home / "storage")),
            capture_output=True, text=True, timeout=900)
        (logs / "train.log").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        delete_party_queues(rabbit_url, [guest, host])

    # one warning, from the CLI, pointing at the environment and the password file; the flow
    # got no password in its parameters (it would warn that Prefect stores it)
    warnings = [line for line in done.stderr.splitlines() if "holds the broker password" in line]
    assert len(warnings) == 1 and warnings[0].startswith("fedboost: warning:"), done.stderr
    assert "FEDBOOST_AMQP_URL" in warnings[0] and "password_file" in warnings[0]
    saved = json.loads((tmp_path / "run" / "job.json").read_text())
    assert saved["transport"]["url"] == broker_user.url(with_password=False)
    assert (tmp_path / "run" / "job.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / f"models-{guest}" / f"creds-{tag}" / guest / "model.json").is_file()
    assert "holds the broker password" in (logs / f"{guest}.log").read_text()  # its worker file
    database = [p for p in prefect_home.rglob("*.db")]
    assert database, f"Prefect wrote no database under {prefect_home}"
    written = [tmp_path / "run", tmp_path / f"models-{guest}", tmp_path / f"models-{host}",
               tmp_path / f"state-{guest}", tmp_path / f"state-{host}", logs, prefect_home]
    # the flow run's parameters reached the database (with the user, without the password)
    assert _files_holding([prefect_home], broker_user.name.encode())
    assert _files_holding(written, broker_user.password.encode()) == []


def test_served_deployment_parameters_hold_no_password(prefect_server: str,
                                                       tmp_path: Path) -> None:
    """'fedboost serve --config JOB': the job becomes the deployment's default parameter, which
    Prefect keeps in its database; the password stays in the runner's environment."""
    password = secrets.token_urlsafe(24)
    url = f"amqp://fedboost-flow:{password}@broker.invalid:5672/%2F"
    job = tmp_path / "job.yaml"
    raw = yaml.safe_load((REPO / "deploy" / "job.yaml").read_text())
    job.write_text(yaml.safe_dump({**raw, "transport": {"kind": "rabbitmq", "url": url}}))
    log = tmp_path / "serve.log"
    with served_deployment("creds", job, prefect_server, tmp_path, log) as deployment:
        stored = deployment["parameters"]["config"]["transport"]["url"]
    assert stored == "amqp://fedboost-flow@broker.invalid:5672/%2F"
    assert log.read_text().count("holds the broker password") == 1
    assert _files_holding([tmp_path / "prefect-home"], b"broker.invalid")  # it was stored
    assert _files_holding([tmp_path], password.encode()) == [str(job)]
