"""'fedboost predict' over the real broker against running 'fedboost worker' processes: each
worker loads its part of the trained job from its own models folder and scores its own data
file; the scores equal the embedded prediction's, in both modes."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from fedboost.cli import main
from fedboost.local_workers import start_worker, stop_workers
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair
from tests.scenarios import REPO

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _job_file(root: Path, tag: str, url: str) -> Path:
    """breast with this run's own party names (own queues), 3 trees, 1024-bit keys."""
    raw = yaml.safe_load((REPO / "configs" / "breast.yaml").read_text())
    parties = {}
    for name, party in raw["parties"].items():
        party["data"] = str((REPO / "configs" / party["data"]).resolve())
        # each worker's own policy, in its entry: this host also answers batched prediction
        party["policy"] = {"min_key_bits": 1024, "predict_modes": ["path", "batched"]}
        parties[f"{name}{tag}"] = party
    raw.update(job=f"breast-{tag}", parties=parties, transport={"kind": "rabbitmq", "url": url},
               signing={"key_dir": str(root / "keys")})
    raw["params"]["n_trees"] = 3
    raw["crypto"]["key_bits"] = 1024
    for name in (*parties, "flow"):
        write_key_pair(root / "keys", name)
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _scores(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.glob("scores-*.csv")}


def test_predict_over_rabbitmq_equals_the_embedded_prediction(
        rabbit_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 'fedboost train' in this process keeps the URL's password in the environment for the
    # flows it runs (job.json holds none); undo that for the tests after this one
    monkeypatch.setenv("FEDBOOST_AMQP_URL", rabbit_url)
    tag = uuid.uuid4().hex[:6]
    job_file = _job_file(tmp_path, tag, rabbit_url)
    models, runs = tmp_path / "models", tmp_path / "runs"
    guest, host = f"guest{tag}", f"host{tag}"
    procs = [start_worker(party, job_file, log=tmp_path / f"{party}.log", cwd=tmp_path,
                          args=["--models", str(models)]) for party in (guest, host)]
    try:
        assert main(["train", str(job_file), "--out", str(runs)]) == 0
        trained = models / f"breast-{tag}" / guest
        assert (trained / "model.json").is_file()
        capsys.readouterr()
        # --out and --data name places the workers cannot be told about: refused, one line
        assert main(["predict", str(runs), "--out", str(tmp_path / "x.csv")]) == 1
        assert "--out: over RabbitMQ" in capsys.readouterr().err
        got: dict[str, bytes] = {}
        for mode in ("path", "batched"):
            before = set(_scores(trained))
            assert main(["predict", str(runs), "--mode", mode]) == 0
            (name,) = set(_scores(trained)) - before  # one new file per prediction
            assert f"({mode} mode)" in capsys.readouterr().out
            got[mode] = _scores(trained)[name]
        assert got["path"] == got["batched"]
    finally:
        codes = stop_workers(procs)
        delete_party_queues(rabbit_url, [guest, host])
    assert codes == [0, 0]

    # the same model parts scored on the embedded default
    embedded = tmp_path / "embedded"
    config = json.loads((runs / "job.json").read_text())
    config["transport"] = {"kind": "memory"}
    for party in (guest, host):
        shutil.copytree(models / f"breast-{tag}" / party, embedded / party)
    (embedded / "job.json").write_text(json.dumps(config))
    assert main(["predict", str(embedded), "--out", str(tmp_path / "embedded.csv")]) == 0
    expected = (tmp_path / "embedded.csv").read_bytes()
    assert got["path"] == expected
    assert expected.count(b"\n") == 570  # header + every aligned row
