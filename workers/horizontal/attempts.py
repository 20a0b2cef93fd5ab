"""The attempts of a horizontal round: a round given up (a member dropped) is redone as a new
attempt, and a step takes the peer messages of the current attempt, dropping those of
abandoned ones (members and the aggregator alike)."""

from __future__ import annotations

from typing import Any

from messages.envelope import Kind
from workers.handlers import StepContext


def take_current(ctx: StepContext, kind: Kind, sender: str, tree: int, depth: int,
                 attempt: int) -> Any:
    """The peer message of this attempt; those of an abandoned attempt are dropped."""
    while True:
        body = ctx.mailbox.take(kind, sender, tree, depth)
        if body.attempt == attempt:
            return body


def require_current(ctx: StepContext, kind: Kind, senders: list[str], tree: int, depth: int,
                    attempt: int) -> None:
    """Raise ``NotReady`` unless every sender's message of this attempt is in, after dropping
    theirs of abandoned attempts: a step that takes from several senders must not take one's
    message and then wait for another's (a retry would then miss the first)."""
    for sender in senders:
        waiting = ctx.mailbox.items.get((kind, sender, tree, depth), [])
        while waiting and waiting[0].attempt != attempt:
            ctx.mailbox.take(kind, sender, tree, depth)
    ctx.mailbox.require(*[(kind, s, tree, depth) for s in senders])
