"""Prefect's ephemeral server, started in a session of its own.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server (uvicorn) in a subprocess of
the command. In the terminal's process group it received Ctrl-C with the command and died
first; the command's Prefect client then spent two to three minutes failing to record the
crash ("Error logging to API") before ``fedboost train`` could print its resume line. In a
session of its own the server stays up until the command stops it at exit, as Prefect does.
A command killed with SIGKILL cannot stop it: the command's guardian does
(``workers.lifeline.guard_descendants``), as it stops every process the command started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any


def isolate_ephemeral_server() -> None:
    """Make the ephemeral server Prefect will start (if it starts one) a session leader; a
    no-op with ``PREFECT_API_URL`` set or once a server was made."""
    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value() or None in prefect_server.SubprocessASGIServer._instances:
        return
    # registered as Prefect's instance for port None: SubprocessASGIServer() returns it
    _isolated_server_class()()


def _isolated_server_class() -> type:
    from prefect.server.api import server as prefect_server
    from prefect.settings import get_current_settings

    class IsolatedServer(prefect_server.SubprocessASGIServer):
        """Prefect 3.8's ``_run_uvicorn_command``, with ``start_new_session``."""

        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            import prefect

            server_env = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                          "PREFECT__SERVER_FINAL": "1"}
            return subprocess.Popen(
                args=[sys.executable, "-m", "uvicorn", "--app-dir",
                      str(prefect.__module_path__.parent), "--factory",
                      "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                      "--port", str(self.port), "--log-level", "error", "--lifespan", "on"],
                env={**os.environ, **server_env,
                     **get_current_settings().to_environment_variables(exclude_unset=True)},
                start_new_session=True)

    return IsolatedServer

