"""``make run``: the log servers of the scheduler, the triggerer and the Celery workers listen on 127.0.0.1.

Airflow 3.3's ``serve_logs`` binds ``host=""`` (all interfaces) with no setting to change it, and
``airflow standalone`` offers no ``--skip-serve-logs``. On one machine nothing needs them from
outside: the api-server reads the task logs from the local files. ``onceflow up`` writes an
``airflow_local_settings.py`` into its AIRFLOW_HOME (Airflow imports it in every process before a
component starts) that calls :func:`bind_log_servers_to_loopback`, which replaces the function the
scheduler, triggerer and ``celery worker`` commands import (``airflow.utils.serve_logs.serve_logs``)
with one that serves the same app on 127.0.0.1. Under ``--executor celery`` each worker has a home
of its own (a host of its own), so the file is written into each worker's ``config`` folder too. Nothing changes outside ``onceflow up``: a deployment whose
api-server fetches logs from worker hosts keeps Airflow's own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

_HEADER = '"""Written by `onceflow up` (onceflow.loopback_logs): log servers on 127.0.0.1 only."""\n'
_LINES = "from onceflow.loopback_logs import bind_log_servers_to_loopback\n\nbind_log_servers_to_loopback()\n"
#: What ``onceflow up`` writes to ``$AIRFLOW_HOME/config/airflow_local_settings.py``.
LOCAL_SETTINGS = _HEADER + _LINES
HOST = "127.0.0.1"
_CALL = "bind_log_servers_to_loopback()"


def write_local_settings(airflow_home: Path) -> Path:
    """Make ``$AIRFLOW_HOME/config/airflow_local_settings.py`` bind the log servers to loopback.

    A file that is already there (a benchmark's preload, a user's policies) keeps its content and
    gets the two lines appended, once; otherwise :data:`LOCAL_SETTINGS` is written. Returns the file.
    """
    from onceflow.local_settings import add_once

    return add_once(airflow_home, _LINES, marker=_CALL, header=_HEADER)


#: The commands that start a log server: ``airflow scheduler``, ``airflow triggerer`` and
#: ``airflow celery worker`` (its ``_serve_logs`` imports ``serve_logs`` when the worker starts and
#: runs it in a child process, fork or spawn alike, so the replaced function is the one it runs).
SERVING_COMMANDS = frozenset({("scheduler",), ("triggerer",), ("celery", "worker")})


def serves_logs(argv: list[str]) -> bool:
    """Whether the ``airflow`` command line ``argv`` starts a log server."""
    return any(tuple(argv[1 : 1 + len(c)]) == c for c in SERVING_COMMANDS)


def bind_log_servers_to_loopback(argv: list[str] | None = None) -> None:
    """Make ``airflow.utils.serve_logs.serve_logs`` serve on :data:`HOST` in a serving command.

    Other processes (every task is one) skip the import of the log server's web stack.
    """
    argv = sys.argv if argv is None else argv
    if not serves_logs(argv):
        return
    try:
        import airflow.utils.serve_logs as package
    except ImportError:  # a process without Airflow's core (nothing serves logs there)
        return
    package.serve_logs = serve_logs_on_loopback


def serve_logs_on_loopback(port: int | None = None) -> None:
    """Airflow's ``serve_logs`` (same app, port and logging settings) bound to :data:`HOST`."""
    import structlog
    import uvicorn
    from airflow.configuration import conf

    if sys.platform != "darwin":
        from setproctitle import setproctitle

        setproctitle("airflow serve-logs")
    port = port or conf.getint("logging", "WORKER_LOG_SERVER_PORT")
    structlog.get_logger(__name__).info("Starting log server on http://%s:%s", HOST, port)
    options: dict[str, Any] = {
        "log_level": conf.get("logging", "uvicorn_logging_level", fallback="info").lower(),
        "log_config": None,
        "access_log": False,
    }
    uvicorn.run("airflow.utils.serve_logs.log_server:get_app", host=HOST, port=port, **options)
