"""A horizontal run killed mid-job (the flow, its Prefect server and every worker, no clean-up)
resumes after the last tree every party checkpointed, and ends with the model of an
uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from boosting.tree import load_model
from tests.scenarios import DATA, REPO

N_TREES = 8


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "job": "homo-resume", "protocol": "horizontal",
        "parties": {"guest": {"role": "member", "data": str(DATA / "breast_homo_guest.csv"),
                              "label": "y"},
                    "host": {"role": "member", "data": str(DATA / "breast_homo_host.csv"),
                             "label": "y"},
                    "aggregator": {"role": "aggregator"}},
        "params": {"n_trees": N_TREES, "max_depth": 3}}))
    return job


def _fedboost(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "fedboost.cli", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own group: killed with its server


def _finish(proc: subprocess.Popen[str]) -> str:
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    return output


def test_a_killed_horizontal_run_resumes_to_the_uninterrupted_model(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _finish(_fedboost("train", str(job), "--out", str(tmp_path / "reference")))
    run = tmp_path / "run"
    flow = _fedboost("train", str(job), "--out", str(run))
    seen: list[str] = []
    assert flow.stdout is not None
    for line in flow.stdout:
        seen.append(line)
        if f"trees 3/{N_TREES} " in line:  # the progress line after tree 3's checkpoint
            os.killpg(flow.pid, signal.SIGKILL)
            break
    flow.wait()
    assert flow.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    output = _finish(_fedboost("resume", "homo-resume", "--out", str(run)))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["resumed_after"] >= 2, output[-3000:]
    assert metrics["trees_trained"] == N_TREES - metrics["resumed_after"]
    assert len(metrics["trees"]) == N_TREES and metrics["dropped"] == []
    for member in ("guest", "host"):
        assert load_model(run / member / "model.json") == \
            load_model(tmp_path / "reference" / member / "model.json"), member
        assert not (run / member / "checkpoints").exists()  # the finished job's are gone
