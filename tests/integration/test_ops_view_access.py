"""Every route of the view's app, whatever it is, refuses an anonymous request (401) and a user
the auth manager refuses (403), with no data: the routes are read from the app itself, so a route
added later (or one FastAPI adds on its own, like ``/openapi.json``) is checked too.

In-process (Starlette's test client), with the auth manager's answer stubbed to "no";
``tests/acceptance/test_ops_view_ui.py`` checks the listed endpoints against a real api-server
with SimpleAuthManager users.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from onceflow.testing.ops_view_state import seed_ledger


def _requests() -> list[tuple[str, str]]:
    from onceflow.opsview import api

    found = []
    for route in api.app.routes:
        path = getattr(route, "path", "").replace("{name}", "index.html")
        for method in sorted(set(getattr(route, "methods", None) or ()) - {"HEAD"}):
            found.append((method, path))
    return found


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from airflow.api_fastapi.app import _AuthManagerState, init_auth_manager

    from onceflow.opsview import api, sources

    tmp = tmp_path_factory.mktemp("opsaccess")
    ledger = sa.create_engine(f"sqlite:///{tmp / 'ledger.db'}")
    seed_ledger(ledger, 1_764_000_000.0)  # data that must not leave
    ledger.dispose()
    (tmp / "dashboard").mkdir()
    (tmp / "dashboard" / "index.html").write_text("<h1>Sales</h1>")
    conn = {"conn_type": "generic", "extra": {"sqlalchemy_url": f"sqlite:///{tmp / 'ledger.db'}"}}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps(conn))
        env.setenv("ONCEFLOW_DASHBOARD_DIR", str(tmp / "dashboard"))
        # the configured auth manager, as the api-server starts it: it reads the tokens
        env.setattr(_AuthManagerState, "instance", None)
        init_auth_manager()
        sources.reset()
        yield TestClient(api.app)
    sources.reset()


def _refusal_only(body: bytes) -> bool:
    return set(json.loads(body)) == {"detail"} and b"work_key" not in body and b"<h1>" not in body


def test_the_app_has_the_routes_of_the_view() -> None:
    assert ("GET", "/api/v1/questions") in _requests() and ("GET", "/metrics") in _requests()


@pytest.mark.parametrize(("method", "path"), _requests())
def test_every_route_refuses_an_anonymous_request(client: TestClient, method: str, path: str) -> None:
    answer = client.request(method, path)
    assert answer.status_code == 401, (path, answer.text[:200])
    assert _refusal_only(answer.content)


@pytest.mark.parametrize(("method", "path"), _requests())
def test_every_route_refuses_a_user_the_auth_manager_refuses(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, method: str, path: str
) -> None:
    from airflow.api_fastapi.core_api.security import get_user

    from onceflow.opsview import access, api

    async def resolve(token: str | None) -> Any:
        return object()

    monkeypatch.setattr(access, "may_read", lambda user, section: False)
    monkeypatch.setattr(api, "resolve_user_from_token", resolve)
    api.app.dependency_overrides[get_user] = lambda: object()
    try:
        answer = client.request(method, path, headers={"Authorization": "Bearer a-user"})
    finally:
        api.app.dependency_overrides.clear()
    assert answer.status_code == 403, (path, answer.text[:200])
    assert _refusal_only(answer.content)


@pytest.mark.parametrize("token", ["caf\u00e9", "scrape-secret\u00ff", "x" * 300])
def test_a_wrong_scrape_token_of_any_bytes_is_refused(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    """Not a 500: a header may carry any byte (Starlette reads it as latin-1)."""
    monkeypatch.setenv("AIRFLOW__ONCEFLOW_OPS__METRICS_TOKEN", "scrape-secret")
    answer = client.get("/metrics", headers={"Authorization": f"Bearer {token}".encode("latin-1")})
    assert answer.status_code == 403, answer.text[:200]
    assert _refusal_only(answer.content)
    right = client.get("/metrics", headers={"Authorization": "Bearer scrape-secret"})
    assert right.status_code == 200 and "# EOF" in right.text
