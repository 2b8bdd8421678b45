"""The api-server's health check as its own incident: down (a closed port), an answer that is
not the health object (a proxy's JSON list), then healthy again: one down alert, one recovery,
and no blindness incident (the check was evaluated each time). Real HTTP servers on 127.0.0.1;
alerts read back from the receiver's store."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from onceflow.testing.alert_receiver import AlertReceiver, read_records
from onceflow.testing.clock import FakeClock
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import Watchdog

if TYPE_CHECKING:
    from pathlib import Path

T0 = 1_800_000_000.0


def test_api_server_down_then_unreadable_then_back(tmp_path: Path) -> None:
    answer: dict[str, Any] = {"body": ["not", "health"]}

    class Health(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            data = json.dumps(answer["body"]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    port = server.server_address[1]
    server.server_close()  # closed for now: the api-server is down
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    try:
        config = parse_config(
            {
                "ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}",
                "state_dir": str(tmp_path / "state"),
                "alerts": {"webhook_url": receiver.webhook_url},
                "checks": {
                    "api_health": {
                        "url": f"http://127.0.0.1:{port}/api/v2/monitor/health",
                        "period_seconds": 30,
                        "grace_seconds": 60,
                    }
                },
            }
        )
        clock = FakeClock(T0)
        wd = Watchdog(config, clock=clock.now)
        first = wd.run_once()
        assert (first.states, first.blind) == ({"api_health": "late"}, {})
        clock.advance(61)
        assert wd.run_once().states == {"api_health": "down"}
        server = ThreadingHTTPServer(("127.0.0.1", port), Health)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        clock.advance(30)
        unreadable = wd.run_once()
        assert (unreadable.states, unreadable.blind) == ({"api_health": "down"}, {})
        answer["body"] = {"metadatabase": {"status": "healthy"}, "scheduler": {"status": "healthy"}}
        clock.advance(30)
        assert wd.run_once().states == {"api_health": "up"}
        server.shutdown()
        server.server_close()
        sent = [r["message"]["onceflow"] for r in read_records(receiver.store) if r["kind"] == "webhook"]
        assert [(m["check"], m["kind"], m["incident"]) for m in sent] == [
            ("api_health", "down", 1),
            ("api_health", "recovery", 1),
        ]
    finally:
        receiver.stop()
