"""A webhook or ping endpoint that drips its answer (a header line every half second, each read
well inside the socket timeout) is given up at the total timeout, not waited for: otherwise it
holds the heartbeat task, or the watchdog's pass past its alert lease (another replica resends).
The endpoint is a real socket on 127.0.0.1; it does finish with 200 after ~20 s, so without a
total deadline the call would succeed, and the assertions are on the outcome, not on time."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest

from onceflow.watchdog.alerts import DeliveryError, ping, post_json
from onceflow.watchdog.checks import api_health
from onceflow.watchdog.config import CheckConfig
from onceflow.watchdog.incidents import FAILING

if TYPE_CHECKING:
    from collections.abc import Iterator

DRIPS = 40


@pytest.fixture
def dripping_url() -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except OSError:
                continue
            with client:
                client.recv(65536)
                try:
                    client.sendall(b"HTTP/1.1 200 OK\r\n")
                    for i in range(DRIPS):
                        if stop.is_set():
                            return
                        time.sleep(0.5)
                        client.sendall(f"X-Drip-{i}: x\r\n".encode())
                    client.sendall(b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")  # healthy JSON
                except OSError:
                    continue  # the caller gave up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/ping/x"
    stop.set()
    thread.join(10)
    server.close()


def test_a_dripping_ping_endpoint_is_given_up_at_the_total_timeout(dripping_url: str) -> None:
    assert ping(dripping_url, timeout=2.0) is False


def test_a_dripping_webhook_is_a_failed_delivery(dripping_url: str) -> None:
    with pytest.raises(DeliveryError, match="no complete answer within 2 s"):
        post_json(dripping_url, {"text": "x"}, 2.0, idempotency_key="k")


def test_a_dripping_api_server_is_failing_not_healthy_late(dripping_url: str) -> None:
    check = CheckConfig(
        "api_health", "api_health", 30, 60, "rb", options={"url": dripping_url, "timeout": 2.0}
    )
    verdict = api_health(check, 0.0)
    assert verdict.state == FAILING and "no complete answer within 2 s" in verdict.reason
