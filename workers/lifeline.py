"""A worker's processes die with the process that started them, however it dies.

Orphans of a killed ``fedboost worker --processes N`` went on consuming the party's queues and
finished its jobs beside the restarted worker (issue 12, item 13). So every process a worker
starts (its other processes, the embedded default's, the active party's crypto processes)
calls ``die_with_parent`` first. On Linux the kernel sends it SIGTERM when its parent exits
(``prctl(PR_SET_PDEATHSIG)``); everywhere, a watchdog thread notices that its parent changed
and sends the same. SIGTERM lets a worker finish the message in hand; a process still alive
``GRACE_SECONDS`` later exits at once (its unacknowledged message goes back to the queue).

Processes that others start for a command cannot call it: Prefect's ephemeral API server
(uvicorn, in a session of its own so that Ctrl-C does not reach it first), the flow runs
``fedboost serve`` starts, and whatever those start. ``fedboost train`` killed with SIGKILL
left its server running (issue 28, item 2). So a command also calls ``guard_descendants``
first: it marks its environment, which every process started after it inherits at any depth,
and starts a guardian process that waits for the command to end, however it ends, then stops
every process carrying the mark (SIGTERM, SIGKILL after ``GRACE_SECONDS``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing as mp
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("fedboost.worker")

PR_SET_PDEATHSIG = 1
POLL_SECONDS = 0.5
"""How often the watchdog looks at the parent's pid."""
GRACE_SECONDS = 10.0
"""How long an orphan may take to finish its message before it exits anyway."""
LIFELINE_MARK = "FEDBOOST_LIFELINE"
"""The environment variable that marks every process a command started, at any depth (the
command's pid and a random tag): how its guardian finds them once they are orphans, reparented
and in sessions of their own."""


def die_with_parent() -> None:
    """Arrange for this process to stop when the process that started it dies (a no-op in a
    process that multiprocessing did not start)."""
    parent = mp.parent_process()
    if parent is None or parent.pid is None:
        return
    _arm_kernel_signal()
    threading.Thread(target=_watch, args=(parent.pid,), name="lifeline", daemon=True).start()


def _arm_kernel_signal() -> None:
    """Linux: SIGTERM from the kernel when the thread that started this process exits (the
    parent's main thread here: workers and pools are started from it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError) as exc:  # the watchdog still covers it
        log.warning("process %d: cannot ask the kernel to stop it with its parent: %s",
                    os.getpid(), exc)


def _watch(parent: int) -> None:
    """Wait until the parent is gone (also if it died before the kernel signal was armed),
    then stop this process: SIGTERM first, exit after ``GRACE_SECONDS``."""
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    log.warning("process %d: parent %d is gone; stopping", os.getpid(), parent)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(1)


def guard_descendants() -> subprocess.Popen[bytes] | None:
    """Mark this process's environment and start its guardian: once this process has ended,
    SIGKILL included, every process started after this call (from it or from its descendants)
    is stopped. Linux only (the guardian reads ``/proc``); a no-op elsewhere, or when this
    process already has a guardian. The guardian, or None."""
    own = os.environ.get(LIFELINE_MARK, "")
    if not sys.platform.startswith("linux") or own.startswith(f"{os.getpid()}-"):
        return None
    mark = f"{os.getpid()}-{secrets.token_hex(8)}"
    environ = {key: value for key, value in os.environ.items() if key != LIFELINE_MARK}
    source = str(Path(__file__).resolve().parents[1])  # however this process found us
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [source, environ.get("PYTHONPATH")]))
    os.environ[LIFELINE_MARK] = mark
    # a session of its own: the terminal's Ctrl-C and hangup are the command's to handle
    return subprocess.Popen([sys.executable, "-m", "workers.lifeline", str(os.getpid()), mark],
                            env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)


def _guard(command: int, mark: str) -> None:
    """The guardian: wait until ``command`` has ended, then stop the processes marked
    ``mark``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _wait_for_exit(command)
    left = _stop_marked(f"{LIFELINE_MARK}={mark}".encode())
    if left:
        print(f"fedboost: processes {', '.join(map(str, left))} of the ended command {command} "
              f"did not stop", file=sys.stderr)


def _wait_for_exit(command: int) -> None:
    """Return once ``command`` (this process's parent) has ended."""
    try:
        handle = os.pidfd_open(command)  # readable once the process has ended (Linux 5.3)
    except OSError:
        handle = -1
    try:
        if os.getppid() != command:  # it ended before we looked
            return
        if handle >= 0:
            select.select([handle], [], [])
            return
        while os.getppid() == command:
            time.sleep(POLL_SECONDS)
    finally:
        if handle >= 0:
            os.close(handle)


def _stop_marked(needle: bytes) -> list[int]:
    """Stop every process whose environment holds ``needle``; the pids still there
    ``2 * GRACE_SECONDS`` later.

    SIGTERM goes to those whose parent is not marked (the command's own children, orphans):
    one with a marked parent is its parent's to stop (``die_with_parent``), so a worker that
    finishes its step keeps its crypto processes until it is done with them (stopped under
    it, they would leave its step waiting for their results). After ``GRACE_SECONDS`` every
    marked process gets SIGKILL."""
    started = time.monotonic()
    signalled: set[int] = set()
    while True:
        marked = {pid: _parent(pid) for pid in _pids() if _carries(pid, needle)}
        waited = time.monotonic() - started
        if not marked or waited > 2 * GRACE_SECONDS:
            return sorted(marked)
        for pid, parent in marked.items():
            if waited > GRACE_SECONDS:
                _signal(pid, signal.SIGKILL, needle)
            elif parent not in marked and pid not in signalled:
                _signal(pid, signal.SIGTERM, needle)
                signalled.add(pid)
        time.sleep(0.1)


def _pids() -> list[int]:
    own = os.getpid()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != own]


def process_status(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after "pid (comm)": state, parent pid, ...; empty
    when the process is gone (or not on Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rpartition(b")")[2].decode().split()
    except OSError:
        return []


def _parent(pid: int) -> int:
    fields = process_status(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def _carries(pid: int, needle: bytes) -> bool:
    """Whether the process started with ``needle`` in its environment (a zombie has none)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return needle in handle.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def _signal(pid: int, signum: int, needle: bytes) -> None:
    """Signal ``pid`` if it still is a marked process (never one that reused its pid)."""
    try:
        handle = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _carries(pid, needle):
            signal.pidfd_send_signal(handle, signum)
    except OSError:
        pass  # it ended meanwhile
    finally:
        os.close(handle)


if __name__ == "__main__":
    _guard(int(sys.argv[1]), sys.argv[2])
