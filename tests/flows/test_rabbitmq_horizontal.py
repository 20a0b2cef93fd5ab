"""Over the real broker, the horizontal protocol as a federation runs it: three members and an
aggregator, each party's worker its own ``fedboost worker`` process with its own worker file
and signing key (``fedboost keys``). The guest's worker serves a horizontal job (as a member)
and a vertical job (as the active party) at the same time; both models equal their embedded
runs. A worker whose policy does not list a protocol refuses its jobs and keeps serving.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.settings import PREFECT_API_URL

from boosting.tree import load_model
from fedboost.embedded import train_embedded
from flows.coordinator import PartyError
from flows.config import AnyJobConfig, load_config
from flows.horizontal import horizontal
from flows.secureboost import vertical_secureboost
from flows.simfl import simfl
from tests.scenarios import DATA, REPO, cli_workers, wait_until

pytestmark = pytest.mark.usefixtures("prefect_harness")
FEDBOOST = [sys.executable, "-m", "fedboost.cli"]
MEMBERS = ("guest", "host_1", "host_2")
HORIZONTAL_PARAMS = {"n_trees": 4, "max_depth": 3, "learning_rate": 0.3, "max_bin": 16,
                     "objective": "binary", "seed": 0}
VERTICAL_PARAMS = {"n_trees": 2, "max_depth": 3, "learning_rate": 0.3, "max_bin": 16,
                   "objective": "binary", "seed": 0}
STEP_TIMEOUT = 180.0
"""A step a worker never answers fails the test in minutes, not after the default hour."""
STEP_LINE = re.compile(r" job=(\S+) step=(\S+) ")


@dataclass
class Federation:
    """Running workers: ``names`` maps each role in this file (guest, host, host_1, host_2,
    aggregator) to this run's party name (its own queues)."""

    root: Path
    url: str
    names: dict[str, str]
    homo: dict[str, Path]
    """Each member's rows of breast_homo (the embedded run reads the same files)."""
    models: Path
    logs: dict[str, Path]
    procs: dict[str, subprocess.Popen[bytes]]


def _split_rows(source: Path, parts: list[Path]) -> None:
    """Deal ``source``'s rows into ``parts`` in turn (every part keeps the header)."""
    with source.open(newline="") as f:
        header, *rows = list(csv.reader(f))
    for k, part in enumerate(parts):
        with part.open("w", newline="") as f:
            csv.writer(f).writerows([header, *rows[k::len(parts)]])


