"""The dashboard read from a real warehouse (SQLite, PostgreSQL) and the operator in a dag.test() run."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from onceflow.sales.dashboard import fetch_dashboard_rows
from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore
from onceflow.sales.schema import SALES_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from sqlalchemy.engine import Engine

NEWEST = dt.date(2026, 11, 28)


def sales_rows(day: dt.date, nets: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "partition_date": day,
                "order_id": f"o-{day:%Y%m%d}-{n}",
                "customer_id": f"c-{n}",
                "source_currency": "EUR",
                "gross_cents": max(net, 0) + 100,
                "refund_cents": 100,
                "net_cents": net,
                "event_count": 2,
                "first_event_utc": dt.datetime.combine(day, dt.time(9, n % 60)),
            }
            for n, net in enumerate(nets)
        ],
        columns=list(SALES_COLUMNS),
    )


def load(store: PartitionStore, day: dt.date, nets: list[int]) -> None:
    run_id = f"scheduled__{day}"
    lease = store.acquire_lease(day, run_id=run_id, try_number=1)
    store.overwrite(lease, sales_rows(day, nets), processing_version="test")


def loaded_warehouse(engine: Engine) -> PartitionStore:
    """Five loaded days ending at NEWEST, with NEWEST-2 missing and NEWEST-1 loaded empty."""
    store = PartitionStore(engine, "daily_sales", clock=lambda: dt.datetime(2026, 11, 29, 0, 5))
    store.create_schema()
    for back, nets in [(5, [1000, 2000]), (4, [500]), (3, [700, -200]), (1, []), (0, [12_345, 55, 100])]:
        load(store, NEWEST - dt.timedelta(days=back), nets)
    other = PartitionStore(engine, "other_sales", clock=store.clock)
    other.create_schema()
    load(other, NEWEST + dt.timedelta(days=3), [1])  # another table's audit rows are ignored
    return store


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def warehouse_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'warehouse.db'}"
    return str(request.getfixturevalue("postgres_url"))


def test_it_reads_one_row_per_loaded_partition_of_the_window(warehouse_url: str) -> None:
    engine = make_engine(warehouse_url)
    loaded_warehouse(engine)

    with engine.connect() as conn:
        rows = fetch_dashboard_rows(conn, table="daily_sales", window_days=5)

    assert [(r.day, r.net_cents, r.refund_cents, r.orders) for r in rows] == [
        (NEWEST - dt.timedelta(days=4), 500, 100, 1),
        (NEWEST - dt.timedelta(days=3), 500, 200, 2),
        (NEWEST - dt.timedelta(days=1), 0, 0, 0),
        (NEWEST, 12_500, 300, 3),
    ]
    assert {r.run_id for r in rows} >= {f"scheduled__{NEWEST}"}
    assert rows[-1].loaded_at_utc == dt.datetime(2026, 11, 29, 0, 5)


def test_an_empty_or_missing_warehouse_gives_no_rows(warehouse_url: str) -> None:
    engine = make_engine(warehouse_url)
    with engine.connect() as conn:
        assert fetch_dashboard_rows(conn, table="daily_sales") == []

    PartitionStore(engine, "daily_sales").create_schema()
    with engine.connect() as conn:
        assert fetch_dashboard_rows(conn, table="daily_sales") == []


def dashboard_dag(output_dir: Path, table: str = "daily_sales") -> Any:
    from airflow.sdk import DAG

    from onceflow.operators.dashboard import SalesDashboardOperator

    with DAG("dashboard_operator_probe", schedule=None, start_date=dt.datetime(2026, 1, 1)) as dag:
        SalesDashboardOperator(task_id="render", table=table, output_dir=str(output_dir))
    return dag


def sqlite_connection(path: Path) -> str:
    return json.dumps({"conn_type": "sqlite", "host": str(path)})


def test_the_operator_publishes_the_dashboard_of_the_warehouse(
    run_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "warehouse.db"
    loaded_warehouse(make_engine(f"sqlite:///{db}"))
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WAREHOUSE", sqlite_connection(db))
    out = tmp_path / "dashboard"

    result = run_dag(dashboard_dag(out))

    assert result.state == "success", result.ti_states
    summary = result.xcom("render")
    assert summary["newest_complete_day"] == "2026-11-28"
    assert NEWEST - dt.timedelta(days=2) in map(dt.date.fromisoformat, summary["missing_days"])
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "Complete through Saturday 28 November 2026" in page
    [chart] = out.glob("sales-chart-*.png")
    assert f'src="{chart.name}"' in page


def test_the_operator_writes_the_no_data_page_for_an_empty_warehouse(
    run_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WAREHOUSE", sqlite_connection(tmp_path / "empty.db"))
    out = tmp_path / "dashboard"

    result = run_dag(dashboard_dag(out))

    assert result.state == "success", result.ti_states
    assert result.xcom("render") == {
        "page": str(out / "index.html"),
        "newest_complete_day": None,
        "missing_days": [],
    }
    assert "<b>No data.</b>" in (out / "index.html").read_text(encoding="utf-8")


def test_the_operator_refuses_an_injection_shaped_table_name(
    run_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WAREHOUSE", sqlite_connection(tmp_path / "w.db"))
    out = tmp_path / "dashboard"

    result = run_dag(dashboard_dag(out, table="daily_sales; DROP TABLE load_audit"))

    assert result.ti_states == {"render": "failed"}
    assert not out.exists()
