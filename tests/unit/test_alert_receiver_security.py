"""The local alert receiver refuses what a web page could send it (issue 30, item 5).

A page open in the developer's browser can POST to 127.0.0.1 (text/plain or a form, with an
Origin header) or reach it through DNS rebinding (a foreign Host). Before, it accepted a forged
RECOVERED alert and ``POST /control/down``, which made it refuse the watchdog's real alerts.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from onceflow.testing.alert_receiver import AlertReceiver, AlertReceiverProcess
from onceflow.watchdog.alerts import DeliveryError, post_json

if TYPE_CHECKING:
    from collections.abc import Iterator

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


def test_the_receiver_process_is_controlled_through_its_token_file_and_keeps_its_store(
    tmp_path: Path,
) -> None:
    # No token given: the process makes one, readable by this user only, and control() reads it.
    r = AlertReceiverProcess(tmp_path / "received.jsonl").start()
    try:
        token_file = tmp_path / "received.jsonl.control-token"
        assert token_file.stat().st_mode & 0o077 == 0
        r.control("down")
        with pytest.raises(DeliveryError, match="503"):
            post_json(r.webhook_url, {"text": "refused"}, 5.0)
        r.control("up")
        assert post_json(r.webhook_url, {"text": "before"}, 5.0) == 200
        r.kill()
        with pytest.raises(DeliveryError, match="unreachable"):
            post_json(r.webhook_url, {"text": "nobody"}, 5.0)
        r.start()  # the same port and store
        assert post_json(r.webhook_url, {"text": "after"}, 5.0) == 200
        assert [m["text"] for m in r.webhooks()] == ["before", "after"]
    finally:
        r.kill()
