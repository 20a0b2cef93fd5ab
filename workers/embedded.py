"""The embedded default: each party's worker in its own OS process, on in-memory queues."""

from __future__ import annotations

import logging
import os
from multiprocessing.process import BaseProcess

from messages.transport import MemoryHub, MemoryTransport
from workers.roles import handlers_for
from workers.runtime import PartySpec, Worker


def run_worker(party: PartySpec, transport: MemoryTransport, log_level: int) -> None:
    """Process entry point: serve one job, then exit."""
    logging.basicConfig(level=log_level, format=f"%(asctime)s [{party.name}] %(message)s")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    Worker(party, transport, handlers_for(party.role), exit_on_close=True).serve()


def start_workers(hub: MemoryHub, parties: list[PartySpec],
                  log_level: int = logging.WARNING) -> list[BaseProcess]:
    """Spawn one worker process per party."""
    procs = []
    for party in parties:
        proc = hub.context.Process(target=run_worker, name=f"fedboost-{party.name}",
                                   args=(party, hub.endpoint(party.name), log_level))
        # not a daemon: the active party's worker starts its own crypto processes
        proc.start()
        procs.append(proc)
    return procs


def stop_workers(procs: list[BaseProcess], timeout: float = 10.0) -> None:
    """Wait for workers to exit after CLOSE_JOB; terminate stragglers."""
    for proc in procs:
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()  # SIGTERM: the worker finishes its current step, then exits
            proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout)
