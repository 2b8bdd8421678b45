"""The ``sheets`` v4 API's resources, built once per process per endpoint and shared by every transport.

google-api-python-client writes a docstring for every method of a resource each time it makes one
(it pretty-prints the request and response schemas): making ``spreadsheets()`` costs about 0.1 s
of CPU, more than the requests of a task that touches the sheet. So the resources
(``spreadsheets()``, its ``values()`` and ``developerMetadata()``) are made once per process for
each (``api_endpoint``, ``universe_domain``) and shared.

They hold no credentials: they are built on :class:`_NoHttp`, and every request is executed with
its transport's own authorized http (``HttpRequest.execute(http=...)``, the client's documented
override). A connection's credentials therefore never serve another connection's request, and a
request executed without its http fails instead of going out unauthenticated. httplib2 is not
thread-safe: each transport keeps its own http; the shared resources only make request objects.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, NoReturn


@dataclass(frozen=True)
class SheetsResources:
    """A ``sheets`` v4 service's resources without credentials (see the module docstring)."""

    spreadsheets: Any
    values: Any
    developer_metadata: Any
    #: the client's universe, which the credentials of every request must belong to
    universe_domain: str


@dataclass(frozen=True)
class _UniverseOnly:
    """What the client reads of a service's credentials before each request: their universe."""

    universe_domain: str


class _NoHttp:
    """The shared resources' own http: refuses to send, so no request leaves without ``http=``.

    Its ``credentials`` are only the client's universe: the resource checks them before making each
    request, and without credentials it would take Google's universe for theirs and refuse every
    request of another universe. The transport's own credentials are checked by :func:`resources_for`.
    """

    def __init__(self, universe_domain: str) -> None:
        self.credentials = _UniverseOnly(universe_domain)

    def request(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("a shared sheets resource's request was executed without its transport's http")

    def close(self) -> None:
        pass


_lock = threading.Lock()


def _new_lock_in_child() -> None:
    # A fork while another thread builds would leave the child a lock nobody releases: every
    # task's first transport would hang. The child starts with a free one (the built resources stay).
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)
_built: dict[tuple[str | None, str], SheetsResources] = {}  # (api_endpoint, universe)


def shared_resources(api_endpoint: str | None = None, universe_domain: str | None = None) -> SheetsResources:
    """This process's resources for the endpoint and universe (built on first use).

    :param api_endpoint: the ``ClientOptions.api_endpoint`` (``None``: Google's).
    :param universe_domain: the ``ClientOptions.universe_domain`` (``None``: the
        ``GOOGLE_CLOUD_UNIVERSE_DOMAIN`` environment variable, else Google's, as the client decides).
    """
    from google.api_core import universe

    resolved = universe.determine_domain(universe_domain, os.environ.get("GOOGLE_CLOUD_UNIVERSE_DOMAIN"))
    key = (api_endpoint, resolved)
    with _lock:  # two threads asking at once build once
        found = _built.get(key)
        if found is None:
            found = _built[key] = _build(api_endpoint, resolved)
        return found


def _build(api_endpoint: str | None, universe_domain: str) -> SheetsResources:
    from google.api_core.client_options import ClientOptions
    from googleapiclient.discovery import build

    # as GSheetsHook.get_conn() builds it (bundled discovery document, no discovery cache), on _NoHttp
    service = build(
        "sheets",
        "v4",
        http=_NoHttp(universe_domain),
        cache_discovery=False,
        client_options=ClientOptions(api_endpoint=api_endpoint, universe_domain=universe_domain),
    )
    spreadsheets = service.spreadsheets()
    return SheetsResources(
        spreadsheets=spreadsheets,
        values=spreadsheets.values(),
        developer_metadata=spreadsheets.developerMetadata(),
        universe_domain=universe_domain,
    )


def resources_for(http: Any, client_options: Any) -> SheetsResources:
    """The shared resources for a connection's ``client_options``, after the check the client makes
    of a service's credentials before its first request (its universe is the credentials' one).

    :param http: the connection's authorized http (``AuthorizedHttp``, its ``credentials``).
    :param client_options: the connection's ``ClientOptions``.
    :raises UniverseMismatchError: the credentials belong to another universe.
    """
    from google.api_core import universe

    resources = shared_resources(
        getattr(client_options, "api_endpoint", None), getattr(client_options, "universe_domain", None)
    )
    universe.compare_domains(resources.universe_domain, getattr(http, "credentials", None))
    return resources


def warm(endpoints: str | None = None) -> None:
    """Build the resources for Google's endpoint and each of ``endpoints`` (comma-separated; default
    the ``ONCEFLOW_SHEETS_API_ENDPOINTS`` environment variable), for ``onceflow.preload``: in the
    process that forks the task processes, every task finds them built."""
    if endpoints is None:
        endpoints = os.environ.get("ONCEFLOW_SHEETS_API_ENDPOINTS", "")
    shared_resources()
    for endpoint in filter(None, (e.strip() for e in endpoints.split(","))):
        shared_resources(endpoint)
