"""A bad ``[onceflow_ops]`` setting or an unreadable source is said on the page, where the operator
looks, and by the API as a 503 with the reason, never a bare 500.

The app runs in-process (Starlette's test client); who the user is and what the auth manager
says are stubbed here because ``tests/acceptance/test_ops_view_ui.py`` tests them against a real
api-server with SimpleAuthManager.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from onceflow.testing.ops_view_state import create_ledger


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    from airflow.api_fastapi.core_api.security import get_user

    from onceflow.opsview import access, api, queue, sources

    ledger = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    create_ledger(ledger)
    ledger.dispose()
    for name, db in (("LEDGER", "ledger.db"), ("WAREHOUSE", "warehouse.db")):
        conn = {"conn_type": "generic", "extra": {"sqlalchemy_url": f"sqlite:///{tmp_path / db}"}}
        monkeypatch.setenv(f"AIRFLOW_CONN_ONCEFLOW_{name}", json.dumps(conn))
    monkeypatch.setattr(access, "may_read", lambda user, section: True)
    monkeypatch.setattr(
        queue, "read_sheet", lambda: [["url", "status", "reason", "run_id", "score", "published_url"]]
    )
    api.app.dependency_overrides[get_user] = lambda: object()
    sources.reset()
    yield TestClient(api.app)
    api.app.dependency_overrides.clear()
    sources.reset()


def test_a_calendar_length_out_of_range_is_on_the_page_and_in_the_api(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__ONCEFLOW_OPS__CALENDAR_DAYS", "0")
    page = client.get("/")
    assert page.status_code == 200
    assert "calendar_days must be between 1 and 3660" in page.text
    answer = client.get("/api/v1/partitions")
    assert answer.status_code == 503
    assert "calendar_days must be between 1 and 3660" in answer.json()["detail"]


def test_a_warehouse_without_load_audit_is_named_in_its_section(client: TestClient) -> None:
    doc = client.get("/api/v1/partitions").json()
    assert doc["tables"][0]["table"] == "daily_sales"
    assert "load_audit" in doc["tables"][0]["error"]
    page = client.get("/")
    assert page.status_code == 200 and "load_audit" in page.text
    assert client.get("/api/v1/questions").status_code == 200  # the other sections still answer