def _worker_files(root: Path, url: str, names: dict[str, str],
                  homo: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each party's own worker file: its data sets, its policy, the broker, its key folder."""
    common = {"models": str(root / "models"), "transport": {"kind": "rabbitmq", "url": url},
              "signing": {"key_dir": str(root / "keys")}}
    homo_set = {"homo": {"data": str(homo["guest"]), "id": "id", "label": "y"}}
    return {
        # no role: each job gives it one (active in the vertical job, member in the horizontal)
        "guest": {"party": names["guest"], "data": str(DATA / "breast_hetero_guest.csv"),
                  "id": "id", "label": "y", "datasets": homo_set,
                  "policy": {"min_key_bits": 1024,
                             "protocols": ["vertical_secureboost", "horizontal", "simfl"]},
                  **common},
        # vertical only, and no role either: a horizontal job reaches its policy's refusal
        "host": {"party": names["host"], "data": str(DATA / "breast_hetero_host.csv"),
                 "id": "id", "policy": {"min_key_bits": 1024,
                                        "protocols": ["vertical_secureboost"]}, **common},
        **{member: {"party": names[member], "role": "member",
                    "datasets": {"homo": {"data": str(homo[member]), "id": "id", "label": "y"}},
                    "policy": {"protocols": ["horizontal", "simfl"]}, **common}
           for member in ("host_1", "host_2")},
        "aggregator": {"party": names["aggregator"], "role": "aggregator",
                       "policy": {"protocols": ["horizontal", "simfl"]}, **common},
    }


@pytest.fixture(scope="module")
def federation(rabbit_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """Five parties, one ``fedboost worker`` process each."""
    tag = uuid.uuid4().hex[:6]
    root = tmp_path_factory.mktemp("horizontal-federation")
    names = {role: f"{role}-{tag}" for role in ("guest", "host", "host_1", "host_2",
                                                 "aggregator")}
    # breast_homo has a guest and a host file: the host's rows make two members
    homo = {"guest": DATA / "breast_homo_guest.csv",
            "host_1": root / "breast_homo_host_1.csv", "host_2": root / "breast_homo_host_2.csv"}
    _split_rows(DATA / "breast_homo_host.csv", [homo["host_1"], homo["host_2"]])
    files = _worker_files(root, rabbit_url, names, homo)
    with cli_workers(root, rabbit_url, names, files) as procs:
        yield Federation(root, rabbit_url, names, homo, root / "models",
                         {role: root / f"{role}.log" for role in files}, procs)


def _horizontal_job(fed: Federation, job: str, members: tuple[str, ...], *,
                    embedded: bool = False) -> dict[str, Any]:
    """The horizontal job file: over the broker each member names its data set ``homo``;
    embedded, the same job with every member's file and the in-memory transport."""
    parties: dict[str, Any] = {
        fed.names[m]: ({"role": "member", "data": str(fed.homo[m]), "id": "id", "label": "y"}
                       if embedded else
                       {"role": "member", "dataset": "homo", "id": "id", "label": "y"})
        for m in members}
    parties[fed.names["aggregator"]] = {"role": "aggregator"}
    return {"job": job, "protocol": "horizontal", "parties": parties,
            "params": HORIZONTAL_PARAMS, **_wiring(fed, embedded)}


def _vertical_job(fed: Federation, job: str, *, embedded: bool = False) -> dict[str, Any]:
    """The vertical job file (guest active, host passive, 1024-bit keys the workers allow)."""
    guest: dict[str, Any] = {"role": "active", "id": "id", "label": "y"}
    host: dict[str, Any] = {"role": "passive", "id": "id"}
    if embedded:
        guest["data"] = str(DATA / "breast_hetero_guest.csv")
        host.update(data=str(DATA / "breast_hetero_host.csv"), processes=1)
    return {"job": job, "protocol": "vertical_secureboost",
            "parties": {fed.names["guest"]: guest, fed.names["host"]: host},
            "params": VERTICAL_PARAMS, "crypto": {"key_bits": 1024},
            "validation": {"fraction": 0.0, "seed": 0}, **_wiring(fed, embedded)}


def _wiring(fed: Federation, embedded: bool) -> dict[str, Any]:
    if embedded:
        return {"transport": {"kind": "memory", "step_timeout": STEP_TIMEOUT}}
    return {"transport": {"kind": "rabbitmq", "url": fed.url, "step_timeout": STEP_TIMEOUT},
            "signing": {"key_dir": str(fed.root / "keys")}}


def _load(folder: Path, raw: dict[str, Any]) -> AnyJobConfig:
    """A job as the CLI reads it: written to a job file, loaded back."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{raw['job']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _steps(log: Path) -> list[tuple[str, str]]:
    """(job, step) of every step a worker's log shows answered, in order."""
    return [(m.group(1), m.group(2)) for line in log.read_text().splitlines()
            if (m := STEP_LINE.search(line))]


def test_a_worker_refuses_a_protocol_its_policy_does_not_list(federation: Federation,
                                                              tmp_path: Path) -> None:
    fed = federation
    host = fed.names["host"]
    refusal = f"party {host} refuses protocol 'horizontal': its policy allows vertical_secureboost"
    job = f"refused-{uuid.uuid4().hex[:6]}"
    config = _load(tmp_path, _horizontal_job(fed, job, ("host_1", "host")))
    with pytest.raises(PartyError) as refused:
        horizontal(config)
    assert refused.value.reply.party == host
    assert refusal in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.user_error, "the job file asks what the party refuses: not a fault"
    assert not (fed.models / job / host).exists()
    # the same worker answers the next job too: 'fedboost train' shows the refusal in one line
    again = _load(tmp_path, _horizontal_job(fed, f"{job}-again", ("host_1", "host")))
    # the CLI's flow run reports to the session's Prefect server (no second one to start)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    started = time.monotonic()
    done = subprocess.run([*FEDBOOST, "train", str(tmp_path / f"{again.job}.yaml")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    print(f"fedboost train refused in {time.monotonic() - started:.1f} s")
    errors = [line for line in done.stderr.splitlines() if line.startswith("fedboost: error:")]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(errors) == 1 and refusal in errors[0], done.stderr[-3000:]
    assert fed.procs["host"].poll() is None, "the host's worker stopped after a refusal"
    refusals = [line for line in fed.logs["host"].read_text().splitlines() if refusal in line]
    assert len(refusals) == 2, refusals


def test_horizontal_and_vertical_jobs_at_once_equal_their_embedded_runs(
        federation: Federation, tmp_path: Path) -> None:
    fed = federation
    tag = uuid.uuid4().hex[:6]
    h_job, v_job = f"homo-{tag}", f"hetero-{tag}"
    h_config = _load(tmp_path / "jobs", _horizontal_job(fed, h_job, MEMBERS))
    v_config = _load(tmp_path / "jobs", _vertical_job(fed, v_job))

    # Flow runs start seconds apart on a busy machine, and each job is short: the guest's
    # worker holds its inbox until both jobs' openers are in it, so both run from the start.
    opened = [(fed.logs["host"], v_job, "OPEN_JOB"), (fed.logs["host_1"], h_job, "H_OPEN_JOB")]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        os.kill(fed.procs["guest"].pid, signal.SIGSTOP)
        try:
            h_run = pool.submit(horizontal, h_config)
            v_run = pool.submit(vertical_secureboost, v_config)
            # a flow sends its opener to every party before it waits for any
            wait_until(lambda: all((job, step) in _steps(log) for log, job, step in opened),
                       120, "both jobs' openers")
        finally:
            os.kill(fed.procs["guest"].pid, signal.SIGCONT)
        h_result, v_result = h_run.result(), v_run.result()
    print(f"both jobs over RabbitMQ in {time.monotonic() - started:.1f} s")

    # the guest's one worker served both jobs at once: its steps of the two jobs interleave
    guest_steps = [job for job, _ in _steps(fed.logs["guest"]) if job in (h_job, v_job)]
    assert {h_job, v_job} <= set(guest_steps)
    switches = sum(a != b for a, b in zip(guest_steps, guest_steps[1:]))
    assert switches >= 3, f"the guest served the jobs one after the other: {guest_steps}"
    # every member and the aggregator took part, through its own worker process
    for role in ("host_1", "host_2", "aggregator"):
        assert any(job == h_job for job, _ in _steps(fed.logs[role])), role
    assert h_result["members"] == [fed.names[m] for m in MEMBERS]
    assert h_result["dropped"] == []
    assert h_result["n_aligned"] == sum(len(fed.homo[m].read_text().splitlines()) - 1
                                        for m in MEMBERS)

    started = time.monotonic()
    h_embedded = train_embedded(_load(tmp_path / "jobs-embedded",
                                      _horizontal_job(fed, h_job, MEMBERS, embedded=True)),
                                tmp_path / "embedded" / h_job)
    v_embedded = train_embedded(_load(tmp_path / "jobs-embedded",
                                      _vertical_job(fed, v_job, embedded=True)),
                                tmp_path / "embedded" / v_job)
    print(f"both jobs embedded in {time.monotonic() - started:.1f} s")

    # horizontal: every member holds the whole model, and each equals the embedded run's
    member_models = set()
    for member in (fed.names[m] for m in MEMBERS):
        over_broker = (fed.models / h_job / member / "model.json").read_bytes()
        embedded = (tmp_path / "embedded" / h_job / member / "model.json").read_bytes()
        assert over_broker == embedded, f"{member}'s model differs from the embedded run's"
        member_models.add(over_broker)
    assert len(member_models) == 1, "the members hold different models"
    assert h_result["train_auc"] == h_embedded["train_auc"]
    assert h_result["train_auc"] > 0.9  # a model that learned (breast cancer is easy)
    # vertical: the active party's model and the passive party's lookup table
    guest, host = fed.names["guest"], fed.names["host"]
    assert v_result["train_auc"] == v_embedded["train_auc"]
    assert (fed.models / v_job / guest / "model.json").read_bytes() == \
        (tmp_path / "embedded" / v_job / guest / "model.json").read_bytes()
    lookups = [json.loads((d / host / "lookup.json").read_text())["records"]
               for d in (fed.models / v_job, tmp_path / "embedded" / v_job)]
    assert lookups[0] == lookups[1]


def test_a_simfl_job_over_the_same_workers_equals_its_embedded_run(
        federation: Federation, tmp_path: Path) -> None:
    """The third protocol on the same five workers: SimFL's members name their data set, the
    aggregator matches their hash values, the trees are the embedded run's."""
    fed = federation
    job = f"simfl-{uuid.uuid4().hex[:6]}"

    def simfl_job(embedded: bool) -> dict[str, Any]:
        raw = _horizontal_job(fed, job, MEMBERS, embedded=embedded)
        raw["protocol"] = "simfl"
        raw["params"] = {**HORIZONTAL_PARAMS, "lsh": {"r": 4.0, "seed": 1}}
        return raw

    over_broker = simfl(_load(tmp_path / "broker", simfl_job(False)))
    embedded_out = tmp_path / "embedded"
    # SimFL's noise and hash functions come from each member's own key, the aggregator's ties
    # from its own: the same keys here
    for member in (*MEMBERS, "aggregator"):
        name = fed.names[member]
        own = embedded_out / ".fedboost" / name
        own.mkdir(parents=True, mode=0o700)
        (own / "checkpoint.key").write_bytes(
            (fed.models / ".fedboost" / name / "checkpoint.key").read_bytes())
    embedded = train_embedded(_load(tmp_path / "embedded-job", simfl_job(True)), embedded_out)
    assert over_broker["preprocess_reused"] is False
    assert over_broker["train_auc"] == embedded["train_auc"]
    for member in MEMBERS:
        name = fed.names[member]
        assert load_model(fed.models / job / name / "model.json") == \
            load_model(embedded_out / name / "model.json"), member
