"""Workers of a local federation as ``fedboost worker`` processes, started the way a party's
operator starts them: what the tests and benchmarks that need real worker processes (over a
real broker) drive, so they all start and stop workers one way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
"""The folder holding this package: on the workers' path, so they run this very code."""
FEDBOOST = (sys.executable, "-m", "fedboost.cli")
"""The command line, as this interpreter's ``fedboost``."""


def worker_env(**extra: str) -> dict[str, str]:
    """A worker process's environment: this code on its path, and no Prefect server (a worker
    never talks to Prefect), with ``extra`` variables."""
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT), **extra}
    env.pop("PREFECT_API_URL", None)
    return env


def start_worker(party: str, config: Path, *, cwd: Path, log: Path | None = None,
                 append: bool = False, args: Iterable[str] = (),
                 env: dict[str, str] | None = None, command: Iterable[str] = FEDBOOST,
                 new_session: bool = False) -> subprocess.Popen[bytes]:
    """``fedboost worker --party PARTY --config CONFIG ARGS`` in ``cwd``, its output in ``log``
    (None: this process's; ``append``: after what an earlier worker wrote there), in a session
    of its own if ``new_session`` (a signal to the session reaches its every process)."""
    output = None if log is None else log.open("a" if append else "w")
    return subprocess.Popen([*command, "worker", "--party", party, "--config", str(config),
                             *args],
                            stdout=output, stderr=None if output is None else subprocess.STDOUT,
                            env=worker_env() if env is None else env, cwd=cwd,
                            start_new_session=new_session)


def stop_workers(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 60) -> list[int]:
    """SIGTERM to every worker still running (a worker passes it on to its processes and
    exits 0); their exit codes."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return [proc.wait(timeout=timeout) for proc in procs]
