"""Prefect settings that must be in place before Prefect is imported."""

import os


def configure() -> None:
    """Defaults for a quiet, offline ephemeral Prefect on a small machine (user values win)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the ephemeral server takes 10-15 s to start on 2 cores; Prefect's default is 20 s
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LOG_PRINTS", "false")
    # the client's telemetry too (its first-run notice would print over the progress bar)
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # the ephemeral server (a subprocess writing to our console) printed a traceback per
    # unflushed event when it was stopped after a run: ~150 lines after a horizontal run's
    # success line; a run's own failures reach the user through the client, not these lines
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
