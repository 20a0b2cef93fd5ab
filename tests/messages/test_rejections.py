"""Refusals are logged within budgets, and a summary line counts the rest by reason and sender
(issue 28 item 5: 2,020 junk messages gave 2,020 warnings)."""

from __future__ import annotations

import logging

import pytest

from messages.rejections import MAX_GROUPS, RejectionLog


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _log(clock: Clock, **limits: float) -> RejectionLog:
    return RejectionLog(logging.getLogger("test.rejections"), "host", clock=clock,
                        **limits)  # type: ignore[arg-type]


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.rejections"]


def test_a_flood_gets_its_first_lines_then_one_summary_with_its_counts(
        caplog: pytest.LogCaptureFixture) -> None:
    # Prepare
    caplog.set_level(logging.INFO, logger="test.rejections")
    clock = Clock()
    rejections = _log(clock, lines=3, quiet=5.0)
    # Execute: 1,000 junk messages from outside the federation, 20 forged, in one second
    for k in range(1000):
        rejections.refuse("malformed", "", "rejected message %d", k, authenticated=False)
        if k % 50 == 0:
            rejections.refuse("forged", "guest", "bad signature %d", k, authenticated=False)
    clock.now += 1.0
    rejections.flush()
    assert len(_lines(caplog)) == 3  # no summary while the flood may go on
    clock.now += 5.0
    rejections.flush()
    # Assert
    lines = _lines(caplog)
    assert lines[:3] == ["host: rejected message 0", "host: bad signature 0",
                         "host: rejected message 1"]
    assert lines[3] == ("host: refused 1020 messages in 6 s, 1017 of them not logged one by "
                        "one: 1000 malformed from unknown senders; 20 forged from unverified "
                        "'guest'")
    clock.now += 100.0
    rejections.flush()
    assert len(_lines(caplog)) == 4  # a summary is given once


def test_authenticated_senders_keep_their_own_lines_through_a_flood(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.rejections")
    clock = Clock()
    rejections = _log(clock, lines=2)
    for _ in range(500):
        rejections.refuse("forged", "mallory", "junk", authenticated=False)
    rejections.refuse("unknown job", "guest", "PSI_POINTS for unknown job %r", "j",
                      authenticated=True, level=logging.INFO)
    rejections.refuse("stale session", "host2", "stale", authenticated=True)
    assert "host: PSI_POINTS for unknown job 'j'" in _lines(caplog)
    assert "host: stale" in _lines(caplog)
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert levels["host: PSI_POINTS for unknown job 'j'"] == logging.INFO


def test_a_summary_of_info_lines_stays_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.rejections")
    clock = Clock()
    rejections = _log(clock, lines=1)
    for _ in range(5):  # a recovered job's late messages: expected, not a warning
        rejections.refuse("stale session", "guest", "stale", authenticated=True,
                          level=logging.INFO)
    rejections.flush(final=True)
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
    assert "5 stale session from 'guest'" in _lines(caplog)[-1]


def test_a_long_flood_gets_a_summary_each_period_and_budgets_renew(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.rejections")
    clock = Clock()
    rejections = _log(clock, lines=2, period=60.0, quiet=5.0)
    for second in range(150):  # one junk message a second, never quiet for 5 s
        clock.now += 1.0
        rejections.refuse("malformed", "", "junk %d", second, authenticated=False)
    rejections.flush()
    summaries = [line for line in _lines(caplog) if "refused" in line]
    junk = [line for line in _lines(caplog) if "junk" in line]
    assert len(summaries) == 2 and len(junk) == 3 * 2  # periods starting at 1, 61, 121
    assert summaries[0].startswith("host: refused 60 messages in 60 s, 58 of them")
    rejections.flush(final=True)  # the endpoint stops: what is left is summed up
    assert _lines(caplog)[-1].startswith("host: refused 30 messages in 29 s, 28 of them")


def test_claimed_sender_names_cannot_grow_the_summary(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.rejections")
    clock = Clock()
    rejections = _log(clock, lines=1)
    for k in range(1000):
        rejections.refuse("forged", f"sender-{k}\n" + "x" * 500, "junk", authenticated=False)
    rejections.flush(final=True)
    summary = _lines(caplog)[-1]
    assert summary.count(" from ") == MAX_GROUPS + 1
    assert f"{1000 - MAX_GROUPS} forged from other senders" in summary
    assert "\n" not in summary and len(summary) < 120 * (MAX_GROUPS + 1)
