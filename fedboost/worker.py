"""``fedboost worker``: a party's long-running worker processes on RabbitMQ.

One process coordinates the party's jobs (the broker's single active consumer of its inbox);
every other process of the party, started here or on other machines with the same command,
takes shards of work from the party's work queue (a passive party's histogram sums, the active
party's encryption and decryption: ``workers.crypto_shards`` says how the job's private key
reaches those) and stands by to take over the inbox if the coordinating process dies.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
from multiprocessing.process import BaseProcess

from flows.job_schema import PolicyConfig
from flows.worker_config import WorkerConfig
from messages import StopRequested, TransportError
from messages.broker_url import redact
from messages.chunks import FrameSigner
from messages.rabbit_queues import queue_of
from messages.rabbitmq import RabbitTransport, StopFlag
from messages.signing import Sealer
from workers.lifeline import die_with_parent
from workers.party import DataSet, PartySpec
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

log = logging.getLogger("fedboost.worker")


def party_spec(config: WorkerConfig) -> PartySpec:
    """The worker's local settings; job J's model part goes to ``models/J/<party>``."""
    return PartySpec(name=config.party, role=config.role or "",
                     data=str(config.data) if config.data else "",
                     id_column=config.id, label=config.label,
                     model_dir=str(config.models / "{job}" / config.party),
                     columns=config.columns, categorical=config.categorical,
                     processes=config.processes,
                     crypto_processes=config.crypto_processes or 0,
                     make_ahead=config.make_ahead,
                     state_dir=str(config.state) if config.state else "",
                     policy=policy_of(config.policy),
                     datasets={name: DataSet(str(d.data), d.id, d.label, d.columns,
                                                     d.categorical)
                               for name, d in config.datasets.items()})


def policy_of(config: PolicyConfig) -> PartyPolicy:
    """A party's policy as its worker holds it."""
    return config.party_policy()


def serve_party(config: WorkerConfig, log_level: int, health_file: str | None = None) -> None:
    """Process entry point: connect, then serve jobs until SIGTERM/SIGINT (or until the
    process that started it dies)."""
    die_with_parent()
    if mp.parent_process() is not None:  # Ctrl-C: the first process forwards it as SIGTERM
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _configure_logging(config.party, log_level)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sealer = Sealer.from_folder(config.signing.key_dir, config.party,
                                end_to_end=config.signing.end_to_end)
    sealer.max_age = config.max_message_age
    # SIGTERM (docker stop, the first process passing it on) while the broker cannot be reached
    # yet: the wait ends at once; the worker's own handler takes over once it serves
    stop = StopFlag()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        transport = RabbitTransport(config.party, config.transport.amqp_url(), party=True,
                                    chunk_bytes=config.transport.chunk_bytes,
                                    frames=FrameSigner(sealer),
                                    partial_seconds=config.transport.partial_seconds,
                                    tls=config.transport.tls_options(), stop=stop)
    except StopRequested as exc:
        log.warning("%s", exc)
        log.info("%s: stopped", config.party)
        return
    except TransportError as exc:  # unreachable broker, refused login or certificate
        log.error("%s", exc)
        raise SystemExit(1) from None
    log.info("%s: connected to %s", config.party, redact(config.transport.amqp_url()))
    if config.processes == 1:
        _warn_if_shared(transport, config)
    worker = Worker(party_spec(config), transport, PROTOCOLS, sealer, health_file=health_file,
                    on_stop=transport.request_stop)
    signal.signal(signal.SIGINT, worker.stop)
    worker.serve()
    log.info("%s: stopped", config.party)


def _warn_if_shared(transport: RabbitTransport, config: WorkerConfig) -> None:
    """A worker of one process finds another consumer on its party's inbox: another worker
    of this party, or someone else's federation on the same broker and virtual host; the
    broker gives the inbox to one of them (the others stand by), so say it once at start."""
    count = transport.consumers(config.party)
    if count is not None and count > 1:
        log.warning("%s: queue %s already has %d other consumer(s) on %s: another worker of "
                    "party %s (only one of them gets the jobs; this one stands by). If it is "
                    "not yours, someone else's federation uses this broker's virtual host with "
                    "the same party names: give yours a vhost of its own "
                    "(docs/operations.md)", config.party, queue_of(config.party), count - 1,
                    redact(config.transport.amqp_url()), config.party)


def run_workers(config: WorkerConfig, log_level: int, health_file: str | None = None) -> int:
    """Start ``config.processes`` processes of the party and wait for them."""
    if config.processes == 1:
        serve_party(config, log_level, health_file)
        return 0
    context = mp.get_context("spawn")
    procs: list[BaseProcess] = [context.Process(target=serve_party,
                                                args=(config, log_level, health_file),
                                                name=f"fedboost-{config.party}-{k}")
                                for k in range(config.processes)]
    for proc in procs:
        proc.start()

    def forward(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for proc in procs:
        proc.join()
    return max(abs(proc.exitcode or 0) for proc in procs)


def _configure_logging(party: str, level: int) -> None:
    logging.basicConfig(level=level, format=f"%(asctime)s [{party} %(process)d] %(levelname)s "
                                            f"%(message)s", force=True)
    for noisy in ("pika", "numba"):  # connection chatter and JIT traces are not task progress
        logging.getLogger(noisy).setLevel(logging.WARNING)
