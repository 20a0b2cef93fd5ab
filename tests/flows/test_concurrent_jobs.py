"""Four jobs at once on one set of workers over the real broker: each job's model equals the
model of the same job run alone (the embedded default), so jobs share nothing they should not.
"""

from __future__ import annotations

import json
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedboost.embedded import train_embedded
from fedboost.local_workers import start_worker, stop_workers
from flows.config import JobConfig, load_config
from flows.secureboost import vertical_secureboost
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair
from tests.scenarios import REPO

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]

VARIANTS: list[dict[str, Any]] = [
    # different shapes, so a message filed under the wrong job would change some model
    {"n_trees": 3, "max_depth": 3},
    {"n_trees": 2, "max_depth": 2, "learning_rate": 0.1},
    {"n_trees": 3, "max_depth": 3, "subsample": 0.8, "seed": 7},
    {"n_trees": 2, "max_depth": 4, "reg_lambda": 5.0},
]


def _job_file(root: Path, tag: str, url: str) -> Path:
    """breast with this run's own party names (own queues), 1024-bit keys the parties'
    policies allow."""
    raw = yaml.safe_load((REPO / "configs" / "breast.yaml").read_text())
    guest, host = raw["parties"]["guest"], raw["parties"]["host"]
    for party in (guest, host):
        party["data"] = str((REPO / "configs" / party["data"]).resolve())
        party["policy"] = {"min_key_bits": 1024}
    raw["parties"] = {f"guest{tag}": guest, f"host{tag}": host}
    raw["job"] = f"breast-{tag}"
    raw["crypto"]["key_bits"] = 1024
    raw["transport"] = {"kind": "rabbitmq", "url": url}
    raw["signing"] = {"key_dir": str(root / "keys")}
    for name in (*raw["parties"], "flow"):
        write_key_pair(root / "keys", name)
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _variant(base: JobConfig, k: int) -> JobConfig:
    params = base.params.model_copy(update=VARIANTS[k])
    return base.model_copy(update={"job": f"{base.job}-{k}", "params": params})


def _model_files(folder: Path, config: JobConfig) -> tuple[bytes, Any]:
    lookup = json.loads((folder / config.passives[0] / "lookup.json").read_text())
    return (folder / config.active / "model.json").read_bytes(), lookup["records"]


@pytest.mark.heavy
def test_four_jobs_at_once_each_equal_their_solo_run(rabbit_url: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    job_file = _job_file(tmp_path, tag, rabbit_url)
    base = load_config(job_file)
    models = tmp_path / "models"
    procs = [start_worker(party, job_file, log=tmp_path / f"{party}.log", cwd=tmp_path,
                          args=["--models", str(models)]) for party in base.parties]
    jobs = [_variant(base, k) for k in range(len(VARIANTS))]
    try:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(vertical_secureboost, jobs))
    finally:
        codes = stop_workers(procs)
        delete_party_queues(rabbit_url, list(base.parties))
    assert codes == [0, 0], f"workers did not stop cleanly: {codes}"

    for config, result in zip(jobs, results, strict=True):
        memory = config.model_copy(update={"transport": config.transport.model_copy(
            update={"kind": "memory"})})
        solo_dir = tmp_path / "solo" / config.job
        # the active party draws a subsample from its own key (workers.vertical.draws): the
        # solo run's party has the worker's
        own = solo_dir / ".fedboost" / config.active
        own.mkdir(parents=True, mode=0o700)
        shutil.copy(models / ".fedboost" / config.active / "checkpoint.key", own / "checkpoint.key")
        solo = train_embedded(memory, solo_dir)
        assert result["n_trees"] == config.params.n_trees
        assert result["train_auc"] == solo["train_auc"], config.job
        assert result["valid_auc"] == solo["valid_auc"], config.job
        assert _model_files(models / config.job, config) == _model_files(solo_dir, config), \
            f"{config.job}: the concurrent run's model differs from its solo run"
    # the jobs ran at once: the active worker's steps of different jobs interleave
    steps = [line.split("job=", 1)[1].split()[0] for line in
             (tmp_path / f"{base.active}.log").read_text().splitlines() if " job=" in line]
    switches = sum(a != b for a, b in zip(steps, steps[1:]))
    assert switches > 2 * len(jobs), f"the jobs ran one after another ({switches} switches)"
    # the four jobs really differ (else equality above would prove less)
    assert len({(models / c.job / c.active / "model.json").read_bytes() for c in jobs}) == 4
