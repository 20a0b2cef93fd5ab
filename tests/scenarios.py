"""Shared protocol scenarios: load a shipped config with overrides, train federatedly and
centrally, and view trees in a form both trainers can be compared in."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from benchmarks.job_files import CONFIGS, config_with  # noqa: F401  tests import it from here
from boosting.params import BoostParams
from boosting.train import predict_blocks, train
from boosting.tree import Model, load_model
from fedboost.joined import JoinedData, join_parties
from fedboost.local_workers import start_worker, stop_workers, worker_env
from flows.config import JobConfig, parse_config
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair
from workers.policy import PartyPolicy
from workers.vertical.draws import in_tree_rows

REPO = Path(__file__).resolve().parents[1]
TEST_POLICY = PartyPolicy(min_key_bits=1024, min_ou_key_bits=1024,
                          pack_bin_sums=("key_holder", "passive"))
"""Workers driven directly by tests accept the tests' 1024-bit keys (the default needs 2048)
and both packings of bin sums (the default refuses the key holder's fold)."""
DATA = REPO.parent / "shared" / "data"


NodeView = tuple[Any, ...]


def fixed_checkpoint_keys(out: Path, parties: tuple[str, ...] | list[str], first: int) -> None:
    """Give each party of an embedded run in ``out`` a fixed checkpoint key (party k's is the byte
    ``first + k``, 32 times): what a party draws from its own key (SimFL's functions and noise,
    horizontal subsamples) is then the same every run."""
    for k, party in enumerate(parties):
        own = out / ".fedboost" / party
        own.mkdir(parents=True, mode=0o700)
        (own / "checkpoint.key").write_bytes(bytes([first + k]) * 32)
        (own / "checkpoint.key").chmod(0o600)


def federated_view(out: Path, config: JobConfig) -> list[list[NodeView]]:
    """Trees of a federated model, passive nodes resolved through the owners' lookup tables."""
    model = load_model(out / config.active / "model.json")
    lookups = {p: json.loads((out / p / "lookup.json").read_text())["records"]
               for p in config.passives}
    trees = []
    for tree in model.trees:
        nodes: list[NodeView] = []
        for n in tree.nodes:
            if n.is_leaf:
                nodes.append((n.id, "leaf", n.value))
            elif n.owner == config.active:
                nodes.append((n.id, n.left, n.right, n.owner, n.feature, n.bin, n.missing_left))
            else:
                rec = lookups[n.owner][str(n.record_id)]
                nodes.append((n.id, n.left, n.right, n.owner, rec["feature"], rec["bin"],
                              rec["missing_left"]))
        trees.append(nodes)
    return trees


def centralized_view(model: Model) -> list[list[NodeView]]:
    """Trees of a centralized model in the same form."""
    return [[(n.id, "leaf", n.value) if n.is_leaf else
             (n.id, n.left, n.right, n.owner, n.feature, n.bin, n.missing_left)
             for n in tree.nodes] for tree in model.trees]


def train_centralized(config: JobConfig, out: Path | None = None) -> tuple[Model, JoinedData]:
    """The lossless reference on the joined data. With ``subsample < 1`` the rows of each tree
    are the active party's draws in the job run into ``out`` (:func:`active_draws`)."""
    joined = join_parties(config)
    blocks, y = joined.part(valid=False)
    # early_stopping_rounds is the flow's, not the core's: train grows every tree
    params = BoostParams.from_dict(config.params.model_dump(exclude={"early_stopping_rounds"}))
    if params.subsample >= 1.0:
        return train(params, blocks, y), joined
    if out is None:
        raise ValueError("subsample < 1: the active party's draws need the run's folder")
    secret = active_draws(out, config)
    return train(params, blocks, y,
                 in_tree=lambda t: in_tree_rows(secret, t, y.size, params.subsample)), joined


def active_draws(out: Path, config: JobConfig) -> bytes:
    """The secret of the active party's row draws in the vertical job run into ``out``, as it
    derives it (``workers.vertical.draws``: its checkpoint key, the job's digest)."""
    from flows.secureboost import job_spec
    from workers.checkpoint import job_digest
    from workers.vertical.draws import active_secret

    party = config.parties[config.active]
    digest = job_digest(job_spec(config), str(party.data), party.columns, party.categorical)
    return active_secret((out / ".fedboost" / config.active / "checkpoint.key").read_bytes(),
                         digest)


def assert_same_trees(fed: list[list[NodeView]], cen: list[list[NodeView]], tol: float = 1e-6) -> None:
    """Identical structure; leaf values within ``tol``."""
    assert len(fed) == len(cen), f"{len(fed)} federated trees vs {len(cen)} centralized"
    for t, (a, b) in enumerate(zip(fed, cen)):
        assert [n[:2] + (n[2:] if n[1] != "leaf" else ()) for n in a] == \
               [n[:2] + (n[2:] if n[1] != "leaf" else ()) for n in b], f"tree {t} structure differs"
        for na, nb in zip(a, b):
            if na[1] == "leaf":
                assert math.isclose(na[2], nb[2], abs_tol=tol), f"tree {t} leaf {na[0]}"


def read_scores(path: Path) -> tuple[list[str], np.ndarray]:
    """Ids and score columns of a scores file."""
    lines = path.read_text().splitlines()
    header, rows = lines[0].split(","), [line.split(",") for line in lines[1:]]
    scores = [k for k, name in enumerate(header) if k and name != "split"]  # not 'train'/'valid'
    return [r[0] for r in rows], np.array([[float(r[k]) for k in scores] for r in rows])


def centralized_predictions(model: Model, joined: JoinedData) -> np.ndarray:
    """Centralized predictions on every joined row (ids sorted)."""
    return predict_blocks(model, joined.blocks)


def wait_until(ready, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll ``ready`` (HTTP and OS errors count as not ready) until true or fail."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(1.0)
    raise AssertionError(f"{what} not ready after {seconds} s")


def create_flow_run(api: str, deployment_id: str, parameters: dict[str, Any] | None = None,
                    seconds: float = 60.0) -> str:
    """Start a run of a deployment through Prefect's REST API, as the UI's Run does; returns
    its id. A 5xx (the server busy with its SQLite database: seen as 503 on 2 cores) is tried
    again until ``seconds`` pass; any other refusal fails at once."""
    deadline = time.monotonic() + seconds
    while True:
        created = httpx.post(f"{api}/deployments/{deployment_id}/create_flow_run",
                             json={"parameters": parameters} if parameters else {}, timeout=10)
        if created.status_code < 500 or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def unavailable(message: str) -> None:
    """A real service or tool a test needs is missing: under CI=true that fails the test,
    locally it skips it."""
    import pytest

    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def rabbitmqctl() -> str:
    """The broker's control tool (definitions, restarts)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        unavailable("rabbitmqctl is not installed: the broker cannot be administered")
    return str(ctl)


@contextmanager
def served_deployment(name: str, job_file: Path, api: str, cwd: Path,
                      log: Path) -> Iterator[dict[str, Any]]:
    """'fedboost serve' of a job file against a Prefect server; yields the deployment once
    registered, and stops the runner after."""
    env = {**os.environ, "PREFECT_API_URL": api, "PYTHONPATH": str(REPO),
           "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    serve = subprocess.Popen([sys.executable, "-m", "fedboost.cli", "serve", "--name", name,
                              "--config", str(job_file)], cwd=cwd, env=env,
                             stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        url = f"{api}/deployments/name/vertical_secureboost/{name}"
        wait_until(lambda: httpx.get(url, timeout=5).status_code == 200, 120, "the deployment")
        yield dict(httpx.get(url, timeout=5).json())
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()


HOMO = {"default_credit": ("guest", "host_1", "host_2"), "breast": ("guest", "host")}
"""The horizontal data sets: each member's rows in DATA/<set>_homo_<member>.csv."""


def horizontal_job(job: str, data_set: str, **overrides: Any) -> dict[str, Any]:
    """A horizontal job mapping over a homo data set's members and one aggregator, with
    sections replaced (or, for dicts, merged) by ``overrides``."""
    raw: dict[str, Any] = {
        "job": job, "protocol": "horizontal",
        "parties": {**{m: {"role": "member", "data": str(DATA / f"{data_set}_homo_{m}.csv"),
                           "id": "id", "label": "y"} for m in HOMO[data_set]},
                    "aggregator": {"role": "aggregator"}},
        "params": {"n_trees": 5, "max_depth": 3, "learning_rate": 0.3, "max_bin": 32,
                   "objective": "binary", "seed": 0}}
    for key, value in overrides.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and key in raw else value
    return raw


def horizontal_config(job: str, data_set: str, **overrides: Any) -> Any:
    """:func:`horizontal_job` validated (a ``flows.config.HorizontalJobConfig``)."""
    return parse_config(horizontal_job(job, data_set, **overrides), base=CONFIGS, source=job)


@contextmanager
def cli_workers(root: Path, url: str, names: dict[str, str],
                files: dict[str, dict[str, Any]]) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A federation of ``fedboost worker`` processes over the real broker: signing keys for
    every name in ``names`` (role -> party) and the flow, one worker per role of ``files`` (its
    worker file), logging to ``root/<role>.log``; yields them once each serves. On the way out
    each gets SIGTERM and must exit 0, and the parties' queues are deleted."""
    env = worker_env()
    made = subprocess.run([sys.executable, "-m", "fedboost.cli", "keys", "--out",
                           str(root / "keys"), "--local-trial",
                           *(f"--name={n}" for n in [*names.values(), "flow"])],
                          env=env, cwd=root, capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    procs = {}
    for role, worker_file in files.items():
        path = root / f"{role}.worker.yaml"
        path.write_text(yaml.safe_dump(worker_file))
        procs[role] = start_worker(names[role], path, log=root / f"{role}.log", cwd=root, env=env,
                                   args=["--health-file", str(root / f"{role}.alive")])
    try:
        for role in procs:  # a worker touches its health file once it serves (queues declared)
            wait_until((root / f"{role}.alive").exists, 120, f"the {role} worker")
        yield procs
    finally:
        codes = dict(zip(procs, stop_workers(procs.values())))
        delete_party_queues(url, list(names.values()))
        assert set(codes.values()) == {0}, f"workers did not stop cleanly on SIGTERM: {codes}"


def passive_worker_file(folder: Path, party: str, url: str, processes: int = 2) -> Path:
    """A worker file (and signing key pair) in ``folder`` for ``party``: breast's host columns,
    ``processes`` processes, on the broker at ``url``."""
    write_key_pair(folder / "keys", party)
    path = folder / f"{party}.yaml"
    path.write_text(yaml.safe_dump({
        "party": party, "role": "passive", "data": str(DATA / "breast_hetero_host.csv"),
        "models": str(folder / "models"), "processes": processes,
        "transport": {"kind": "rabbitmq", "url": url},
        "signing": {"key_dir": str(folder / "keys")}}))
    return path
