"""This repository's own short names for the onceflow pytest plugin's fixtures.

The plugin (entry point ``pytest11``) loads in every test suite of an environment that installs
the provider, so its fixtures carry the ``onceflow_`` prefix and never shadow a user's
``ledger`` or ``free_port``. The suite here was written with the short names; these aliases keep
them for this repository only (docs/testing.md lists both). Aliases take the prefixed fixture as
an argument, so its scope, parametrisation (``ledger_url`` over SQLite and PostgreSQL) and
teardown stay the plugin's. Airflow is not imported here (the plugin configures it first).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


@pytest.fixture(scope="session")
def airflow_env(onceflow_airflow_env: Any) -> Any:
    return onceflow_airflow_env


@pytest.fixture(scope="session")
def airflow_db(onceflow_airflow_db: Any) -> Any:
    return onceflow_airflow_db


@pytest.fixture
def run_dag(onceflow_run_dag: Any) -> Any:
    return onceflow_run_dag


@pytest.fixture
def airflow_cluster_factory(onceflow_airflow_cluster_factory: Any) -> Any:
    return onceflow_airflow_cluster_factory


@pytest.fixture
def airflow_cluster(onceflow_airflow_cluster: Any) -> Any:
    return onceflow_airflow_cluster


@pytest.fixture(scope="session")
def postgres_url_factory(onceflow_postgres_url_factory: Any) -> Any:
    return onceflow_postgres_url_factory


@pytest.fixture
def postgres_url(onceflow_postgres_url: Any) -> Any:
    return onceflow_postgres_url


@pytest.fixture
def free_port(onceflow_free_port: Any) -> Any:
    return onceflow_free_port


@pytest.fixture
def sheets_emulator(onceflow_sheets_emulator: Any) -> Any:
    return onceflow_sheets_emulator


@pytest.fixture
def sheets_emulator_factory(onceflow_sheets_emulator_factory: Any) -> Any:
    return onceflow_sheets_emulator_factory


@pytest.fixture
def fake_clock(onceflow_fake_clock: Any) -> Any:
    return onceflow_fake_clock


@pytest.fixture
def ledger_url(onceflow_ledger_url: Any) -> Any:
    return onceflow_ledger_url


@pytest.fixture
def ledger(onceflow_ledger: Any) -> Any:
    return onceflow_ledger


@pytest.fixture
def sqlite_ledger(onceflow_sqlite_ledger: Any) -> Any:
    return onceflow_sqlite_ledger


@pytest.fixture
def sales_db_url(onceflow_sales_db_url: Any) -> Any:
    return onceflow_sales_db_url


@pytest.fixture
def shop_orders(onceflow_shop_orders: Any) -> Any:
    return onceflow_shop_orders


@pytest.fixture
def sales_connections(onceflow_sales_connections: Any) -> Any:
    return onceflow_sales_connections


@pytest.fixture
def daily_sales_env(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    sales_db_url: str,
    sales_connections: Callable[[str, str], Path],
) -> dict[str, str]:
    """daily_sales' databases for one test: the shop in a SQLite file, the warehouse in
    ``sales_db_url`` (SQLite or PostgreSQL), the work ledger in a fresh database of the same
    backend; no retries. Returns their URLs (``shop``, ``warehouse``, ``ledger``)."""
    monkeypatch.setenv("ONCEFLOW_SALES_RETRIES", "0")
    shop = f"sqlite:///{tmp_path / 'shop.db'}"
    sales_connections(shop, sales_db_url)
    if sales_db_url.startswith("sqlite"):
        ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        ledger = str(request.getfixturevalue("postgres_url_factory")("ledger"))
    kind = "sqlite" if ledger.startswith("sqlite") else "postgres"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": kind, "extra": {"sqlalchemy_url": ledger}})
    )
    return {"shop": shop, "warehouse": sales_db_url, "ledger": ledger}


@pytest.fixture
def article_site(onceflow_article_site: Any) -> Any:
    return onceflow_article_site


@pytest.fixture(scope="session")
def fake_gcs(onceflow_fake_gcs: Any) -> Any:
    return onceflow_fake_gcs


@pytest.fixture
def queue_sheet(onceflow_queue_sheet: Any) -> Any:
    return onceflow_queue_sheet


@pytest.fixture
def network_refusals(onceflow_network_refusals: Any) -> Any:
    return onceflow_network_refusals
