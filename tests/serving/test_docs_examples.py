"""docs/serving.md's shell example, run as written (issue 37): make a key, start the service,
score with curl, revoke the key. Only what the example leaves to the reader is filled in: the
run folder (``runs/<job>``), a free port for 8443, the key ``fbk_...`` the first line printed,
and the optional ``[--tls-client-ca ...]`` left out."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import _free_port
from tests.scenarios import REPO
from tests.serving.federation import Federation, env


def _example_commands() -> list[str]:
    """The shell commands of the first ``bash`` block of docs/serving.md, continuation lines
    joined."""
    text = (REPO / "docs" / "serving.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None, "docs/serving.md has no bash example"
    return [line.strip() for line in block.group(1).replace("\\\n", " ").splitlines()
            if line.strip()]


def _run(command: str, cwd: Path, environ: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


def test_the_serving_docs_shell_example_runs_as_written(federation: Federation,
                                                        tmp_path: Path) -> None:
    keys_add, serve, curl, revoke = _example_commands()
    for name in ("server.pem", "server.key", "ca.pem"):
        shutil.copy(federation.tls / name, tmp_path / name)
    port = str(_free_port())
    environ = {**env(), "FEDBOOST_AMQP_URL": federation.url,
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    key = _run(keys_add, tmp_path, environ).strip()
    assert key.startswith("fbk_"), key
    serve = (serve.replace("runs/<job>", str(federation.runs)).replace("8443", port)
             .replace(" [--tls-client-ca clients-ca.pem]", ""))
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(["bash", "-c", f"exec {serve}"], cwd=tmp_path, env=environ,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "/v1/score (session" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        asked = curl.replace("fbk_...", key).replace("8443", port)
        answer = json.loads(_run(asked, tmp_path, environ))
        assert answer.get("ids") == ["133", "273"], answer
        assert len(answer["scores"]) == 2 and all(0 < s < 1 for s in answer["scores"])
        _run(revoke, tmp_path, environ)
        time.sleep(1.5)  # "refused within a second"
        refused = json.loads(_run(asked, tmp_path, environ))
        assert refused == {"detail": "the API key is not valid (unknown or revoked)"}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()[-2000:]
