"""The worker loop: receive, validate, dispatch to the role's handlers, reply.

Commands from the flow run a handler and get exactly one reply. Peer messages (ciphertexts,
instance spaces) are filed in the job's mailbox; a handler that needs one that has not arrived
raises ``NotReady`` and its command is retried whenever new peer data comes in. Peer messages
that come before their job's opener are kept for it (``workers.early_mail``). A role may also
act on a peer message as it is filed (an ``Arrival``: get ready for the step that will need it);
that answers nothing, and what fails there is left for the step to find and answer. A handler's
failure becomes an ``ErrorReply``; the worker keeps serving.

Work messages (``WORK``) are shards of a step that the party's coordinating process hands to
its own helper processes, and data those shards share; they need no job state. A shard's reply
goes back to the party's inbox; a work handler that only keeps data returns None, no reply.
A message is acknowledged to the transport only once its outcome (reply sent, or filed) is done;
a command whose step waits for peer data stays unacknowledged (``Transport.hold``) until it is
answered, so a worker killed while it waits leaves it to its next process, which tells the flow
that the job's state is gone (the flow resumes instead of waiting out its step timeout).

What a step sees and a protocol declares is ``workers.handlers``; the party's own settings are
``workers.party``. This module stays near 530 lines on purpose: ``Worker.handle_bytes`` and the
methods it calls are the order in which a message is checked (signature, addressee, work,
replay, opener, session, job), and that order is the worker's security argument, read best in
one place.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boosting import BoostingError
from crypto import CryptoError
from crypto.bin_products import kernel as bin_products_kernel
from messages import DecodeError, MessageError, StopRequested, UnknownMessageType
from messages.bodies import ErrorReply
from messages.envelope import (COMMANDS, OPENERS, TRANSIENT, UNRECORDED, WORK, Envelope, Kind,
                               MsgType)
from messages.rejections import RejectionLog
from messages.signing import CLOCK_SKEW_SECONDS, ForgedMessage, Sealer, claimed_signer, is_flow
from messages.transport import Transport
from workers import DataError, NotReady, ProtocolError
from workers.answered import AnsweredRecord
from workers.early_mail import EARLY_SECONDS, EarlyMail
from workers.handlers import Handler, Protocol, RoleSteps, StepContext
from workers.mailbox import Mailbox, mail_key
from workers.party import PartySpec
from workers.policy import PolicyError

log = logging.getLogger("fedboost.worker")

USER_ERRORS = (DataError, BoostingError)
STEP_ERRORS = (ProtocolError, CryptoError, DecodeError, MessageError)
"""Failures of a step that are the peers' or the input's, not a bug: answered, logged briefly."""
SWITCH_INTERVAL = 0.0005
"""Seconds a thread may hold the GIL while another waits (Python's default: 0.005). A worker
sums ciphertexts on its main thread while a background thread (broker publisher, queue feeder)
hands its helpers their shards; at the default, that thread waited for the GIL so often that
handing out a 15 MB shard took 0.8 s instead of 0.18 s (measured on 2 cores)."""


@dataclass(slots=True)
class _Pending:
    env: Envelope
    since: float
    waiting_for: str
    held: object | None = None
    """The transport's hold on the command's delivery (``Transport.hold``): released once
    it is answered, so a worker killed while the step waits leaves the command to its next
    process, which tells the flow the job's state is gone."""


@dataclass(slots=True)
class _Job:
    steps: RoleSteps = field(default_factory=lambda: RoleSteps({}))
    """The steps of this party's role in the job's protocol."""
    parties: frozenset[str] = frozenset()
    """Every party of the job (peer messages come only from them)."""
    state: Any = None
    mailbox: Mailbox = field(default_factory=Mailbox)
    pending: list[_Pending] = field(default_factory=list)
    session: str = ""
    """The flow session that opened the job; messages of earlier sessions are stale."""
    done: set[str] = field(default_factory=set)
    """Task ids of commands answered in this job: the same id again is a replay."""
    last_seen: float = field(default_factory=time.monotonic)
    """When a message of this job last arrived (idle jobs are dropped, see ``IDLE_JOB_SECONDS``)."""

    def discard(self) -> None:
        """Release what the job's state holds outside this process (crypto processes)."""
        close = getattr(getattr(self.state, "role_state", None), "close", None)
        if callable(close):
            close()


def session_of(task: str) -> str:
    """A flow prefixes every task id with its session (``<session>/<step>``)."""
    return task.split("/", 1)[0] if "/" in task else ""




MAX_PENDING = 64
"""Steps of one job that may wait for peer data at once (the flow sends a handful)."""

DEFAULT_PEER_TIMEOUT = 900.0
"""Seconds a step may wait for a peer's message before it fails, naming the peer."""
RETRY_SECONDS = 1.0
"""How often waiting steps are retried when no message comes (see ``Worker._retry_waiting``)."""
IDLE_JOB_SECONDS = 24 * 3600.0
"""A job without any message for this long is dropped from memory (its flow died and was not
resumed); its checkpoints stay on disk, so resuming it later still continues where it stopped."""


class Worker:
    """A party's long-running worker."""

    def __init__(self, party: PartySpec, transport: Transport,
                 protocols: dict[str, Protocol], sealer: Sealer, *,
                 exit_on_close: bool = False,
                 peer_timeout: float = DEFAULT_PEER_TIMEOUT,
                 idle_job_seconds: float = IDLE_JOB_SECONDS,
                 early_mail_seconds: float = EARLY_SECONDS,
                 health_file: str | None = None,
                 on_stop: Callable[[], None] | None = None) -> None:
        self.party = party
        self._on_stop = on_stop
        """Called by ``stop`` too (from the signal handler): ends the transport's waits for an
        unreachable broker (``RabbitTransport.request_stop``)."""
        self.health_file = Path(health_file) if health_file else None
        self._last_beat = 0.0
        self.peer_timeout = peer_timeout
        self.idle_job_seconds = idle_job_seconds
        self.transport = transport
        self.protocols = protocols
        self.work: dict[Kind, Handler] = {
            kind: handler for protocol in protocols.values() for kind, handler in protocol.work.items()}
        self.sealer = sealer
        """Signs what this worker sends; verifies and de-duplicates what it receives."""
        self.exit_on_close = exit_on_close
        self.jobs: dict[str, _Job] = {}
        self.rejections = RejectionLog(log, party.name)
        """Refused messages, logged within budgets, with summaries (``messages.rejections``)."""
        self._in_steps = 0.0
        """Seconds spent in steps: the early-mail clock stands still meanwhile (an opener may
        wait in the queue behind another job's long step)."""
        self.early = EarlyMail(party.name, self.rejections, early_mail_seconds,
                               lambda: time.monotonic() - self._in_steps)
        """Peer messages of jobs (or sessions) not open yet (``workers.early_mail``)."""
        self._answered: AnsweredRecord | None = None
        self._stopping = False
        self._last_retry = time.monotonic()

    def stop(self, *_: object) -> None:
        """Finish the current message and exit the loop."""
        self._stopping = True
        if self._on_stop is not None:
            self._on_stop()

    def serve(self) -> None:
        """Serve until stopped (SIGTERM/SIGINT) or, in single-job mode, until CLOSE_JOB."""
        signal.signal(signal.SIGTERM, self.stop)
        sys.setswitchinterval(SWITCH_INTERVAL)
        served = [p for p in sorted(self.protocols) if p in self.party.policy.protocols]
        log.info("worker %s serving %s; %d answered commands on record; bin products in %s",
                 self.party.name,
                 ", ".join(served) or "no protocol (its policy lists none this worker has)",
                 len(self.answered), bin_products_kernel())
        try:
            while not self._stopping:
                data = self.transport.receive(timeout=0.5)
                if data is not None:
                    self.handle_bytes(data)
                    self.transport.acknowledge()
                self._expire_pending()
                self._retry_waiting()
                self._drop_idle_jobs()
                self.early.expire()
                self.rejections.flush()
                self._beat()
        except StopRequested as exc:  # SIGTERM while the broker was unreachable: stop now
            log.warning("%s", exc)
        self.rejections.flush(final=True)
        if self.jobs:  # stopped mid-job (Ctrl-C, SIGTERM): say so, once (a single-job
            # worker, the embedded default's, is stopped by the command that says so itself)
            log.log(logging.INFO if self.exit_on_close else logging.WARNING,"worker %s stops with %d job(s) unfinished: %s; its checkpoints stay, "
                        "and a worker started again resumes them when their flow asks",
                        self.party.name, len(self.jobs), ", ".join(sorted(self.jobs)))
        for job in self.jobs.values():  # their crypto processes go now, not at exit
            job.discard()
        self.jobs.clear()
        self.transport.close()

    @property
    def answered(self) -> AnsweredRecord:
        """The party's persisted record of answered commands (``workers.answered``), read when
        the worker starts serving (a folder it cannot use fails the start, not a job)."""
        if self._answered is None:
            self._answered = AnsweredRecord(self.party.private_dir(),
                                            self.sealer.max_age + CLOCK_SKEW_SECONDS)
        return self._answered

    def _replayed(self, env: Envelope) -> bool:
        """A command this party answered before, also before a restart: refused, logged."""
        if (env.job, env.task) not in self.answered:
            return False
        self.rejections.refuse("replayed command", env.sender, "rejected replayed %s %s of job "
                               "%r (answered before)", env.kind.name, env.task, env.job,
                               authenticated=True)
        return True

    def _record(self, env: Envelope) -> None:
        """Put an answered command on record, durably, before its reply acknowledges it."""
        try:
            self.answered.add(env.job, env.task)
        except OSError as exc:  # the party's folder is full or gone: say so, keep serving
            log.error("%s: could not record %s %s of job %r as answered: %s", self.party.name,
                      env.kind.name, env.task, env.job, exc)

    def _beat(self) -> None:
        """Touch the health file (a container health check reads its age)."""
        now = time.monotonic()
        if self.health_file is not None and now - self._last_beat > 5.0:
            self.health_file.touch()
            self._last_beat = now

    def _drop_idle_jobs(self) -> None:
        now = time.monotonic()
        for name in [n for n, job in self.jobs.items()
                     if now - job.last_seen > self.idle_job_seconds]:
            log.warning("%s: dropped job %r after %.0f s without messages (its checkpoints "
                        "stay)", self.party.name, name, now - self.jobs[name].last_seen)
            self._discard(self.jobs.pop(name))

    def _retry_waiting(self) -> None:
        """Retry waiting steps now and then even without new mail: a step may decide to go on
        without input that stopped coming (a helper process that died mid-level)."""
        now = time.monotonic()
        if now - self._last_retry < RETRY_SECONDS:
            return
        self._last_retry = now
        for job in list(self.jobs.values()):
            if job.pending:
                self._retry_pending(job)

    def _expire_pending(self) -> None:
        """Fail steps whose peer input never came, so no flow waits forever."""
        now = time.monotonic()
        for job in self.jobs.values():
            expired = [p for p in job.pending if now - p.since > self.peer_timeout]
            for p in expired:
                job.pending.remove(p)
                self._reply(p.env, MsgType.ERROR, ErrorReply(
                    self.party.name, p.env.kind.name,
                    f"waited {self.peer_timeout:.0f} s for {p.waiting_for}", False))
                self._release(p)

    def handle_bytes(self, data: bytes) -> None:
        """Process one raw message; never raises."""
        try:
            env = self.sealer.open(data)
        except MessageError as exc:  # malformed, forged, unknown signer, replayed
            signer = claimed_signer(data)
            reason = ("forged or replayed" if isinstance(exc, ForgedMessage) else "unknown kind"
                      if isinstance(exc, UnknownMessageType) else "malformed" if signer
                      else "unsigned or unreadable")
            self.rejections.refuse(reason, signer, "rejected message: %s", exc,
                                   authenticated=False)
            return
        if env.recipient != self.party.name:
            self._refuse(env, "misaddressed", "rejected message addressed to %r", env.recipient)
            return
        own = env.sender == self.party.name
        if env.kind in WORK:
            if not own:
                self._refuse(env, "work from another party", "rejected %s work from %r",
                             env.kind.name, env.sender)
                return
            self._run(_Job(RoleSteps(self.work)), env)  # shards carry all they need: no job state
            return
        if env.kind in COMMANDS and not is_flow(env.sender):
            self._refuse(env, "command from a party", "rejected %s from %r: commands come from "
                         "flows", env.kind.name, env.sender)
            return
        if env.kind in COMMANDS and env.kind not in UNRECORDED and self._replayed(env):
            # before anything: a replayed opener must not even replace the open job. A
            # command this process did not answer itself is told to the flow, though: a worker
            # killed after recording its answer but before the reply went out gets the same
            # command again from the broker, and the flow that waits for that reply resumes
            # from the checkpoints instead of timing out (the reply goes to the signed sender,
            # a flow; replies to tasks it is not waiting for are stale to it and dropped).
            answered_here = env.job in self.jobs and env.task in self.jobs[env.job].done
            if not answered_here:
                self._reply(env, MsgType.ERROR, ErrorReply(
                    self.party.name, env.kind.name, f"{env.kind.name} {env.task} of job "
                    f"{env.job!r} was answered before; its reply may have been lost (worker "
                    f"restarted?)", False, state_lost=True))
            return
        session = session_of(env.task)
        opening = env.kind in OPENERS and (env.job not in self.jobs
                                           or self.jobs[env.job].session != session)
        if opening:  # a new flow session (a resumed or recovering run) starts the job afresh
            opened = self._open(env, session)
            if opened is None:
                return
            if env.job in self.jobs:
                self._discard(self.jobs.pop(env.job))
            self.jobs[env.job] = opened
            self.early.opened(env.job, session)
        job = self.jobs.get(env.job)
        if self.early.keep(env, session, len(data), job.session if job else None):
            return  # a peer's message that came before this party's opener
        if job is None:  # late or forged: nothing to file it under
            self._refuse(env, "unknown job", "%s for unknown job %r", env.kind.name, env.job)
            if env.kind in COMMANDS:  # e.g. this worker restarted: the flow can resume the job
                self._reply(env, MsgType.ERROR, ErrorReply(
                    self.party.name, env.kind.name, f"job {env.job!r} is not open here (worker "
                    f"restarted?)", False, state_lost=True))
            return
        job.last_seen = time.monotonic()
        if session != job.session:  # sent before the job was reopened: its step is over
            self._refuse(env, "stale session", "dropped %s of another session of job %r",
                         env.kind.name, env.job, level=logging.INFO)
            if env.kind in COMMANDS:  # a flow still running beside a newer one: stop it
                self._reply(env, MsgType.ERROR, ErrorReply(
                    self.party.name, env.kind.name, f"job {env.job!r} was reopened by another "
                    f"flow run (session {job.session}); this run is superseded", False))
            return
        if env.kind in COMMANDS:
            if env.task in job.done:
                self._refuse(env, "replayed command", "rejected replayed %s %s of job %r",
                             env.kind.name, env.task, env.job)
                return
            if any(p.env.task == env.task for p in job.pending):
                return  # the same step again while it waits: one answer will come
            if len(job.pending) >= MAX_PENDING:
                self._reply(env, MsgType.ERROR, ErrorReply(
                    self.party.name, env.kind.name, f"{MAX_PENDING} steps already wait", False))
                return
            self._run(job, env)
            if opening:  # what its peers sent before the opener, as if it came now
                early = self.early.release(env.job, session)
                for peer_env, size in early:
                    self._file(job, peer_env, size, retry=False)
                if early:
                    self._retry_pending(job)
        elif env.kind == MsgType.ERROR and own:
            self._fail_pending(job, env)  # a helper process failed a shard of a waiting step
        else:
            self._file(job, env, len(data))

    def _file(self, job: _Job, env: Envelope, size: int, *, retry: bool = True) -> None:
        """File a peer message of the job in its mailbox and let waiting steps try again."""
        if not (env.sender == self.party.name or env.sender in job.parties):
            self._refuse(env, "not a party of the job", "rejected %s from %r: not a party of "
                         "job %r", env.kind.name, env.sender, env.job)
            return
        full = job.mailbox.put(mail_key(env), env.body, size)
        if full:
            self._refuse(env, "mailbox full", "dropped %s from %r of job %r: mailbox full, %s",
                         env.kind.name, env.sender, env.job, full)
            return
        self._arrived(job, env)
        if retry:
            self._retry_pending(job)

    def _refuse(self, env: Envelope, reason: str, message: str, *args: object,
                level: int = logging.WARNING) -> None:
        """Log a refused message whose signature verified (``messages.rejections``)."""
        self.rejections.refuse(reason, env.sender, message, *args, authenticated=True,
                               level=level)

    def _open(self, env: Envelope, session: str) -> _Job | None:
        """A job for an opener: its protocol's steps for the role the job gives this party.
        A protocol this worker does not serve or its policy does not list, or a role it does
        not take, is answered with one line naming them (and nothing is opened)."""
        protocol = self.protocols.get(env.body.protocol)
        roles = {p.name: p.role for p in env.body.parties}
        role = roles.get(self.party.name)
        problem = ""
        if protocol is None:
            problem = (f"protocol {env.body.protocol!r} is not served here (this worker serves "
                       f"{', '.join(sorted(self.protocols))})")
        elif protocol.name not in self.party.policy.protocols:
            problem = (f"refuses protocol {protocol.name!r}: its policy allows "
                       f"{', '.join(self.party.policy.protocols)}")
        elif role is None:
            problem = f"the job does not name party {self.party.name}"
        elif self.party.role and role != self.party.role:
            problem = (f"the job gives it role {role!r}; its worker file allows only "
                       f"{self.party.role!r}")
        elif role not in protocol.roles:
            problem = f"protocol {protocol.name} has no role {role!r}"
        else:
            problem = self.party.policy.refuses_role(protocol.name, role)
        if problem or protocol is None or role is None:  # (the last two set a problem)
            # "party X refuses ..." reads as one sentence; other problems follow "party X: "
            said = (f"party {self.party.name} {problem}" if problem.startswith("refuses ")
                    else f"party {self.party.name}: {problem}")
            log.warning("refused %s of job %r: %s", env.kind.name, env.job, said)
            self._reply(env, MsgType.ERROR, ErrorReply(self.party.name, env.kind.name, said,
                                                       True))
            return None
        return _Job(protocol.roles[role], frozenset(roles), session=session)

    def _arrived(self, job: _Job, env: Envelope) -> None:
        """Let the role act on a filed peer message; its failures are the step's to answer."""
        arrival = job.steps.arrivals.get(env.kind)
        if arrival is None:
            return
        ctx = self._context(job, env)
        try:
            arrival(ctx, env.sender, env.body)
        except NotReady:
            pass
        except (*USER_ERRORS, *STEP_ERRORS) as exc:
            log.info("%s: on %s: %s (the step will answer it)", self.party.name, env.kind.name,
                     exc)
        except Exception:  # a bug must not take the worker down
            log.error("%s: on %s:\n%s", self.party.name, env.kind.name, traceback.format_exc())

    def _context(self, job: _Job, env: Envelope) -> StepContext:
        return StepContext(self.party, env.job, env.task, job.state, job.mailbox,
                           self._send_for(env.job), self.transport, self.sealer)

    def _fail_pending(self, job: _Job, failure: Envelope) -> None:
        for p in [p for p in job.pending if p.env.task == failure.task]:
            job.pending.remove(p)
            self._reply(p.env, MsgType.ERROR, failure.body)
            self._release(p)

    def _retry_pending(self, job: _Job) -> None:
        waiting, job.pending = job.pending, []
        for p in waiting:
            self._run(job, p.env, since=p.since, held=p.held)

    def _release(self, pending: _Pending) -> None:
        if pending.held is not None:
            self.transport.release(pending.held)

    def _release_waiting(self, job: _Job) -> None:
        """A job closed or dropped: its waiting steps' deliveries are done with too."""
        for p in job.pending:
            self._release(p)

    def _discard(self, job: _Job) -> None:
        """A job dropped (idle, reopened by a newer session)."""
        self._release_waiting(job)
        job.discard()

    def _run(self, job: _Job, env: Envelope, since: float | None = None,
             held: object | None = None) -> None:
        handler = job.steps.handlers.get(env.kind)
        if handler is None:
            self._reply(env, MsgType.ERROR, ErrorReply(self.party.name, env.kind.name,
                        f"party {self.party.name} has no step {env.kind.name} in this job",
                        False))
            return
        ctx = self._context(job, env)
        start, first_try = time.perf_counter(), since or time.monotonic()
        try:
            reply = handler(ctx, env.body)
            if reply is None and env.kind not in WORK:
                raise TypeError(f"step {env.kind.name} returned no reply")
        except NotReady as waiting:
            self._in_steps += time.perf_counter() - start
            if since is None and env.kind in COMMANDS:  # its own delivery is the one in hand
                held = self.transport.hold()
            job.pending.append(_Pending(env, first_try, str(waiting), held))
            return
        except USER_ERRORS as exc:
            reply = MsgType.ERROR, ErrorReply(self.party.name, env.kind.name, str(exc), True)
        except PolicyError as exc:  # the job asks what this party refuses: the job file's to change
            log.warning("%s: refused %s of job %r: %s", self.party.name, env.kind.name, env.job,
                        exc)
            reply = MsgType.ERROR, ErrorReply(self.party.name, env.kind.name, str(exc), True)
        except STEP_ERRORS as exc:
            log.warning("%s: %s failed: %s", self.party.name, env.kind.name, exc)
            reply = MsgType.ERROR, ErrorReply(self.party.name, env.kind.name, str(exc), False)
        except Exception as exc:  # a bug must not take the worker down
            log.error("%s: %s crashed:\n%s", self.party.name, env.kind.name, traceback.format_exc())
            reply = MsgType.ERROR, ErrorReply(self.party.name, env.kind.name,
                                              f"internal error: {exc!r}", False)
        self._in_steps += time.perf_counter() - start
        if ctx.state is not None:
            job.state = ctx.state
        waited = f" (first tried {time.monotonic() - since:.3f}s ago)" if since else ""
        if env.kind in UNRECORDED:  # many a second: no line each at INFO
            log.debug("%s job=%s step=%s task=%s %.4fs%s", self.party.name, env.job,
                      env.kind.name, env.task, time.perf_counter() - start, waited)
        else:
            job.done.add(env.task)
            if env.kind in COMMANDS:
                self._record(env)
            log.info("%s job=%s step=%s task=%s %.3fs%s", self.party.name, env.job,
                     env.kind.name, env.task, time.perf_counter() - start, waited)
        if reply is not None:
            self._reply(env, *reply)
        if held is not None:
            self.transport.release(held)
        if env.kind == MsgType.CLOSE_JOB:
            closed = self.jobs.pop(env.job, None)
            if closed is not None:  # steps still waiting at the close are answered by it
                self._release_waiting(closed)
            if self.exit_on_close:
                self._stopping = True

    def _send_for(self, job: str) -> Callable[[str, Kind, Any, str], None]:
        def send(recipient: str, kind: Kind, body: Any, task: str) -> None:
            env = Envelope(job=job, task=task, sender=self.party.name, recipient=recipient,
                           kind=kind, body=body)
            if kind in TRANSIENT:
                self.transport.send(recipient, self.sealer.seal(env), persistent=False)
            else:
                self.transport.send(recipient, self.sealer.seal(env))
        return send

    def _reply(self, env: Envelope, kind: Kind, body: Any) -> None:
        try:
            self._send_for(env.job)(env.sender, kind, body, env.task)
        except MessageError as exc:  # an unreachable sender must not stop the worker
            log.error("%s: could not answer %s to %r: %s", self.party.name, env.kind.name,
                      env.sender, exc)
