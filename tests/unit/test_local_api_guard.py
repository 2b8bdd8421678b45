"""`make run`'s api-server guard (issue 30 item 5, issue 26 item 4): foreign Host names and
cross-site writes are refused, the UI starts in the business timezone, production is untouched."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.testclient import TestClient

from onceflow.local_api_guard import LocalRunGuard, loopback_hosts, timezone_script
from onceflow.priority import OnceflowPriorityPlugin

PAGE = "<!doctype html><html><head><title>Airflow</title></head><body></body></html>"


def _client(**guard: object) -> TestClient:
    app = FastAPI()

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return PAGE

    @app.post("/api/v2/variables")
    def create() -> dict[str, str]:
        return {"created": "yes"}

    app.add_middleware(LocalRunGuard, **guard)  # type: ignore[arg-type]
    return TestClient(app, base_url="http://localhost:8080")


def test_a_request_for_another_host_name_is_refused_before_the_api_sees_it() -> None:
    client = _client(allowed_hosts=loopback_hosts(8080))
    refused = client.post("/api/v2/variables", headers={"Host": "rebind.evil.example"})
    assert refused.status_code == 421
    assert "rebind.evil.example" in refused.text and "localhost:8080" in refused.text
    assert client.get("/", headers={"Host": "rebind.evil.example:8080"}).status_code == 421


def test_the_loopback_names_of_its_own_port_are_served() -> None:
    client = _client(allowed_hosts=loopback_hosts(8080))
    for host in ("localhost:8080", "127.0.0.1:8080", "LOCALHOST:8080"):
        assert client.post("/api/v2/variables", headers={"Host": host}).json() == {"created": "yes"}
    assert client.post("/api/v2/variables", headers={"Host": "localhost:9999"}).status_code == 421


def test_a_cross_site_write_is_refused_and_the_ui_own_origin_is_not() -> None:
    client = _client(allowed_hosts=loopback_hosts(8080))
    evil = client.post("/api/v2/variables", headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and "evil.example" in evil.text
    own = client.post("/api/v2/variables", headers={"Origin": "http://localhost:8080"})
    assert own.status_code == 200
    assert client.get("/", headers={"Origin": "http://evil.example"}).status_code == 200  # reads: CORS


def test_the_ui_page_seeds_the_business_timezone_once() -> None:
    client = _client(ui_timezone="Europe/Amsterdam")
    page = client.get("/", headers={"Accept": "text/html"}).text
    assert page.startswith("<!doctype html><html><head>" + timezone_script("Europe/Amsterdam"))
    assert 'localStorage.setItem("timezone","\\"Europe/Amsterdam\\"")' in page
    assert "if(!localStorage.getItem(" in page  # a timezone the user picked stays theirs
    assert client.post("/api/v2/variables").json() == {"created": "yes"}


def test_without_onceflow_up_settings_it_changes_nothing(monkeypatch: object) -> None:
    import os

    assert "ONCEFLOW_API_ALLOWED_HOSTS" not in os.environ
    client = _client()
    assert client.post("/api/v2/variables", headers={"Host": "airflow.corp.example"}).status_code == 200
    assert client.get("/", headers={"Accept": "text/html"}).text == PAGE


def test_the_provider_plugin_installs_the_guard() -> None:
    assert {"name": "onceflow_local_run_guard", "middleware": LocalRunGuard} in (
        OnceflowPriorityPlugin.fastapi_root_middlewares
    )
