"""The demo article site's HTTP server: the shipped pages, bad-behaviour endpoints, published pages.

Routes (GET and HEAD):

- ``/`` an index of the articles; ``/articles/<slug>.html``, ``/static/<file>``, ``/notes.pdf``,
  ``/data/<file>.csv``: the shipped files (see :mod:`.catalog`), some served with a deliberately
  wrong charset in ``Content-Type``.
- ``/redirect/<n>``: a chain of ``n`` redirects ending at an article (``?to=/path`` picks which).
- ``/redirect-to?url=<url>``: one redirect anywhere (``/private-redirect`` goes to 10.0.0.1).
- ``/status/<code>``: that status, with ``Retry-After`` when ``?retry_after=`` is given.
- ``/busy/<n>``: ``429 Too Many Requests`` with ``Retry-After: <retry_after>`` (default 1) to the
  first ``n`` requests of that exact path and query, then the article ``?to=`` names (default
  ``/articles/gazpacho.html``): a server that asks to be retried later. ``?status=503`` refuses
  with that status instead; an empty ``retry_after=`` sends no ``Retry-After`` (a server that
  fails for a while and says nothing).
- ``/huge``: 50 MB of HTML generated while it is sent (``?bytes=N``; ``?declare=1`` sends a
  ``Content-Length``); ``/slow``: HTML headers, then one byte per second forever
  (``?interval=s``); ``/slow-headers``: the same inside a header line that never ends.
- ``/published/<path>``: files under ``published_dir`` and nothing outside it; ``/published/``
  itself lists the published pages by title (:mod:`.published_index`).
- ``/dashboard/<path>``: files under ``dashboard_dir`` (``make run`` serves the sales dashboard).

Every accepted TCP connection is counted and every request is logged (:attr:`ArticleSite.log`):
tests use them to prove that a refused fetch never reached the server.
"""

from __future__ import annotations

import html
import mimetypes
import socket
import socketserver
import ssl
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from onceflow.testing.article_site.catalog import ARTICLES, FILES, Entry
from onceflow.testing.article_site.published_index import published_index

HUGE_BYTES = 50 * 1024 * 1024
PRIVATE_REDIRECT = "http://10.0.0.1/"
_FILLER = ("<p>" + "relleno " * 120 + "</p>\n").encode("ascii")


@dataclass
class Access:
    """One request, logged when it arrives; ``status`` and ``bytes_sent`` fill in as it is answered.

    :ivar bytes_sent: body bytes written so far (final once the response ended or the client left).
    """

    method: str
    path: str
    host: str
    status: int = 0
    bytes_sent: int = 0
    #: ``time.monotonic()`` when the request arrived
    at: float = field(default_factory=time.monotonic)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    site: ArticleSite

    def server_bind(self) -> None:
        # Not HTTPServer's: it names the server by socket.getfqdn(host), a reverse lookup that the
        # C library sends to the DNS server for an address /etc/hosts does not list (127.0.0.2,
        # ::1). The name is never used; the network guard refuses that lookup.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.site._count_connection()
        return True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that refused our certificate or hung up mid-request is expected in tests
        if self.site.verbose:
            super().handle_error(request, client_address)


