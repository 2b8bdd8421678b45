"""A local stand-in for Slack incoming webhooks and healthchecks.io pings, for tests and ``make run``.

``python -m onceflow.testing.alert_receiver --port 8765 --store alerts.jsonl`` (or
:class:`AlertReceiver` in a thread, or :class:`AlertReceiverProcess`: that command as a process a
test can kill and restart on its port) answers:

* ``POST /webhook``: a Slack-compatible message (``{"text": ...}``), recorded, 200 ``ok``;
* ``GET|POST /ping/<uuid>``, ``/ping/<uuid>/start``, ``/ping/<uuid>/fail`` (``?rid=<run id>``):
  a healthchecks.io ping, recorded;
* ``GET /messages``: every record as a JSON list (``kind`` = ``webhook`` or ``ping``);
* ``POST /control/down`` and ``/control/up`` with header ``X-Control-Token: <token>``: while
  down, webhooks and pings get 503 and are recorded as ``refused`` (to test delivery retries
  without killing the process); ``POST /control/delay?seconds=0.9`` (same header) answers each
  later webhook that late (a slow Slack; 0 ends it). The token is made per run (or ``--control-token``), printed on the
  first line and written to ``<store>.control-token`` (mode 0600).

It listens on 127.0.0.1 only, and refuses what a web page open in the developer's browser could
send (issue 30): any request whose ``Host`` is not ``127.0.0.1``/``localhost`` (DNS rebinding),
any write carrying an ``Origin`` header (browsers add it to cross-origin requests; the watchdog and
curl do not), and a webhook whose ``Content-Type`` is not ``application/json`` (the only bodies a
page can post without a preflight are form and text types): 403 or 415, recorded as ``refused``.

Records are appended to the JSONL ``store`` (one per line, flushed each time), so a restarted
receiver keeps its history and a test can read the file directly.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import secrets
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit
from urllib.request import Request, urlopen

if TYPE_CHECKING:
    from collections.abc import Callable


def read_records(store: str | Path) -> list[dict[str, Any]]:
    """The records in a receiver's store file (independent of any running receiver)."""
    path = Path(store)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _foreign(self, write: bool) -> bool:
        """Refuse a request a web page could have made (see the module docstring)."""
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
        reason = None
        if host not in ("127.0.0.1", "localhost", "::1"):
            reason = "foreign Host"
        elif write and self.headers.get("Origin") is not None:
            reason = "cross-origin write"
        if reason is None:
            return False
        self.server.record({"kind": "refused", "refused": True, "reason": reason, "path": self.path})
        self._reply(403, reason)
        return True

    def do_GET(self) -> None:
        if self._foreign(write=False):
            return
        path = urlsplit(self.path).path
        if path == "/messages":
            self._reply(200, read_records(self.server.store))
        elif path.startswith("/ping/"):
            self._ping(b"")
        else:
            self._reply(404, "not found")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        arrived_at = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(length, 1 << 20)) if length else b""
        if self._foreign(write=True):
            return
        path = urlsplit(self.path).path
        if path in ("/control/down", "/control/up", "/control/delay"):
            given = self.headers.get("X-Control-Token") or ""
            if not hmac.compare_digest(given.encode(), self.server.control_token.encode()):
                self._reply(403, "control needs X-Control-Token")
                return
            if path == "/control/delay":
                try:
                    delay = float(parse_qs(urlsplit(self.path).query)["seconds"][0])
                except (KeyError, ValueError):
                    self._reply(400, "/control/delay?seconds=<float>")
                    return
                self.server.delay = max(0.0, min(delay, 60.0))
                self._reply(200, f"delay {self.server.delay}")
                return
            self.server.down = path == "/control/down"
            self._reply(200, "down" if self.server.down else "up")
        elif path == "/webhook":
            ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                self._reply(415, "Content-Type must be application/json")
                return
            try:
                message = json.loads(body or b"null")
            except ValueError:
                self._reply(400, "invalid JSON")
                return
            if not isinstance(message, dict) or not isinstance(message.get("text"), str):
                self._reply(400, "missing text")  # what Slack answers too ("no_text")
                return
            if self._refused("webhook"):
                return
            self.server.before_accept(self)
            self.server.record(
                {
                    "kind": "webhook",
                    "message": message,
                    "idempotency_key": self.headers.get("Idempotency-Key"),
                    # When the request was read (received_at is after any delay): how long a
                    # sender waited for this acceptance.
                    "arrived_at": arrived_at,
                }
            )
            self._reply(200, "ok")
        elif path.startswith("/ping/"):
            self._ping(body)
        else:
            self._reply(404, "not found")

    def _refused(self, kind: str) -> bool:
        if self.server.down:
            self.server.record({"kind": kind, "refused": True, "path": self.path})
            self._reply(503, "receiver is down")
            return True
        return False

    def _ping(self, body: bytes) -> None:
        if self._refused("ping"):
            return
        parts = urlsplit(self.path)
        segments = parts.path.split("/")[2:]  # /ping/<uuid>[/start|/fail]
        uuid = segments[0] if segments else ""
        signal = segments[1] if len(segments) > 1 else "success"
        rid = parse_qs(parts.query).get("rid", [None])[0]
        self.server.record(
            {
                "kind": "ping",
                "uuid": uuid,
                "signal": signal,
                "rid": rid,
                "body": body.decode(errors="replace")[:1000],
            }
        )
        self._reply(200, "OK")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, store: Path, control_token: str) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.store = store
        self.control_token = control_token
        self.down = False
        self.delay = 0.0
        self.on_accept: Callable[[dict[str, str]], None] | None = None
        self._lock = threading.Lock()

    def before_accept(self, handler: _Handler) -> None:
        """A slow receiver (``delay``) and a test's hook, run before a webhook is recorded."""
        if self.delay:
            time.sleep(self.delay)
        if self.on_accept is not None:
            self.on_accept(dict(handler.headers.items()))

    def record(self, record: dict[str, Any]) -> None:
        record = {"received_at": time.time(), **record}
        with self._lock, self.store.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()


