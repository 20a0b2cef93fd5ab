"""The Python API: ``fedboost.train`` from a path, a mapping or a ``JobConfig`` gives the model
``fedboost train`` gives; ``fedboost.predict`` the command's scores; the README's example runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import fedboost
from flows.config import ConfigError, JobConfig, load_config
from tests.scenarios import CONFIGS, REPO

FEDBOOST = [sys.executable, "-m", "fedboost.cli"]
PARTS = ("guest/model.json", "host/lookup.json")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    return subprocess.run([*FEDBOOST, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def _job() -> dict[str, Any]:
    raw = yaml.safe_load((CONFIGS / "breast.yaml").read_text())
    for party in raw["parties"].values():
        party["data"] = str((CONFIGS / party["data"]).resolve())
    raw["crypto"]["key_bits"] = 1024
    raw["params"]["n_trees"] = 3
    return raw


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fedboost train`` and ``fedboost predict`` as a user runs them."""
    folder = tmp_path_factory.mktemp("cli")
    (folder / "job.yaml").write_text(yaml.safe_dump(_job()))
    done = _run("train", "job.yaml", "--out", "run", cwd=folder)
    assert done.returncode == 0, done.stderr
    done = _run("predict", "run", "--out", "scores.csv", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder


# three embedded trainings (136 s in CI): make test-all; CI keeps the README's API example
# (tests/test_first_hour.py) and fedboost.train's errors below
@pytest.mark.heavy
@pytest.mark.usefixtures("prefect_harness")
def test_train_from_a_path_a_mapping_or_a_config_gives_the_cli_model(
        cli_run: Path, tmp_path: Path) -> None:
    sources: dict[str, Any] = {"path": cli_run / "job.yaml", "mapping": _job(),
                               "config": load_config(cli_run / "job.yaml")}
    assert isinstance(sources["config"], JobConfig)
    for kind, source in sources.items():
        result = fedboost.train(source, out=tmp_path / kind)
        for part in PARTS:
            assert (tmp_path / kind / part).read_bytes() == \
                (cli_run / "run" / part).read_bytes(), (kind, part)
        assert isinstance(result, fedboost.TrainResult)
        assert result.job == "breast" and result.protocol == "vertical_secureboost"
        assert result.run_dir == tmp_path / kind and result.n_trees == 3
        assert result.model_parts == {"guest": tmp_path / kind / "guest" / "model.json",
                                      "host": tmp_path / kind / "host" / "lookup.json"}
        assert result.metrics == json.loads((tmp_path / kind / "metrics.json").read_text())
        assert [t.tree for t in result.history] == [0, 1, 2]
        assert all(t.seconds and t.seconds > 0 and "train_auc" in t.metrics
                   for t in result.history)
        assert result.history[-1].metrics["train_auc"] == result.final_metrics["train_auc"]
        assert set(result.final_metrics) == {"train_auc", "train_logloss", "valid_auc",
                                             "valid_logloss"}
        assert fedboost.TrainResult.load(tmp_path / kind) == result

    scored = fedboost.predict(tmp_path / "path", out=tmp_path / "scores.csv")
    assert isinstance(scored, fedboost.PredictResult)
    assert scored.n_scored == 569 and scored.mode == "path" and scored.party == "guest"
    assert scored.scores_file == (tmp_path / "scores.csv").resolve()
    assert scored.scores_file.read_bytes() == (cli_run / "scores.csv").read_bytes()
    ids, scores = scored.read_scores()
    assert len(ids) == 569 and scores.shape == (569, 1) and np.all((scores > 0) & (scores < 1))


def test_bad_input_raises_the_error_the_cli_prints(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'params.max_dept'"):
        fedboost.train({**_job(), "params": {"max_dept": 2}}, out=tmp_path)
    with pytest.raises(ConfigError, match="not a fedboost model folder"):
        fedboost.predict(tmp_path)
    with pytest.raises(ConfigError, match="no job to resume"):
        fedboost.resume("breast", out=tmp_path)


def test_importing_fedboost_is_light() -> None:
    """Prefect reads its settings when imported: the API imports it only when it runs."""
    done = subprocess.run([sys.executable, "-c", "import sys, fedboost; print(sorted(m for m in "
                           "('prefect', 'flows', 'workers', 'numpy') if m in sys.modules))"],
                          capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "[]"


def test_a_broker_password_is_cut_out_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedboost.api import keep_password_out
    from flows.config import AMQP_URL_ENV, parse_config

    monkeypatch.setenv(AMQP_URL_ENV, "amqp://u:kept@h:5672/%2F")  # restored after the test
    raw = {**_job(), "transport": {"kind": "rabbitmq", "url": "amqp://u:secret@h:5672/%2F"},
           "signing": {"key_dir": "keys"}}
    config = parse_config(raw, base=CONFIGS, source="job.yaml")
    with pytest.warns(fedboost.FedboostWarning, match="job.yaml: transport.url holds the broker "
                                                      "password") as caught:
        stripped = keep_password_out(config, "job.yaml")
    assert len(caught) == 1 and "secret" not in stripped.model_dump_json()
    assert "FEDBOOST_AMQP_URL" in str(caught[0].message)
