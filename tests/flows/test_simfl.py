"""SimFL end to end on the embedded default (breast_homo's two hospitals): every member ends
with the same model; a second run on the same data reuses the preprocessing and trains the same
model; a recorded run shows no feature value leaving a member but the thresholds of the trees
it built; bad input ends with one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import yaml

from boosting.binning import fit_cuts
from boosting.tree import load_model
from fedboost.cli import main
from fedboost.embedded import FLOW_ENDPOINT, train_embedded
from flows.config import SimflJobConfig, load_config
from messages.codec import to_wire
from messages.envelope import MsgType, decode_envelope
from messages.transport import MemoryHub
from tests.scenarios import DATA
from workers.data import load_party_data

pytestmark = pytest.mark.usefixtures("prefect_harness")

MEMBERS = ("guest", "host")


def _raw(job: str, **data: Path) -> dict[str, Any]:
    parties: dict[str, Any] = {
        m: {"role": "member", "data": str(data.get(m, DATA / f"breast_homo_{m}.csv")),
            "id": "id", "label": "y"} for m in MEMBERS}
    parties["aggregator"] = {"role": "aggregator"}
    return {"job": job, "protocol": "simfl", "parties": parties,
            "params": {"n_trees": 6, "max_depth": 4, "learning_rate": 0.3, "max_bin": 32,
                       "objective": "binary", "seed": 0, "lsh": {"r": 4.0, "seed": 3}}}


def _config(job: str, **data: Path) -> SimflJobConfig:
    return SimflJobConfig.model_validate(_raw(job, **data))


def test_members_share_one_model_and_a_second_run_reuses_the_preprocessing(
        tmp_path: Path) -> None:
    config = _config("simfl-breast")
    first = train_embedded(config, tmp_path)
    models = [load_model(tmp_path / m / "model.json") for m in MEMBERS]
    assert models[0] == models[1] and len(models[0].trees) == 6
    assert first["preprocess_reused"] is False and first["preprocess_seconds"] > 0
    assert all(b > 0 for b in first["preprocess_bytes"].values())
    assert first["tree_bytes"] > 0 and first["train_auc"] > 0.95
    assert [h["builder"] for h in first["history"]] == ["guest", "host"] * 3  # taking turns
    second = train_embedded(config, tmp_path)  # same members, data and LSH: reused
    assert second["preprocess_reused"] is True
    assert load_model(tmp_path / "guest" / "model.json") == models[0]
    other_seed = _raw("simfl-breast")
    other_seed["params"]["lsh"]["seed"] = 4  # other functions: preprocessing again
    third = train_embedded(SimflJobConfig.model_validate(other_seed), tmp_path)
    assert third["preprocess_reused"] is False


def test_no_feature_value_leaves_a_member_but_its_trees_thresholds(tmp_path: Path) -> None:
    config = _config("simfl-audit")
    hub = MemoryHub([*config.parties, FLOW_ENDPOINT], record=True)
    train_embedded(config, tmp_path, hub=hub)
    recorded = [(s, r, decode_envelope(msgpack.unpackb(d)["envelope"]))
                for s, r, d in hub.recorded()]
    for member in MEMBERS:
        data = load_party_data(member, DATA / f"breast_homo_{member}.csv", "id", "y",
                               require_label=True)
        values = {v for v in np.unique(data.x) if v not in (0.0, 1.0)}
        cuts = {float(c) for col in fit_cuts(data.x, 32) for c in col}
        sent = [env for s, _, env in recorded if s == member]
        kinds = {env.kind for env in sent}
        assert kinds & {MsgType.S_ROW_HASHES, MsgType.S_GRADIENTS}, kinds
        for env in sent:
            if env.kind == MsgType.S_TREE:  # the model it built: thresholds are its cut points
                thresholds = {n.threshold for n in env.body.nodes if n.left != -1}
                assert thresholds <= cuts, thresholds - cuts
                continue
            floats = set(_floats(to_wire(env.body)))
            raw = b"".join(_bytes(to_wire(env.body)))
            assert not floats & values, (env.kind.name, sorted(floats & values)[:3])
            candidates = values
            if env.kind == MsgType.S_GRADIENTS:  # noisy sums, multiples of the noise's grid:
                sums = np.frombuffer(env.body.g + np.float64(env.body.h_total).tobytes(),
                                     "<f8")  # a feature value on
                assert np.allclose(sums * 4096, np.round(sums * 4096), rtol=0, atol=1e-6)
                candidates = {v for v in values if v * 4096 != round(v * 4096)}  # it: chance
            leaked = [v for v in list(candidates)[:200]
                      if np.float64(v).tobytes() in raw or np.float32(v).tobytes() in raw]
            assert not leaked, (env.kind.name, leaked[:3])


def share_keys(source: Path, target: Path, parties: tuple[str, ...] | list[str]) -> None:
    """Give the embedded parties under ``target`` the checkpoint keys of those under
    ``source`` (their private folders: ``.fedboost/<party>``)."""
    for party in parties:
        folder = target / ".fedboost" / party
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = folder / "checkpoint.key"
        key.write_bytes((source / ".fedboost" / party / "checkpoint.key").read_bytes())
        key.chmod(0o600)


def _floats(value: Any) -> list[float]:
    if isinstance(value, (list, tuple)):
        return [f for v in value for f in _floats(v)]
    return [value] if isinstance(value, float) else []


def _bytes(value: Any) -> list[bytes]:
    if isinstance(value, (list, tuple)):
        return [b for v in value for b in _bytes(v)]
    return [value] if isinstance(value, bytes) else []


def _write(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


def _train_cli(tmp_path: Path, raw: dict[str, Any],
               capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(raw))
    code = main(["train", str(job), "--out", str(tmp_path / "run")])
    return code, capsys.readouterr().err


def test_a_member_whose_columns_differ_is_named_with_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header, rows = _rows(DATA / "breast_homo_host.csv")
    renamed = _write(tmp_path / "host.csv", [*header[:-1], "other"], rows)
    code, err = _train_cli(tmp_path, _raw("simfl-columns", host=renamed), capsys)
    lines = [line for line in err.splitlines() if line.startswith("fedboost: error:")]
    assert code == 1 and len(lines) == 1, err[-2000:]
    assert f"party host: file {renamed}: columns differ" in lines[0]


def test_a_member_with_one_class_is_named_with_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header, rows = _rows(DATA / "breast_homo_host.csv")
    label = header.index("y")
    one_class = _write(tmp_path / "host.csv", header, [r for r in rows if r[label] == "1"])
    code, err = _train_cli(tmp_path, _raw("simfl-one-class", host=one_class), capsys)
    lines = [line for line in err.splitlines() if line.startswith("fedboost: error:")]
    assert code == 1 and len(lines) == 1, err[-2000:]
    assert f"party host: file {one_class}: its labels hold one class only" in lines[0]


def test_fewer_than_two_members_is_a_config_error(tmp_path: Path) -> None:
    raw = _raw("simfl-alone")
    del raw["parties"]["host"]
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(raw))
    with pytest.raises(Exception, match="1 member\\(s\\): SimFL needs at least 2 members"):
        load_config(job)
    assert main(["train", str(job)]) == 1
    json.dumps(raw)  # the job file itself is plain data


def test_a_run_that_died_mid_job_resumes_to_the_uninterrupted_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flows.simfl

    config = _config("simfl-resume")
    reference = train_embedded(config, tmp_path / "reference")
    # the members' noise and hash functions come from their own keys, the aggregator's ties
    # from its own: the same keys, the same model (what the uninterrupted run would have given)
    share_keys(tmp_path / "reference", tmp_path / "run", [*MEMBERS, "aggregator"])
    share = flows.simfl.share

    def dies_at_tree_4(job: str, others: list[str], builder: str, tree: int) -> Any:
        if tree == 4:
            raise KeyboardInterrupt("the flow's machine went down")
        return share(job, others, builder, tree)

    monkeypatch.setattr(flows.simfl, "share", dies_at_tree_4)
    with pytest.raises(KeyboardInterrupt):
        train_embedded(config, tmp_path / "run")
    monkeypatch.setattr(flows.simfl, "share", share)
    resumed = train_embedded(config, tmp_path / "run")
    assert resumed["resumed_after"] == 4 and resumed["trees_trained"] == 2
    for member in MEMBERS:
        assert load_model(tmp_path / "run" / member / "model.json") == \
            load_model(tmp_path / "reference" / member / "model.json")
    assert resumed["train_auc"] == reference["train_auc"]
