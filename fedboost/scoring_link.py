"""The scoring service's link to the parties: one scoring session, scored in rounds over RabbitMQ.

The service signs as ``flow`` (it needs the flow key, like ``fedboost predict`` over RabbitMQ)
and opens a scoring session at every party's running worker (``OPEN_SCORING``). A round sends
``SCORE_ROWS`` with the round's ids to every party at once: each passive party evaluates all its
nodes on those rows and sends the bit-packed decisions to the active party's worker (round 1),
which finishes the traversal (round 2) and answers the predictions. The decisions never reach
this process; the active party's worker, not this process, holds its model part and rows. That
costs one hop more than doing the active party's part here (about 0.7 ms on loopback, measured
with a persistent ping-pong), and keeps this process free of data and keys but its own.

A request whose ids have not all been found at every party in this session first goes through a
membership round (``FIND_ROWS``): every party answers which ids it lacks and sends nothing else.
A request with an id some party lacks fails (404, the same for whichever party lacks it; which
party is only logged here); the others are scored next. So a request that cannot be scored sends
no decisions to the active party. Ids every party has been found to hold are remembered for the
session (each party indexed its rows once, at open): asked again, they are scored at once.

A failure fails the requests it touches, never the link: a round that cannot be sealed or sent
fails its own requests, a reply that cannot be handled fails its round; anything else that
escapes the link's loop is a bug, and ends the link with every waiting request failed and
``on_death`` called (``fedboost serve-model`` then exits non-zero, for a supervisor to restart
it). A party whose worker is not connected to the broker (no consumer on its queue: killed, or
stopped) is known gone: the link looks when it is idle or a round is late, at most once every
``WATCH_SECONDS``; while a party is gone, every request fails at once with a 503 naming it (and
``Retry-After``), and when its worker is back the session is opened again without a restart.

One thread owns the broker connection (pika's is not thread-safe). Requests queue here from any
thread; whenever fewer than ``max_in_flight`` rounds are out, the queued requests, up to
``max_rows`` rows, become one round: concurrent small requests are micro-batched. What a
session is planned with and what its requests get back are in ``fedboost.scoring_session``.

The module stays near 480 lines on purpose: rounds, their expiry and the watch on gone parties
all run in the one thread that owns the connection and share its queues and rounds; split
apart they would have to pass that state back and forth or take locks the single owner avoids.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedboost.scoring_session import (Done, LinkStats, Observer, Scored, ScoringFailure,
                                      SessionPlan)
from flows.coordinator import Coordinator, PartyError, step_id
from messages import MessageError, TransportError
from messages.bodies import ErrorReply, PartyInfo, Step
from messages.scoring import FindRows, OpenScoring, RowsFound, ScoreRows, Scores
from messages.envelope import Envelope, Kind, MsgType
from messages.rabbitmq import RabbitTransport

log = logging.getLogger("fedboost.serving")

WATCH_SECONDS = 1.0
"""How often the link asks the broker whether every party's worker is connected, while idle,
while a round is late or while a party is gone (never while rounds answer promptly: the
question costs broker round trips on the link's thread)."""
RETRY_SECONDS = 2
"""``Retry-After`` of a request refused because a party is gone: about when the link looks
again."""


@dataclass(slots=True)
class _Request:
    ids: list[str]
    done: Done
    client: str = ""
    found: bool = False
    """Every party holds every id (a membership round said so in this session)."""


@dataclass(slots=True)
class _Round:
    number: int
    kind: Kind
    """``FIND_ROWS`` (membership; no ids: a ping) or ``SCORE_ROWS``."""
    requests: list[_Request]
    ids: list[str]
    started: float
    replies: dict[str, Any] = field(default_factory=dict)


class ScoringLink:
    """A scoring session at the parties' workers, fed by requests from any thread."""

    def __init__(self, plan: SessionPlan, coordinator: Coordinator, *,
                 max_in_flight: int = 2, observe: Observer | None = None,
                 on_death: Callable[[], None] | None = None) -> None:
        self.plan = plan
        self.coordinator = coordinator
        if not isinstance(coordinator.transport, RabbitTransport):
            raise TypeError("a scoring session's coordinator talks to the parties over RabbitMQ")
        self.transport = coordinator.transport
        self.max_in_flight = max_in_flight
        self.observe = observe
        self.on_death = on_death
        """Called (from the link's thread) when the link ends on a bug, not on ``stop``."""
        self.stats = LinkStats()
        self.problem = "the scoring session is not open yet"
        """Why the service cannot score now ("" when it can)."""
        self._submitted: deque[_Request] = deque()
        """Requests from any thread (a deque's append and popleft are thread-safe)."""
        self._queue: deque[_Request] = deque()
        """Requests waiting for a round: the link's thread only."""
        self._pings: deque[_Request] = deque()
        self._in_flight: dict[str, _Round] = {}
        self._number = 0
        self._reopen = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._found: set[str] = set()
        """Ids every party holds (this session); at most the fewest rows a party indexed."""
        self._most_found = 0
        self.gone: dict[str, str] = {}
        """Parties known gone (no worker of theirs on the broker), with why."""
        self._gone_since = 0.0
        self._watched = 0.0
        self._busy_at = 0.0
        """When a round last went out or was answered (monotonic): the link is idle, and may
        spend broker round trips on the watch, only a ``WATCH_SECONDS`` after it (a client
        asking one row after another would otherwise wait for the watch once a second)."""

    # ---- the session ------------------------------------------------------------------------

    def open(self) -> None:
        """Open the session at every party (each loads its model part, indexes its rows)."""
        plan = self.plan
        parties = ([PartyInfo(plan.active, "active", plan.datasets.get(plan.active, ""))]
                   + [PartyInfo(p, "passive", plan.datasets.get(p, "")) for p in plan.passives])
        self.coordinator.begin_session()
        acks = self.coordinator.call(plan.parties, MsgType.OPEN_SCORING,
                                     OpenScoring(parties=parties, model_job=plan.model_job,
                                                 max_rows=plan.max_rows,
                                                 protocol=plan.protocol),
                                     step_id(MsgType.OPEN_SCORING))
        self.problem, self._reopen = "", False
        self._found.clear()  # a reopened session may index other rows
        self._most_found = min(int(getattr(a, "count", 0)) for a in acks.values())
        for request in self._queue:
            request.found = False
        self.stats.opened_at = time.time()

    def close_session(self) -> None:
        """Let every party drop the session (best effort: a party that is gone is logged)."""
        try:
            self.coordinator.timeout = min(self.coordinator.timeout, 5.0)
            self.coordinator.call(self.plan.parties, MsgType.CLOSE_JOB, Step(),
                                  step_id(MsgType.CLOSE_JOB))
        except Exception as exc:  # noqa: BLE001 - best effort, also after the link failed
            log.warning("could not close scoring session %s: %r", self.plan.job, exc)

    def start(self) -> None:
        """Score queued requests in a thread of its own until ``stop``."""
        self._thread = threading.Thread(target=self._serve, name="scoring-link", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Fail what is still queued, close the session at the parties, end the thread."""
        self._stopping = True
        self.transport.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, ids: list[str], done: Done, client: str = "") -> None:
        """Queue a request (any thread); ``done`` gets its scores or its failure. ``client``
        names the caller in the log."""
        if not self.alive():
            done(ScoringFailure(503, self.problem or "the scoring link has stopped"))
            return
        self._submitted.append(_Request(ids, done, client))
        self.transport.wake()

    def ping(self, done: Done) -> None:
        """Ask every party to answer (any thread): ``done`` gets an empty ``Scored`` when all
        did, or a 503 naming the silent ones after the round timeout."""
        self._pings.append(_Request([], done))
        self.transport.wake()

    # ---- the link's thread ------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._stopping:
                # a reply that ends a membership round queues its requests for scoring: their
                # round goes out before anything else the loop does
                self._launch()
                data = self.transport.receive(timeout=self._wait())
                if data is not None:
                    self.transport.acknowledge()
                    self._file(data)
                    self._launch()
                self._expire()
                self._watch()
        except Exception as exc:  # a bug, or a broker gone for longer than reconnects try
            log.critical("scoring session %s: the scoring link stopped: %r", self.plan.job,
                         exc, exc_info=True)
            self.problem = f"the scoring link stopped ({type(exc).__name__}; see the log)"
            self._fail_waiting(ScoringFailure(503, self.problem))
            if self.on_death is not None:
                self.on_death()
            return
        self._fail_waiting(ScoringFailure(503, "the scoring service is shutting down"))
        self.close_session()

    def _fail_waiting(self, failure: ScoringFailure) -> None:
        """Fail every request queued, waiting for a round or in one."""
        self._take_submitted()
        waiting = [*_drained(self._queue), *_drained(self._pings),
                   *(r for x in self._in_flight.values() for r in x.requests)]
        self._in_flight.clear()
        for request in waiting:
            self._finish(request, failure)

    def _wait(self) -> float:
        if not self._in_flight:
            return 0.5
        oldest = min(r.started for r in self._in_flight.values())
        return max(0.0, min(0.5, oldest + self.plan.timeout - time.monotonic()))

    def _launch(self) -> None:
        """Turn queued requests into rounds: scoring rounds of requests whose ids every party
        holds, membership rounds of the others, up to ``max_in_flight`` of each kind at once
        (a membership round costs the parties a lookup: it does not hold up scoring)."""
        self._take_submitted()
        if self.gone:
            self._fail_waiting(self._gone_failure())
            return
        if self._reopen and (self._queue or self._pings) and not self._in_flight:
            self._try_reopen()
        if self._reopen:
            return
        if self._pings and not any(not r.ids for x in self._in_flight.values()
                                   for r in x.requests):
            # one ping round answers every waiting probe
            self._send_round(_drained(self._pings), [], MsgType.FIND_ROWS)
        for kind in (MsgType.SCORE_ROWS, MsgType.FIND_ROWS):
            while self._queue and self._out(kind) < self.max_in_flight:
                requests, ids = self._take(kind == MsgType.SCORE_ROWS)
                if not requests:
                    break
                self._send_round(requests, ids, kind)

    def _take_submitted(self) -> None:
        self._queue.extend(_drained(self._submitted))

    def _out(self, kind: Kind) -> int:
        return sum(1 for r in self._in_flight.values() if r.kind == kind and r.ids)

    def _take(self, found: bool) -> tuple[list[_Request], list[str]]:
        """Queued requests, in order, whose ids are (``found``) or are not all known to be at
        every party, up to ``max_rows`` rows; the others stay queued."""
        taken: list[_Request] = []
        ids: list[str] = []
        kept: deque[_Request] = deque()
        for request in self._queue:
            fits = len(ids) + len(request.ids) <= self.plan.max_rows
            if fits and (request.found or self._found.issuperset(request.ids)) == found:
                taken.append(request)
                ids.extend(request.ids)
            else:
                kept.append(request)
        self._queue = kept
        return taken, ids

    def _try_reopen(self) -> None:
        try:
            self.open()
            log.warning("reopened scoring session %s (a worker had restarted)", self.plan.job)
        except (PartyError, TransportError) as exc:
            self.problem = str(exc)
            for request in [*_drained(self._queue), *_drained(self._pings)]:
                self._finish(request, ScoringFailure(503, str(exc)))

    def _send_round(self, requests: list[_Request], ids: list[str], kind: Kind) -> None:
        """Send a round to every party; one that cannot be sealed or sent fails its own
        requests (the API checked the ids: an encoding failure here is a bug, logged)."""
        self._number += 1
        task = f"{self.coordinator.session}/{kind.name.lower()}/r{self._number}"
        body: FindRows | ScoreRows = (
            FindRows(round=self._number, ids=ids) if kind == MsgType.FIND_ROWS
            else ScoreRows(round=self._number, ids=ids, wait_seconds=float(self.plan.timeout)))
        sealer = self.coordinator.sealer
        try:  # the active party last: it waits for the others' decisions anyway
            sealed = [(party, sealer.seal(Envelope(
                job=self.plan.job, task=task, sender=self.transport.name, recipient=party,
                kind=kind, body=body))) for party in [*self.plan.passives, self.plan.active]]
            # every party's message out at once, not one broker confirm after another (three
            # round trips to the broker before the last party had its message): the round's
            # answers confirm it, and a round not answered in time fails its requests
            self.transport.send_unconfirmed(sealed)
        except MessageError as exc:
            for request in requests:
                self._finish(request, ScoringFailure(503, f"cannot reach the parties: {exc}"))
            return
        except Exception as exc:  # noqa: BLE001 - one round's failure, not the link's
            log.exception("scoring session %s: round %d could not be sent", self.plan.job,
                          self._number)
            for request in requests:
                self._finish(request, ScoringFailure(
                    500, f"round {self._number} could not be sent ({type(exc).__name__})"))
            return
        self._in_flight[task] = _Round(self._number, kind, requests, ids, time.monotonic())
        self._busy_at = time.monotonic()
        if kind == MsgType.SCORE_ROWS:
            self.stats.rounds += 1
        else:
            self.stats.membership_rounds += 1

    def _file(self, data: bytes) -> None:
        try:
            env = self.coordinator.sealer.open(data)
        except MessageError as exc:
            log.warning("scoring session %s: dropped a reply: %s", self.plan.job, exc)
            return
        round_ = self._in_flight.get(env.task)
        if (round_ is None or env.job != self.plan.job or env.sender not in self.plan.parties
                or env.sender in round_.replies):
            return  # a round already given up, or not ours
        try:
            self._take_reply(env, round_)
        except Exception as exc:  # noqa: BLE001 - one round's failure, not the link's
            log.exception("scoring session %s: round %d: %s's reply could not be handled",
                          self.plan.job, round_.number, env.sender)
            self._in_flight.pop(env.task, None)
            self._fail_requests(round_, ScoringFailure(
                502, f"party {env.sender}'s answer to round {round_.number} could not be "
                     f"handled ({type(exc).__name__})"))

    def _take_reply(self, env: Envelope, round_: _Round) -> None:
        expected = (Scores if env.sender == self.plan.active
                    and round_.kind == MsgType.SCORE_ROWS else RowsFound)
        if isinstance(env.body, ErrorReply):
            self._fail_round(env.task, ScoringFailure(503, f"party {env.sender}: "
                                                           f"{env.body.message}"))
            if env.body.state_lost:
                self._reopen, self.problem = True, f"party {env.sender} restarted"
            return
        if not isinstance(env.body, expected) or env.body.round != round_.number:
            self._fail_round(env.task, ScoringFailure(
                502, f"party {env.sender} answered round {round_.number} with "
                     f"{env.kind.name}"))
            return
        round_.replies[env.sender] = env.body
        self._busy_at = time.monotonic()
        if self.observe is not None:
            self.observe(env.sender, "find" if round_.kind == MsgType.FIND_ROWS else "score",
                         time.monotonic() - round_.started)
        if len(round_.replies) == len(self.plan.parties):
            del self._in_flight[env.task]
            self.stats.all_answered_at = time.monotonic()
            self._complete(round_)

    def _complete(self, round_: _Round) -> None:
        unknown: dict[int, list[str]] = {}
        for party, reply in round_.replies.items():
            for position in reply.unknown:
                if not 0 <= int(position) < len(round_.ids):
                    self._fail_requests(round_, ScoringFailure(
                        502, f"party {party} answered round {round_.number} with a position "
                             f"outside it"))
                    return
                unknown.setdefault(int(position), []).append(party)
        if unknown:
            self._sort_out_unknown(round_, unknown)
            return
        if round_.kind == MsgType.FIND_ROWS:
            self._found_everywhere(round_)
            return
        scores: Scores = round_.replies[self.plan.active]
        n = len(round_.ids)
        if scores.incomplete or len(scores.values) != 8 * n * scores.n_outputs:
            message = f"party {self.plan.active} answered round {round_.number} incompletely"
            for request in round_.requests:
                self._finish(request, ScoringFailure(502, message))
            return
        values = np.frombuffer(scores.values, dtype="<f8").reshape(n, scores.n_outputs)
        start = 0
        for request in round_.requests:
            end = start + len(request.ids)
            self._finish(request, Scored(values[start:end], round_.number, n))
            start = end
        self.stats.rows += n

    def _found_everywhere(self, round_: _Round) -> None:
        """A membership round found every id at every party: score its requests next."""
        if len(self._found) + len(round_.ids) <= self._most_found:
            self._found.update(round_.ids)
        for request in round_.requests:
            request.found = True
            if not request.ids:  # a ping
                self._finish(request, Scored(np.zeros((0, 1)), round_.number, 0))
        self._queue.extendleft(reversed([r for r in round_.requests if r.ids]))

    def _sort_out_unknown(self, round_: _Round, unknown: dict[int, list[str]]) -> None:
        """Fail the requests with ids some party lacks (one 404, whichever party it is: which
        one goes to this log only); score the others next."""
        start, again = 0, []
        for request in round_.requests:
            mine = {k - start: unknown[k] for k in range(start, start + len(request.ids))
                    if k in unknown}
            start += len(request.ids)
            if not mine:
                request.found = True
                again.append(request)
                continue
            names = [request.ids[k] for k in sorted(mine)]
            self._found.difference_update(names)
            lacking: dict[str, list[str]] = {}
            for k in sorted(mine):
                for party in mine[k]:
                    lacking.setdefault(party, []).append(request.ids[k])
            log.warning("scoring session %s round %d: %d of %d ids of a request%s cannot be "
                        "scored: %s", self.plan.job, round_.number, len(names),
                        len(request.ids), f" of client {request.client}" if request.client
                        else "", "; ".join(f"{party} has no row for {_shown(ids)}"
                                           for party, ids in sorted(lacking.items())))
            self._finish(request, ScoringFailure(
                404, f"{len(names)} of {len(request.ids)} ids cannot be scored: "
                     f"{_shown(names)}", names))
        self._queue.extendleft(reversed(again))

    def _fail_round(self, task: str, failure: ScoringFailure) -> None:
        self._fail_requests(self._in_flight.pop(task), failure)

    def _fail_requests(self, round_: _Round, failure: ScoringFailure) -> None:
        for request in round_.requests:
            self._finish(request, failure)

    def _expire(self) -> None:
        now = time.monotonic()
        for task, round_ in list(self._in_flight.items()):
            if now - round_.started <= self.plan.timeout:
                continue
            silent = [p for p in self.plan.passives if p not in round_.replies]
            silent = silent or [self.plan.active]
            what = "scoring" if round_.kind == MsgType.SCORE_ROWS else "membership"
            self._fail_round(task, ScoringFailure(
                503, f"party {', '.join(silent)}: no answer to {what} round {round_.number} "
                     f"within {self.plan.timeout:g} s (is its worker running?)"))
            self._watched = 0.0  # is it gone? look now: the requests queued behind it wait

    def _watch(self) -> None:
        """Ask the broker which parties' workers are gone: when idle (no round for a
        ``WATCH_SECONDS``), when a round is late, or while a party is gone, at most every
        ``WATCH_SECONDS``."""
        now = time.monotonic()
        late = any(now - r.started > WATCH_SECONDS for r in self._in_flight.values())
        idle = (not self._in_flight and not self._queue and not self._submitted
                and now - self._busy_at >= WATCH_SECONDS)
        if (now - self._watched < WATCH_SECONDS or self.coordinator.presence is None
                or not (late or self.gone or idle)):
            return
        self._watched = now
        gone = self.coordinator.presence(self.plan.parties)
        if gone and not self.gone:
            self._gone_since = now
            log.warning("scoring session %s: %s", self.plan.job, "; ".join(
                f"party {p}: {why}" for p, why in gone.items()))
        elif self.gone and not gone:
            log.warning("scoring session %s: every party's worker is connected again",
                        self.plan.job)
            self.gone, self._reopen = {}, True
            self._try_reopen()  # a worker that was gone holds no session: open it again now
            return
        self.gone = gone
        if gone:
            self.problem = self._gone_failure().message
            self._fail_waiting(self._gone_failure())

    def _gone_failure(self) -> ScoringFailure:
        since = time.monotonic() - self._gone_since
        return ScoringFailure(503, "; ".join(
            f"party {p}: {why} (for {since:.0f} s)" for p, why in self.gone.items()),
            retry_after=RETRY_SECONDS)

    def _finish(self, request: _Request, outcome: Scored | ScoringFailure) -> None:
        if request.ids:  # pings are not requests
            self.stats.requests += 1
            self.stats.failed += isinstance(outcome, ScoringFailure)
        try:
            request.done(outcome)
        except Exception:  # a caller's callback must not end the link
            log.exception("scoring request callback failed")


def _shown(ids: list[str]) -> str:
    return ", ".join(repr(i) for i in ids[:20]) + (", ..." if len(ids) > 20 else "")


def _drained(waiting: deque[_Request]) -> list[_Request]:
    """Everything in a deque another thread may append to, none lost."""
    taken = []
    while waiting:
        taken.append(waiting.popleft())
    return taken
