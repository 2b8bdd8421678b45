"""Smaller daily_sales consistency rules (issue 12 defect 7), against real databases.

* The shop database is only read: a SQLite shop keeps its journal mode and is read while the shop
  holds its write lock.
* ``load_audit.reject_count`` always counts the partition's rows in ``rejects``.
* The dashboard reads audit rows and sums in one snapshot, even while a load commits.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from typing import TYPE_CHECKING, Any

import pendulum
import pytest
import sqlalchemy as sa

from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.dashboard import fetch_dashboard_rows
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders
from onceflow.sales.partition_store import PartitionStore
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from pathlib import Path

DAY = dt.date(2024, 6, 15)
CONFIG = GeneratorConfig(seed=8, orders_per_day=30)


def test_a_sqlite_shop_is_read_without_its_write_lock_and_keeps_its_journal_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onceflow.hooks.warehouse import ShopDbHook

    path = tmp_path / "shop.db"
    engine = make_engine(f"sqlite:///{path}")
    write_orders(engine, generate_orders(DAY, DAY + dt.timedelta(days=1), CONFIG))
    engine.dispose()
    with sqlite3.connect(path) as conn:  # the shop as shops run it: rollback journal
        conn.execute("PRAGMA journal_mode = DELETE")
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_SHOP_DB", json.dumps({"conn_type": "sqlite", "host": str(path)})
    )

    shop = sqlite3.connect(path, timeout=0, isolation_level=None)
    shop.execute("BEGIN IMMEDIATE")  # the shop is writing right now and holds its write lock
    shop.execute("DELETE FROM orders")  # uncommitted: the extract must not see it
    try:
        start = pendulum.datetime(DAY.year, DAY.month, DAY.day, tz="Europe/Amsterdam")
        frame = ShopDbHook().read_interval(start, start.add(days=1))
    finally:
        shop.execute("ROLLBACK")
        shop.close()
    assert len(frame) > 0  # the committed rows, not the uncommitted delete
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert not (tmp_path / "shop.db-wal").exists()


def test_recording_rejects_keeps_the_audit_reject_count(sales_db_url: str) -> None:
    result = clean_day(DAY, CONFIG)
    engine = make_engine(sales_db_url)
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()
    lease = store.acquire_lease(DAY, run_id="r", try_number=1)
    store.overwrite(lease, result.rows, result.rejects, processing_version=PROCESSING_VERSION)
    assert store.audit(DAY).reject_count == len(result.rejects) > 1  # type: ignore[union-attr]

    # The next try is refused for too many rejects: its reasons replace the partition's rejects.
    retry = store.acquire_lease(DAY, run_id="r", try_number=2)
    store.record_rejects(retry, result.rejects.iloc[:1])
    audit = store.audit(DAY)
    assert audit is not None and audit.reject_count == len(store.partition_rejects(DAY)) == 1
    assert (audit.try_number, audit.row_count) == (1, len(result.rows))  # the rows are the old load's
    engine.dispose()


@pytest.mark.postgres
def test_the_dashboard_reads_audit_rows_and_sums_in_one_snapshot(postgres_url: str) -> None:
    """A load commits between any two statements of the read; each day still shows one load."""
    result = clean_day(DAY, CONFIG)
    small, large = result.rows.iloc[:3], result.rows
    writer_engine = make_engine(postgres_url)
    writer = PartitionStore(writer_engine, "daily_sales")
    writer.create_schema()
    try_number = 0

    def load(rows: Any, run_id: str) -> None:
        nonlocal try_number
        try_number += 1
        lease = writer.acquire_lease(DAY, run_id=run_id, try_number=try_number, lease_seconds=0)
        writer.overwrite(lease, rows, None, processing_version=PROCESSING_VERSION)

    expected = {("small", len(small)), ("large", len(large))}
    reader = make_engine(postgres_url)
    seen: set[tuple[str, int]] = set()
    for after_statement in range(1, 12):
        load(small, "small")
        executed = 0

        def interleave(*_args: Any, at: int = after_statement) -> None:
            nonlocal executed
            executed += 1
            if executed == at:
                load(large, "large")  # another connection commits while the read is under way

        sa.event.listen(reader, "after_cursor_execute", interleave)
        try:
            with reader.connect() as conn:
                [row] = fetch_dashboard_rows(conn, table="daily_sales")
        finally:
            sa.event.remove(reader, "after_cursor_execute", interleave)
        seen.add((row.run_id, row.orders))
        assert (row.run_id, row.orders) in expected, f"run {row.run_id} with {row.orders} orders"
        if executed < after_statement:
            break  # the read has fewer statements than this; every gap was tried
    assert seen == expected  # both outcomes happened: the load really raced the read
    reader.dispose()
    writer_engine.dispose()


@pytest.mark.postgres
def test_a_postgresql_shop_is_read_in_read_only_snapshots(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onceflow.hooks.warehouse import ShopDbHook

    engine = make_engine(postgres_url)
    write_orders(engine, generate_orders(DAY, DAY + dt.timedelta(days=1), CONFIG))
    engine.dispose()
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_SHOP_DB",
        json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": postgres_url}}),
    )
    hook = ShopDbHook()
    start = pendulum.datetime(DAY.year, DAY.month, DAY.day, tz="Europe/Amsterdam")
    assert len(hook.read_interval(start, start.add(days=1))) > 0
    with hook.engine.begin() as conn:
        assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "repeatable read"
        with pytest.raises(sa.exc.DBAPIError, match="read-only transaction"):
            conn.exec_driver_sql("DELETE FROM orders")
    hook.engine.dispose()
