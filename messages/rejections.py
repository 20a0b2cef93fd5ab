"""Warnings about refused messages, rate-limited, with a summary line of what was not logged.

Anyone who may publish to a party's queue can send junk as fast as the broker takes it: a line
per refused message filled the disk and buried every other line (2,020 junk messages, 2,020
warnings). Each refusal is counted by reason and sender; the first ``lines`` of a period are
logged as they come, the rest only counted, and one summary line gives the counts of every
refusal since the last summary: once refusals stop for ``quiet`` seconds, or every ``period``
seconds while they go on.

Budgets are kept apart: every authenticated sender (a signature checked) has its own, and
everything unauthenticated shares one, so junk from outside the federation cannot use up the
lines about a party's own messages. Whatever arrives, a period gets at most
``lines * (senders + 1)`` lines and ``period / quiet`` summaries (each under ``MAX_GROUPS``
counts).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

LINES_PER_PERIOD = 10
"""Refusals logged one by one per budget and period: enough to see what is refused and why."""
PERIOD_SECONDS = 60.0
"""How often a long flood gets its summary line (1,440 lines a day at most)."""
QUIET_SECONDS = 5.0
"""A flood that stopped for this long is summed up at once (an operator sees it end)."""
MAX_GROUPS = 32
"""(reason, sender) pairs counted apart per period; more (a flood claiming ever new sender
names) are counted under "other senders", so a summary stays one short line."""
UNAUTHENTICATED = ""
"""The budget of every message whose signature was not checked (or did not verify)."""


def _label(sender: str, authenticated: bool) -> str:
    """A sender as a summary names it: claimed names are attacker text, so cut and quoted."""
    if authenticated:
        return repr(sender[:64])
    return f"unverified {sender[:64]!r}" if sender else "unknown senders"


@dataclass(slots=True)
class RejectionLog:
    """Logs refusals of one endpoint (``owner``) through ``log``, within budgets."""

    log: logging.Logger
    owner: str
    lines: int = LINES_PER_PERIOD
    period: float = PERIOD_SECONDS
    quiet: float = QUIET_SECONDS
    clock: Callable[[], float] = time.monotonic
    _logged: Counter[str] = field(default_factory=Counter)
    """Lines logged this period, per budget (an authenticated sender, or ``UNAUTHENTICATED``)."""
    _period_start: float = float("-inf")
    _counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Refusals since the last summary, by (reason, sender)."""
    _hidden: int = 0
    _level: int = logging.NOTSET
    """The highest level of a refusal not logged: the summary's level."""
    _since: float | None = None
    _last: float = 0.0

    def refuse(self, reason: str, sender: str, message: str, *args: object,
               authenticated: bool, level: int = logging.WARNING) -> None:
        """Count a refused message; log ``message % args`` (after the owner's name) if its
        sender's budget has room. ``reason`` is a short fixed phrase ("bad signature") that
        the summary counts by; ``sender`` is who the message names, checked or not."""
        now = self.clock()
        self._flush(now)
        if now - self._period_start >= self.period:
            self._period_start = now
            self._logged.clear()
        if self._since is None:
            self._since = now
        self._last = now
        group = (reason, _label(sender, authenticated))
        if group not in self._counts and len(self._counts) >= MAX_GROUPS:
            group = (reason, "other senders")
        self._counts[group] += 1
        budget = sender if authenticated else UNAUTHENTICATED
        if self._logged[budget] < self.lines:
            self._logged[budget] += 1
            self.log.log(level, "%s: " + message, self.owner, *args)
        else:
            self._hidden += 1
            self._level = max(self._level, level)

    def flush(self, *, final: bool = False) -> None:
        """Log the summary if one is due (refusals went unlogged, and they stopped for
        ``quiet`` seconds or a ``period`` passed; ``final``: now, as the endpoint stops). Call
        it now and then, as a worker's loop does."""
        self._flush(self.clock(), final)

    def _flush(self, now: float, final: bool = False) -> None:
        if self._since is None:
            return
        over = final or now - self._since >= self.period
        if not self._hidden:
            if over:  # every refusal since the last summary was logged: nothing to sum up
                self._counts.clear()
                self._since = None
            return
        if not over and now - self._last < self.quiet:
            return
        groups = "; ".join(f"{count} {reason} from {sender}"
                           for (reason, sender), count in self._counts.most_common())
        self.log.log(self._level, "%s: refused %d messages in %.0f s, %d of them not logged one "
                     "by one: %s", self.owner, sum(self._counts.values()), now - self._since,
                     self._hidden, groups)
        self._counts.clear()
        self._hidden, self._level, self._since = 0, logging.NOTSET, None
