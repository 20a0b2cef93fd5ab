"""A worker's processes die with it (issue 12, item 13): SIGKILL of a real ``fedboost worker
--processes 2`` over RabbitMQ, and of a process holding the active party's crypto pool, leaves
no orphan behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from fedboost.local_workers import start_worker
from messages.rabbit_queues import delete_party_queues
from tests.scenarios import REPO, passive_worker_file, wait_until



def _children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (from /proc), but multiprocessing's resource
    tracker and the command's guardian (``tests/test_command_lifelines.py`` has those)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        if (int(fields[1]) == pid and fields[0] != "Z" and b"resource_tracker" not in cmdline
                and b"workers.lifeline" not in cmdline):
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still alive after ``seconds`` (killed then, so no test leaves orphans)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    left = [p for p in pids if _alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def test_killing_the_worker_command_stops_its_processes(rabbit_url: str, tmp_path: Path) -> None:
    party = f"host{uuid.uuid4().hex[:6]}"
    worker_file = passive_worker_file(tmp_path, party, rabbit_url)
    log = tmp_path / "worker.log"
    parent = start_worker(party, worker_file, log=log, cwd=tmp_path)
    children: list[int] = []
    try:
        wait_until(lambda: log.read_text().count(f"worker {party} serving") == 2, 120,
                   f"both processes of {party}")
        children = _children(parent.pid)
        assert len(children) == 2, (children, log.read_text()[-2000:])
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _gone_within(children, 5.0) == [], f"orphans left running: {log.read_text()}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        _gone_within(children, 0.0)
        delete_party_queues(rabbit_url, [party])


_POOL_HOLDER = """
import sys, time
from crypto.paillier import generate_keypair
from crypto.pool import KeyHolderPool
from workers.lifeline import die_with_parent
public, private = generate_keypair(512)
pool = KeyHolderPool(private, processes=2, on_start=die_with_parent)
pool.encrypt([1, 2, 3])  # the processes are up
pool.prepare(1_000_000)  # and the preparers, at idle priority, with their own pipes
print("ready", flush=True)
time.sleep(600)
"""


def test_crypto_processes_die_with_the_worker_process_that_holds_the_key(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _POOL_HOLDER], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    pool: list[int] = []
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ready"
        pool = _children(holder.pid)
        assert len(pool) == 4, pool  # two encrypting, two making obfuscators ahead
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        assert _gone_within(pool, 5.0) == [], "crypto processes outlived their worker"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        _gone_within(pool, 0.0)
