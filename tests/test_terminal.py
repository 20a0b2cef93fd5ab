"""README step 5 typed into a real terminal (a tmux pane): two workers started with '&' in the
terminal the training's progress bar runs in, their lines sent to files as the README says;
the pane then holds the bar and the result line, not the workers' step lines over them."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.scenarios import CONFIGS, DATA, REPO

N_TREES = 3


def _readme_step_5() -> list[str]:
    readme = (REPO / "README.md").read_text()
    step = readme[readme.index("**5. Run the federation.**"):]
    block = re.search(r"```bash\n(.*?)```", step, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def _tmux(*args: str, socket: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], check=True, capture_output=True,
                          text=True, timeout=30).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_readme_step_5_in_a_terminal_keeps_the_bar_clear_of_worker_lines(
        tmp_path: Path, rabbit_url: str) -> None:
    tag = f"{os.getpid() % 100000}"
    guest, host = f"g{tag}", f"h{tag}"  # the shared test broker: names of this test's own
    raw = yaml.safe_load((CONFIGS / "default_credit_rabbitmq.yaml").read_text())
    raw["job"] = f"terminal-{tag}"
    raw["parties"] = {
        guest: {**raw["parties"]["guest"], "data": str(DATA / "breast_hetero_guest.csv")},
        host: {**raw["parties"]["host"], "data": str(DATA / "breast_hetero_host.csv")}}
    # 2048-bit keys as the job file has them: a worker's default policy refuses fewer
    raw["params"]["n_trees"] = N_TREES
    raw["signing"] = {"key_dir": str(tmp_path / "keys")}
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default_credit_rabbitmq.yaml").write_text(yaml.safe_dump(raw))
    # the README's lines as they are, but for the names of this test's parties and its key folder
    lines = [line.replace("--name guest --name host", f"--name {guest} --name {host}")
             .replace("--party guest", f"--party {guest}").replace("--party host",
                                                                   f"--party {host}")
             .replace("deploy/keys", str(tmp_path / "keys")) for line in _readme_step_5()]
    assert any("> guest.log 2>&1 &" in line for line in _readme_step_5()), lines
    bindir = Path(sys.executable).parent
    script = tmp_path / "step5.sh"
    script.write_text("\n".join([
        f"export PATH={shlex.quote(str(bindir))}:$PATH FEDBOOST_AMQP_URL={shlex.quote(rabbit_url)}"
        " PREFECT_SERVER_ANALYTICS_ENABLED=false", "unset PREFECT_API_URL", "set -m",
        *lines, "echo STEP5-DONE"]) + "\n")
    socket = f"fedboost-{tag}"
    _tmux("new-session", "-d", "-s", "step5", "-x", "160", "-y", "50", "-c", str(tmp_path),
          f"bash --norc --noprofile {shlex.quote(str(script))}; sleep 600", socket=socket)
    try:
        deadline = time.monotonic() + 600
        pane = ""
        while time.monotonic() < deadline and "STEP5-DONE" not in pane:
            time.sleep(2)
            pane = _tmux("capture-pane", "-p", "-t", "step5", "-S", "-200", socket=socket)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30)
    assert "STEP5-DONE" in pane, pane
    shown = [line.rstrip() for line in pane.splitlines() if line.strip()]
    trained = [line for line in shown if line.startswith(f"trained {N_TREES} trees")]
    assert trained, pane
    bar = [line for line in shown if re.search(rf"trees {N_TREES}/{N_TREES} .*s/tree", line)]
    assert bar and re.search(r"train_auc=0\.\d{4}", bar[-1]), pane  # drawn whole, in place
    assert not [line for line in shown if " INFO " in line or "WARNING" in line], pane
    logs = {p: (tmp_path / f"{p}.log").read_text() for p in ("guest", "host")}
    assert all(" INFO " in text for text in logs.values()), logs  # their lines went there
