"""The HTTP side: route Sheets API v4 paths to handlers, one lock around apply + persist.

``ThreadingHTTPServer`` gives every connection its own thread, so concurrent clients really race;
the store's lock is what makes each request atomic. Control endpoints live under ``/_emulator/``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from onceflow.testing.sheets_emulator import batch, byfilter, handlers, htmlview, metadata, request_guard
from onceflow.testing.sheets_emulator.cells import Skip, parse_input, render
from onceflow.testing.sheets_emulator.errors import ApiError, invalid_argument, not_found
from onceflow.testing.sheets_emulator.faults import Fault, FaultInjector
from onceflow.testing.sheets_emulator.limits import METADATA_LIMIT
from onceflow.testing.sheets_emulator.model import Store
from onceflow.testing.sheets_emulator.quota import Quota
from onceflow.testing.sheets_emulator.requestlog import RequestEvent, RequestLog

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

log = logging.getLogger(__name__)

# method name -> (handler, counts as a write request for Google's quotas)
METHODS: dict[str, tuple[Callable[[Store, handlers.ApiRequest], dict[str, Any]], bool]] = {
    "spreadsheets.get": (handlers.spreadsheets_get, False),
    "spreadsheets.create": (handlers.spreadsheets_create, True),
    "spreadsheets.batchUpdate": (batch.spreadsheets_batch_update, True),
    "values.get": (handlers.values_get, False),
    "values.batchGet": (handlers.values_batch_get, False),
    "values.update": (handlers.values_update, True),
    "values.batchUpdate": (handlers.values_batch_update, True),
    "values.append": (handlers.values_append, True),
    "values.clear": (handlers.values_clear, True),
    "values.batchClear": (handlers.values_batch_clear, True),
    "values.batchGetByDataFilter": (byfilter.values_batch_get_by_data_filter, False),
    "values.batchUpdateByDataFilter": (byfilter.values_batch_update_by_data_filter, True),
    "developerMetadata.get": (metadata.developer_metadata_get, False),
    "developerMetadata.search": (metadata.developer_metadata_search, False),
}

_PREFIX = "/v4/spreadsheets"


def route(http_method: str, raw_path: str) -> tuple[str, str, str]:
    """Map an HTTP method and raw (still percent-encoded) path to (method, spreadsheet id, range).

    The range is split off before decoding, so ``%3A`` inside it never looks like ``:append``.

    :raises ApiError: 404 when no API method has that path.
    """
    if raw_path == _PREFIX and http_method == "POST":
        return "spreadsheets.create", "", ""
    if not raw_path.startswith(_PREFIX + "/"):
        raise not_found(f"The requested URL {raw_path} was not found on this server.")
    rest = raw_path[len(_PREFIX) + 1 :]
    cut = min((i for i in (rest.find("/"), rest.find(":")) if i >= 0), default=len(rest))
    sid, rest = unquote(rest[:cut]), rest[cut:]
    simple = {
        ("GET", ""): "spreadsheets.get",
        ("POST", ":batchUpdate"): "spreadsheets.batchUpdate",
        ("GET", "/values:batchGet"): "values.batchGet",
        ("POST", "/values:batchUpdate"): "values.batchUpdate",
        ("POST", "/values:batchClear"): "values.batchClear",
        ("POST", "/values:batchGetByDataFilter"): "values.batchGetByDataFilter",
        ("POST", "/values:batchUpdateByDataFilter"): "values.batchUpdateByDataFilter",
        ("POST", "/developerMetadata:search"): "developerMetadata.search",
    }
    if (http_method, rest) in simple:
        return simple[(http_method, rest)], sid, ""
    if http_method == "GET" and rest.startswith("/developerMetadata/"):
        # the metadata id travels in the range slot of the request
        return "developerMetadata.get", sid, unquote(rest[len("/developerMetadata/") :])
    if rest.startswith("/values/") and len(rest) > len("/values/"):
        encoded = rest[len("/values/") :]
        if http_method == "POST":
            for verb in ("append", "clear"):
                if encoded.endswith(":" + verb):
                    return f"values.{verb}", sid, unquote(encoded[: -len(verb) - 1])
        if http_method == "GET":
            return "values.get", sid, unquote(encoded)
        if http_method == "PUT":
            return "values.update", sid, unquote(encoded)
    raise not_found(f"The requested URL {raw_path} was not found on this server.")


class SheetsEmulatorServer:
    """A Sheets API v4 emulator bound to ``host:port`` (port 0 picks a free one).

    :param host: interface to listen on; keep it 127.0.0.1.
    :param port: TCP port, 0 for any free port.
    :param state: JSON state file; state is loaded from it and written after every write request.
    :param verbose: log every request to stderr.
    :param metadata_limit: developer metadata cap in characters per spreadsheet and per sheet,
        Google's 30,000 by default; ``None`` turns it off.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        state: str | Path | None = None,
        verbose: bool = False,
        metadata_limit: int | None = METADATA_LIMIT,
    ) -> None:
        self.store = Store(state, metadata_limit=metadata_limit)
        self.faults = FaultInjector()
        self.request_log = RequestLog()
        self.quota: Quota | None = None
        self.verbose = verbose
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._httpd = _HTTPServer((host, port), _make_handler(self))
        self._thread: threading.Thread | None = None
        self._serving = False
        self._stopped = False

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def endpoint(self) -> str:
        """Base URL to pass as ``api_endpoint`` (``http://127.0.0.1:PORT/``)."""
        return f"http://{self.host}:{self.port}/"

    def start(self) -> SheetsEmulatorServer:
        """Serve in a daemon thread and return self."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name=f"sheets-emulator-{self.port}", daemon=True
        )
        self._serving = True
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until :meth:`stop` is called from another one."""
        self._serving = True
        self._httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving and drop open keep-alive connections, so clients cannot reach old state."""
        if self._stopped:
            return
        self._stopped = True
        if self._serving:
            self._httpd.shutdown()
        self._httpd.server_close()
        with self._connections_lock:
            for conn in list(self._connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> SheetsEmulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- request handling (called from the HTTP handler threads) -------------------------------

    def handle_api(self, request: handlers.ApiRequest) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Apply one API request: count it, inject faults, then apply + persist under the lock.

        Its arrival time, status and ``Retry-After`` go to the request log's ``timeline``.
        """
        arrived = time.monotonic()
        status: int = 500
        headers: dict[str, str] = {}
        try:
            status, reply, headers = self._handle_api(request)
            return status, reply, headers
        except ApiError as exc:
            status, headers = exc.code, exc.headers
            raise
        except DropConnection:
            status = 0  # no response at all
            raise
        finally:
            self.request_log.record_reply(
                RequestEvent(arrived, request.method, status, headers.get("Retry-After"))
            )

    def _handle_api(self, request: handlers.ApiRequest) -> tuple[int, dict[str, Any], dict[str, str]]:
        handler, writes = METHODS[request.method]
        self.request_log.record(request.method, writes=writes)
        quota = self.quota
        wait = quota.admit(writes) if quota is not None else None
        if wait is not None:
            self.request_log.record_fault("quota")
            return 429, _quota_error(writes), {"Retry-After": Quota.header(wait)}
        decision = self.faults.decide(request.method)
        if decision.latency > 0:
            time.sleep(decision.latency)
        failure = decision.failure
        if failure is not None and failure.kind == "429":
            self.request_log.record_fault("429")
            header = failure.retry_after_header
            return 429, _quota_error(writes), {} if header is None else {"Retry-After": header}
        if failure is not None and failure.kind == "500":
            self.request_log.record_fault("500")
            return 500, _internal_error(), {}
        with self.store.lock:
            reply = handler(self.store, request)
            if failure is not None and failure.after_apply is not None:
                failure.after_apply(self.store)  # lands between this copy and its resend
            if writes:
                self.store.save(request.spreadsheet_id or reply.get("spreadsheetId"))
        if failure is not None:  # the write has landed and been persisted
            self.request_log.record_fault(failure.kind)
            if failure.kind == "apply_then_drop":
                raise DropConnection(request.method)
            return 500, _internal_error(), {}
        return 200, reply, {}

    def handle_control(self, http_method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        """The ``/_emulator/`` endpoints: request log, faults, seeding and raw reads."""
        key = (http_method, path)
        if key == ("GET", "/_emulator/health"):
            return {"ok": True}
        if key == ("GET", "/_emulator/requests"):
            return self.request_log.snapshot()
        if key in (("DELETE", "/_emulator/requests"), ("POST", "/_emulator/requests/reset")):
            self.request_log.reset()
            return self.request_log.snapshot()
        if key == ("GET", "/_emulator/faults"):
            return {"faults": self.faults.rules()}
        if key == ("POST", "/_emulator/faults"):
            specs = body.get("faults", [body]) if isinstance(body, dict) else body
            try:
                for spec in specs:
                    self.faults.add(Fault.from_json(spec))
            except (TypeError, ValueError) as exc:
                raise invalid_argument(str(exc)) from None
            return {"faults": self.faults.rules()}
        if key == ("DELETE", "/_emulator/faults"):
            self.faults.clear()
            return {"faults": []}
        if key == ("GET", "/_emulator/limits"):
            return {"metadata_characters": self.store.metadata_limit}
        if key == ("POST", "/_emulator/limits"):
            value = (body or {}).get("metadata_characters", METADATA_LIMIT)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise invalid_argument("metadata_characters must be a non-negative integer or null")
            self.store.metadata_limit = value
            return {"metadata_characters": value}
        if key == ("GET", "/_emulator/quota"):
            return {"quota": self.quota.to_json() if self.quota else None}
        if key == ("POST", "/_emulator/quota"):
            try:
                self.quota = Quota.from_json(body or {})
            except (TypeError, ValueError) as exc:
                raise invalid_argument(str(exc)) from None
            return {"quota": self.quota.to_json()}
        if key == ("DELETE", "/_emulator/quota"):
            self.quota = None
            return {"quota": None}
        if key == ("POST", "/_emulator/spreadsheets"):
            return self.seed(body)
        if key == ("GET", "/_emulator/values"):
            sid = (query.get("spreadsheetId") or [""])[-1]
            rng = (query.get("range") or [""])[-1]
            return {"values": self.raw_values(sid, rng)}
        raise not_found(f"No emulator control endpoint {http_method} {path}")

    def seed(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Create a spreadsheet with data, without counting API requests.

        :param spec: ``{"title", "spreadsheetId"?, "sheets": {title: rows}, "valueInputOption"?}``;
            ``sheets`` keeps its order, the first is the default sheet of ranges without a title.
        """
        sheets: dict[str, list[list[Any]]] = spec.get("sheets") or {"Sheet1": []}
        option = spec.get("valueInputOption", "RAW")
        with self.store.lock:
            book = self.store.create(
                spec.get("title", "Untitled spreadsheet"), list(sheets), spec.get("spreadsheetId")
            )
            for sheet, rows in zip(book.sheets, sheets.values(), strict=True):
                width = max((len(r) for r in rows), default=0)
                sheet.grow(len(rows), width)
                for r, row in enumerate(rows):
                    for c, raw in enumerate(row):
                        value = parse_input(raw, option)
                        if value is not Skip:
                            sheet.set(r, c, value)  # type: ignore[arg-type]
            self.store.save(book.spreadsheet_id)
            return book.resource()

    def raw_values(self, spreadsheet_id: str, range_: str) -> list[list[Any]]:
        """Read cells straight from the state (formulas as text, trimmed), without counting a request."""
        with self.store.lock:
            bounds = self.store.get(spreadsheet_id).resolve(range_, for_write=True)
            return [[render(c, "FORMULA") for c in row] for row in bounds.sheet.block(bounds)]


class DropConnection(Exception):
    """Close the client's connection without any response (fault ``apply_then_drop``)."""


def _quota_error(writes: bool) -> dict[str, Any]:
    kind = "Write" if writes else "Read"
    return {
        "error": {
            "code": 429,
            "message": (
                f"Quota exceeded for quota metric '{kind} requests' and limit '{kind} requests per "
                "minute per user' of service 'sheets.googleapis.com' for consumer 'project_number:0'."
            ),
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "RATE_LIMIT_EXCEEDED",
                    "domain": "googleapis.com",
                    "metadata": {
                        "service": "sheets.googleapis.com",
                        "quota_limit": f"{kind}RequestsPerMinutePerUser",
                    },
                }
            ],
        }
    }