class ArticleSite:
    """The demo article site on ``host:port`` (port 0 picks a free one). Start it with :func:`serve`.

    :param published_dir: directory whose files are served under ``/published/``.
    :param dashboard_dir: directory whose files are served under ``/dashboard/``.
    :param verbose: log requests to stderr.
    :param tls: a server-side TLS context: serve ``https`` (tests of SNI and certificate checks).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        published_dir: str | Path | None = None,
        verbose: bool = False,
        tls: ssl.SSLContext | None = None,
        dashboard_dir: str | Path | None = None,
    ) -> None:
        self.published_dir = Path(published_dir).resolve() if published_dir is not None else None
        self.dashboard_dir = Path(dashboard_dir).resolve() if dashboard_dir is not None else None
        self.verbose = verbose
        self.log: list[Access] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._busy_seen: dict[str, int] = {}
        self._stopping = threading.Event()
        server_class = (
            type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
        )
        self._httpd = server_class((host, port), _Handler)
        self._httpd.site = self
        self.scheme = "http"
        if tls is not None:  # the handshake runs in the handler thread, on the first read
            self._httpd.socket = tls.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"
        self._thread: threading.Thread | None = None
        self._serving = False

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (IPv6 hosts in brackets), without a trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def address(self) -> str:
        """``host:port`` as an allow-list entry."""
        return self.base_url.split("://", 1)[1]

    def url(self, path: str = "/") -> str:
        """The absolute URL of ``path`` on this site."""
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def start(self) -> ArticleSite:
        """Serve in a daemon thread and return self."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"article-site-{self.port}",
            daemon=True,
        )
        self._serving = True
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until :meth:`stop` is called from another one."""
        self._serving = True
        self._httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving; endless responses (``/slow``, ``/huge``) end too."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._serving:  # shutdown() waits for a serve_forever loop: never call it without one
            self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ArticleSite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def requests_to(self, path_prefix: str = "/") -> list[Access]:
        """The logged requests whose path starts with ``path_prefix``."""
        with self._lock:
            return [a for a in self.log if a.path.startswith(path_prefix)]

    def _busy_count(self, key: str) -> int:
        """How many requests of ``key`` (path and query) ``/busy`` saw before this one."""
        with self._lock:
            seen = self._busy_seen.get(key, 0)
            self._busy_seen[key] = seen + 1
            return seen

    def _count_connection(self) -> None:
        with self._lock:
            self.connections += 1

    def _record(self, access: Access) -> None:
        with self._lock:
            self.log.append(access)


def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    published_dir: str | Path | None = None,
    verbose: bool = False,
    tls: ssl.SSLContext | None = None,
    dashboard_dir: str | Path | None = None,
) -> ArticleSite:
    """Start the demo site in a background thread; use it as a context manager to stop it."""
    site = ArticleSite(
        host, port, published_dir=published_dir, verbose=verbose, tls=tls, dashboard_dir=dashboard_dir
    )
    return site.start()


def page_bytes(entry: Entry) -> bytes:
    """A shipped file's bytes, exactly as stored (wrongly encoded pages included)."""
    return resources.files("onceflow.testing.article_site").joinpath(entry.file).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "onceflow-article-site/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.site.verbose:
            super().log_message(format, *args)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        # logged on arrival, so a client that saw an answer always finds its request in the log
        self._access = Access(self.command, self.path, self.headers.get("Host", ""))
        self.server.site._record(self._access)
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            self._route(parts.path, query)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client hung up: normal for a capped or cut fetch

    # -- routing ---------------------------------------------------------------------------------

    def _route(self, path: str, query: dict[str, str]) -> None:
        site = self.server.site
        if path in ("/", "/index.html"):
            self._send(200, _index().encode("utf-8"), "text/html; charset=utf-8")
        elif path in ARTICLES or path in FILES:
            entry = ARTICLES.get(path) or FILES[path]
            self._send(200, page_bytes(entry), entry.content_type)
        elif path.startswith("/static/"):
            self._static(path)
        elif path.startswith("/redirect/"):
            self._redirect_chain(path, query)
        elif path == "/redirect-to":
            self._redirect(query.get("url", "/"), int(query.get("status", "302")))
        elif path == "/private-redirect":
            self._redirect(PRIVATE_REDIRECT, 302)
        elif path.startswith("/status/"):
            self._status_page(path, query)
        elif path.startswith("/busy/"):
            self._busy(path, query, site)
        elif path == "/huge":
            self._huge(int(query.get("bytes", HUGE_BYTES)), query.get("declare") == "1")
        elif path == "/slow":
            self._slow(float(query.get("interval", "1")), site)
        elif path == "/slow-headers":
            self._slow_headers(float(query.get("interval", "1")), site)
        elif path == "/published" or path.startswith("/published/"):
            self._files("/published", site.published_dir, path)
        elif path == "/dashboard" or path.startswith("/dashboard/"):
            self._files("/dashboard", site.dashboard_dir, path)
        else:
            self._error(404)

    def _send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self._access.status = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            self._access.bytes_sent = len(body)

    def _error(self, status: int, headers: dict[str, str] | None = None) -> None:
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Status"
        body = f"<!doctype html><title>{status} {phrase}</title><h1>{status} {phrase}</h1>\n"
        self._send(status, body.encode("utf-8"), "text/html; charset=utf-8", headers)

    def _redirect(self, location: str, status: int = 302) -> None:
        self._access.status = status
        self.send_response(status)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _static(self, path: str) -> None:
        entry = FILES.get(path)
        if entry is None:
            self._error(404)
            return
        self._send(200, page_bytes(entry), entry.content_type)

    def _redirect_chain(self, path: str, query: dict[str, str]) -> None:
        rest = path.removeprefix("/redirect/")
        if not rest.isdigit():
            self._error(404)
            return
        hops = int(rest)
        end = query.get("to", "/articles/huertos-urbanos.html")
        suffix = f"?to={end}" if "to" in query else ""
        self._redirect(f"/redirect/{hops - 1}{suffix}" if hops > 1 else end, 302)

    def _status_page(self, path: str, query: dict[str, str]) -> None:
        code = path.removeprefix("/status/")
        if not code.isdigit() or not 200 <= int(code) <= 599:
            self._error(404)
            return
        headers = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
        self._error(int(code), headers)

    def _busy(self, path: str, query: dict[str, str], site: ArticleSite) -> None:
        refusals = path.removeprefix("/busy/")
        entry = ARTICLES.get(query.get("to", "/articles/gazpacho.html"))
        if not refusals.isdigit() or entry is None:
            self._error(404)
            return
        if site._busy_count(self.path) < int(refusals):
            after = query.get("retry_after", "1")
            status = query.get("status", "429")
            self._error(int(status) if status.isdigit() else 429, {"Retry-After": after} if after else {})
        else:
            self._send(200, page_bytes(entry), entry.content_type)

    def _huge(self, size: int, declare: bool) -> None:
        """Generate ``size`` bytes of HTML as they are sent: never more than one chunk in memory."""
        self._access.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        if declare:
            self.send_header("Content-Length", str(size))
        self.end_headers()
        self.close_connection = True
        while self._access.bytes_sent < size and not self.server.site._stopping.is_set():
            chunk = _FILLER[: size - self._access.bytes_sent]
            self.wfile.write(chunk)
            self._access.bytes_sent += len(chunk)

    def _slow(self, interval: float, site: ArticleSite) -> None:
        """HTML headers at once, then a byte every ``interval`` seconds until the client leaves."""
        self._access.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.close_connection = True
        self.wfile.write(b"<!doctype html><html><body><p>")
        self.wfile.flush()
        while not site._stopping.wait(interval):
            self.wfile.write(b".")
            self.wfile.flush()
            self._access.bytes_sent += 1

    def _slow_headers(self, interval: float, site: ArticleSite) -> None:
        """A status line, then a header that never ends, a byte every ``interval`` seconds."""
        self.close_connection = True
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Drip: ")
        self.wfile.flush()
        self._access.status = 200
        while not site._stopping.wait(interval):
            self.wfile.write(b"a")
            self.wfile.flush()

    def _files(self, prefix: str, root: Path | None, path: str) -> None:
        if root is None:
            self._error(404)
            return
        relative = unquote(path.removeprefix(prefix).lstrip("/"))
        target = (root / relative).resolve()
        if not target.is_relative_to(root):  # "..", symlinks out, absolute paths: all refused
            self._error(404)
            return
        if target.is_dir():
            index = target / "index.html"
            if index.is_file():
                target = index
            elif prefix == "/published" and target == root:
                page = published_index(root)
                self._send(200, page.encode("utf-8"), "text/html; charset=utf-8")
                return
            else:
                self._send(200, _listing(root, target, prefix).encode("utf-8"), "text/html; charset=utf-8")
                return
        if not target.is_file():
            self._error(404)
            return
        kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if kind.startswith("text/"):
            kind += "; charset=utf-8"
        self._send(200, target.read_bytes(), kind)


def _index() -> str:
    items = "\n".join(
        f'<li><a href="{html.escape(path)}">{html.escape(entry.title)}</a> ({entry.language})</li>'
        for path, entry in ARTICLES.items()
    )
    return (
        '<!doctype html><html lang="es"><head><meta charset="utf-8"><title>Artículos de demostración'
        f"</title></head><body><h1>Artículos de demostración</h1><ul>\n{items}\n</ul>"
        '<p><a href="/published/">Páginas publicadas</a></p></body></html>\n'
    )


def _listing(root: Path, directory: Path, prefix: str) -> str:
    links = []
    for child in sorted(directory.iterdir()):
        if child.is_file() or child.is_dir():
            href = f"{prefix}/" + child.relative_to(root).as_posix() + ("/" if child.is_dir() else "")
            links.append(f'<li><a href="{html.escape(href)}">{html.escape(child.name)}</a></li>')
    title = "/" + directory.relative_to(root).as_posix()
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>Publicado {html.escape(title)}</title>'
        f"</head><body><h1>Páginas publicadas</h1><ul>{''.join(links)}</ul></body></html>\n"
    )
