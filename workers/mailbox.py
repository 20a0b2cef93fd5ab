"""A job's peer messages, filed by (kind, sender, tree, depth) until a step takes them.

Bounded per sender and per job: a peer, even an authenticated one, cannot grow a party's memory
at will; what is over a limit is refused (the worker drops it with a warning naming the sender
and the job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from messages.envelope import Envelope, Kind, MsgType
from workers import NotReady

MailKey = tuple[Kind, str, int, int]

SENDER_MAIL = (8192, 4 << 30)
"""Messages and bytes one sender may have waiting in one job's mailbox. The protocol needs one
tree's gradient chunks (4096 ciphertexts, 2 MiB each at 2048 bits: 512 bytes a row) and a
level's histograms or answers: 4 GiB holds the gradients of 8 million rows."""
JOB_MAIL = (32768, 8 << 30)
"""Messages and bytes all senders together may have waiting in one job's mailbox."""


def mail_key(env: Envelope) -> MailKey:
    """Where a peer message is filed: its kind, sender, and the tree and depth (or batch,
    round, PSI stage) its body names; -1 for what a body does not name."""
    tree = getattr(env.body, "tree", -1)
    depth = getattr(env.body, "depth", -1)
    if env.kind in (MsgType.DECISIONS, MsgType.DECISION_REQUEST, MsgType.PATH_DECISIONS):
        tree = env.body.batch
    if env.kind == MsgType.ROUND_DECISIONS:
        tree = env.body.round
    if env.kind == MsgType.PSI_POINTS:
        depth = env.body.stage
    return (env.kind, env.sender, tree, depth)


@dataclass(slots=True)
class Mailbox:
    """Peer messages of one job, filed by (kind, sender, tree, depth), bounded per sender and
    per job (``SENDER_MAIL``, ``JOB_MAIL``): a peer cannot grow a party's memory at will."""

    items: dict[MailKey, list[Any]] = field(default_factory=dict)
    sizes: dict[MailKey, list[int]] = field(default_factory=dict)
    """The size on the wire of each filed message, in the order of ``items``."""
    held: dict[str, list[int]] = field(default_factory=dict)
    """Messages and bytes waiting, per sender."""
    sender_limit: tuple[int, int] = SENDER_MAIL
    job_limit: tuple[int, int] = JOB_MAIL

    def put(self, key: MailKey, body: Any, size: int = 0) -> str | None:
        """File a message of ``size`` bytes; over a limit, refuse it and say which."""
        mine = self.held.setdefault(key[1], [0, 0])
        if mine[0] >= self.sender_limit[0] or mine[1] + size > self.sender_limit[1]:
            return (f"{mine[0]} messages, {mine[1]} bytes of this sender wait (limit "
                    f"{self.sender_limit[0]}, {self.sender_limit[1]})")
        count, total = (sum(h[i] for h in self.held.values()) for i in (0, 1))
        if count >= self.job_limit[0] or total + size > self.job_limit[1]:
            return (f"{count} messages, {total} bytes of the job wait (limit "
                    f"{self.job_limit[0]}, {self.job_limit[1]})")
        self.items.setdefault(key, []).append(body)
        self.sizes.setdefault(key, []).append(size)
        mine[0], mine[1] = mine[0] + 1, mine[1] + size
        return None

    def _release(self, key: MailKey, sizes: list[int]) -> None:
        mine = self.held.get(key[1])
        if mine is not None:
            mine[0], mine[1] = mine[0] - len(sizes), mine[1] - sum(sizes)

    def take(self, kind: Kind, sender: str, tree: int = -1, depth: int = -1) -> Any:
        """Remove and return one message, or raise ``NotReady``."""
        key = (kind, sender, tree, depth)
        bodies = self.items.get(key)
        if not bodies:
            raise NotReady(f"{kind.name} from {sender}")
        body = bodies.pop(0)
        self._release(key, [self.sizes[key].pop(0)])
        if not bodies:
            del self.items[key], self.sizes[key]
        return body

    def require(self, *keys: MailKey, counts: list[int] | None = None) -> None:
        """Raise ``NotReady`` unless every key has (at least ``counts[i]``) messages.

        Handlers call this before taking anything, so a retried command finds its inputs intact.
        """
        for i, key in enumerate(keys):
            need = 1 if counts is None else counts[i]
            if len(self.items.get(key, [])) < need:
                raise NotReady(f"{key[0].name} from {key[1]}")

    def take_all(self, kind: Kind, sender: str, tree: int = -1, depth: int = -1) -> list[Any]:
        key = (kind, sender, tree, depth)
        self._release(key, self.sizes.pop(key, []))
        return self.items.pop(key, [])

    def drop_tree(self, tree: int) -> None:
        """Forget everything of a finished tree."""
        for key in [k for k in self.items if k[2] == tree]:
            self.take_all(*key)
