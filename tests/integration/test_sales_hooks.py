"""Connections of the daily_sales hooks, and the embedded SQLite defaults."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def test_without_connections_the_hooks_use_sqlite_files_under_airflow_home(airflow_db: object) -> None:
    from onceflow.hooks.warehouse import ShopDbHook, WarehouseHook

    home = Path(os.environ["AIRFLOW_HOME"])
    assert (
        WarehouseHook("onceflow_missing_warehouse").get_url()
        == f"sqlite:///{home / 'onceflow' / 'warehouse.db'}"
    )
    assert ShopDbHook("onceflow_missing_shop").get_url() == f"sqlite:///{home / 'onceflow' / 'shop.db'}"
    assert not WarehouseHook("onceflow_missing_warehouse").is_bigquery


@pytest.mark.parametrize(
    ("conn", "url"),
    [
        (
            "postgresql://etl:s3cret@127.0.0.1:5432/warehouse",
            "postgresql+psycopg2://etl:s3cret@127.0.0.1:5432/warehouse",
        ),
        (
            json.dumps(
                {
                    "conn_type": "postgres",
                    "host": "db",
                    "schema": "wh",
                    "login": "u",
                    "extra": {"driver": "psycopg"},
                }
            ),
            "postgresql+psycopg://u@db/wh",
        ),
        (json.dumps({"conn_type": "sqlite", "host": "/data/wh.db"}), "sqlite:////data/wh.db"),
        (
            json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": "sqlite:////x.db"}}),
            "sqlite:////x.db",
        ),
    ],
)
def test_connections_become_sqlalchemy_urls(monkeypatch: pytest.MonkeyPatch, conn: str, url: str) -> None:
    from onceflow.hooks.warehouse import WarehouseHook

    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WAREHOUSE_T", conn)
    assert WarehouseHook("onceflow_warehouse_t").get_url() == url


def test_a_google_cloud_connection_means_bigquery(monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow.hooks.warehouse import WarehouseHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE_G",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"project": "p"}}),
    )
    hook = WarehouseHook("onceflow_warehouse_g")
    assert hook.is_bigquery
    with pytest.raises(ValueError, match="not PostgreSQL or SQLite"):
        hook.get_url()
