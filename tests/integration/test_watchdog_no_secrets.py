"""A watchdog run seeded with marker secrets leaves none in its logs, ledger tables or alerts
(issue 30, item 1): the webhook's token, the self-heartbeat's ping UUID, the SMTP password."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING

import sqlalchemy as sa

from onceflow.testing.alert_receiver import AlertReceiver
from onceflow.watchdog.schema import ensure_schema, heartbeats

if TYPE_CHECKING:
    from pathlib import Path

MARKERS = ("XOXB-MARKER-TOKEN", "HC-MARKER-UUID-77", "SMTP-MARKER-PW")


def test_no_marker_secret_in_logs_ledger_rows_or_alerts(tmp_path: Path) -> None:
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = sa.create_engine(ledger)
    ensure_schema(engine, [heartbeats])
    old = time.time() - 3600
    with engine.begin() as conn:  # a beat an hour old: the check is down at the first pass
        conn.execute(
            heartbeats.insert().values(
                run_id="r1",
                dag_id="heartbeat",
                scheduled_at=old,
                started_at=old,
                lag_seconds=0.0,
                try_number=1,
            )
        )
    config = tmp_path / "watchdog.toml"
    config.write_text(
        f"""
ledger_url = "{ledger}"
state_dir = "{tmp_path / "state"}"
[self_heartbeat]
url = "{receiver.url}/nowhere/ping/{MARKERS[1]}"
[alerts]
webhook_url = "{receiver.url}/services/T000/B000/{MARKERS[0]}"
smtp_url = "smtp://alerts:{MARKERS[2]}@127.0.0.1:1"
email_to = ["oncall@example.com"]
backoff_seconds = 0
[checks.heartbeat]
period_seconds = 60
grace_seconds = 60
"""
    )
    try:
        logs = ""
        for _ in range(3):  # the webhook answers 404, SMTP refuses: errors recorded and logged
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "onceflow.watchdog",
                    "--config",
                    str(config),
                    "--once",
                    "--log-level",
                    "debug",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 1, proc.stderr[-2000:]
            logs += proc.stdout + proc.stderr
    finally:
        receiver.stop()
    assert "answered 404" in logs and "attempt" in logs  # failures happened and were logged
    rows = ""
    for url in (ledger, f"sqlite:///{tmp_path / 'state' / 'watchdog-local.db'}"):
        eng = sa.create_engine(url)
        with eng.connect() as conn:
            for table in sa.inspect(eng).get_table_names():
                rows += "\n".join(str(tuple(r)) for r in conn.execute(sa.text(f'SELECT * FROM "{table}"')))
        eng.dispose()
    assert "last_error" not in rows and "DeliveryError" in rows  # errors are in the ledger rows
    store = tmp_path / "received.jsonl"  # 404s are not recorded: the payloads are in the ledger rows
    received = store.read_text() if store.exists() else ""
    for marker in MARKERS:
        assert marker not in logs, marker
        assert marker not in rows, marker
        assert marker not in received, marker
