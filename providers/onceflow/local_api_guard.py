"""``make run``'s guard in front of the api-server: loopback Host names only, and the business timezone.

``make run`` runs Airflow in all-admins mode with no login, on 127.0.0.1. That alone does not keep a
web page out: a page on ``rebind.evil.example`` whose name is re-pointed at 127.0.0.1 (DNS
rebinding) is same-origin to itself and reaches the API as admin. Refusing every request whose
``Host`` is not one of the names the server was started on stops it (the browser sends the page's
name); refusing a state-changing request whose ``Origin`` is another site stops a cross-site form.

The UI's timezone is the browser's unless the user picks one (``localStorage["timezone"]``,
Airflow 3 has no server setting). ``daily_sales``'s days start at business midnight, so a picker in
UTC turns "Nov 28 to Nov 30" into two runs. For the local run the guard seeds that key with the
business timezone in the UI's HTML page when the browser has no choice stored yet; a choice the
user makes in the UI stays theirs.

Installed by ``OnceflowPriorityPlugin`` as a root middleware of every api-server that loads the
provider, it does nothing unless ``onceflow up`` set :data:`ALLOWED_HOSTS_ENV` or
:data:`UI_TIMEZONE_ENV`: a production api-server behind its own proxy and login is untouched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

#: Comma-separated ``host:port`` names the api-server answers to (``onceflow up`` sets it).
ALLOWED_HOSTS_ENV = "ONCEFLOW_API_ALLOWED_HOSTS"
#: The IANA timezone the UI starts in when the browser has none stored (``onceflow up`` sets it).
UI_TIMEZONE_ENV = "ONCEFLOW_UI_DEFAULT_TIMEZONE"
#: The UI's own localStorage key for the selected timezone (Airflow 3.3 UI).
UI_TIMEZONE_KEY = "timezone"

_UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def loopback_hosts(port: int) -> list[str]:
    """The ``Host`` values a browser or a worker on this machine sends to a server on ``port``."""
    return [f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"]


def timezone_script(timezone: str) -> str:
    """The inline script that stores ``timezone`` as the UI's choice unless one is stored."""
    key, value = json.dumps(UI_TIMEZONE_KEY), json.dumps(json.dumps(timezone))
    return (
        f"<script>try{{if(!localStorage.getItem({key}))localStorage.setItem({key},{value})}}"
        "catch(e){}</script>"
    )


class LocalRunGuard:
    """ASGI middleware: refuse foreign ``Host`` and cross-site ``Origin``; seed the UI timezone.

    :param app: the api-server's ASGI app.
    :param allowed_hosts: ``host:port`` names to accept; default :data:`ALLOWED_HOSTS_ENV`.
    :param ui_timezone: the UI's starting timezone; default :data:`UI_TIMEZONE_ENV`.
    """

    def __init__(
        self, app: ASGIApp, allowed_hosts: list[str] | None = None, ui_timezone: str | None = None
    ) -> None:
        self.app = app
        if allowed_hosts is None:
            allowed_hosts = [h for h in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if h.strip()]
        #: in the caller's order: the first is the name the refusal message suggests
        self.allowed_hosts = [h.strip().lower() for h in allowed_hosts]
        self.ui_timezone = ui_timezone if ui_timezone is not None else os.environ.get(UI_TIMEZONE_ENV)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.allowed_hosts:
            problem = self._refusal(scope, headers)
            if problem is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                else:
                    status = 421 if problem.startswith("Host") else 403
                    await send_response(
                        send, status, b"text/plain; charset=utf-8", f"onceflow: {problem}\n".encode()
                    )
                return
        wants_page = scope["type"] == "http" and scope.get("method") == "GET"
        if self.ui_timezone and wants_page and "text/html" in headers.get("accept", ""):
            await self._with_timezone(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> str | None:
        host = headers.get("host", "").lower()
        if host not in self.allowed_hosts:
            return (
                f"Host {host!r} is not this local Airflow's name; open it as "
                f"http://{self.allowed_hosts[0]}/ (DNS-rebinding guard of `make run`)"
            )
        origin = headers.get("origin")
        # "null" is a sandboxed frame or a file: page, never the UI
        if (
            scope.get("method") in _UNSAFE
            and origin
            and urlsplit(origin).netloc.lower() not in self.allowed_hosts
        ):
            return f"cross-site request from {origin!r} refused (`make run` accepts its own pages only)"
        return None

    async def _with_timezone(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Ask for an uncompressed body: the script goes into the HTML text.
        scope = dict(scope)
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"accept-encoding"]
        start: Message | None = None
        chunks: list[bytes] = []
        script = timezone_script(str(self.ui_timezone)).encode()

        async def wrapped(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
                if b"text/html" not in ctype:
                    start = None
                    await send(message)
                    wrapped.passthrough = True  # type: ignore[attr-defined]
                    return
                start = message
                return
            if getattr(wrapped, "passthrough", False) or start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            body = body.replace(b"<head>", b"<head>" + script, 1) if b"<head>" in body else script + body
            start_headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            start_headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": start_headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, wrapped)


async def send_response(send: Send, status: int, content_type: bytes, body: bytes) -> None:
    """Answer the request in the app's place with ``body`` whole: a guard's refusal."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
