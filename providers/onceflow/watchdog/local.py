"""Start the watchdog (and the local alert receiver) beside a local Airflow, for ``make run``.

::

    receiver = start_receiver(home, port)                 # messages in <home>/onceflow/alerts.jsonl
    watchdog = start_beside(home, ledger_url, port)       # log in <home>/onceflow/watchdog.log

Both are processes in their own session; stop them with ``proc.terminate()``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEMO_CONFIG = """\
# onceflow-watchdog demo configuration (written by onceflow.watchdog.local); see docs/watchdog.md
ledger_url = "{ledger_url}"
state_dir = "{state_dir}"
loop_seconds = 15
runbook_base = "docs/watchdog.md"

[alerts]
webhook_url = "http://127.0.0.1:{port}/webhook"
reminder_seconds = 1800

[checks.heartbeat]
period_seconds = 60
grace_seconds = 120
max_lag_seconds = 30

[checks.article_queue]
period_seconds = 60
grace_seconds = 600
max_age_seconds = 3600
"""


def demo_config(airflow_home: str | Path, ledger_url: str, receiver_port: int) -> Path:
    """Write the demo config to ``<airflow_home>/onceflow/watchdog.toml`` and return its path."""
    base = Path(airflow_home) / "onceflow"
    base.mkdir(parents=True, exist_ok=True)
    path = base / "watchdog.toml"
    path.write_text(
        DEMO_CONFIG.format(ledger_url=ledger_url, state_dir=base / "watchdog-state", port=receiver_port)
    )
    return path


def start_receiver(airflow_home: str | Path, receiver_port: int) -> subprocess.Popen[bytes]:
    """The local webhook receiver; it records to ``<airflow_home>/onceflow/alerts.jsonl``."""
    base = Path(airflow_home) / "onceflow"
    base.mkdir(parents=True, exist_ok=True)
    with (base / "alert-receiver.log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onceflow.testing.alert_receiver",
                "--port",
                str(receiver_port),
                "--store",
                str(base / "alerts.jsonl"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def start_beside(airflow_home: str | Path, ledger_url: str, receiver_port: int) -> subprocess.Popen[bytes]:
    """Run ``onceflow-watchdog`` in a loop on the demo config; its log is ``<home>/onceflow/watchdog.log``."""
    config = demo_config(airflow_home, ledger_url, receiver_port)
    with (config.parent / "watchdog.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "onceflow.watchdog", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
