"""What Prefect prints on the console while fedboost runs a flow.

Prefect logs a line per flow state and task run at INFO on the console; the Prefect API (and so
its UI) keeps every line, so fedboost's commands and Python functions show only warnings and
errors unless asked for more (``--log-level`` / ``log_level=``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_INTERRUPTED = "aborted by an interrupt signal"
"""Prefect's words for a task or flow run stopped by Ctrl-C (its 'Crash detected!' lines)."""
_CONSOLE_LOGGERS = ("", "prefect", "prefect.flow_runs", "prefect.task_runs")


class UserErrorFilter(logging.Filter):
    """Keep tracebacks of user errors (bad data, empty intersection), of parties that
    stopped answering and of a restarted party's lost state (the flow recovers and says so in
    one line), and Prefect's crash lines after Ctrl-C, off the console.

    Prefect logs a failing task or flow with its traceback; for bad input the caller gets one
    line instead. Records still reach the Prefect API, so the UI shows the full failure.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()
        self.lost: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        from flows.errors import JobStopped, PartyError, StepTimeout

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (JobStopped, StepTimeout)) or (isinstance(exc, PartyError)
                                                          and exc.user_error):
            self.seen.add(str(exc))
            return False
        message = record.getMessage()
        if isinstance(exc, PartyError) and exc.reply.state_lost:
            # a restarted worker: the flow resumes from checkpoints and says so in one
            # WARNING line; should the recovery fail, the command's error shows the cause
            self.lost.add(str(exc))
            return False
        if record.levelno >= logging.ERROR and any(text in message for text in self.lost):
            return False  # the task's "Finished in state Failed(...)" line of the same error
        if _raised_by_interrupt(exc) or _INTERRUPTED in message:
            return False  # Ctrl-C: the command says so in one line
        return not any(text in message for text in self.seen)


def _raised_by_interrupt(exc: BaseException | None) -> bool:
    """``exc`` is a KeyboardInterrupt or was raised while one was being handled: Ctrl-C
    between two task runs makes Prefect's crash handler fail with "Task run is not set", and
    the flow logs that ValueError (its context the interrupt) with a traceback."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class _BelowLevel(logging.Filter):
    """Drops records under ``level``; on the ``prefect`` logger itself it applies only to that
    logger's own lines (the ephemeral server's start and stop), not to the flow and task
    lines its children send to the Prefect API."""

    def __init__(self) -> None:
        super().__init__()
        self.level = logging.WARNING

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


_SERVER_LINES = _BelowLevel()
"""Stays on the ``prefect`` logger after a run: the server stops when the process exits."""


def _console_handlers() -> list[logging.Handler]:
    return [handler for name in _CONSOLE_LOGGERS
            for handler in logging.getLogger(name or None).handlers
            if isinstance(handler, logging.StreamHandler)]


@contextmanager
def prefect_console(level: str = "WARNING") -> Iterator[None]:
    """Prefect's console lines at ``level`` and above while the block runs (a line per task
    run only at ``DEBUG``); the previous levels come back after it."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    import flows.protocols  # noqa: F401  Prefect sets up its logging on import: adjust it after

    tasks = logging.getLogger("prefect.task_runs")
    handlers = _console_handlers()
    saved = tasks.level, [handler.level for handler in handlers]
    user_errors = UserErrorFilter()
    tasks.setLevel(logging.INFO if level == "DEBUG" else logging.WARNING)
    _SERVER_LINES.level = getattr(logging, level)
    logging.getLogger("prefect").addFilter(_SERVER_LINES)  # once: filters are a set
    for handler in handlers:
        handler.setLevel(getattr(logging, level))
        handler.addFilter(user_errors)
    try:
        yield
    finally:
        tasks.setLevel(saved[0])
        for handler, handler_level in zip(handlers, saved[1], strict=True):
            handler.setLevel(handler_level)
            handler.removeFilter(user_errors)
