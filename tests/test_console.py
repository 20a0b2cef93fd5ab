"""What reaches the console while a command runs a flow: Ctrl-C ends in the command's one line,
not in Prefect's crash handling."""

from __future__ import annotations

import logging

import pytest

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


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_prefects_own_lines_after_ctrl_c_before_a_task_run_exists_stay_off_the_console(
        prefect_harness, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The race CI met: Ctrl-C lands while Prefect's task engine is creating a task run (made
    to happen here by raising it from that call). Prefect's crash handler then fails with
    "Task run is not set" and the flow logs that error with a traceback; none of what Prefect
    logs about it passes the console's filter."""
    import prefect.task_engine
    from prefect import flow, task

    @task
    def step() -> int:
        return 1

    @flow
    def job() -> int:
        return step()

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(prefect.task_engine, "_create_task_run_locally", interrupted)
    seen = _Records()
    loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    for logger in loggers:
        logger.addHandler(seen)
    try:
        with pytest.raises(BaseException) as raised:
            job()
    finally:
        for logger in loggers:
            logger.removeHandler(seen)
    error: BaseException | None = raised.value
    chain = []
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, KeyboardInterrupt) for e in chain), chain
    noisy = [r for r in seen.records if r.levelno >= logging.WARNING]
    assert any(r.exc_info for r in noisy), [r.getMessage() for r in noisy]  # the traceback CI saw
    keep = UserErrorFilter()
    assert [r.getMessage() for r in noisy if keep.filter(r)] == []


def test_a_restarted_party_s_lost_state_is_one_warning_line_not_an_error_and_traceback(
        prefect_harness) -> None:  # type: ignore[no-untyped-def]
    """A worker killed and restarted mid-job answers the next step with ``state_lost``: the
    task fails (Prefect logs an ERROR and the traceback), the flow resumes from checkpoints
    and logs one WARNING saying so, as ``flows.coordinator.train_with_recoveries`` does. Only
    that warning passes the console's filter; a fault that is not a lost state still shows."""
    from prefect import flow, get_run_logger, task

    from flows.errors import PartyError
    from messages.bodies import ErrorReply

    @task(name="build_histograms", task_run_name="build-histograms-t3-d0")
    def step(lost: bool) -> int:
        raise PartyError(ErrorReply("host", "build_histograms/t3/d0",
                                    "no state for job j (restarted?)" if lost else "KeyError: 7",
                                    user_error=False, state_lost=lost))

    @flow
    def job(lost: bool) -> str:
        try:
            step(lost)
        except PartyError as exc:
            get_run_logger().warning("%s; resuming from the parties' checkpoints", exc)
        return "done"

    seen = _Records()
    loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    for logger in loggers:
        logger.addHandler(seen)
    try:
        assert job(True) == "done"
        job(False)
    finally:
        for logger in loggers:
            logger.removeHandler(seen)
    keep = UserErrorFilter()
    shown = [r for r in seen.records if r.levelno >= logging.WARNING and keep.filter(r)]
    lost_lines = [r for r in shown if "restarted?" in r.getMessage()
                  or (r.exc_info and "restarted?" in str(r.exc_info[1]))]
    assert [(r.levelname, r.exc_info is None) for r in lost_lines] == [("WARNING", True)], \
        [(r.levelname, r.getMessage()) for r in lost_lines]
    assert "resuming from the parties' checkpoints" in lost_lines[0].getMessage()
    assert any(r.levelno >= logging.ERROR and r.exc_info and "KeyError: 7" in
               str(r.exc_info[1]) for r in shown)  # a real fault keeps its traceback
