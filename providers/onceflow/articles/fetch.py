"""The fetch step's I/O: one guarded HTTP GET of an article page.

:func:`fetch_page` checks the URL with :mod:`onceflow.articles.ssrf`, connects to exactly the
address that was checked (the socket is opened on the IP, never on the name; TLS is wrapped with
SNI and certificate checks for the URL's host name; the ``Host`` header carries the name), and
repeats the check on every redirect hop, up to ``max_redirects``.

Limits, each enforced while the response streams in:

- ``max_bytes``: a declared ``Content-Length`` over the cap is refused before reading; otherwise
  reading stops at ``max_bytes + 1`` bytes. Nothing larger is ever buffered.
- ``connect_timeout`` and ``read_timeout`` per socket operation: a server that does not answer
  in time is a transient failure (it may be back later; Airflow retries).
- ``total_timeout`` for the whole fetch, redirects included, enforced by a watchdog that shuts
  the socket down: a server that dribbles bytes forever never trips the read timeout, and would
  do the same on every retry, so it is a permanent failure ("too slow").

Permanent (:class:`PermanentStepError`, no retry): blocked addresses, bad URLs, 4xx statuses
other than 408/425/429, too many redirects, too large, too slow, not HTML. Transient
(:class:`TransientStepError`): 5xx, 408, 425, 429 (``Retry-After`` in seconds or as an HTTP date
becomes ``retry_after``), timeouts, refused or reset connections, DNS failures other than "no
such host".
"""

from __future__ import annotations

import contextlib
import http.client
import math
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin

from onceflow.articles.charset import decode_html
from onceflow.articles.errors import PermanentStepError, TransientStepError
from onceflow.articles.ssrf import (
    AllowList,
    IPAddress,
    Resolver,
    Target,
    check_target,
    parse_url,
    system_resolver,
)

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
REDIRECTS = frozenset({301, 302, 303, 307, 308})
TRANSIENT_4XX = frozenset({408, 425, 429})
USER_AGENT = "onceflow-fetch/1.0 (article chain; +https://github.com/onceflow)"
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class FetchPolicy:
    """Limits and permissions of one fetch; built from the ``onceflow_fetch`` connection.

    :param resolver: name -> addresses; the system's ``getaddrinfo`` unless a test injects one.
    :param ssl_context: TLS settings; the system's trust store with hostname checks by default.
    """

    connect_timeout: float = 5.0
    read_timeout: float = 15.0
    total_timeout: float = 60.0
    max_bytes: int = 5_000_000
    max_redirects: int = 5
    allow: AllowList = field(default_factory=AllowList)
    user_agent: str = USER_AGENT
    resolver: Resolver = field(default=system_resolver, compare=False)
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)

    @classmethod
    def from_extras(cls, extras: Mapping[str, Any]) -> FetchPolicy:
        """Build from a connection's extras; every key is optional.

        ``{"allow": ["127.0.0.1:8765", "10.0.0.0/8"], "max_bytes": 5000000, "max_redirects": 5,
        "connect_timeout": 5, "read_timeout": 15, "total_timeout": 60, "user_agent": "..."}``;
        ``allow`` may also be one comma-separated string.

        :raises ValueError: naming each unknown key and each bad value.
        """
        known = {"allow", "user_agent", *_POSITIVE_NUMBERS, *_INTEGERS}
        problems = [f"unknown key {key!r}" for key in extras if key not in known]
        values: dict[str, Any] = {}
        for key, value in extras.items():
            if key not in known:
                continue
            try:
                values[key] = _extra_value(key, value)
            except ValueError as exc:
                problems.append(f"{key}: {exc}")
        if problems:
            allowed = ", ".join(sorted(known))
            raise ValueError(f"bad onceflow_fetch extras: {'; '.join(problems)} (keys: {allowed})")
        return cls(**values)


_POSITIVE_NUMBERS = ("connect_timeout", "read_timeout", "total_timeout")
_INTEGERS = {"max_bytes": 1, "max_redirects": 0}  # key -> smallest value


def _extra_value(key: str, value: Any) -> Any:
    if key == "allow":
        entries = value.split(",") if isinstance(value, str) else value
        if not isinstance(entries, list | tuple):
            raise ValueError(f"expected a list of hosts or ranges, got {value!r}")
        return AllowList.parse(e for e in entries if not (isinstance(e, str) and not e.strip()))
    if key == "user_agent":
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"expected a non-empty string, got {value!r}")
        return value.strip()
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if key in _INTEGERS:
        try:
            number = int(value) if isinstance(value, int | str) else math.nan
        except ValueError:
            number = math.nan
        if math.isnan(number) or number < _INTEGERS[key]:
            raise ValueError(f"expected an integer >= {_INTEGERS[key]}, got {value!r}")
        return int(number)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"expected a positive number of seconds, got {value!r}")
    return seconds


