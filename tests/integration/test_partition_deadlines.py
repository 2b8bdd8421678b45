"""No wait without a deadline: a lock held past lock_timeout fails the try with a clear message and
hands the ledger lease back; the next try loads once the lock is gone. Real PostgreSQL warehouse
and shop, a real ledger; the lock is a real ``LOCK TABLE`` held by another session."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from onceflow.ledger import Ledger
from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.deadlines import DeadlineExceeded, Deadlines
from onceflow.sales.engine import make_engine, make_source_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.ledger_link import load_partition, work_key_for
from onceflow.sales.partition_store import AuditRecord, Lease, PartitionStore
from onceflow.testing.sales_fixtures import clean_day

pytestmark = pytest.mark.postgres

DAY = dt.date(2024, 10, 27)
DATA = clean_day(DAY, GeneratorConfig(seed=5, orders_per_day=40))
SHORT = Deadlines(lock_timeout_s=1, statement_timeout_s=0.5)


def shown_deadlines(conn: Any) -> list[str]:
    """The session's lock_timeout and statement_timeout, as PostgreSQL shows them."""
    return [
        conn.exec_driver_sql(f"SHOW {name}").scalar_one() for name in ("lock_timeout", "statement_timeout")
    ]


def attempt(ledger: Ledger, store: PartitionStore, try_number: int) -> AuditRecord:
    def write(lease: Lease) -> AuditRecord:
        return store.overwrite(lease, DATA.rows, DATA.rejects, processing_version=PROCESSING_VERSION)

    return load_partition(
        ledger, store, partition=DAY, owner=f"daily_sales/r/{try_number}", run_id="r",
        try_number=try_number, processing_version=PROCESSING_VERSION, write=write, lease_seconds=600,
    )  # fmt: skip


def test_a_lock_held_past_lock_timeout_fails_the_try_and_the_next_try_loads_when_it_goes(
    postgres_url: str, ledger: Ledger
) -> None:
    store = PartitionStore(make_engine(postgres_url, deadlines=Deadlines(lock_timeout_s=1)), "daily_sales")
    store.create_schema()
    blocker = make_engine(postgres_url).connect()
    try:
        blocker.exec_driver_sql("LOCK TABLE daily_sales IN SHARE MODE")  # a long report, say
        with pytest.raises(DeadlineExceeded, match=r"waited more than lock_timeout=1s for a lock") as failed:
            attempt(ledger, store, 1)
        assert "DELETE FROM" in str(failed.value) and "ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS" in str(
            failed.value
        )
        assert "work-ledger lease (daily_sales/2024-10-27) was handed back" in str(failed.value)
        item = ledger.item(work_key_for("daily_sales", DAY))
        assert item.state != "leased"  # handed back: the next try need not wait 600 s for it
        assert store.audit(DAY) is None  # nothing half-written
        with pytest.raises(DeadlineExceeded):
            attempt(ledger, store, 2)  # still held: still refused, still not waiting forever
        blocker.rollback()  # the lock goes
        audit = attempt(ledger, store, 3)
    finally:
        blocker.close()
    assert audit.row_count == len(DATA.rows) and store.partition_checksum(DAY) == audit.checksum
    assert ledger.item(work_key_for("daily_sales", DAY)).state == "done"


