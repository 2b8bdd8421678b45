"""Issue 26 item 9 under ``make run --executor celery``: a Celery worker's log server, started by
``airflow celery worker`` itself, listens on 127.0.0.1 like the scheduler's and triggerer's.

A real ``airflow celery worker`` on the local Redis, with the ``airflow_local_settings.py`` that
``onceflow up`` writes into each worker's own home; the listener is read from the kernel (``ss``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from onceflow import local_run
from onceflow.testing.ports import free_port

pytestmark = [pytest.mark.real_airflow, pytest.mark.slow]


def _listeners(pid_root: int) -> list[str]:
    """``ss`` lines of listening TCP sockets owned by ``pid_root``'s process group."""
    pids = {
        int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(int(p.name)) == pid_root
    }
    listing = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if any(f"pid={p}," in line for p in pids)]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_celery_workers_log_server_listens_on_loopback(tmp_path: Path, onceflow_airflow_db: Any) -> None:
    home = tmp_path / "worker-home"
    local_run._write_local_settings_into(home)  # what onceflow up writes into each worker's home
    port = free_port()
    env = {
        **os.environ,
        **onceflow_airflow_db.variables,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": "redis://127.0.0.1:6379/0",
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__GLOBAL_KEYPREFIX": f"onceflow-logtest-{port}:",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(port),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(tmp_path / "logs"),
    }
    queue = f"onceflow-logtest-{port}"
    with (tmp_path / "worker.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", "celery", "worker", "--queues", queue, "--concurrency", "1"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        found: list[str] = []
        while time.monotonic() < deadline and proc.poll() is None:
            found = [line for line in _listeners(proc.pid) if f":{port} " in line]
            if found:
                break
            time.sleep(1)
        assert found, (tmp_path / "worker.log").read_text()[-3000:]
        addresses = [line.split()[3] for line in _listeners(proc.pid)]
        assert all(a.startswith(("127.", "[::1]")) for a in addresses), addresses
        assert f"127.0.0.1:{port}" in addresses
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
