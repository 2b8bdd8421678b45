"""The Sheets API resources are built once per process per endpoint (``onceflow.sheets.service``)
and every request still goes with its own connection's credentials, to its own endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.hooks.sheets import SheetQueueHook
from onceflow.sheets import service
from onceflow.sheets.transport import GoogleSheetsTransport

if TYPE_CHECKING:
    from collections.abc import Callable

    from onceflow.testing.sheets_fixtures import SheetsEmulator


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """An empty resource cache; the endpoint of every ``sheets`` service built from here on."""
    from googleapiclient import discovery

    monkeypatch.setattr(service, "_built", {})
    built: list[str | None] = []
    build = discovery.build

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(getattr(kwargs.get("client_options"), "api_endpoint", None))
        return build(*args, **kwargs)

    monkeypatch.setattr(discovery, "build", counted)
    return built


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, emulator: SheetsEmulator, sid: str) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", emulator.connection_json(spreadsheet_id=sid))


def test_transports_of_a_connection_share_one_service_and_still_read_what_they_wrote(
    sheets_emulator: SheetsEmulator, builds: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [["url", "status"]]})
    _connection(monkeypatch, "onceflow_sheets", sheets_emulator, sid)
    # a hook per task step, as the chain makes them, and a second transport of one hook
    writer = SheetQueueHook().transport()
    reader = SheetQueueHook().transport()
    again = SheetQueueHook().transport()
    writer.write_values([("queue!A2:B2", [["https://a.example/", "NEW"]])])
    assert reader.read(["queue!A1:B2"]) == [[["url", "status"], ["https://a.example/", "NEW"]]]
    assert again.sheet_ids() == {"queue": 0}
    assert again.search_metadata([{"developerMetadataLookup": {"metadataKey": "none"}}]) == []
    assert builds == [sheets_emulator.endpoint]
    assert writer._values is reader._values  # the same resource objects, not rebuilt
    assert writer._http is not reader._http  # but each hook's own http (httplib2 is not thread-safe)
    assert sheets_emulator.request_log.counts["values.batchGet"] == 1


def test_another_endpoint_gets_its_own_service_and_its_requests_go_there(
    sheets_emulator_factory: Callable[..., SheetsEmulator],
    builds: list[str | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = sheets_emulator_factory(), sheets_emulator_factory()
    sid1 = first.create_spreadsheet("one", sheets={"queue": [["first"]]})
    sid2 = second.create_spreadsheet("two", sheets={"queue": [["second"]]})
    _connection(monkeypatch, "sheets_one", first, sid1)
    _connection(monkeypatch, "sheets_two", second, sid2)
    for _ in range(2):
        assert SheetQueueHook("sheets_one").transport().read(["queue!A1"]) == [[["first"]]]
        assert SheetQueueHook("sheets_two").transport().read(["queue!A1"]) == [[["second"]]]
    assert builds == [first.endpoint, second.endpoint]
    assert (first.request_log.counts["values.batchGet"], second.request_log.counts["values.batchGet"]) == (
        2,
        2,
    )


class _Recording:
    """An ``httplib2.Http`` that keeps the Authorization header of each request it sends."""

    def __init__(self, seen: list[str | None]) -> None:
        import httplib2

        self._http = httplib2.Http()
        self._seen = seen

    def request(self, uri: str, method: str = "GET", body: Any = None, headers: Any = None, **kw: Any) -> Any:
        self._seen.append((headers or {}).get("authorization"))
        return self._http.request(uri, method=method, body=body, headers=headers, **kw)


def _authorized(token: str, seen: list[str | None], universe: str = "googleapis.com") -> Any:
    from google.oauth2.credentials import Credentials
    from google_auth_httplib2 import AuthorizedHttp

    return AuthorizedHttp(Credentials(token=token, universe_domain=universe), http=_Recording(seen))


def test_two_connections_on_one_endpoint_each_send_their_own_credentials(
    sheets_emulator: SheetsEmulator, builds: list[str | None]
) -> None:
    from google.api_core.client_options import ClientOptions

    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [["x"]]})
    options = ClientOptions(api_endpoint=sheets_emulator.endpoint)
    seen_a: list[str | None] = []
    seen_b: list[str | None] = []
    a = GoogleSheetsTransport.shared(_authorized("token-a", seen_a), sid, options)
    b = GoogleSheetsTransport.shared(_authorized("token-b", seen_b), sid, options)
    for transport in (a, b, a):
        assert transport.read(["queue!A1"]) == [[["x"]]]
    assert (seen_a, seen_b) == (["Bearer token-a", "Bearer token-a"], ["Bearer token-b"])
    assert len(builds) == 1


def test_a_shared_resource_never_sends_a_request_by_itself(
    sheets_emulator: SheetsEmulator, builds: list[str | None]
) -> None:
    """Built without credentials: a request executed without its transport's http fails here
    instead of going out unauthenticated."""
    resources = service.shared_resources(sheets_emulator.endpoint)
    request = resources.values.batchGet(spreadsheetId="any", ranges=["A1"])
    with pytest.raises(RuntimeError, match="without its transport's http"):
        request.execute()
    assert sheets_emulator.request_log.total == 0


def test_credentials_of_another_universe_are_refused_as_the_client_refuses_them(
    sheets_emulator: SheetsEmulator, builds: list[str | None]
) -> None:
    from google.api_core.client_options import ClientOptions
    from google.api_core.universe import UniverseMismatchError

    options = ClientOptions(api_endpoint=sheets_emulator.endpoint)
    with pytest.raises(UniverseMismatchError):
        GoogleSheetsTransport.shared(_authorized("t", [], universe="other.example"), "sid", options)


class _Canned:
    """An ``httplib2.Http`` that answers every request with one value, without the network."""

    def __init__(self) -> None:
        self.uris: list[str] = []

    def request(self, uri: str, method: str = "GET", body: Any = None, headers: Any = None, **kw: Any) -> Any:
        import httplib2

        self.uris.append(uri)
        return httplib2.Response({"status": "200"}), b'{"valueRanges": [{"values": [["x"]]}]}'


@pytest.mark.parametrize("named_by", ["the hook's client options", "the environment only"])
def test_a_connection_of_another_universe_is_served_as_its_own_service_would_serve_it(
    builds: list[str | None], monkeypatch: pytest.MonkeyPatch, named_by: str
) -> None:
    """With ``GOOGLE_CLOUD_UNIVERSE_DOMAIN`` set, the hook's client options name that universe (and
    the client reads the variable when they do not): the request goes to that universe's endpoint
    with the connection's http. Credentials of Google's universe are refused there, before sending."""
    from google.api_core.client_options import ClientOptions
    from google.api_core.universe import UniverseMismatchError
    from google.oauth2.credentials import Credentials
    from google_auth_httplib2 import AuthorizedHttp

    monkeypatch.setenv("GOOGLE_CLOUD_UNIVERSE_DOMAIN", "other.example")
    anonymous = {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", json.dumps(anonymous))
    options = SheetQueueHook().get_client_options() if named_by.startswith("the hook") else ClientOptions()
    canned = _Canned()
    http = AuthorizedHttp(Credentials(token="t", universe_domain="other.example"), http=canned)
    assert GoogleSheetsTransport.shared(http, "sid", options).read(["A1"]) == [[["x"]]]
    assert [u.split("?")[0] for u in canned.uris] == [
        "https://sheets.other.example/v4/spreadsheets/sid/values:batchGet"
    ]
    with pytest.raises(UniverseMismatchError):
        GoogleSheetsTransport.shared(AuthorizedHttp(Credentials(token="g"), http=canned), "sid", options)
    assert len(canned.uris) == 1


def test_the_warm_up_builds_googles_and_the_configured_endpoints(
    builds: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_SHEETS_API_ENDPOINTS", "http://127.0.0.1:1/, http://127.0.0.1:2/")
    service.warm()
    service.warm()
    assert builds == [None, "http://127.0.0.1:1/", "http://127.0.0.1:2/"]
    google = "googleapis.com"  # the universe each is keyed by, as the client resolves it
    assert set(service._built) == {
        (None, google),
        ("http://127.0.0.1:1/", google),
        ("http://127.0.0.1:2/", google),
    }


def test_a_task_forked_while_another_thread_builds_can_still_build() -> None:
    """The scheduler forks task processes: a fork while a thread holds the build lock must not
    leave the child a lock nobody releases (its first transport would hang)."""
    code = textwrap.dedent(
        """
        import os, threading, time
        from onceflow.sheets import service

        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with service._lock:
                held.set()
                release.wait()

        threading.Thread(target=hold, daemon=True).start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            service.shared_resources("http://127.0.0.1:9")  # builds from the bundled document
            os._exit(0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("child exit", os.waitstatus_to_exitcode(status))
                break
            time.sleep(0.1)
        else:
            os.kill(pid, 9)
            print("child hung")
        release.set()
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "child exit 0", done.stdout + done.stderr[-2000:]