class _Recorded:
    store: Path

    def records(self) -> list[dict[str, Any]]:
        """Every record in the store, refused ones included."""
        return read_records(self.store)

    def webhooks(self) -> list[dict[str, Any]]:
        """The accepted webhook messages, in order."""
        return [r["message"] for r in self.records() if r["kind"] == "webhook" and not r.get("refused")]


class AlertReceiver(_Recorded):
    """The receiver in a thread of this process: ``.url``, ``.webhook_url``, ``.ping_url(uuid)``."""

    def __init__(self, store: str | Path, port: int = 0, control_token: str | None = None) -> None:
        self.store = Path(store)
        self.store.parent.mkdir(parents=True, exist_ok=True)
        self.control_token = control_token or secrets.token_urlsafe(16)
        self._server = _Server(port, self.store, self.control_token)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.webhook_url = f"{self.url}/webhook"
        # A short poll: stop() waits for the loop's next poll, and fault schedules stop many receivers.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    def ping_url(self, uuid: str) -> str:
        return f"{self.url}/ping/{uuid}"

    def start(self) -> AlertReceiver:
        self._thread.start()
        return self

    def set_down(self, down: bool) -> None:
        self._server.down = down

    def set_delay(self, seconds: float) -> None:
        """Answer each webhook ``seconds`` late (a slow Slack)."""
        self._server.delay = seconds

    def on_accept(self, hook: Callable[[dict[str, str]], None] | None) -> None:
        """Call ``hook(headers)`` in the handler thread before each webhook is accepted (tests)."""
        self._server.on_accept = hook

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class AlertReceiverProcess(_Recorded):
    """``python -m onceflow.testing.alert_receiver`` as a process: killed (connection refused) and
    started again on the same port and store, or driven through ``/control``.

    :param control_token: passed on the command line; by default the process makes its own and
        :meth:`control` reads it from ``<store>.control-token``, as a developer would.
    """

    def __init__(self, store: str | Path, port: int | None = None, control_token: str | None = None) -> None:
        from onceflow.testing.ports import free_port

        self.store = Path(store)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.webhook_url = f"{self.url}/webhook"
        self.control_token = control_token
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AlertReceiverProcess:
        """Start it and return once it listens (its first line is printed after the bind)."""
        token = ["--control-token", self.control_token] if self.control_token else []
        command = [
            sys.executable,
            "-m",
            "onceflow.testing.alert_receiver",
            "--port",
            str(self.port),
            "--store",
            str(self.store),
            *token,
        ]
        with Path(f"{self.store}.log").open("ab") as log:  # a crash's traceback, across restarts
            self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.proc.stdout.close()
        if b"alert receiver on" not in line:
            self.kill()
            raise RuntimeError(f"the alert receiver did not start: {line!r} (see {self.store}.log)")
        return self

    def kill(self) -> None:
        """SIGKILL: whatever it was answering is cut off; its store keeps what it recorded."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: hung. The kernel still accepts connections and takes requests in; nothing
        answers them until :meth:`resume`, which answers every one queued meanwhile."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def control(self, path: str) -> None:
        """``POST /control/<path>`` (``down``, ``up``, ``delay?seconds=0.9``) with the token."""
        token = self.control_token or Path(f"{self.store}.control-token").read_text()
        request = Request(f"{self.url}/control/{path}", data=b"", headers={"X-Control-Token": token})
        with urlopen(request, timeout=10) as response:
            response.read()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--control-token", default=None, help="default: a new random one")
    args = parser.parse_args(argv)
    receiver = AlertReceiver(args.store, args.port, control_token=args.control_token)
    token_file = Path(f"{receiver.store}.control-token")
    token_file.touch(mode=0o600)
    token_file.write_text(receiver.control_token)
    print(
        f"alert receiver on {receiver.url} (webhook {receiver.webhook_url}), store {receiver.store}, "
        f"control token in {token_file}",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        receiver._server.serve_forever()


if __name__ == "__main__":
    main()
