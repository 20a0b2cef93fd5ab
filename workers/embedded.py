"""The embedded default: each party's worker in its own OS process, on in-memory queues."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.machinery
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess

from messages.signing import Sealer
from messages.transport import MemoryHub, MemoryTransport
from workers.lifeline import die_with_parent
from workers.party import PartySpec
from workers.protocols import PROTOCOLS
from workers.runtime import Worker


def run_worker(party: PartySpec, transport: MemoryTransport, sealer: Sealer, log_level: int,
               helper: bool = False) -> None:
    """Process entry point: serve one job, then exit (helpers serve until terminated); stop
    if the process that started it dies."""
    die_with_parent()
    # Ctrl-C is the starting process's to handle: it stops these workers (and the processes
    # they spawn, which inherit the ignored signal) instead of each printing a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    label = f"{party.name}/helper" if helper else party.name
    name_process(f"fb-{party.name}{'+' if helper else ''}")
    logging.basicConfig(level=log_level, format=f"%(asctime)s [{label}] %(message)s")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    Worker(party, transport, PROTOCOLS, sealer, exit_on_close=not helper).serve()


@contextmanager
def caller_script_left_alone() -> Iterator[None]:
    """Spawned workers run fedboost's code only, never the caller's script.

    ``spawn`` re-runs the starting process's ``__main__`` file in every child before its
    target, so a user's script without an ``if __name__ == "__main__":`` guard started
    ``fedboost.train`` again in each child, which died at once, and the flow waited for
    workers that were gone (piped to ``python -``, the child looked for a file ``<stdin>``).
    A main module with a spec named ``__main__`` is one that spawn skips; nothing the workers
    receive is defined in the caller's script."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        yield  # run as a module (python -m, a console script): spawn imports it by name
        return
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = None


PR_SET_NAME = 15


def name_process(name: str) -> None:
    """Linux: the name ``ps -o comm`` and ``top`` show (15 bytes at most), so an operator can
    tell the parties' processes apart; a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def start_workers(hub: MemoryHub, parties: list[PartySpec], sealers: dict[str, Sealer],
                  log_level: int = logging.WARNING) -> tuple[list[BaseProcess], list[BaseProcess]]:
    """Spawn each party's coordinating worker process and its helper processes, each with its
    party's signing key."""
    with caller_script_left_alone():
        return _start_workers(hub, parties, sealers, log_level)


def _start_workers(hub: MemoryHub, parties: list[PartySpec], sealers: dict[str, Sealer],
                   log_level: int) -> tuple[list[BaseProcess], list[BaseProcess]]:
    procs: list[BaseProcess] = []
    helpers: list[BaseProcess] = []
    for party in parties:
        proc = hub.context.Process(target=run_worker, name=f"fedboost-{party.name}",
                                   args=(party, hub.endpoint(party.name), sealers[party.name],
                                         log_level))
        # not a daemon: the active party's worker starts its own crypto processes
        proc.start()
        procs.append(proc)
        for k in range(hub.helpers.get(party.name, 0)):
            helper = hub.context.Process(
                target=run_worker, name=f"fedboost-{party.name}-helper{k + 1}",
                args=(party, hub.endpoint(party.name, helper=True), sealers[party.name],
                      log_level, True))
            helper.start()
            helpers.append(helper)
    return procs, helpers


def stop_workers(procs: list[BaseProcess], timeout: float = 10.0) -> None:
    """Wait for workers to exit after CLOSE_JOB; stop stragglers, all at once: SIGTERM (a
    worker finishes its current step, then exits), then SIGKILL after ``timeout`` seconds.
    One after the other, three stragglers held a failed run's exit for a minute."""
    _join_all(procs, timeout)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    _join_all(procs, timeout)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    _join_all(procs, timeout)


def _join_all(procs: list[BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
