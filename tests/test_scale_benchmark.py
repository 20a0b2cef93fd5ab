"""benchmarks.scale end to end, tiny: the real workers, broker and flow give the numbers its
JSON contract promises (issue 17's run is the same command at a million rows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scenarios import REPO


# a benchmark's own check: make test-all
@pytest.mark.heavy
@pytest.mark.slow
def test_a_tiny_scale_run_reports_every_number(tmp_path: Path, rabbit_url: str) -> None:
    # Prepare
    out = tmp_path / "scale.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)  # the benchmark runs its own ephemeral Prefect
    # Execute
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--rows", "2000", "--features", "10",
         "--bits", "1024", "--depth", "2", "--url", rabbit_url, "--json", str(out),
         "--work", str(tmp_path / "work")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    # Assert
    assert run.returncode == 0, run.stderr[-3000:]
    numbers = json.loads(out.read_text())
    assert numbers["psi_seconds"] > 0
    assert len(numbers["tree_seconds"]) == 1 and numbers["tree_seconds"][0] > 0
    assert numbers["steps"]["align-entities"] == numbers["psi_seconds"]
    assert all(numbers["steps"][s] > 0 for s in ("encrypt-gradients", "build-histograms",
                                                 "find-splits"))
    rss = numbers["peak_rss_bytes"]
    assert {"guest", "host-0", "host-1"} <= set(rss) and all(v > 0 for v in rss.values())
    assert numbers["n_train"] == 1900  # 95% of each party's ids are shared
    assert "PSI (align-entities)" in run.stdout
