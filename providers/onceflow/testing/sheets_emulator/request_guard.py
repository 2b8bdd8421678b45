"""Requests a web page in the developer's browser could forge are refused (``make run``'s emulator).

The emulator has no login, so anything that reaches it can edit the queue. A page on another site
can still make the browser send requests to 127.0.0.1:

- a cross-site "simple" request (a form, or ``fetch`` with ``text/plain``) needs no preflight, so
  a write must carry ``Content-Type: application/json`` (which a foreign page cannot send without a
  preflight that the emulator never answers) and, when the browser names one, an ``Origin`` that
  is the emulator's own;
- a page whose host name is re-pointed at 127.0.0.1 (DNS rebinding) is same-origin to itself, so
  an emulator listening on a loopback address answers only loopback ``Host`` names.

Clients that are not browsers (the Google client library, ``curl`` with the banner's
``-H 'Content-Type: application/json'``) send exactly that and are unaffected.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol
from urllib.parse import urlsplit


class Headers(Protocol):
    """Request headers looked up by name (``http.server``'s message, or a dict)."""

    def get(self, name: str, default: None = None) -> str | None: ...


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def refusal(method: str, headers: Headers, *, bound_host: str, has_body: bool) -> tuple[int, str] | None:
    """``(status, reason)`` when the request must be refused, else ``None``.

    :param headers: request headers (any case; looked up case-insensitively by the caller's mapping).
    :param bound_host: the address the emulator listens on.
    :param has_body: whether the request carries a body.
    """
    host = (headers.get("Host") or "").strip().lower()
    if _is_loopback(bound_host):
        name = urlsplit(f"//{host}").hostname or ""
        if name not in LOOPBACK_NAMES:
            return 421, f"Host {host!r} is not a loopback name (DNS-rebinding guard); use 127.0.0.1"
    if method not in WRITE_METHODS:
        return None
    origin = headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != host:
        return 403, f"cross-origin write from {origin!r} refused"
    ctype = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if has_body and ctype != "application/json":
        return 415, f"a write must be sent as application/json, not {ctype or 'no Content-Type'!r}"
    return None


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
