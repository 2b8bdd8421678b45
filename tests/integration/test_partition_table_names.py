"""Table names that would lose data are refused; one physical table has one fence (PostgreSQL, SQLite)."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest
import sqlalchemy as sa

from onceflow.sales.clean import empty_sales_frame
from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore
from onceflow.sales.table_names import InvalidNameError, resolve_table, validate_table_name

DAY = dt.date(2024, 5, 6)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("pg_temp.daily_sales", "temporary or system schema"),
        ("pg_temp_3.daily_sales", "temporary or system schema"),
        ("temp.daily_sales", "temporary or system schema"),
        ("TEMP.daily_sales", "temporary or system schema"),
        ("pg_catalog.daily_sales", "temporary or system schema"),
        ("rejects", "tables every sales table shares"),
        ("public.load_fence", "tables every sales table shares"),
        ("Load_Audit", "tables every sales table shares"),
        ("s" * 46, "at most 45 fit"),
        ("analytics." + "t" * 63, "at most 45 fit"),
        ("sales; DROP TABLE x", "expected an identifier"),
    ],
)
def test_names_that_lose_data_or_break_are_refused_with_the_reason(name: str, why: str) -> None:
    with pytest.raises(InvalidNameError, match=why):
        validate_table_name(name)


def test_the_longest_name_that_fits_its_index_loads(sales_db_url: str) -> None:
    name = "s" * 45
    assert validate_table_name(name) == name
    store = PartitionStore(make_engine(sales_db_url), name)
    store.create_schema()
    lease = store.acquire_lease(DAY, run_id="r", try_number=1)
    store.overwrite(lease, empty_sales_frame(), processing_version="v")
    assert store.audit(DAY) is not None


def _one_row() -> pd.DataFrame:
    from onceflow.sales.clean import normalise_sales_frame

    return normalise_sales_frame(
        pd.DataFrame(
            {
                "partition_date": [DAY], "order_id": ["O1"], "customer_id": ["C1"], "source_currency": ["EUR"],
                "gross_cents": [100], "refund_cents": [0], "net_cents": [100], "event_count": [1],
                "first_event_utc": [dt.datetime(2024, 5, 6, 8)],
            }
        )
    )  # fmt: skip


def test_a_bare_and_a_schema_qualified_name_of_one_table_share_one_fence(sales_db_url: str) -> None:
    engine = make_engine(sales_db_url)
    qualified = "public.daily_sales" if engine.dialect.name == "postgresql" else "main.daily_sales"
    bare, other = PartitionStore(engine, "daily_sales"), PartitionStore(engine, qualified)
    bare.create_schema()
    assert other.table_name == bare.table_name == "daily_sales"
    first = bare.register_ledger_token(DAY, token=7, work_key="k", run_id="a", try_number=1)
    second = other.register_ledger_token(DAY, token=8, work_key="k", run_id="b", try_number=1)
    assert second.fence_token == first.fence_token + 1  # one token sequence, not two token 1s
    with pytest.raises(Exception, match="refusing to overwrite"):
        bare.overwrite(first, _one_row(), processing_version="v")
    other.overwrite(second, _one_row(), processing_version="v")
    assert len(bare.partition_rows(DAY)) == 1


@pytest.mark.postgres
def test_postgres_resolves_through_the_search_path_and_refuses_a_shadowing_temp_table(
    postgres_url: str,
) -> None:
    engine = make_engine(postgres_url, connect_args={"options": "-c search_path=analytics,public"})
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA analytics")
    # Not there yet: it will be created where the search path creates it, and fenced under that name.
    resolved = resolve_table(engine, "daily_sales")
    assert (resolved.fence_name, resolved.statement_name) == (
        "analytics.daily_sales",
        "analytics.daily_sales",
    )
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()
    assert PartitionStore(engine, "analytics.daily_sales").table_name == store.table_name
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT to_regclass('analytics.daily_sales') IS NOT NULL").scalar_one()
    with pytest.raises(InvalidNameError, match="no schema 'nowhere'"):
        resolve_table(engine, "nowhere.daily_sales")

    # A session's temporary table of the same name shadows the permanent one: refused, not used.
    single = make_engine(postgres_url, poolclass=sa.pool.StaticPool)
    with single.connect() as conn:
        conn.exec_driver_sql("CREATE TEMP TABLE daily_sales (x int)")
        conn.commit()
    with pytest.raises(InvalidNameError, match=r"temporary table pg_temp_\d+\.daily_sales"):
        PartitionStore(single, "daily_sales")


def test_sqlite_refuses_a_shadowing_temp_table_and_an_unattached_database(tmp_path: object) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/wh.db", poolclass=sa.pool.StaticPool)
    with pytest.raises(InvalidNameError, match="no database 'analytics' attached"):
        resolve_table(engine, "analytics.daily_sales")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TEMP TABLE daily_sales (x int)")
    with pytest.raises(InvalidNameError, match=r"temporary table temp\.daily_sales"):
        PartitionStore(engine, "daily_sales")


def test_sqlite_names_differing_only_in_case_share_one_fence(tmp_path: object) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/wh.db")
    store = PartitionStore(engine, "DailySales")
    store.create_schema()
    assert PartitionStore(engine, "dailysales").table_name == "DailySales"
