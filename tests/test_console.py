"""What reaches the console while a command runs a flow: Ctrl-C ends in the command's one line,
not in Prefect's crash handling."""

from __future__ import annotations

import logging

from fedboost._console import UserErrorFilter


def _record(exc: BaseException, message: str = "Encountered exception during execution") \
        -> logging.LogRecord:
    return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, message, (),
                             (type(exc), exc, exc.__traceback__))


def _raised_while_handling_ctrl_c() -> ValueError:
    """What Prefect's task engine raises when Ctrl-C lands before a task run exists: its crash
    handler asks for the run's state and fails, with the interrupt as the error's context."""
    try:
        try:
            raise KeyboardInterrupt
        except BaseException:
            raise ValueError("Task run is not set")  # noqa: B904  as Prefect does
    except ValueError as error:
        return error


def test_an_error_raised_while_prefect_handled_ctrl_c_stays_off_the_console() -> None:
    error = _raised_while_handling_ctrl_c()
    assert isinstance(error.__context__, KeyboardInterrupt)
    assert not UserErrorFilter().filter(_record(error))


def test_ctrl_c_itself_and_prefects_crash_line_stay_off_the_console() -> None:
    keep = UserErrorFilter()
    assert not keep.filter(_record(KeyboardInterrupt()))
    assert not keep.filter(logging.LogRecord(
        "prefect.task_runs", logging.ERROR, __file__, 1,
        "Crash detected! Execution was aborted by an interrupt signal.", (), None))


def test_other_errors_still_reach_the_console_with_their_traceback() -> None:
    try:
        try:
            raise KeyError("bin")
        except KeyError:
            raise ValueError("Task run is not set")  # noqa: B904  chained to a plain error
    except ValueError as error:
        assert UserErrorFilter().filter(_record(error))
