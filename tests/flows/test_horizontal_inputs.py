"""Bad input to a horizontal job, as a user meets it through ``fedboost train`` (in-process,
real workers, real Prefect): each ends with exit status 1 and one line on stderr naming the
member and its file, or the config key. And the shipped job files still load under their
protocol's schema."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedboost.cli import main
from flows.config import ConfigError, job_schemas, load_config, parse_config
from tests.scenarios import CONFIGS, DATA, REPO, horizontal_config, horizontal_job
from workers import DataError
from workers.party import DataSet, PartySpec

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _edited(tmp_path: Path, member: str, edit: Callable[[list[str]], list[str]]) -> Path:
    """A copy of breast_homo's ``member`` file with its lines edited."""
    lines = (DATA / f"breast_homo_{member}.csv").read_text().splitlines()
    out = tmp_path / f"edited_{member}.csv"
    out.write_text("".join(f"{line}\n" for line in edit(lines)))
    return out


def _train(tmp_path: Path, capsys: pytest.CaptureFixture[str], raw: dict[str, Any]) -> str:
    """'fedboost train' of ``raw``: exit status 1 (a fault would raise out of ``main``);
    returns the one error line. (Prefect's log handlers may still write to an earlier test's
    captured stream and report that on this one's: only the error lines are counted.)"""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["train", str(job_file), "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("fedboost: error:")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def _host_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
               edit: Callable[[list[str]], list[str]], **params: Any) -> tuple[str, Path]:
    """Train breast_homo with the host's file edited; the error line and that file."""
    host = _edited(tmp_path, "host", edit)
    raw = horizontal_job("homo-bad-input", "breast", params={"n_trees": 2, **params})
    raw["parties"]["host"]["data"] = str(host)
    return _train(tmp_path, capsys, raw), host


def _cells(edit: Callable[[list[str]], list[str]]) -> Callable[[list[str]], list[str]]:
    """An edit of every line's comma-separated cells."""
    return lambda lines: [",".join(edit(line.split(","))) for line in lines]


def test_member_with_a_renamed_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line, host = _host_file(tmp_path, capsys, lambda ls: [ls[0].replace(",x3,", ",z3,"), *ls[1:]])
    assert "party host" in line and str(host) in line, line
    assert "columns differ" in line and "'z3'" in line and "'x3'" in line, line