def test_without_the_ledger_a_lock_timeout_says_what_became_of_the_warehouse_lease(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator with ledger_conn_id=None: no ledger lease exists to hand back; the message
    says the warehouse lease stays until it expires and that this run's retry takes it over,
    and the retry does once the lock goes."""
    from types import SimpleNamespace

    from onceflow.operators.partition import PartitionOverwriteOperator
    from onceflow.sales.staging import StagedClean

    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WAREHOUSE_DL", postgres_url.replace("+psycopg2", ""))
    monkeypatch.setenv("ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS", "1")
    from onceflow.hooks.warehouse import WarehouseHook

    staged = StagedClean(
        partition=DAY, rows=DATA.rows, rejects=DATA.rejects, source_rows=DATA.source_rows,
        processing_version=PROCESSING_VERSION,
    )  # fmt: skip
    op = PartitionOverwriteOperator(
        task_id="load", partition=DAY.isoformat(), staging_dir="unused", table="daily_sales",
        warehouse_conn_id="onceflow_warehouse_dl", ledger_conn_id=None, lease_seconds=600,
    )  # fmt: skip
    warehouse = WarehouseHook("onceflow_warehouse_dl")
    warehouse.get_store("daily_sales")
    blocker = make_engine(postgres_url).connect()
    try:
        blocker.exec_driver_sql("LOCK TABLE daily_sales IN SHARE MODE")
        context = {"run_id": "r", "ti": SimpleNamespace(try_number=1, dag_id="daily_sales")}
        with pytest.raises(DeadlineExceeded) as failed:
            op._execute(context, warehouse, staged, DAY)  # type: ignore[arg-type]
        message = str(failed.value)
        assert "waited more than lock_timeout=1s" in message
        assert "lease was handed back" not in message and "lease is released" not in message
        assert "Without a work ledger" in message and "warehouse lease stays with run 'r' until" in message
        blocker.rollback()
        context["ti"] = SimpleNamespace(try_number=2, dag_id="daily_sales")
        result = op._execute(context, warehouse, staged, DAY)  # type: ignore[arg-type]
    finally:
        blocker.close()
    store = PartitionStore(make_engine(postgres_url), "daily_sales")
    assert result["row_count"] == len(DATA.rows) and store.partition_checksum(DAY) == result["checksum"]


@pytest.mark.parametrize("make", [make_engine, make_source_engine], ids=["warehouse", "shop"])
def test_a_statement_running_past_statement_timeout_fails_naming_the_setting(
    postgres_url: str, make: object
) -> None:
    engine = make(postgres_url, deadlines=SHORT)  # type: ignore[operator]
    with (
        pytest.raises(DeadlineExceeded, match=r"statement ran longer than statement_timeout=0\.5s"),
        engine.connect() as conn,
    ):
        conn.exec_driver_sql("SELECT pg_sleep(3)")
    with engine.connect() as conn:  # the session is still usable: the setting, not a broken pool
        assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "1s"


def test_deadlines_must_be_positive_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS", "0")
    with pytest.raises(ValueError, match="must be positive"):
        Deadlines.from_env()
    monkeypatch.setenv("ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ValueError, match="number of seconds"):
        Deadlines.from_env()


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "1e300"])
def test_deadlines_must_be_finite(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    """'nan' passed the positive check (nan <= 0 is false) and failed every connect with a bare
    "cannot convert float NaN to integer"; 'inf' and 1e300 with an OverflowError or an out-of-range SET."""
    monkeypatch.setenv("ONCEFLOW_SALES_STATEMENT_TIMEOUT_SECONDS", raw)
    with pytest.raises(ValueError, match="ONCEFLOW_SALES_STATEMENT_TIMEOUT_SECONDS"):
        Deadlines.from_env()


@pytest.mark.postgres
def test_a_deadline_below_a_millisecond_is_one_millisecond_not_none(postgres_url: str) -> None:
    """0.0004 s was set as lock_timeout = '0ms', which PostgreSQL reads as no timeout: a wait
    without a deadline from a setting that asked for the shortest one."""
    engine = make_engine(postgres_url, deadlines=Deadlines(lock_timeout_s=0.0004, statement_timeout_s=0.0009))
    try:
        with engine.connect() as conn:
            shown = shown_deadlines(conn)
        assert shown == ["1ms", "1ms"]
    finally:
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_both_deadlines_are_set_on_each_driver_s_new_sessions(postgres_url: str, driver: str) -> None:
    """Both deadlines are set by one statement on each new session, on either driver onceflow
    supports, and kept on the pooled session."""
    import sqlalchemy as sa

    url = sa.engine.make_url(postgres_url).set(drivername=f"postgresql+{driver}")
    engine = make_engine(
        url.render_as_string(hide_password=False),
        deadlines=Deadlines(lock_timeout_s=2.5, statement_timeout_s=7),
    )
    try:
        assert engine.dialect.driver == driver
        for _ in range(2):  # a new session, then a pooled one: set once per session, kept
            with engine.connect() as conn:
                shown = shown_deadlines(conn)
            assert shown == ["2500ms", "7s"]
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_both_deadlines_are_set_where_psycopg_3_prepares_every_statement(postgres_url: str) -> None:
    """psycopg 3 with ``prepare_threshold=0`` (passed through make_engine to create_engine) sends
    every query as a prepared statement, which may hold one command only: two SETs joined by ';'
    failed every new connection there ("cannot insert multiple commands into a prepared
    statement")."""
    import sqlalchemy as sa

    url = sa.engine.make_url(postgres_url).set(drivername="postgresql+psycopg")
    engine = make_engine(
        url.render_as_string(hide_password=False),
        deadlines=Deadlines(lock_timeout_s=2.5, statement_timeout_s=7),
        connect_args={"prepare_threshold": 0},
    )
    try:
        with engine.connect() as conn:
            shown = shown_deadlines(conn)
            assert conn.connection.dbapi_connection.prepare_threshold == 0
        assert shown == ["2500ms", "7s"]
    finally:
        engine.dispose()
