"""A worker's processes die with the process that started them, however it dies.

Orphans of a killed ``fedboost worker --processes N`` went on consuming the party's queues and
finished its jobs beside the restarted worker (issue 12, item 13). So every process a worker
starts (its other processes, the embedded default's, the active party's crypto processes)
calls ``die_with_parent`` first. On Linux the kernel sends it SIGTERM when its parent exits
(``prctl(PR_SET_PDEATHSIG)``); everywhere, a watchdog thread notices that its parent changed
and sends the same. SIGTERM lets a worker finish the message in hand; a process still alive
``GRACE_SECONDS`` later exits at once (its unacknowledged message goes back to the queue).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time

log = logging.getLogger("fedboost.worker")

PR_SET_PDEATHSIG = 1
POLL_SECONDS = 0.5
"""How often the watchdog looks at the parent's pid."""
GRACE_SECONDS = 10.0
"""How long an orphan may take to finish its message before it exits anyway."""


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
