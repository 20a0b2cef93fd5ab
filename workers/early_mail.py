"""Peer messages that reach a party before the opener of their job, kept until it opens.

A flow sends its opener to every party of a job in one go, and a party that opens first may at
once send its peers messages of the job: a horizontal member's mask key reached two members
before their ``H_OPEN_JOB`` did, they dropped it, and the job waited out its step timeout. The
same race comes with a job reopened by a new flow session while a party still holds the old
one, and from the transport, which hands a chunked message over only once it is whole (an
opener in many chunks completes after small messages sent later). So a worker keeps peer
messages of a (job, session) it has not opened, and hands them to the job when the opener of
that session opens it; they then meet every check of a message that arrives after the opener
(a party of the job, the mailbox's limits, each step's own checks).

Only messages whose signature verified as a federation party's are kept (never the flow's, nor
the worker's own processes'), so a broker user outside the federation can keep nothing here.
What the parties can keep is bounded per sender, per job and in all (``SENDER_EARLY``,
``JOB_EARLY``, ``ALL_EARLY``: counts and bytes on the wire), and for ``EARLY_SECONDS`` of the
worker's time (time it spends in steps does not count: an opener may queue behind another job's
long step). A message over a limit is refused and what expires is dropped; the worker logs
each once, with its reason.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from messages.envelope import PEER_MAIL, Envelope
from messages.rejections import RejectionLog
from messages.signing import is_flow

log = logging.getLogger("fedboost.worker")

SENDER_EARLY = (64, 64 << 20)
"""Messages and bytes one sender may have kept, over every job: a peer sends a few small ones
as it opens a job (a mask key per member: 32 bytes), and a flood of validly signed ones from a
party gone bad fills only its own share: 1/16 of ``ALL_EARLY``."""
JOB_EARLY = (256, 256 << 20)
"""Messages and bytes kept for one job (every session, every sender)."""
ALL_EARLY = (1024, 1 << 30)
"""Messages and bytes kept in all: the most memory early mail takes, however many jobs and
senders there are."""
EARLY_SECONDS = 120.0
"""How long a message waits for its opener, in worker time outside steps. The flow sends the
opener to every party at once, so it is due within seconds; a job that never opens here (a
flow that died, a stale session after a restart) gives up its messages after this."""
OPENED_SESSIONS = 10_000
"""(job, session) pairs remembered as opened here: their late messages are stale, not early (a
restarted worker has forgotten them; what it keeps of theirs expires)."""


@dataclass(slots=True)
class _Held:
    env: Envelope
    size: int
    since: float


@dataclass(frozen=True, slots=True)
class Expired:
    """Messages of one sender for one (job, session) that waited too long for the opener."""

    job: str
    session: str
    sender: str
    kinds: tuple[str, ...]
    """The kind of each message, in arrival order."""
    size: int


@dataclass(slots=True)
class EarlyMail:
    """Peer messages kept by (job, session) until that session opens the job at ``owner``."""

    owner: str
    rejections: RejectionLog
    """Where what is refused or expires is reported, once (``messages.rejections``)."""
    seconds: float = EARLY_SECONDS
    clock: Callable[[], float] = time.monotonic
    """The worker's time outside steps (what ``seconds`` counts)."""
    sender_limit: tuple[int, int] = SENDER_EARLY
    job_limit: tuple[int, int] = JOB_EARLY
    all_limit: tuple[int, int] = ALL_EARLY
    _held: dict[tuple[str, str], list[_Held]] = field(default_factory=dict)
    _count: Counter[str] = field(default_factory=Counter)
    """Messages kept, by ``"sender:" + name``, ``"job:" + name`` and ``""`` (all)."""
    _bytes: Counter[str] = field(default_factory=Counter)
    _opened: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)
    """(job, session) pairs opened here, latest last (``OPENED_SESSIONS``)."""

    def __len__(self) -> int:
        return self._count[""]

    def opened(self, job: str, session: str) -> None:
        """``session`` opened ``job`` here: its messages from now on are not early, ever."""
        self._opened[job, session] = None
        if len(self._opened) > OPENED_SESSIONS:
            self._opened.popitem(last=False)

    def keep(self, env: Envelope, session: str, size: int, open_session: str | None) -> bool:
        """Keep ``env`` if it is a party's peer message for a session of its job that is not
        open here (``open_session``: the job's, None if closed) and never was. True if kept,
        or refused here for good (over a limit, logged); False: not early mail."""
        if (env.kind not in PEER_MAIL or env.sender == self.owner or is_flow(env.sender)
                or session == open_session or (env.job, session) in self._opened):
            return False
        refused = self.hold(env, session, size, self.clock())
        if refused:
            self.rejections.refuse("early mail over its limit", env.sender, "dropped %s from "
                                   "%r for job %r, which is not open here yet: %s",
                                   env.kind.name, env.sender, env.job, refused,
                                   authenticated=True)
        else:
            log.debug("%s: keeping %s from %r for job %r until its opener (session %s) "
                      "arrives", self.owner, env.kind.name, env.sender, env.job, session)
        return True

    def hold(self, env: Envelope, session: str, size: int, now: float) -> str | None:
        """Keep a verified peer message of ``session`` of its job, received at ``now``; over a
        limit, keep nothing and say which."""
        for scope, name, (count, total) in (("sender", env.sender, self.sender_limit),
                                            ("job", env.job, self.job_limit),
                                            ("", "", self.all_limit)):
            key = f"{scope}:{name}" if scope else ""
            if self._count[key] >= count or self._bytes[key] + size > total:
                whose = f"this {scope}'s" if scope else "every job's"
                return (f"{self._count[key]} messages, {self._bytes[key]} bytes of {whose} early "
                        f"mail are kept (limit {count}, {total})")
        self._held.setdefault((env.job, session), []).append(_Held(env, size, now))
        self._tally(env, size, +1)
        return None

    def release(self, job: str, session: str) -> list[tuple[Envelope, int]]:
        """Every message kept for ``session`` of ``job``, in arrival order, with its size; they
        are no longer kept."""
        held = self._held.pop((job, session), [])
        for h in held:
            self._tally(h.env, h.size, -1)
        if held:
            log.info("%s: job %r opened: the %d peer messages that came before its opener "
                     "follow", self.owner, job, len(held))
        return [(h.env, h.size) for h in held]

    def expire(self) -> None:
        """Drop what waited over ``seconds``, reporting it once per sender and (job,
        session)."""
        for gone in self.expired(self.clock()):
            self.rejections.refuse(
                "early mail expired", gone.sender, "dropped %d peer messages (%s, %d bytes) "
                "from %r for job %r (session %s): the job did not open here within %.0f s",
                len(gone.kinds), ", ".join(sorted(set(gone.kinds))), gone.size, gone.sender,
                gone.job, gone.session, self.seconds, authenticated=True)

    def expired(self, now: float) -> list[Expired]:
        """Drop and return what waited over ``seconds`` at ``now``."""
        expired: list[Expired] = []
        for key in list(self._held):
            held = self._held[key]
            old = [h for h in held if now - h.since > self.seconds]
            if not old:
                continue
            self._held[key] = [h for h in held if now - h.since <= self.seconds]
            if not self._held[key]:
                del self._held[key]
            for sender in dict.fromkeys(h.env.sender for h in old):
                mine = [h for h in old if h.env.sender == sender]
                for h in mine:
                    self._tally(h.env, h.size, -1)
                expired.append(Expired(key[0], key[1], sender,
                                       tuple(h.env.kind.name for h in mine),
                                       sum(h.size for h in mine)))
        return expired

    def _tally(self, env: Envelope, size: int, sign: int) -> None:
        for key in (f"sender:{env.sender}", f"job:{env.job}", ""):
            self._count[key] += sign
            self._bytes[key] += sign * size
            if not self._count[key]:
                del self._count[key], self._bytes[key]