def test_member_with_columns_in_another_order(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    swap = _cells(lambda c: [*c[:2], c[3], c[2], *c[4:]])  # x0 and x1, header and rows
    line, host = _host_file(tmp_path, capsys, swap)
    assert "party host" in line and str(host) in line, line
    assert "columns differ" in line and "'x1'" in line and "'x0'" in line, line


def test_member_without_the_label_column(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    line, host = _host_file(tmp_path, capsys, _cells(lambda c: [c[0], *c[2:]]))
    assert "party host" in line and str(host) in line and "no label column 'y'" in line, line


def test_non_binary_label_for_binary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def spoil(lines: list[str]) -> list[str]:
        cells = lines[7].split(",")
        cells[1] = "2"
        return [*lines[:7], ",".join(cells), *lines[8:]]

    line, host = _host_file(tmp_path, capsys, spoil)
    assert "party host" in line and str(host) in line, line
    # the file's 7th data row (line 8 with the header), named where the member loads its file
    assert "row 8," in line, line
    assert "label column 'y': 2 is not 0 or 1 (objective binary)" in line, line


def test_empty_member_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line, host = _host_file(tmp_path, capsys, lambda ls: [])
    assert "party host" in line and str(host) in line and "empty file" in line, line


def test_a_data_set_the_member_does_not_have() -> None:
    """Over a broker a member names a data set of its worker file (the embedded default gives
    files): a name it lacks is a DataError naming the party and the name."""
    spec = PartySpec(name="host_1", role="", data="", id_column="id", label=None,
                     model_dir="/tmp/models",
                     datasets={"homo": DataSet(str(DATA / "default_credit_homo_host_1.csv"),
                                               label="y")})
    assert spec.dataset("homo").label == "y"
    with pytest.raises(DataError, match=r"party host_1 has no data set 'nope' .*\(it has: homo\)"):
        spec.dataset("nope")


@pytest.mark.parametrize(("section", "value", "key"), [
    ("crypto", {"key_bits": 2048}, "'crypto'"),
    ("validation", {"fraction": 0.3}, "'validation'"),
    ("params", {"n_trees": 2, "complete_secure": True}, "'params.complete_secure'"),
])
def test_keys_of_the_vertical_protocol_in_a_horizontal_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, value: Any,
        key: str) -> None:
    raw = horizontal_job("homo-bad-key", "breast")
    raw[section] = value
    line = _train(tmp_path, capsys, raw)
    assert f"unknown key {key}" in line and str(tmp_path / "job.yaml") in line, line


def _vertical_job(name: str) -> dict[str, Any]:
    raw = yaml.safe_load((CONFIGS / name).read_text())
    for party in raw["parties"].values():
        party["data"] = str((CONFIGS / party["data"]).resolve())
    return raw


@pytest.mark.parametrize(("job", "params", "privacy", "expected"), [
    ("breast_homo", {}, {"epsilon": 0.0}, "key 'privacy.epsilon': Input should be greater than 0"),
    ("breast_homo", {}, {"epsilon": 1.0, "clip": -1.0}, "key 'privacy.clip': Input should be greater"),
    ("breast_homo", {}, {"epsilon": 1.0, "trees_per_ensemble": 0},
     "key 'privacy.trees_per_ensemble': Input should be greater than or equal to 1"),
    ("breast_homo", {}, {"epsilon": 1.0, "delta": 1e-5}, "unknown key 'privacy.delta'"),
    ("breast_homo", {"reg_lambda": 0.0}, {"epsilon": 1.0}, "privacy needs params.reg_lambda > 0"),
    ("breast", {"reg_lambda": 0.0}, {"epsilon": 1.0}, "privacy needs params.reg_lambda > 0"),
    ("default_credit_forest", {}, {"epsilon": 1.0},
     "privacy: vertical_random_forest has no differential privacy"),
])
def test_bad_privacy_blocks_are_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], job: str, params: dict[str, Any],
        privacy: dict[str, Any], expected: str) -> None:
    raw = (horizontal_job("homo-bad-privacy", "breast") if job == "breast_homo"
           else _vertical_job(f"{job}.yaml"))
    raw["params"].update(params)
    raw["privacy"] = privacy
    line = _train(tmp_path, capsys, raw)
    assert expected in line and str(tmp_path / "job.yaml") in line, line


def test_a_member_entry_with_a_vertical_role(tmp_path: Path) -> None:
    raw = horizontal_job("homo-bad-role", "breast")
    raw["parties"]["host"]["role"] = "passive"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"parties\.host\.role"):
        load_config(tmp_path / "job.yaml")


def test_every_shipped_job_file_loads_under_its_protocol() -> None:
    """configs/*.yaml and deploy/*job*.yaml: each validates against the schema its
    ``protocol:`` selects (vertical SecureBoost when it names none)."""
    files = sorted(CONFIGS.glob("*.yaml")) + sorted((REPO / "deploy").glob("*job*.yaml"))
    assert len(files) >= 9
    protocols = set()
    for path in files:
        raw = yaml.safe_load(path.read_text())
        config = load_config(path)
        protocol = raw.get("protocol", "vertical_secureboost")
        assert type(config) is job_schemas()[protocol], path.name
        protocols.add(protocol)
    assert protocols == set(job_schemas())


def test_min_members_defaults_to_every_member_and_a_job_may_set_it_lower() -> None:
    """A dropout stops a job by default: going on without a member would show the aggregator
    its rows per bin (docs/horizontal.md, "Dropouts")."""
    assert horizontal_config("homo-min-default", "default_credit").min_members == 3
    assert horizontal_config("homo-min-two", "breast").min_members == 2
    assert horizontal_config("homo-min-set", "default_credit", min_members=2).min_members == 2
    shipped = load_config(CONFIGS / "default_credit_homo.yaml")
    assert shipped.min_members == 3
    with pytest.raises(ConfigError, match="min_members is 4"):
        parse_config(horizontal_job("homo-min-four", "default_credit", min_members=4),
                     base=CONFIGS, source="homo-min-four")
