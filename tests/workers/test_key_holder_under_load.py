"""The key holder's processes on a machine with no idle CPU (issue 28, item 1).

The preparers that make obfuscators ahead run at ``SCHED_IDLE``: with every core busy they may
not run again for minutes. ``multiprocessing.Pool.terminate`` waited 900 s there for its result
queue's lock, held by such a preparer. Here every core runs two busy loops while the pool's
preparers are starved, by the load alone or for good (SIGSTOP, wherever they were): closing the
pool and ending the active party's job must still return within seconds.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from boosting.params import BoostParams
from crypto.paillier import ciphertexts_from_bytes
from crypto.pool import PREPARE_BATCH, KeyHolderPool
from workers.vertical.active_state import ActiveTraining

BUSY_SECONDS = 90
"""Each busy loop ends by itself after this, even if the test is killed."""
CLOSE_SECONDS = 10.0
"""A close that takes longer waited for a starved process (the bound leaves a loaded CI
machine room: the kills and the encrypting processes' exit take about a second here)."""
_BUSY_LOOP = (f"import time\nend = time.monotonic() + {BUSY_SECONDS}\n"
              "while time.monotonic() < end: pass\n")


@pytest.fixture
def every_core_busy() -> Iterator[None]:
    """Two busy loops per core at normal priority: no CPU is left over for ``SCHED_IDLE``."""
    loops = [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP])
             for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
        for loop in loops:
            loop.wait()


def _preparers_at_idle_priority(count: int, seconds: float = 20.0) -> list[int]:
    """The pids of this process's ``count`` children running at ``SCHED_IDLE`` (the
    preparers, once started), waited for."""
    deadline = time.monotonic() + seconds
    while True:
        idle = []
        for child in mp.active_children():
            try:
                if child.pid and os.sched_getscheduler(child.pid) == os.SCHED_IDLE:
                    idle.append(child.pid)
            except OSError:  # gone meanwhile
                continue
        if len(idle) == count:
            return idle
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(idle)} of {count} preparers reached SCHED_IDLE")
        time.sleep(0.05)


def _starve_for_good(pids: list[int]) -> None:
    """The limit of starvation: the preparers never run again, wherever they were (holding
    whatever they held)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(60)
@pytest.mark.parametrize("starved", ["by the load", "for good"])
def test_the_pool_closes_in_seconds_while_its_preparers_get_no_cpu(
        keypair_1024, every_core_busy: None, starved: str) -> None:  # type: ignore[no-untyped-def]
    _, private = keypair_1024
    pool = KeyHolderPool(private, processes=2)
    preparers: list[int] = []
    try:
        pool.encrypt([1, 2, 3])  # the encrypting processes are up
        pool.prepare(100 * PREPARE_BATCH)  # more than they make before the close
        preparers = _preparers_at_idle_priority(2)
        if starved == "for good":
            _starve_for_good(preparers)
        started = time.monotonic()
        pool.close()
        took = time.monotonic() - started
    finally:
        _kill(preparers)
    assert took < CLOSE_SECONDS, f"close() took {took:.1f} s"


@pytest.mark.timeout(60)
def test_the_active_party_ends_its_job_in_seconds_while_its_preparers_get_no_cpu(
        keypair_1024, every_core_busy: None) -> None:  # type: ignore[no-untyped-def]
    public, private = keypair_1024
    run = ActiveTraining(params=BoostParams(n_trees=2), public=public, private=private,
                         crypto_processes=2)
    preparers: list[int] = []
    try:
        run.prepare_encryption(50 * PREPARE_BATCH, 0)  # as after a tree, waiting for histograms
        preparers = _preparers_at_idle_priority(2)
        _starve_for_good(preparers)
        plain = list(range(300))  # encryption does not wait for them either
        cts = ciphertexts_from_bytes(run.crypto_pool().encrypt(plain), public)
        assert [int(m) for m in private.decrypt_batch(cts)] == plain
        started = time.monotonic()
        run.close()  # what CLOSE_JOB does
        took = time.monotonic() - started
    finally:
        _kill(preparers)
    assert took < CLOSE_SECONDS, f"the job's close took {took:.1f} s"
    assert run.pool is None