@dataclass(frozen=True)
class FetchedPage:
    """A fetched HTML page.

    :ivar url: the URL asked for; ``final_url`` the one that answered, after ``redirects``.
    :ivar headers: response headers, names lower-cased (a repeated header keeps its last value).
    :ivar declared_charset: what the ``Content-Type`` header said, if anything.
    :ivar charset: the codec ``text`` was decoded with; ``charset_source`` says why (see
        :func:`onceflow.articles.charset.decode_html`).
    :ivar address: the IP address the final response came from.
    """

    url: str
    final_url: str
    status: int
    headers: dict[str, str]
    content_type: str
    declared_charset: str | None
    charset: str
    charset_source: str
    body: bytes
    text: str
    redirects: list[str]
    address: str


def fetch_page(url: str, policy: FetchPolicy | None = None) -> FetchedPage:
    """GET ``url`` under ``policy`` and return the decoded HTML page.

    :raises PermanentStepError: retrying cannot help (the reason says why, for the row).
    :raises TransientStepError: retrying later may help.
    """
    policy = policy or FetchPolicy()
    redirects: list[str] = []
    current = url
    with _Watchdog(policy.total_timeout) as watchdog:
        while True:
            target = parse_url(current)
            addresses = check_target(target, policy.allow, policy.resolver)
            with _exchange(target, addresses, policy, watchdog) as (response, address):
                location = response.getheader("Location")
                if response.status in REDIRECTS and location:
                    if len(redirects) >= policy.max_redirects:
                        raise PermanentStepError(
                            f"too many redirects (more than {policy.max_redirects}) from {url}", step="fetch"
                        )
                    current = urljoin(current, _header_text(location).strip())
                    redirects.append(current)
                    continue
                _check_status(response, current)
                content_type, declared = _check_content_type(response)
                body = _read_capped(response, policy, watchdog)
            if content_type == "":
                content_type = _sniff_html(body)
            decoded = decode_html(body, declared)
            return FetchedPage(
                url=url,
                final_url=current,
                status=response.status,
                headers={name.lower(): value for name, value in response.getheaders()},
                content_type=content_type,
                declared_charset=declared,
                charset=decoded.charset,
                charset_source=decoded.source,
                body=body,
                text=decoded.text,
                redirects=redirects,
                address=str(address),
            )


