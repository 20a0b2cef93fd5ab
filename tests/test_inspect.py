"""``fedboost inspect``: every party part of real runs (the active party's model, a passive
party's lookup table, a horizontal member's copy, a centralized model), each showing only what
its owner holds; ``--json`` and ``--party``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import fedboost
from fedboost.inspection import ModelInspection, PartView
from tests.scenarios import CONFIGS, horizontal_job


def _inspect(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run([sys.executable, "-m", "fedboost.cli", "inspect", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> dict[str, Path]:
    """A vertical, a horizontal and a centralized run of breast, two trees each."""
    folder = tmp_path_factory.mktemp("runs")
    raw: dict[str, Any] = yaml.safe_load((CONFIGS / "breast.yaml").read_text())
    for party in raw["parties"].values():
        party["data"] = str((CONFIGS / party["data"]).resolve())
    raw["crypto"]["key_bits"] = 1024
    raw["params"]["n_trees"] = 2
    fedboost.train(raw, out=folder / "vertical")
    fedboost.train(horizontal_job("breast-homo", "breast", params={"n_trees": 2}),
                   out=folder / "horizontal")
    fedboost.centralized(raw, out=folder / "centralized")
    return {"vertical": folder / "vertical", "horizontal": folder / "horizontal",
            "centralized": folder / "centralized"}


def _part(found: ModelInspection, party: str) -> PartView:
    return next(p for p in found.parts if p.party == party)


def test_active_part_names_passive_nodes_by_record_only(runs: dict[str, Path]) -> None:
    found = fedboost.inspect(runs["vertical"])
    assert [(p.party, p.role) for p in found.parts] == [("guest", "active"), ("host", "passive")]
    guest = _part(found, "guest")
    saved = json.loads((runs["vertical"] / "guest" / "model.json").read_text())
    assert (guest.format, guest.version) == (saved["format"], saved["version"])
    assert (guest.ensemble, guest.objective, guest.n_trees) == ("boosting", "binary", 2)
    assert guest.max_depth == 3 and guest.features == saved["features"]["guest"]
    assert [t.depth for t in guest.trees] == [3, 3]
    for tree, raw in zip(guest.trees, saved["trees"], strict=True):
        for node, stored in zip(tree.nodes, raw["nodes"], strict=True):
            if node.leaf:
                assert node.value == stored["value"]
            elif stored["owner"] == "guest":  # its own splits, with its thresholds
                assert node.feature == saved["features"]["guest"][stored["feature"]]
                assert node.threshold == stored["threshold"] and node.record is None
            else:  # the host's: a record of its lookup table, nothing more
                assert node.owner == "host" and node.record == stored["record_id"]
                assert node.feature is None and node.threshold is None
                assert f"host:record#{node.record}" in node.text()
    host_nodes = {n.record for t in guest.trees for n in t.nodes if n.owner == "host"}
    assert guest.other_records == {"host": len(host_nodes)} and host_nodes


def test_passive_part_is_its_lookup_table(runs: dict[str, Path]) -> None:
    found = fedboost.inspect(runs["vertical"])
    guest, host = _part(found, "guest"), _part(found, "host")
    saved = json.loads((runs["vertical"] / "host" / "lookup.json").read_text())
    assert (host.format, host.version, host.job) == ("fedboost-lookup", 1, "breast")
    assert host.lookup_size == len(saved["records"]) and not host.trees  # no leaf values
    assert {r.record for r in host.records} == {n.record for t in guest.trees
                                                 for n in t.nodes if n.owner == "host"}
    for r in host.records:
        stored = saved["records"][str(r.record)]
        assert r.feature == saved["features"][stored["feature"]]
        assert (r.threshold, r.bin) == (stored["threshold"], stored["bin"])
    text = found.text()
    assert f"lookup table: {host.lookup_size} records over 20 features" in text
    assert f"record#{host.records[0].record}: {host.records[0].feature} <= " in text


def test_member_and_centralized_parts(runs: dict[str, Path]) -> None:
    found = fedboost.inspect(runs["horizontal"])
    assert [(p.party, p.role) for p in found.parts] == [("guest", "member"), ("host", "member")]
    for part in found.parts:  # every member holds the whole model, every threshold
        assert part.n_trees == 2 and not part.other_records and part.job == "breast-homo"
        assert all(n.leaf or (n.feature and n.threshold is not None)
                   for t in part.trees for n in t.nodes)
    member = fedboost.inspect(runs["horizontal"] / "host")  # a worker's own folder
    assert [(p.party, p.role) for p in member.parts] == [("host", "member")]
    central = fedboost.inspect(runs["centralized"])
    assert [(p.party, p.role) for p in central.parts] == [("centralized", "centralized")]
    assert central.parts[0].n_trees == 2 and not central.parts[0].other_records


def test_command_prints_text_and_json(runs: dict[str, Path]) -> None:
    done = _inspect(str(runs["vertical"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{runs['vertical']}: 2 model part(s)\n")
    assert "guest (active)" in done.stdout and "host (passive)" in done.stdout
    assert "host:record#" in done.stdout and "leaf " in done.stdout
    done = _inspect(str(runs["vertical"]), "--json", "--party", "host")
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout)
    assert parsed == fedboost.inspect(runs["vertical"], party="host").to_dict()
    assert [p["party"] for p in parsed["parts"]] == ["host"]
    assert parsed["parts"][0]["lookup_size"] == len(parsed["parts"][0]["records"])


def test_folders_without_parts_are_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    done = _inspect(str(tmp_path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"fedboost: error: {tmp_path}: no model part here")
    done = _inspect(str(runs["vertical"]), "--party", "nobody")
    assert done.returncode == 1 and "parties: guest, host" in done.stderr
    (tmp_path / "model.json").write_text("{}")
    done = _inspect(str(tmp_path))
    assert done.returncode == 1 and "cannot read it as a model" in done.stderr
