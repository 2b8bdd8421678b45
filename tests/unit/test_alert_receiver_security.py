"""The local alert receiver refuses what a web page could send it (issue 30, item 5).

A page open in the developer's browser can POST to 127.0.0.1 (text/plain or a form, with an
Origin header) or reach it through DNS rebinding (a foreign Host). Before, it accepted a forged
RECOVERED alert and ``POST /control/down``, which made it refuse the watchdog's real alerts.
"""

from __future__ import annotations

import http.client
import json
from typing import TYPE_CHECKING

import pytest

from onceflow.testing.alert_receiver import AlertReceiver
from onceflow.watchdog.alerts import post_json

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

FORGED = json.dumps({"text": "RECOVERED", "onceflow": {"check": "heartbeat", "kind": "recovery"}})


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[AlertReceiver]:
    r = AlertReceiver(tmp_path / "received.jsonl").start()
    yield r
    r.stop()


def send(r: AlertReceiver, path: str, body: str, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=5)
    try:
        conn.request("POST", path, body=body.encode(), headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain"},  # a page's simple cross-origin POST (no preflight)
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "application/json", "Origin": "https://evil.example"},
        {"Content-Type": "application/json", "Host": "rebind.evil.example:8765"},
    ],
    ids=["text-plain", "form", "foreign-origin", "rebound-host"],
)
def test_a_forged_recovery_from_a_web_page_is_refused(
    receiver: AlertReceiver, headers: dict[str, str]
) -> None:
    assert send(receiver, "/webhook", FORGED, headers) in (403, 415)
    assert receiver.webhooks() == []


def test_control_needs_the_per_run_token_and_no_origin(receiver: AlertReceiver) -> None:
    assert send(receiver, "/control/down", "", {}) == 403
    assert send(receiver, "/control/down", "", {"X-Control-Token": "guess"}) == 403
    token = {"X-Control-Token": receiver.control_token}
    assert send(receiver, "/control/down", "", {**token, "Origin": "https://evil.example"}) == 403
    assert send(receiver, "/webhook", FORGED, {"Content-Type": "application/json"}) == 200  # still up
    assert send(receiver, "/control/down", "", token) == 200
    assert send(receiver, "/webhook", FORGED, {"Content-Type": "application/json"}) == 503
    assert send(receiver, "/control/up", "", token) == 200


def test_the_watchdogs_own_posts_are_accepted(receiver: AlertReceiver) -> None:
    assert post_json(receiver.webhook_url, {"text": "hello"}, 5.0, idempotency_key="k") == 200
    assert [m["text"] for m in receiver.webhooks()] == ["hello"]
