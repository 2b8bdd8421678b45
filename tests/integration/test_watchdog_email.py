"""Alerts by e-mail through ``smtplib`` to a real SMTP conversation on a local socket.

aiosmtpd is not in the environment, so the server is a small line-based SMTP server in a thread
(EHLO/HELO, MAIL, RCPT, DATA, QUIT); it can refuse recipients with 550 to test retries.
"""

from __future__ import annotations

import socket
import threading
from email import message_from_bytes
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.testing.clock import FakeClock
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import Watchdog
from onceflow.watchdog.schema import ensure_schema, heartbeats

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

T0 = 1_800_000_000.0


class TinySMTP:
    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.refuse = False
        self.messages: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb") as f:
                self._session(f)

    def _session(self, f: Any) -> None:
        def say(line: str) -> None:
            f.write(line.encode() + b"\r\n")
            f.flush()

        say("220 tiny ESMTP")
        while True:
            line = f.readline()
            if not line:
                return
            verb = line.decode().strip().split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                say("250 tiny")
            elif verb == "MAIL":
                say("250 ok")
            elif verb == "RCPT":
                say("550 mailbox unavailable" if self.refuse else "250 ok")
            elif verb == "DATA":
                say("354 go ahead")
                data = b""
                while (chunk := f.readline()) not in (b".\r\n", b""):
                    data += chunk
                self.messages.append(data)
                say("250 queued")
            elif verb == "QUIT":
                say("221 bye")
                return
            else:
                say("250 ok")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def smtp() -> Iterator[TinySMTP]:
    server = TinySMTP()
    yield server
    server.close()


def test_a_down_alert_is_mailed_once_after_a_refused_attempt(tmp_path: Path, smtp: TinySMTP) -> None:
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = sa.create_engine(ledger)
    ensure_schema(engine, [heartbeats])
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id="r1", dag_id="heartbeat", scheduled_at=T0, started_at=T0, lag_seconds=0.0, try_number=1
            )
        )
    config = parse_config(
        {
            "ledger_url": ledger,
            "state_dir": str(tmp_path / "state"),
            "alerts": {
                "smtp_url": f"smtp://127.0.0.1:{smtp.port}",
                "email_to": ["oncall@example.com"],
                "backoff_seconds": 1,
            },
            "checks": {"heartbeat": {"period_seconds": 60, "grace_seconds": 60}},
        }
    )
    clock = FakeClock(T0 + 300)
    wd = Watchdog(config, clock=clock.now)
    smtp.refuse = True
    wd.run_once()
    assert smtp.messages == []
    smtp.refuse = False
    clock.advance(5)
    wd.run_once()
    clock.advance(5)
    wd.run_once()
    [raw] = smtp.messages
    mail = message_from_bytes(raw)
    assert mail["Subject"] == "[onceflow watchdog] heartbeat DOWN (incident 1)"
    assert mail["To"] == "oncall@example.com"
    assert mail["Message-ID"] == "<heartbeat.1.down.email@onceflow-watchdog>"
    assert "docs/watchdog.md#check-heartbeat" in mail.get_payload()
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT state, attempts, last_error FROM watchdog_alerts")).one()
    assert (row.state, row.attempts) == ("sent", 2)
    assert "550" in row.last_error
    engine.dispose()
