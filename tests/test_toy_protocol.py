"""A fifth protocol that lives only in tests/ (``tests.toy_protocol``) trains end to end on the
embedded default, with ``fedboost train``, its workers in their own processes: fedboost finds
it through ``FEDBOOST_PROTOCOLS`` alone, no file of fedboost edited (docs/protocols.md)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from messages.bodies import Ack
from messages.envelope import MsgType
from messages.kinds import EXTRA_PROTOCOLS_ENV, declare
from tests.scenarios import DATA
from workers.handlers import Protocol, RoleSteps

REPO = Path(__file__).resolve().parents[1]


def _labels(path: Path) -> list[float]:
    with path.open(newline="") as f:
        return [float(row["y"]) for row in csv.DictReader(f)]


def test_a_protocol_declared_outside_fedboost_trains_with_fedboost_train(tmp_path: Path) -> None:
    guest, host = DATA / "breast_homo_guest.csv", DATA / "breast_homo_host.csv"
    job = tmp_path / "toy.yaml"
    job.write_text(f"""job: toy
protocol: toy_mean
parties:
  guest: {{role: member, data: {guest}, id: id, label: y}}
  host: {{role: member, data: {host}, id: id, label: y}}
  aggregator: {{role: aggregator}}
params: {{rounds: 4, learning_rate: 0.5}}
""")
    env = {**os.environ, EXTRA_PROTOCOLS_ENV: "tests.toy_protocol", "PYTHONPATH": str(REPO)}
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fedboost.cli", "train", str(job), "--out",
                           str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trained 4 trees" in done.stdout
    labels = _labels(guest) + _labels(host)
    mean = sum(labels) / len(labels)
    # squared loss from 0 with constant leaves: p_t = mean * (1 - (1 - lr)^t)
    expected = [mean * 0.5 ** (t + 1) for t in range(4)]
    for member in ("guest", "host"):
        leaves = json.loads((out / member / "model.json").read_text())["leaves"]
        assert leaves == pytest.approx(expected, rel=1e-9)
    metrics = json.loads((out / "metrics.json").read_text())
    rmse = [tree["train_rmse"] for tree in metrics["trees"]]
    assert rmse == sorted(rmse, reverse=True) and len(rmse) == 4
    final = mean * (1 - 0.5 ** 4)
    assert rmse[-1] == pytest.approx((sum((final - y) ** 2 for y in labels) / len(labels)) ** 0.5)

    without = subprocess.run([sys.executable, "-m", "fedboost.cli", "train", str(job)],
                             cwd=tmp_path, env={**env, EXTRA_PROTOCOLS_ENV: ""},
                             capture_output=True, text=True, timeout=120)
    assert without.returncode != 0
    assert "'toy_mean' is not a protocol" in without.stderr


def test_a_step_for_a_kind_not_declared_a_command_is_refused() -> None:
    declare("test_undeclared", peer={"T_ONLY_PEER_MAIL": (990, Ack)})

    def step(ctx: object, body: object) -> None:
        return None

    with pytest.raises(ValueError, match="T_ONLY_PEER_MAIL.* is not declared a command"):
        Protocol("test_undeclared", {"member": RoleSteps({MsgType.T_ONLY_PEER_MAIL: step})})
    with pytest.raises(ValueError, match="message kind 990 is T_ONLY_PEER_MAIL"):
        declare("another", commands={"T_OTHER": (990, Ack)})
    with pytest.raises(ValueError, match="not a declared message kind"):
        MsgType(989)