def _internal_error() -> dict[str, Any]:
    return {"error": {"code": 500, "message": "Internal error encountered.", "status": "INTERNAL"}}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def _make_handler(emulator: SheetsEmulatorServer) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "onceflow-sheets-emulator"

        def setup(self) -> None:
            super().setup()
            # Headers and body are two writes; without NODELAY, Nagle plus the client's delayed
            # ACK can add ~40 ms to every keep-alive request.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with emulator._connections_lock:
                emulator._connections.add(self.connection)

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                with emulator._connections_lock:
                    emulator._connections.discard(self.connection)

        def log_message(self, format: str, *args: Any) -> None:
            if emulator.verbose:
                sys.stderr.write(f"sheets-emulator: {format % args}\n")

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

        def _dispatch(self, http_method: str) -> None:
            split = urlsplit(self.path)
            query = parse_qs(split.query, keep_blank_values=True)
            has_body = int(self.headers.get("Content-Length") or 0) > 0
            refused = request_guard.refusal(
                http_method, self.headers, bound_host=emulator.host, has_body=has_body
            )
            if refused is not None:
                self.close_connection = True  # the body, if any, stays unread
                self._send(refused[0], {"error": {"code": refused[0], "message": refused[1]}})
                return
            if http_method == "GET" and htmlview.is_view_path(split.path):
                self._send_html(*htmlview.render_path(emulator.store, split.path))
                return
            try:
                body = self._body()
                if split.path.startswith("/_emulator/"):
                    self._send(200, emulator.handle_control(http_method, split.path, query, body))
                    return
                method, sid, rng = route(http_method, split.path)
                if body is None:
                    body = {}
                if not isinstance(body, dict):
                    raise invalid_argument("Invalid JSON payload received. Expected an object.")
                request = handlers.ApiRequest(method, sid, rng, query, body)
                status, reply, headers = emulator.handle_api(request)
                self._send(status, reply, headers)
            except DropConnection:
                # no status line at all: the client sees the connection close under its request
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
            except ApiError as exc:
                self._send(exc.code, exc.body(), exc.headers)
            except Exception:
                traceback.print_exc()
                self._send(500, _internal_error())

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0:
                return None
            raw = self.rfile.read(length)
            try:
                return json.loads(raw)
            except ValueError:
                raise invalid_argument("Invalid JSON payload received.") from None

        def _send_html(self, status: int, page: str) -> None:
            data = page.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
            self.end_headers()
            self.wfile.write(data)

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

    return _Handler