def _header_text(value: str) -> str:
    """A header as UTF-8: http.client decodes header bytes as latin-1, servers send UTF-8."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


class _Watchdog:
    """Ends the whole fetch after ``total_timeout`` seconds by shutting its socket down."""

    def __init__(self, total_timeout: float) -> None:
        self.total_timeout = total_timeout
        self._deadline = time.monotonic() + total_timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.fired = False
        self._timer = threading.Timer(total_timeout, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0 or self.fired:
            raise self.too_slow()
        return left

    def watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            if sock is not None and self.fired:
                self._shutdown(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                self._shutdown(self._sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            # the plain socket's shutdown, also for an SSLSocket: no TLS close_notify from this thread
            socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def too_slow(self) -> PermanentStepError:
        return PermanentStepError(
            f"too slow: no complete response within {self.total_timeout:g} seconds", step="fetch"
        )


@contextlib.contextmanager
def _exchange(
    target: Target, addresses: list[IPAddress], policy: FetchPolicy, watchdog: _Watchdog
) -> Iterator[tuple[http.client.HTTPResponse, IPAddress]]:
    """Send the GET to a checked address; yield the response with its headers read."""
    sock, address = _connect(target, addresses, policy, watchdog)
    conn = http.client.HTTPConnection(target.host, target.port)
    conn.sock = sock  # already connected to the checked address: http.client never resolves
    try:
        try:
            conn.putrequest("GET", target.request_target, skip_host=True, skip_accept_encoding=True)
            for name, value in (
                ("Host", target.host_header),
                ("User-Agent", policy.user_agent),
                ("Accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.1"),
                ("Accept-Encoding", "identity"),
                ("Connection", "close"),
            ):
                conn.putheader(name, value)
            conn.endheaders()
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise _io_error(exc, target, address, policy, watchdog) from exc
        yield response, address
    finally:
        watchdog.watch(None)
        conn.close()


def _connect(
    target: Target, addresses: list[IPAddress], policy: FetchPolicy, watchdog: _Watchdog
) -> tuple[socket.socket, IPAddress]:
    """A socket connected to the first reachable checked address (TLS-wrapped for https)."""
    failures: list[str] = []
    for address in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        watchdog.watch(sock)
        try:
            sock.settimeout(min(policy.connect_timeout, watchdog.remaining()))
            sock.connect((str(address), target.port))  # a numeric address: no name lookup
            sock.settimeout(policy.read_timeout)
            if target.scheme == "https":
                context = policy.ssl_context or ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=target.host)
                watchdog.watch(sock)
            return sock, address
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise PermanentStepError(
                f"TLS certificate not valid for {target.host}: {exc.verify_message}", step="fetch"
            ) from exc
        except OSError as exc:
            sock.close()
            if watchdog.fired:
                raise watchdog.too_slow() from exc
            kind = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            failures.append(f"{address} port {target.port}: {kind}")
    raise TransientStepError(
        f"could not connect to {target.written_host} ({'; '.join(failures)})", step="fetch"
    )


def _io_error(
    exc: Exception, target: Target, address: IPAddress, policy: FetchPolicy, watchdog: _Watchdog
) -> Exception:
    """Map a failure while talking to the server onto a step error."""
    if watchdog.fired:
        return watchdog.too_slow()
    where = f"{target.written_host} ({address})"
    if isinstance(exc, TimeoutError):
        return TransientStepError(
            f"read timeout: {where} sent nothing for {policy.read_timeout:g} seconds", step="fetch"
        )
    return TransientStepError(f"connection to {where} failed: {exc or type(exc).__name__}", step="fetch")


def _check_status(response: http.client.HTTPResponse, url: str) -> None:
    status = response.status
    if 200 <= status < 300 and status not in (204, 205):
        return
    what = f"HTTP {status} {response.reason}".rstrip()
    if status >= 500 or status in TRANSIENT_4XX:
        retry_after = parse_retry_after(response.getheader("Retry-After"))
        later = f", retry after {retry_after:g} s" if retry_after is not None else ""
        raise TransientStepError(f"{what}{later}: {url}", step="fetch", retry_after=retry_after)
    if status in REDIRECTS:
        raise PermanentStepError(f"{what} without a Location header: {url}", step="fetch")
    raise PermanentStepError(f"{what}: {url}", step="fetch")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay seconds or an HTTP date; ``None`` if absent
    or unreadable. A date in the past gives 0."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        seconds = float(text)  # 400 digits are float("inf"): no delay anyone can wait for
        return seconds if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" dates: HTTP dates are always GMT
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _check_content_type(response: http.client.HTTPResponse) -> tuple[str, str | None]:
    """The media type ("" when the server sent none) and the declared charset."""
    encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise PermanentStepError(f"unsupported Content-Encoding: {encoding}", step="fetch")
    if response.getheader("Content-Type") is None:
        return "", None
    media = response.headers.get_content_type()
    if media not in HTML_TYPES:
        raise PermanentStepError(f"not HTML: {media}", step="fetch")
    charset = response.headers.get_param("charset")
    return media, charset if isinstance(charset, str) and charset.strip() else None


def _sniff_html(body: bytes) -> str:
    """No Content-Type: accept only a body that starts like an HTML document."""
    head = body[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body", b"<!--")):
        return "text/html"
    raise PermanentStepError("not HTML: no Content-Type and the body does not look like HTML", step="fetch")


def _read_capped(response: http.client.HTTPResponse, policy: FetchPolicy, watchdog: _Watchdog) -> bytes:
    """Read the body, at most ``max_bytes + 1`` bytes of it, refusing anything larger."""
    cap = policy.max_bytes
    length = response.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > cap:
        raise PermanentStepError(f"too large: Content-Length {int(length)} bytes, limit {cap}", step="fetch")
    body = bytearray()
    try:
        while len(body) <= cap:
            chunk = response.read1(min(_CHUNK, cap + 1 - len(body)))
            if not chunk:
                break
            body += chunk
    except (OSError, http.client.HTTPException) as exc:
        if watchdog.fired:
            raise watchdog.too_slow() from exc
        if isinstance(exc, TimeoutError):
            raise TransientStepError(
                f"read timeout: no data for {policy.read_timeout:g} seconds", step="fetch"
            ) from exc
        raise TransientStepError(f"connection broken while reading: {exc!r}", step="fetch") from exc
    if watchdog.fired:  # the watchdog's shutdown reads as a clean end of stream
        raise watchdog.too_slow()
    if len(body) > cap:
        raise PermanentStepError(f"too large: more than {cap} bytes", step="fetch")
    return bytes(body)
