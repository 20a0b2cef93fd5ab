"""The flows' client of the parties: the ``Coordinator`` that sends a step's command to
parties and awaits their replies, and the helpers every protocol flow shares.

Each task sends one command to one or more parties and waits for their small typed replies.
The link to the transport is attached per job by whoever starts the flow (the CLI for the
embedded default), because a transport connection is not a flow parameter: to the caller's
context (a ``ContextVar``), which the flow shares and Prefect copies into each task it submits
(``ThreadPoolTaskRunner.submit``), so two runs in one process never see each other's.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from messages import MessageError, TransportError
from messages.bodies import Aligned, ErrorReply, Step
from flows.job_schema import JobFile
from flows.schema_base import ConfigError
from flows.errors import (JobStopped, PartyError, PartyGone,  # noqa: F401  the flows' errors,
                          StepTimeout)                       # imported from here by them
from flows.progress import (PartiesSilent, has_listener, step_progress, step_text, tell_silence,
                            tree_done)
from messages.envelope import Envelope, Kind, MsgType
from messages.chunks import FrameSigner
from messages.broker_url import holds_password
from messages.rabbitmq import RabbitTransport
from messages.signing import FLOW_IDENTITY, Sealer
from messages.transport import Transport

log = logging.getLogger("fedboost.flow")

DEFAULT_STEP_TIMEOUT = 3600.0
"""Seconds a step may take before its party is reported unresponsive."""
FIRST_NOTICE_SECONDS = 30.0
"""A step still waiting for parties after this long says whom it waits for..."""
NOTICE_EVERY_SECONDS = 60.0
"""...and says it again this often, until they answer or the step times out."""


Presence = Callable[[list[str]], dict[str, str]]
"""What is known of parties that have not answered: party -> a short note (e.g. "its worker
process exited with code 1", "no worker is connected to its queue"); parties with nothing
known are left out."""


def _new_session() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(slots=True)
class Coordinator:
    """The flow's endpoint for one job."""

    job: str
    transport: Transport
    sealer: Sealer
    """Signs the flow's commands (as ``flow``) and verifies the parties' replies."""
    timeout: float = DEFAULT_STEP_TIMEOUT
    session: str = field(default_factory=_new_session)
    """Prefix of every task id: parties drop messages of a session that is over (a killed
    flow, a step abandoned by a recovery), and refuse a task id they already answered."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while the transport is used (calls of concurrent tasks share it)."""
    in_flight: dict[str, list[Envelope]] = field(default_factory=dict)
    """Calls waiting for replies, by task id, with replies other calls received for them."""
    step_seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds spent in each kind of step (send to last reply), summed over the run's
    calls (calls running at once, as the forest's trees, each count their own)."""
    lost: ErrorReply | None = None
    """A party's answer that it lost this session's state (``abandon``); None while it holds."""
    gone: Presence | None = None
    """Parties whose worker is known to have stopped (the embedded default watches its
    processes): a step waiting for one fails at once with :class:`PartyGone`."""
    presence: Presence | None = None
    """Notes on silent parties for the waiting notices (over RabbitMQ: whether a worker
    consumes the party's queue)."""
    parties: tuple[str, ...] = ()
    """Every party of the job: ``gone`` and ``presence`` look at them all while a step waits,
    since a party that does not answer may itself wait for another's peer messages."""
    first_notice: float = FIRST_NOTICE_SECONDS
    notice_every: float = NOTICE_EVERY_SECONDS

    def begin_session(self) -> None:
        """Start a new session: the parties will open the job afresh (or from checkpoints)."""
        self.session = _new_session()
        self.lost = None

    def leave(self, parties: list[str]) -> None:
        """The job goes on without ``parties`` (horizontal members dropped): no step waits for
        them any more, so their being gone ends none."""
        self.parties = tuple(p for p in self.parties if p not in parties)

    def abandon(self, lost: ErrorReply) -> None:
        """A party lost this session's state: the calls still waiting (the forest's other
        trees) fail with its error within a second, instead of waiting out the step timeout
        for input that party will never send. The next session clears it."""
        self.lost = lost

    def call(self, parties: list[str], kind: Kind, body: Any, step: str) -> dict[str, Any]:
        """Send a command to every party and return each party's reply body.

        Thread-safe: tasks running at once (the forest's trees) share the job's connection;
        whichever call receives a reply to another call in flight files it for that one."""
        return self.collect(self.send(parties, kind, body, step))

    def send(self, parties: list[str], kind: Kind, body: Any, step: str) -> Sent:
        """Send a command to every party now; :meth:`collect` awaits the replies. A command
        sent before the next one's messages start does not queue behind them on a slow link."""
        if self.lost is not None:  # nothing more is sent in a session a party lost
            raise PartyError(self.lost)
        sent = Sent(parties, kind, step, f"{self.session}/{step}", time.monotonic())
        step_progress(self.job, kind, 0, len(parties))
        with self.lock:
            self.in_flight[sent.task] = []
            for party in parties:
                env = Envelope(job=self.job, task=sent.task, sender=self.transport.name,
                               recipient=party, kind=kind, body=body)
                self.transport.send(party, self.sealer.seal(env))
        return sent

    def collect(self, sent: Sent) -> dict[str, Any]:
        """Each party's reply body to a command :meth:`send` sent (its error raised)."""
        parties, kind, step, task = sent.parties, sent.kind, sent.step, sent.task
        replies: dict[str, Any] = {}
        deadline = sent.sent_at + self.timeout
        silence = _Silence(self, step, sent.sent_at)
        try:
            while len(replies) < len(parties):
                if self.lost is not None:
                    raise PartyError(self.lost)
                silence.check([p for p in parties if p not in replies])
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(parties) - set(replies))
                    raise StepTimeout(f"party {', '.join(missing)}: no answer to step {step} "
                                      f"within {self.timeout:.0f} s (transport.step_timeout)",
                                      missing)
                failed = False
                for env in self._next_replies(task, left):
                    if env.job != self.job or env.sender not in parties:
                        log.warning("flow %s: dropped stale reply %s from %s", self.job,
                                    env.task, env.sender)
                        continue
                    replies[env.sender] = env.body
                    failed = failed or isinstance(env.body, ErrorReply)
                if failed:
                    break  # fail fast: the others may be waiting for the failed party's data
                step_progress(self.job, kind, len(replies), len(parties))
        finally:
            name = kind.name.lower()
            with self.lock:
                self.in_flight.pop(task, None)
                self.step_seconds[name] = (self.step_seconds.get(name, 0.0)
                                           + time.monotonic() - sent.sent_at)
        errors = [r for r in replies.values() if isinstance(r, ErrorReply)]
        if errors:
            raise PartyError(sorted(errors, key=lambda e: not e.user_error)[0])
        return replies

    def _next_replies(self, task: str, left: float) -> list[Envelope]:
        """Replies to ``task`` filed by other calls, or the next message received (filed for
        its own call if that is another one in flight)."""
        with self.lock:
            filed = self.in_flight.get(task)
            if filed:
                self.in_flight[task] = []
                return filed
            alone = len(self.in_flight) == 1
            # alone: wait long on the transport; else briefly, so the other calls get the lock
            data = self.transport.receive(timeout=min(left, 1.0 if alone else 0.05))
            if data is None:
                return []
            self.transport.acknowledge()  # a reply needs no redelivery: the step is re-sent
            try:
                env = self.sealer.open(data)
            except MessageError as exc:
                log.warning("flow %s: dropped reply: %s", self.job, exc)
                return []
            if env.task == task:
                return [env]
            if env.task in self.in_flight:
                self.in_flight[env.task].append(env)
            else:
                log.warning("flow %s: dropped stale reply %s from %s", self.job, env.task,
                            env.sender)
            return []


@dataclass(frozen=True, slots=True)
class Sent:
    """A command sent and not yet answered (``Coordinator.send``)."""

    parties: list[str]
    kind: Kind
    step: str
    task: str
    sent_at: float
    """``time.monotonic()`` as it was sent: its seconds, timeout and notices count from here."""


class _Silence:
    """One call's watch over the parties that have not answered it yet: fails at once when
    one is known to be gone, and says whom the step waits for after ``first_notice`` seconds,
    then every ``notice_every``."""

    def __init__(self, coordinator: Coordinator, step: str, started: float) -> None:
        self.coordinator, self.step, self.started = coordinator, step, started
        self.wall_started = time.time()
        self.next_notice = started + coordinator.first_notice

    def check(self, silent: list[str]) -> None:
        coord = self.coordinator
        # every party of the job: a silent one may be waiting for another's peer messages
        everyone = sorted(set(coord.parties) | set(silent))
        if coord.gone is not None:
            # a gone party the step waits for ends it at once; another one only once the step
            # has waited first_notice seconds: the silent ones may be waiting for its peer
            # messages, or may answer from what it sent before it left (a horizontal member
            # that dies after its vector is in: the aggregator's sum still comes)
            early = time.monotonic() - self.started < coord.first_notice
            gone = coord.gone(silent if early else everyone)
            if gone:
                raise PartyGone("; ".join(f"party {p}: {why} while the flow waited for "
                                          f"{', '.join(silent)} to answer "
                                          f"{step_text(self.step)}"
                                          for p, why in sorted(gone.items())),
                                sorted(gone))
        now = time.monotonic()
        if now < self.next_notice or not silent:
            return
        self.next_notice = now + coord.notice_every
        notes = {}
        if coord.presence is not None:
            with coord.lock:  # it asks the broker on the job's connection
                notes = coord.presence(everyone)
        event = PartiesSilent(self.step, tuple(silent), now - self.started,
                              time.strftime("%H:%M:%S", time.localtime(self.wall_started)),
                              tuple(sorted(notes.items())))
        tell_silence(coord.job, event)
        # the Prefect UI shows it on the flow run; a listener (the command line) shows it itself
        _run_log().log(logging.INFO if has_listener(coord.job) else logging.WARNING,
                       "%s; the step gives up after %.0f s (transport.step_timeout)",
                       event.text(), coord.timeout)


def _run_log() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The flow run's logger (its lines reach the Prefect UI), or this module's outside one."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log


_ATTACHED: ContextVar[Coordinator | None] = ContextVar("fedboost_coordinator", default=None)


@contextmanager
def attached(coordinator: Coordinator) -> Iterator[Coordinator]:
    """Make a job's coordinator the one its flow's tasks reach while the block runs: the flow
    must be called inside the block, in this thread (its submitted tasks inherit it)."""
    token = _ATTACHED.set(coordinator)
    try:
        yield coordinator
    finally:
        _ATTACHED.reset(token)


@contextmanager
def connected(config: JobFile) -> Iterator[Coordinator]:
    """The job's coordinator: the one attached by the caller (the embedded default starts
    its workers and attaches), or a new connection to the broker for the flow run's lifetime
    (deployments, ``fedboost train`` with ``transport.kind: rabbitmq``)."""
    job, transport = config.job, config.transport
    existing = _ATTACHED.get()
    if existing is not None and existing.job == job:
        yield existing
        return
    if transport.kind != "rabbitmq":
        raise TransportError(f"job {job!r}: transport {transport.kind!r} has no running workers "
                             f"to reach; run it with 'fedboost train', or use rabbitmq")
    if holds_password(transport.url):
        log.warning("flow %s: transport.url holds the broker password, and Prefect stores it "
                    "with this run's parameters: give it through FEDBOOST_AMQP_URL or "
                    "transport.password_file", job)
    coordinator = broker_coordinator(config, job, transport.step_timeout)
    endpoint: Any = coordinator.transport
    try:
        with attached(coordinator):
            yield coordinator
    finally:
        endpoint.delete_inbox()
        endpoint.close()


def broker_coordinator(config: JobFile, job: str, timeout: float) -> Coordinator:
    """A flow endpoint of its own on the job's broker (reply queue ``flow.<job>.<id>``), signing
    with the flow key of ``config.signing``; the caller deletes its queue and closes it."""
    if config.signing is None:
        raise ConfigError(f"job {job!r}: signing.key_dir is required over RabbitMQ")
    try:
        sealer = Sealer.from_folder(config.signing.key_dir, FLOW_IDENTITY,
                                    end_to_end=config.signing.end_to_end)
    except MessageError as exc:
        raise ConfigError(f"job {job!r}: {exc}") from None
    transport = config.transport
    endpoint = RabbitTransport(f"flow.{job}.{uuid.uuid4().hex[:8]}", transport.amqp_url(),
                               party=False, chunk_bytes=transport.chunk_bytes,
                               frames=FrameSigner(sealer),
                               partial_seconds=transport.partial_seconds,
                               tls=transport.tls_options())
    return Coordinator(job=job, transport=endpoint, sealer=sealer, timeout=timeout,
                       parties=tuple(getattr(config, "parties", ())),
                       presence=lambda parties: _unconsumed(endpoint, parties))


def _unconsumed(endpoint: RabbitTransport, parties: list[str]) -> dict[str, str]:
    """Of ``parties``, those whose inbox no worker consumes now."""
    return {p: "no worker of it is connected to the broker" for p in parties
            if endpoint.consumers(p) == 0}


MAX_RECOVERIES = 3
"""Times one flow run resumes from checkpoints after a party lost its state (restarted)."""

T = TypeVar("T")


def train_with_recoveries(config: Any, train: Callable[[Any, Any], T]) -> T:
    """Run a protocol's training body ``train(config, progress)`` on the job's connection;
    when a party lost its state (its worker restarted), run it again: the parties resume from
    the checkpoints they all hold."""
    with connected(config):
        logger = get_run_logger()
        progress = create_progress_artifact(0.0, description=f"{config.job}: trees done (%)")
        for attempt in range(MAX_RECOVERIES + 1):
            try:
                return train(config, progress)
            except PartyError as exc:
                if not exc.reply.state_lost or attempt == MAX_RECOVERIES:
                    raise
                logger.warning("%s; resuming from the parties' checkpoints", exc)
        raise AssertionError("unreachable")


def record_tree(job: str, progress: Any, done: int, total: int, seconds: float,
                metrics: dict[str, Any]) -> None:
    """A tree is done: move the run's progress artifact and tell the job's progress listener
    (the command line's progress bar)."""
    update_progress_artifact(progress, 100.0 * done / total)
    tree_done(job, done, total, seconds, metrics)


def link(job: str) -> Coordinator:
    """The coordinator of the job whose flow runs in this context."""
    coordinator = _ATTACHED.get()
    if coordinator is None or coordinator.job != job:
        raise TransportError(f"job {job!r} has no transport attached")
    return coordinator


def step_id(kind: Kind, tree: int = -1, depth: int = -1) -> str:
    """Deterministic task id of a step: (kind, tree, depth)."""
    return f"{kind.name.lower()}/t{tree}/d{depth}"


# ---- tasks shared by the training and prediction flows -------------------------------------

@task(name="align_entities", task_run_name="align-entities", cache_policy=NO_CACHE)
def align_entities(job: str, active: str, passives: list[str]) -> Aligned:
    """SecureBoost section 3: DH-PSI between the active party and every passive party."""
    coord = link(job)
    coord.call([active, *passives], MsgType.PSI_BLIND, Step(), step_id(MsgType.PSI_BLIND))
    coord.call(passives, MsgType.PSI_REBLIND, Step(), step_id(MsgType.PSI_REBLIND))
    reply: Aligned = coord.call([active], MsgType.PSI_INTERSECT, Step(),
                                step_id(MsgType.PSI_INTERSECT))[active]
    return reply


@task(name="close_job", task_run_name="close-job", cache_policy=NO_CACHE)
def close_job(job: str, parties: list[str]) -> None:
    """Let every party release the job's state."""
    link(job).call(parties, MsgType.CLOSE_JOB, Step(), step_id(MsgType.CLOSE_JOB))
